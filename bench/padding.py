"""The training side of one GRPO round on CPU, with TRL's padding and with ``trim_padding``.

One round of the paper recipe's structure (per process: 8 rows per micro-batch, 4 micro-batches per
optimizer step, 16 per round, so the old-log-prob pass runs) on a random Qwen2 model of a few M parameters
built in code. Prompts are the augmented prompts of the synthetic dataset, rendered as in training;
completions are random tokens whose lengths follow a long-tailed mix like the paper's: one row in 16 reaches
the cap, the rest are drawn from an exponential, for a mean of about a quarter of the cap. The generation
itself is replaced by that draw (it is not what is timed); everything after it is `PromptAugGRPOTrainer`.

Both runs start from the same weights and train on the same round (checked). Timed: the old-log-prob pass
and the optimizer steps (forward, backward, optimizer). Prints a table and, last,
``trimmed/padded training-side time: X.XX``.

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
from transformers import GenerationConfig, Qwen2Config, Qwen2ForCausalLM

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


def run(model_path: Path, out: Path, trim_padding: bool, args: argparse.Namespace) -> dict:
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
    trainer.timings = {"old_logps": 0.0, "generate_and_score": 0.0, "training_step": 0.0}
    trainer.train()
    timings = trainer.timings
    steps = timings["training_step"] - timings["generate_and_score"]  # the 4 optimizer steps
    completion_ids, prompt_ids = trainer.round
    stats = trainer.padding_stats
    return {
        "old_logps": timings["old_logps"],
        "steps": steps,
        "share": stats["real"] / stats["processed"],
        "processed": stats["processed"],
        "round": completion_ids,
        "prompts": prompt_ids,
        "rows": completion_ids.size(0),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--cap", type=int, default=512, help="max_completion_length (default 512)")
    parser.add_argument("--micro_batch", type=int, default=8, help="per_device_train_batch_size (default 8)")
    parser.add_argument("--hidden", type=int, default=256)
    parser.add_argument("--layers", type=int, default=4)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        model_path = build_model(Path(tmp) / "model", args.hidden, args.layers, seed=0)
        params = sum(p.numel() for p in Qwen2ForCausalLM.from_pretrained(model_path).parameters())
        padded = run(model_path, Path(tmp) / "padded", False, args)
        trimmed = run(model_path, Path(tmp) / "trimmed", True, args)
    if not torch.equal(padded["round"], trimmed["round"]) or not torch.equal(
        padded["prompts"], trimmed["prompts"]
    ):
        raise SystemExit("bench/padding.py: the two runs trained on different rounds")
    lengths = (padded["round"] != 0).sum(1).float()
    prompts = (padded["prompts"] != 0).sum(1).float()
    print(
        f"model: {params / 1e6:.1f} M parameters (hidden {args.hidden}, {args.layers} layers); round: "
        f"{padded['rows']} rows, prompts {prompts.min():.0f}-{prompts.max():.0f} tokens, "
        f"completions mean {lengths.mean():.0f} of cap {args.cap} "
        f"({int((lengths == args.cap).sum())} at the cap); torch threads {torch.get_num_threads()}"
    )
    print(f"{'':10} {'real-token share':>17} {'tokens run':>11} {'old log-probs s':>16} "
          f"{'optimizer steps s':>18} {'training side s':>16}")  # fmt: skip
    for name, r in (("padded", padded), ("trimmed", trimmed)):
        total = r["old_logps"] + r["steps"]
        print(f"{name:10} {r['share']:>17.3f} {r['processed']:>11} {r['old_logps']:>16.2f} "
              f"{r['steps']:>18.2f} {total:>16.2f}")  # fmt: skip
    ratio = (trimmed["old_logps"] + trimmed["steps"]) / (padded["old_logps"] + padded["steps"])
    print(f"trimmed/padded training-side time: {ratio:.2f}")


if __name__ == "__main__":
    main()
