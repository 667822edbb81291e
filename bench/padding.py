"""The training side of one GRPO round on CPU, on each path of ``trim_padding``: off, trim and packed.

One round of the paper recipe's structure (per process: 8 rows per micro-batch, 4 micro-batches per
optimizer step, 16 per round, so the old-log-prob pass runs) on a random Qwen2 model of a few M parameters
built in code, or on a saved model (``--model``). Prompts are the augmented prompts of the synthetic
dataset, rendered as in training; completions are random tokens whose lengths follow a long-tailed mix like
the paper's: one row in 16 reaches the cap, the rest are drawn from an exponential, for a mean of about a
quarter of the cap. The generation itself is replaced by that draw (it is not what is timed); everything
after it is `PromptAugGRPOTrainer`.

Paths (``trim_padding``): ``off`` (TRL's padded calls), ``trim`` (one trimmed call per TRL call) and
``packed`` (each TRL call's real tokens in one row; what the default, ``auto``, picks on CUDA and CPU,
with SDPA run on each sequence on CPU); ``--paths`` may add ``packed-shared`` (``packing_share_prompts``: a
call runs each shared prompt once; its "tokens run" count such a prompt once). All runs start from the same
weights and train on the same round (checked). Timed: the old-log-prob pass and the forward and backward
passes of the optimizer steps (TRL's ``training_step``; the gradient clipping and ``optimizer.step`` that
transformers' Trainer runs after it are not timed), in wall-clock and in this process's CPU seconds; the
"training side" is the two together. Prints a table (per path and phase: both times, real-token share,
model calls, tokens run), the loss of each optimizer step per path, the
wall-clock ratios, then ``trim/padded training-side time: X.XX`` and, last,
``packed/padded training-side time: X.XX``. Those two ratios are of CPU seconds: with one torch thread they
equal wall-clock time on a quiet machine, and on a shared one they do not move with the other jobs' load
(the wall-clock ratios do). Each path prints its seconds a round as it ends (``<path> done (...)``, with
the path the trainer took, the attention that ran and whether prompts were shared), so that a time limit
that stops the bench leaves them; a path other than padded that fails (out of memory, a kernel error) is
reported, and the others run. The trainer's own log lines (which path, which attention, and any fallback)
go to stderr.

``--device cuda`` runs the same trainer on a GPU in bf16 with gradient checkpointing, the way a GPU recipe
trains; there the ratios are of wall-clock seconds (synchronised), and ``--shape paper`` gives the model
Qwen2.5-Math-1.5B's architecture (random weights; the tiny tokenizer, with the model's 151,936-entry
vocabulary so that the fused head costs what it does in the paper run), the paper's completion cap (3,072)
and two rounds, the first of which warms up. Prompts are the synthetic dataset's, shorter than MATH's. On a
GPU, a packed path that did not run the varlen kernel alone (or, for ``packed-shared``, did not share
prompts) gets a line of its own starting with ``!!!``: its times are a fallback's.

    OMP_NUM_THREADS=1 python bench/padding.py            # about 3 minutes on one quiet core
    python bench/padding.py --device cuda --shape paper  # one GPU: 3 paths x 2 rounds of 128 rows
    python bench/padding.py --model DIR --micro_batch 2 --cap 128   # a saved model (e.g. SmolLM2-135M)
"""

from __future__ import annotations

import argparse
import logging
import sys
import tempfile
import time
import traceback
from pathlib import Path

sys.path.insert(
    0, str(Path(__file__).resolve().parents[1])
)  # this checkout's prompt_aug, not an installed one

import torch
from datasets import Dataset
from transformers import (
    AutoConfig,
    AutoModelForCausalLM,
    GenerationConfig,
    PrinterCallback,
    Qwen2Config,
    Qwen2ForCausalLM,
)

from prompt_aug.config import PromptAugGRPOConfig
from prompt_aug.demo.smoke import build_tiny_tokenizer, synthetic_problems
from prompt_aug.padding import long_tailed_lengths
from prompt_aug.trainer import PromptAugGRPOTrainer
from prompt_aug.trl_seam import Generation
from prompt_aug.varlen import attention_of


class _AttentionLines(logging.Handler):
    """The packed attention's log lines (`prompt_aug.varlen`'s, one per model set up: the kernel ran, or
    which fallback and why), kept until cleared: what a packed path really ran."""

    def __init__(self) -> None:
        super().__init__(logging.INFO)
        self.lines: set[str] = set()

    def emit(self, record: logging.LogRecord) -> None:
        message = record.getMessage()
        if message.startswith("packed attention:"):
            self.lines.add(message)


ATTENTION_LINES = _AttentionLines()
KERNEL_LINE = "packed attention: varlen"  # the one line of a packed path that ran the varlen kernel


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
        if self.args.use_cpu is False and torch.cuda.is_available():
            torch.cuda.synchronize()  # the GPU's work, not its launch
        for clock, now in (("wall", time.perf_counter()), ("cpu", time.process_time())):
            self.per_round[-1][clock][key] += now - start[0 if clock == "wall" else 1]

    def token_logps_and_entropies(self, *args, **kwargs):
        start = time.perf_counter(), time.process_time()
        out = super().token_logps_and_entropies(*args, **kwargs)
        if not kwargs.get("compute_entropy"):  # the old-log-prob pass (the loss forward computes entropies)
            self._add("old_logps", start)
        return out

    def score_round(self, inputs):
        # A new round: its first training_step (which called this) is timed into it.
        self.per_round.append({clock: dict.fromkeys(PHASES, 0.0) for clock in ("wall", "cpu")})
        self.round_start_stats = dict(self.padding_free.stats)
        start = time.perf_counter(), time.process_time()
        output = super().score_round(inputs)
        self._add("generate_and_score", start)
        self.old_logps_stats = dict(self.padding_free.stats)  # the counts of the old-log-prob pass
        self.round = (output["completion_ids"].clone(), output["prompt_ids"].clone())
        self.round_lengths = (output["completion_mask"].sum(1).float(), output["prompt_mask"].sum(1).float())
        return output

    def training_step(self, model, inputs, num_items_in_batch=None):
        # TRL generates (and runs the old-log-prob pass) inside the first training_step of a round.
        if self.args.use_cpu is False and torch.cuda.is_available():
            torch.cuda.synchronize()
        start = time.perf_counter(), time.process_time()
        loss = super().training_step(model, inputs, num_items_in_batch)
        self._add("training_step", start)
        return loss


def _reward(completions, **kwargs):
    return [float(len(c) % 3) for c in completions]


PAPER_MODEL = {  # Qwen2.5-Math-1.5B's architecture
    "hidden_size": 1536, "num_hidden_layers": 28, "num_attention_heads": 12, "num_key_value_heads": 2,
    "intermediate_size": 8960, "vocab_size": 151936,
}  # fmt: skip


def build_model(
    path: Path, hidden: int, layers: int, seed: int, paper: bool = False, device: str = "cpu"
) -> Path:
    """A random Qwen2 model of ``layers`` layers at width ``hidden`` (or, with ``paper``, Qwen2.5-Math-1.5B's
    architecture), with the tiny ChatML tokenizer."""
    tokenizer = build_tiny_tokenizer()
    shape = PAPER_MODEL if paper else {
        "hidden_size": hidden, "num_hidden_layers": layers, "num_attention_heads": hidden // 64,
        "num_key_value_heads": max(1, hidden // 256), "intermediate_size": 3 * hidden,
        "vocab_size": len(tokenizer),
    }  # fmt: skip
    config = Qwen2Config(
        **shape, max_position_embeddings=4096 + 1024, tie_word_embeddings=True, bos_token_id=None,
        eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id,
    )  # fmt: skip
    torch.manual_seed(seed)
    with torch.device(device):  # on a GPU, a 1.5B model initialises in a second
        model = Qwen2ForCausalLM(config)
    model.generation_config = GenerationConfig(
        eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id
    )
    model.save_pretrained(path)
    tokenizer.save_pretrained(path)
    return path


def run(
    model_path: Path, out: Path, trim_padding: str, attention: str, share: bool, args: argparse.Namespace
) -> dict:
    gpu = args.device == "cuda"
    config = PromptAugGRPOConfig(
        output_dir=str(out), per_device_train_batch_size=args.micro_batch, gradient_accumulation_steps=4,
        steps_per_generation=16, num_generations=8, max_completion_length=args.cap, max_steps=4 * args.rounds,
        learning_rate=1e-5, report_to="none", save_strategy="no", logging_steps=1, use_cpu=not gpu, bf16=gpu,
        loss_type="dapo", beta=0.0, seed=0, gradient_checkpointing=gpu, disable_tqdm=True,
        trim_padding=trim_padding, model_init_kwargs={"attn_implementation": attention},
        packing_share_prompts=share,
        save_on_preemption=False,  # a step limit's SIGTERM ends the bench, with no checkpoint of GBs to save
    )  # fmt: skip
    questions = synthetic_problems(64, seed=0)
    ATTENTION_LINES.lines.clear()
    trainer = _BenchTrainer(
        model=str(model_path),
        reward_funcs=_reward,
        args=config,
        train_dataset=Dataset.from_list(questions),
    )
    trainer.remove_callback(PrinterCallback)  # the table below, not every step's log
    trainer.per_round = []
    if gpu:
        torch.cuda.reset_peak_memory_stats()
    trainer.train()
    # Per round, the optimizer steps' forward and backward passes are training_step less the generation and
    # scoring (old-log-prob pass included) that TRL runs inside a round's first training_step; the clipping
    # and optimizer.step that the Trainer runs after training_step are outside it.
    rounds = [
        {clock: {"old_logps": t[clock]["old_logps"],
                 "steps": t[clock]["training_step"] - t[clock]["generate_and_score"]}
         for clock in ("wall", "cpu")}
        for t in trainer.per_round
    ]  # fmt: skip
    times = rounds[-1]  # the phase table is the last round's
    stats, start, old = trainer.padding_free.stats, trainer.round_start_stats, trainer.old_logps_stats
    old = {key: old[key] - start[key] for key in stats}  # the last round's old-log-prob pass
    steps = {key: stats[key] - trainer.old_logps_stats[key] for key in stats}  # its 4 optimizer steps
    completion_ids, prompt_ids = trainer.round
    padding_free = trainer.padding_free
    return {
        "path": padding_free.mode,  # packed falls back to trim (and logs why) where it cannot serve
        # The attention the packed path set (None off it: the model's own), and what its packed calls ran.
        "attention": padding_free.attention or attention_of(trainer.model),
        "ran": sorted(ATTENTION_LINES.lines),
        "shared": padding_free.share_prompts,  # False once a check stopped sharing
        "times": times,
        "rounds": rounds,
        "peak_gib": torch.cuda.max_memory_allocated() / 2**30 if gpu else float("nan"),
        "stats": {"old_logps": old, "steps": steps},
        "losses": [log["loss"] for log in trainer.state.log_history if "loss" in log],
        "round": completion_ids,
        "prompts": prompt_ids,
        "lengths": trainer.round_lengths,  # (completion, prompt) tokens per row
        "rows": completion_ids.size(0),
    }


PHASES = ("old_logps", "generate_and_score", "training_step")  # timed per round
MODES = {  # name: (trim_padding, attention implementation, packing_share_prompts)
    "padded": ("off", "sdpa", False),
    "trim": ("trim", "sdpa", False),
    "packed": ("packed", "sdpa", False),
    "packed-shared": ("packed", "sdpa", True),  # each call runs a shared prompt once
    "packed-flex": ("packed", "flex_attention", False),  # a GPU's: flex_attention has no backward on CPU
}


def how_it_ran(name: str, r: dict, gpu: bool) -> tuple[str, str | None]:
    """What a path ran, for its "done" line (the trainer's path, the attention and what its packed calls
    ran, whether prompts were shared), and on a GPU, for a packed path that timed a fallback instead of the
    varlen kernel (or of shared prompts), why, for a line of its own; else None."""
    trim_padding, _, share = MODES[name]
    ran = "; ".join(line.removeprefix("packed attention: ") for line in r["ran"])
    attention = r["attention"] + (f" ({ran})" if ran else "")
    prompts = "per row" if not share else "shared" if r["shared"] else "not shared"
    how = f"{r['path']} path; attention {attention}; prompts {prompts}"
    if not gpu or trim_padding != "packed":
        return how, None
    fallbacks = []
    if r["path"] != "packed":
        fallbacks.append(f"the {r['path']} path, not packed")
    if r["ran"] != [KERNEL_LINE]:
        fallbacks.append(f"attention {attention}, not the varlen kernel alone")
    if share and not r["shared"]:
        fallbacks.append("prompts not shared")
    return how, "; ".join(fallbacks) or None


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--cap", type=int, default=512, help="max_completion_length (default 512)")
    parser.add_argument("--micro_batch", type=int, default=8, help="per_device_train_batch_size (default 8)")
    parser.add_argument(
        "--model", type=Path, default=None,
        help="a pretrained model's folder instead of the random Qwen2 (e.g. the one `python -m "
        "prompt_aug.models fetch smollm2-135m-instruct` prints); --hidden and --layers do not apply, and "
        "--shape paper sets only the cap and the rounds",
    )  # fmt: skip
    parser.add_argument("--hidden", type=int, default=256)
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--device", choices=("cpu", "cuda"), default="cpu", help="cuda: bf16, checkpointing")
    parser.add_argument("--shape", choices=("small", "paper"), default="small", help="paper: see above")
    parser.add_argument("--rounds", type=int, default=None, help="rounds per path (1; paper shape: 2)")
    parser.add_argument(
        "--paths", default="padded,trim,packed", help=f"comma-separated, of {', '.join(MODES)}"
    )
    args = parser.parse_args()
    args.paths = [name.strip() for name in args.paths.split(",") if name.strip()]
    if unknown := sorted(set(args.paths) - set(MODES)):
        parser.error(f"--paths: unknown {unknown}; choose among {', '.join(MODES)}")
    if "padded" not in args.paths:
        parser.error("--paths: include padded, the path the others are compared with")
    paper = args.shape == "paper"
    if paper and args.cap == parser.get_default("cap"):
        args.cap = 3072
    args.rounds = args.rounds or (2 if paper else 1)
    if args.device == "cuda" and not torch.cuda.is_available():
        parser.error("--device cuda: torch sees no GPU here")
    if args.model is not None and not (args.model / "config.json").is_file():
        parser.error(f"--model {args.model}: no config.json there; give a saved transformers model's folder")
    # The trainer's lines (its path, the packed attention, any fallback) go to the log, as in a training run.
    logging.basicConfig(level=logging.WARNING, format="%(message)s")
    logging.getLogger("prompt_aug").setLevel(logging.INFO)
    logging.getLogger("prompt_aug").addHandler(ATTENTION_LINES)
    results = {}
    start = time.perf_counter()
    with tempfile.TemporaryDirectory() as tmp:
        model_path = args.model or build_model(
            Path(tmp) / "model", args.hidden, args.layers, seed=0, paper=paper, device=args.device
        )
        with torch.device("meta"):
            model = AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(model_path))
        params = sum(p.numel() for p in model.parameters())
        shape = f"{model.config.hidden_size} wide, {model.config.num_hidden_layers} layers"
        if args.model is not None:
            shape = f"{args.model.name}, {shape}"
        for name in args.paths:
            try:
                r = results[name] = run(model_path, Path(tmp) / name, *MODES[name], args)
            except (RuntimeError, AssertionError, ValueError) as error:  # out of memory, a kernel error
                if name == "padded":  # the others are compared with it
                    raise
                traceback.print_exc()
                print(f"{name}: failed ({type(error).__name__}: {_first_line(error)}); the other paths run")
                continue
            # Each path's rounds as it ends: a step limit that stops the bench leaves them in the log.
            rounds = ", ".join(f"{sum(t['wall'].values()):.2f}" for t in r["rounds"])
            peak = f"; peak {r['peak_gib']:.1f} GiB" if args.device == "cuda" else ""
            how, fallback = how_it_ran(name, r, args.device == "cuda")
            print(f"{name} done ({how}): {rounds} s a round, wall-clock{peak}", flush=True)
            if fallback:  # on a GPU: these times are not the packed path's with the varlen kernel
                print(f"!!! {name} timed a fallback: {fallback}", flush=True)
    padded = results["padded"]
    for name, r in results.items():
        if not torch.equal(padded["round"], r["round"]) or not torch.equal(padded["prompts"], r["prompts"]):
            raise SystemExit(f"bench/padding.py: the {name} and padded runs trained on different rounds")
    lengths, prompts = padded["lengths"]
    print(
        f"device: {device_name(args.device)}; torch {torch.__version__}; model: {params / 1e6:.1f} M "
        f"parameters ({shape}); round: "
        f"{padded['rows']} rows, prompts {prompts.min():.0f}-{prompts.max():.0f} tokens, "
        f"completions mean {lengths.mean():.0f} of cap {args.cap} "
        f"({int((lengths == args.cap).sum())} at the cap); torch threads {torch.get_num_threads()}; "
        f"{time.perf_counter() - start:.0f} s in all"
    )
    if args.rounds > 1:
        print(f"the last of {args.rounds} rounds:")
    print(
        f"{'':13} {'path':>6}  {'phase':<16} {'wall s':>7} {'cpu s':>7} {'real-token share':>16} "
        f"{'calls':>5} {'tokens run':>10}"
    )
    for name, r in results.items():
        for phase, label in (
            ("old_logps", "old log-probs"),
            ("steps", "forward+backward"),  # of the optimizer steps, not their optimizer.step
            (None, "training side"),
        ):
            wall, cpu = (_seconds(r, clock, phase) for clock in ("wall", "cpu"))
            count = _stats(r, phase)
            print(
                f"{name:13} {r['path']:>6}  {label:<16} {wall:>7.2f} {cpu:>7.2f} "
                f"{count['real'] / count['processed']:>16.3f} {count['calls']:>5} {count['processed']:>10}"
            )
    for name, r in results.items():
        gap = max(abs(a - b) for a, b in zip(r["losses"], padded["losses"], strict=True))
        losses = ", ".join(f"{loss:.6g}" for loss in r["losses"])
        print(f"{name} loss per optimizer step: {losses} (largest gap to padded {gap:.2g})")
    ratios = {
        clock: {name: _seconds(r, clock) / _seconds(padded, clock) for name, r in results.items()}
        for clock in ("wall", "cpu")
    }
    print(
        "wall-clock training-side time (moves with the machine's load): "
        + ", ".join(
            f"{name}/padded {ratio:.2f}" for name, ratio in ratios["wall"].items() if name != "padded"
        )
    )
    if args.device == "cuda":  # wall-clock seconds, synchronised; the first round warms each path up
        print(f"{'':13} " + " ".join(f"{f'round {i + 1} s':>10}" for i in range(args.rounds)) + "   peak GiB")
        for name, r in results.items():
            cells = " ".join(f"{sum(t['wall'].values()):>10.2f}" for t in r["rounds"])
            print(f"{name:13} {cells} {r['peak_gib']:>10.1f}")
        steady = slice(1, None) if args.rounds > 1 else slice(None)
        base = sum(sum(t["wall"].values()) for t in padded["rounds"][steady])
        for name in [n for n in results if n != "padded"]:
            ratio = sum(sum(t["wall"].values()) for t in results[name]["rounds"][steady]) / base
            print(f"{name}/padded training-side time: {ratio:.2f} (wall-clock, rounds after the first)")
        return
    for name in [n for n in results if n != "padded"]:  # in --paths order: packed last by default
        print(f"{name}/padded training-side time: {ratios['cpu'][name]:.2f}")


def _first_line(error: BaseException) -> str:
    return (str(error).strip().splitlines() or [""])[0]


def device_name(device: str) -> str:
    """The GPU's name, or the CPU's threads."""
    if device == "cuda":
        return torch.cuda.get_device_name()
    return f"CPU, {torch.get_num_threads()} torch threads"


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
