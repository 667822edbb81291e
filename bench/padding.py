"""The training side of one GRPO round on CPU, on each path of ``trim_padding``: off, trim and packed.

One round of the paper recipe's structure (per process: 8 rows per micro-batch, 4 micro-batches per
optimizer step, 16 per round, so the old-log-prob pass runs) on a random Qwen2 model of a few M parameters
built in code. Prompts are the augmented prompts of the synthetic dataset, rendered as in training;
completions are random tokens whose lengths follow a long-tailed mix like the paper's: one row in 16 reaches
the cap, the rest are drawn from an exponential, for a mean of about a quarter of the cap. The generation
itself is replaced by that draw (it is not what is timed); everything after it is `PromptAugGRPOTrainer`.

Paths (``trim_padding``): ``off`` (TRL's padded calls), ``trim`` (one trimmed call per TRL call) and
``packed`` (each TRL call's real tokens in one row; the default). All three runs start from the same weights
and train on the same round (checked). Timed: the old-log-prob pass and the optimizer steps (forward,
backward, optimizer). Prints a table (per phase: seconds, real-token share, model calls), the loss of each
optimizer step per path, then ``trim/padded training-side time: X.XX`` and, last,
``packed/padded training-side time: X.XX``.

    OMP_NUM_THREADS=1 python bench/padding.py            # about 3 minutes on one quiet core
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(
    0, str(Path(__file__).resolve().parents[1])
)  # this checkout's prompt_aug, not an installed one

import torch
from datasets import Dataset
from transformers import GenerationConfig, PrinterCallback, Qwen2Config, Qwen2ForCausalLM

from prompt_aug.config import PromptAugGRPOConfig
from prompt_aug.demo.smoke import build_tiny_tokenizer, synthetic_problems
from prompt_aug.padding import long_tailed_lengths
from prompt_aug.trainer import PromptAugGRPOTrainer
from prompt_aug.trl_seam import Generation


class _BenchTrainer(PromptAugGRPOTrainer):
    """Draws the round's completions instead of sampling them, and times the training side."""

    def generate_round(self, prompts: list) -> Generation:
        generator = torch.Generator().manual_seed(1000 + self.micro_step)
        tokenizer = self.text_tokenizer
        prompt_ids = tokenizer(prompts, add_special_tokens=False)["input_ids"]
        lengths = long_tailed_lengths(len(prompt_ids), self.max_completion_length, generator)
        completions = []
        for n in lengths:
            ids = torch.randint(20, len(tokenizer), (n,), generator=generator).tolist()
            if n < self.max_completion_length:
                ids[-1] = tokenizer.eos_token_id
            completions.append(ids)
        texts = tokenizer.batch_decode(completions, skip_special_tokens=True)
        return Generation(prompt_ids, completions, None, texts, None, {}, None, [])

    def token_logps_and_entropies(self, *args, **kwargs):
        start = time.perf_counter()
        out = super().token_logps_and_entropies(*args, **kwargs)
        if not kwargs.get("compute_entropy"):
            self.timings["old_logps"] += time.perf_counter() - start
        return out

    def score_round(self, inputs):
        start = time.perf_counter()
        output = super().score_round(inputs)
        self.timings["generate_and_score"] += time.perf_counter() - start
        self.old_logps_stats = dict(self.padding_free.stats)  # the counts of the old-log-prob pass
        self.round = (output["completion_ids"].clone(), output["prompt_ids"].clone())
        return output

    def training_step(self, model, inputs, num_items_in_batch=None):
        # TRL generates (and runs the old-log-prob pass) inside the first training_step of a round.
        start = time.perf_counter()
        loss = super().training_step(model, inputs, num_items_in_batch)
        self.timings["training_step"] += time.perf_counter() - start
        return loss


def _reward(completions, **kwargs):
    return [float(len(c) % 3) for c in completions]


def build_model(path: Path, hidden: int, layers: int, seed: int) -> Path:
    """A random Qwen2 model of ``layers`` layers at width ``hidden``, with the tiny ChatML tokenizer."""
    tokenizer = build_tiny_tokenizer()
    config = Qwen2Config(
        vocab_size=len(tokenizer), hidden_size=hidden, intermediate_size=3 * hidden, num_hidden_layers=layers,
        num_attention_heads=hidden // 64, num_key_value_heads=max(1, hidden // 256),
        max_position_embeddings=4096, tie_word_embeddings=True, bos_token_id=None,
        eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id,
    )  # fmt: skip
    torch.manual_seed(seed)
    model = Qwen2ForCausalLM(config)
    model.generation_config = GenerationConfig(
        eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id
    )
    model.save_pretrained(path)
    tokenizer.save_pretrained(path)
    return path


def run(model_path: Path, out: Path, trim_padding: str, args: argparse.Namespace) -> dict:
    config = PromptAugGRPOConfig(
        output_dir=str(out), per_device_train_batch_size=args.micro_batch, gradient_accumulation_steps=4,
        steps_per_generation=16, num_generations=8, max_completion_length=args.cap, max_steps=4,
        learning_rate=1e-5, report_to="none", save_strategy="no", logging_steps=1, use_cpu=True, bf16=False,
        loss_type="dapo", beta=0.0, seed=0, gradient_checkpointing=False, disable_tqdm=True,
        trim_padding=trim_padding,
    )  # fmt: skip
    questions = synthetic_problems(64, seed=0)
    trainer = _BenchTrainer(
        model=str(model_path),
        reward_funcs=_reward,
        args=config,
        train_dataset=Dataset.from_list(questions),
    )
    trainer.remove_callback(PrinterCallback)  # the table below, not every step's log
    trainer.timings = {"old_logps": 0.0, "generate_and_score": 0.0, "training_step": 0.0}
    trainer.train()
    timings = trainer.timings
    stats, old = trainer.padding_free.stats, trainer.old_logps_stats
    steps = {key: stats[key] - old[key] for key in stats}  # the 4 optimizer steps' forward calls
    completion_ids, prompt_ids = trainer.round
    return {
        "path": trainer.padding_free.mode,  # packed falls back to trim (and logs why) where it cannot serve
        "old_logps": timings["old_logps"],
        "steps": timings["training_step"] - timings["generate_and_score"],
        "old_share": old["real"] / old["processed"],
        "steps_share": steps["real"] / steps["processed"],
        "old_calls": old["calls"],
        "steps_calls": steps["calls"],
        "processed": stats["processed"],
        "losses": [log["loss"] for log in trainer.state.log_history if "loss" in log],
        "round": completion_ids,
        "prompts": prompt_ids,
        "rows": completion_ids.size(0),
    }


MODES = {"padded": "off", "trim": "trim", "packed": "packed"}  # name: trim_padding


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--cap", type=int, default=512, help="max_completion_length (default 512)")
    parser.add_argument("--micro_batch", type=int, default=8, help="per_device_train_batch_size (default 8)")
    parser.add_argument("--hidden", type=int, default=256)
    parser.add_argument("--layers", type=int, default=4)
    args = parser.parse_args()
    results = {}
    start = time.perf_counter()
    with tempfile.TemporaryDirectory() as tmp:
        model_path = build_model(Path(tmp) / "model", args.hidden, args.layers, seed=0)
        params = sum(p.numel() for p in Qwen2ForCausalLM.from_pretrained(model_path).parameters())
        for name, mode in MODES.items():
            results[name] = run(model_path, Path(tmp) / name, mode, args)
    padded = results["padded"]
    for name, r in results.items():
        if not torch.equal(padded["round"], r["round"]) or not torch.equal(padded["prompts"], r["prompts"]):
            raise SystemExit(f"bench/padding.py: the {name} and padded runs trained on different rounds")
    lengths = (padded["round"] != 0).sum(1).float()
    prompts = (padded["prompts"] != 0).sum(1).float()
    print(
        f"model: {params / 1e6:.1f} M parameters (hidden {args.hidden}, {args.layers} layers); round: "
        f"{padded['rows']} rows, prompts {prompts.min():.0f}-{prompts.max():.0f} tokens, "
        f"completions mean {lengths.mean():.0f} of cap {args.cap} "
        f"({int((lengths == args.cap).sum())} at the cap); torch threads {torch.get_num_threads()}; "
        f"{time.perf_counter() - start:.0f} s in all"
    )
    print(
        f"{'':7} {'path':>6} | {'old log-probs: s':>16} {'share':>6} {'calls':>5} | "
        f"{'optimizer steps: s':>18} {'share':>6} {'calls':>5} | {'tokens run':>10} {'training side s':>15}"
    )
    for name, r in results.items():
        total = r["old_logps"] + r["steps"]
        old_logps = f"{r['old_logps']:>16.2f} {r['old_share']:>6.3f} {r['old_calls']:>5}"
        steps = f"{r['steps']:>18.2f} {r['steps_share']:>6.3f} {r['steps_calls']:>5}"
        print(f"{name:7} {r['path']:>6} | {old_logps} | {steps} | {r['processed']:>10} {total:>15.2f}")
    for name, r in results.items():
        gap = max(abs(a - b) for a, b in zip(r["losses"], padded["losses"], strict=True))
        losses = ", ".join(f"{loss:.6g}" for loss in r["losses"])
        print(f"{name} loss per optimizer step: {losses} (largest gap to padded {gap:.2g})")
    padded_total = padded["old_logps"] + padded["steps"]
    for name in ("trim", "packed"):  # packed last
        ratio = (results[name]["old_logps"] + results[name]["steps"]) / padded_total
        print(f"{name}/padded training-side time: {ratio:.2f}")


if __name__ == "__main__":
    main()
