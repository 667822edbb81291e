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
backward, optimizer), in wall-clock and in this process's CPU seconds. Prints a table (per path and phase:
both times, real-token share, model calls, tokens run), the loss of each optimizer step per path, the
wall-clock ratios, then ``trim/padded training-side time: X.XX`` and, last,
``packed/padded training-side time: X.XX``. Those two ratios are of CPU seconds: with one torch thread they
equal wall-clock time on a quiet machine, and on a shared one they do not move with the other jobs' load
(the wall-clock ratios do).

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

    def _add(self, key: str, start: tuple[float, float]) -> None:
        self.wall[key] += time.perf_counter() - start[0]
        self.cpu[key] += time.process_time() - start[1]

    def token_logps_and_entropies(self, *args, **kwargs):
        start = time.perf_counter(), time.process_time()
        out = super().token_logps_and_entropies(*args, **kwargs)
        if not kwargs.get("compute_entropy"):  # the old-log-prob pass (the loss forward computes entropies)
            self._add("old_logps", start)
        return out

    def score_round(self, inputs):
        start = time.perf_counter(), time.process_time()
        output = super().score_round(inputs)
        self._add("generate_and_score", start)
        self.old_logps_stats = dict(self.padding_free.stats)  # the counts of the old-log-prob pass
        self.round = (output["completion_ids"].clone(), output["prompt_ids"].clone())
        return output

    def training_step(self, model, inputs, num_items_in_batch=None):
        # TRL generates (and runs the old-log-prob pass) inside the first training_step of a round.
        start = time.perf_counter(), time.process_time()
        loss = super().training_step(model, inputs, num_items_in_batch)
        self._add("training_step", start)
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
    trainer.wall = {"old_logps": 0.0, "generate_and_score": 0.0, "training_step": 0.0}
    trainer.cpu = dict(trainer.wall)
    trainer.train()
    # The optimizer steps: training_step less the generation and scoring (old-log-prob pass included) that
    # TRL runs inside a round's first training_step.
    times = {
        clock: {"old_logps": t["old_logps"], "steps": t["training_step"] - t["generate_and_score"]}
        for clock, t in (("wall", trainer.wall), ("cpu", trainer.cpu))
    }
    stats, old = trainer.padding_free.stats, trainer.old_logps_stats
    steps = {key: stats[key] - old[key] for key in stats}  # the 4 optimizer steps' forward calls
    completion_ids, prompt_ids = trainer.round
    return {
        "path": trainer.padding_free.mode,  # packed falls back to trim (and logs why) where it cannot serve
        "times": times,
        "stats": {"old_logps": old, "steps": steps},
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
        f"{'':7} {'path':>6}  {'phase':<16} {'wall s':>7} {'cpu s':>7} {'real-token share':>16} {'calls':>5} "
        f"{'tokens run':>10}"
    )
    for name, r in results.items():
        for phase, label in (
            ("old_logps", "old log-probs"),
            ("steps", "optimizer steps"),
            (None, "training side"),
        ):
            wall, cpu = (_seconds(r, clock, phase) for clock in ("wall", "cpu"))
            count = _stats(r, phase)
            print(
                f"{name:7} {r['path']:>6}  {label:<16} {wall:>7.2f} {cpu:>7.2f} "
                f"{count['real'] / count['processed']:>16.3f} {count['calls']:>5} {count['processed']:>10}"
            )
    for name, r in results.items():
        gap = max(abs(a - b) for a, b in zip(r["losses"], padded["losses"], strict=True))
        losses = ", ".join(f"{loss:.6g}" for loss in r["losses"])
        print(f"{name} loss per optimizer step: {losses} (largest gap to padded {gap:.2g})")
    ratios = {
        clock: {name: _seconds(results[name], clock) / _seconds(padded, clock) for name in ("trim", "packed")}
        for clock in ("wall", "cpu")
    }
    print(
        f"wall-clock training-side time (moves with the machine's load): "
        f"trim/padded {ratios['wall']['trim']:.2f}, packed/padded {ratios['wall']['packed']:.2f}"
    )
    for name in ("trim", "packed"):  # packed last
        print(f"{name}/padded training-side time: {ratios['cpu'][name]:.2f}")


def _seconds(result: dict, clock: str, phase: str | None = None) -> float:
    """A run's seconds on ``clock`` (wall, cpu) in ``phase`` (old_logps, steps; None: both)."""
    times = result["times"][clock]
    return times[phase] if phase else times["old_logps"] + times["steps"]


def _stats(result: dict, phase: str | None = None) -> dict:
    """A run's real and processed tokens and calls in ``phase`` (old_logps, steps; None: both)."""
    stats = result["stats"]
    if phase:
        return stats[phase]
    return {key: stats["old_logps"][key] + stats["steps"][key] for key in stats["steps"]}


if __name__ == "__main__":
    main()
