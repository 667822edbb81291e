"""The training side of GRPO rounds at the paper's shapes: TRL's padded layout, trimmed, and packed.

Per process, as in recipes/qwen2.5-math-1.5b/prompt_aug.yaml: 128 rows (16 groups of 8 completions sharing
a prompt; 16 micro-batches of 8, 4 per optimizer step, so the old-log-prob pass runs), prompts of 100-300
tokens, completions up to 3,072 with a long-tailed mix (one row in 16 at the cap, mean about a quarter of
it), dapo's loss, AdamW, bf16 autocast over float32 weights, gradient checkpointing. The model has
Qwen2.5-Math-1.5B's architecture (hidden 1536, 28 layers, 12 heads, 2 KV heads, intermediate 8960,
vocabulary 151,936, tied embeddings) with random weights built from that config: no download.

Modes (each from the same weights, on the same rounds):

* ``padded``: what TRL 1.16 runs: the shuffled round cut into micro-batches of 8, every call (and every
  chunk of 8 rows of the old-log-prob pass) at the round's longest prompt plus longest completion; SDPA.
* ``trim``: `prompt_aug.padding`: rows sorted by length within each optimizer step (`regroup`), each
  micro-batch trimmed to its own widths, one call per micro-batch (`chunked_forward` with
  ``rows_per_chunk``); SDPA.
* ``packed-sdpa`` / ``packed-varlen`` / ``packed-flex`` / ``packed-flash``: `prompt_aug.packing`, the
  trainer's code: each micro-batch's real tokens in one row, position ids restarting per sequence, no
  attention mask (`packed_forward`), TRL's micro-batches, with SDPA (a dense block-diagonal mask),
  torch's ``varlen_attn`` through `prompt_aug.varlen` (on CPU: SDPA on each sequence),
  ``flex_attention`` (skipped on CPU, which has no flex backward; compiles for minutes, so not in the
  default run) or ``flash_attention_2`` (only where ``flash_attn`` imports). Packed lengths are rounded up
  to a multiple of ``--pad-to-multiple-of`` (64) to bound the number of shapes.
* ``packed-balanced``: what the trainer's default runs: packed, with the attention
  `prompt_aug.varlen.packed_attention` picks (varlen on CUDA where torch has it and on CPU), and each
  optimizer step's rows dealt into token-balanced micro-batches of TRL's row count (`regroup(balance=True)`,
  `prompt_aug.balance`). One difference: packed lengths here are rounded up as for every packed mode, where
  the trainer's ``packing_pad_to_multiple_of`` is unset by default (``--pad-to-multiple-of 0`` runs its
  shapes; the rounding adds under 64 tokens a call).
* ``packed-shared``: ``packed-balanced`` with ``packing_share_prompts``: the rows of a call that share a
  prompt run it once (all of a group in the old-log-prob pass, whose calls follow TRL's group order; in the
  training micro-batches, the rows of a group that one optimizer step holds, which the balancer deals
  together where they fit), through `prompt_aug.varlen` (the kernel with gathered keys on CUDA, SDPA on each
  sequence with the same keys on CPU).
  Its "real share" is the rows' tokens over the tokens run, above 1 where prompts are shared.

Every mode of the table is listed in the output: run, or skipped with the reason (not asked for, not
possible on this device, or past ``--budget_s``; a mode or round the budget skips also gets a line starting
with ``!!!``, as the run then lacks it). A mode that fails (out of memory, a kernel error) prints its
traceback and ends there; the other modes run, and the summary compares what ran.

The log-probs are TRL's fused head's: the LM head runs in tiles under checkpointing, on the labelled
positions only (`head_logps`), in every mode. Each mode trains ``--rounds`` rounds of new lengths (seeds
``seed``, ``seed + 1``, ...) and then the last round once more (the same shapes again, so that warm-up
and new-shape costs show against it). Printed per mode and round: the time of each phase (old log-probs,
forward + backward, optimizer), peak GPU memory, real tokens over the tokens run, and model calls; then
each mode's loss per optimizer step, side by side, and how far each mode is from ``padded`` (losses, and
the first round's old log-probs), and a table of each mode's seconds and ratios to ``padded`` on rounds of
new lengths (after the first; a mode stopped after its first round, which warms up, has none) and on the
repeated round. With ``--profile DIR``, two more rounds follow each mode's timed ones under
``torch.profiler``: lengths the mode has not seen, then the same round again, one profile per phase; the top
CUDA kernels and CPU ops of each go to one file, ``DIR/profile.txt``, and the top few are printed side by
side, to find what a new shape costs. Tolerance: float32 on CPU agrees within 1e-4 relative (the tiny run:
about 1e-7); bf16 on a GPU differs by rounding only (0.0025 of the losses' mean size on one H100 for
packed-sdpa); a gap of the losses' own size means a layout is wrong.

Needs torch, transformers and accelerate (which transformers' Trainer needs too; `prompt_aug.padding`
imports it), not TRL, datasets or math-verify.

    python bench/gpu_round.py                # one GPU: 2 rounds + 1 repeat a mode; no round begun after 240 s
                                             # (counted from the end of the imports)
    python bench/gpu_round.py --tiny         # a tiny model and round, on CPU (seconds): 4 rounds + 1 repeat
    python bench/gpu_round.py --modes padded,packed-sdpa --rounds 4 --budget_s 0   # 0: no budget
    python bench/gpu_round.py --modes padded,packed-balanced --profile /tmp/profile
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.util
import logging
import signal
import sys
import threading
import time
import traceback
from collections.abc import Iterator
from pathlib import Path

sys.path.insert(
    0, str(Path(__file__).resolve().parents[1])
)  # this checkout's prompt_aug, not an installed one

import torch
from transformers import Qwen2Config, Qwen2ForCausalLM

from prompt_aug.packing import IGNORE_INDEX, host_rows, packed_forward
from prompt_aug.padding import chunked_forward, long_tailed_lengths, optimizer_step_segments, regroup
from prompt_aug.varlen import VARLEN_ATTENTION, packed_attention, register, varlen_kernel

PAPER = {
    "model": {"hidden_size": 1536, "num_hidden_layers": 28, "num_attention_heads": 12,
              "num_key_value_heads": 2, "intermediate_size": 8960, "vocab_size": 151936},
    "rows": 128, "group": 8, "micro_batch": 8, "accumulation": 4, "prompt": (100, 300), "cap": 3072,
    "rounds": 2,
}  # fmt: skip
TINY = {
    "model": {"hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
              "intermediate_size": 128, "vocab_size": 1000},
    "rows": 32, "group": 4, "micro_batch": 4, "accumulation": 2, "prompt": (8, 24), "cap": 64, "rounds": 4,
}  # fmt: skip
MODES = {  # mode: attention implementation ("default": what `packed_attention` picks on the device)
    "padded": "sdpa",
    "packed-balanced": "default",
    "packed-shared": VARLEN_ATTENTION,
    "packed-varlen": VARLEN_ATTENTION,
    "packed-sdpa": "sdpa",
    "trim": "sdpa",
    "packed-flex": "flex_attention",
    "packed-flash": "flash_attention_2",
}
DEFAULT_MODES = ("padded", "packed-balanced", "packed-shared", "packed-varlen", "packed-sdpa", "trim")
HEAD_TILE = 1024  # tokens per LM-head tile


def build_round(shape: dict, seed: int, device: torch.device) -> dict:
    """One process's round as TRL lays it out: groups of ``shape["group"]`` rows sharing a prompt, one after
    the other, left-padded prompts, right-padded completions, advantages."""
    generator = torch.Generator().manual_seed(seed)
    rows, cap, vocab, group = shape["rows"], shape["cap"], shape["model"]["vocab_size"], shape["group"]
    low, high = shape["prompt"]
    prompt_lengths = torch.randint(low, high + 1, (rows // group,), generator=generator)
    prompt_lengths = prompt_lengths.repeat_interleave(group)
    completion_lengths = torch.tensor(long_tailed_lengths(rows, cap, generator))
    width_p, width_c = int(prompt_lengths.max()), int(completion_lengths.max())
    positions_p, positions_c = torch.arange(width_p), torch.arange(width_c)
    prompt_mask = (positions_p[None] >= width_p - prompt_lengths[:, None]).long()
    completion_mask = (positions_c[None] < completion_lengths[:, None]).long()
    batch = {
        "prompt_ids": torch.randint(
            10, vocab, (rows // group, width_p), generator=generator
        ).repeat_interleave(group, dim=0)
        * prompt_mask,
        "prompt_mask": prompt_mask,
        "completion_ids": torch.randint(10, vocab, (rows, width_c), generator=generator) * completion_mask,
        "completion_mask": completion_mask,
        "advantages": torch.randn(rows, generator=generator),
    }
    batch["num_items_in_batch"] = completion_mask.sum().float()
    return {k: v.to(device) for k, v in batch.items()}


def head_logps(model, states: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """Log-probs of ``targets`` from hidden ``states`` (both over labelled tokens only), the LM head run in
    tiles under checkpointing as TRL's fused head does, so the (tokens, vocabulary) logits are never all
    held."""
    weight = model.get_output_embeddings().weight

    def tile(h: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
        logits = (h @ weight.T).float()
        return logits.gather(-1, t[:, None]).squeeze(-1) - logits.logsumexp(-1)

    pieces = [
        torch.utils.checkpoint.checkpoint(
            tile, states[i : i + HEAD_TILE], targets[i : i + HEAD_TILE], use_reentrant=False
        )
        for i in range(0, states.size(0), HEAD_TILE)
    ]
    return torch.cat(pieces) if pieces else states.new_zeros(0, dtype=torch.float32)


def token_logps(model, ids: torch.Tensor, mask: torch.Tensor, keep: int) -> torch.Tensor:
    """A padded call's log-probs of the last ``keep`` tokens, (rows, keep), 0 where masked."""
    hidden = model.model(input_ids=ids, attention_mask=mask, use_cache=False).last_hidden_state
    hidden = hidden[:, -keep - 1 : -1]
    valid = mask[:, -keep:].bool()
    out = hidden.new_zeros(valid.shape, dtype=torch.float32)
    out[valid] = head_logps(model, hidden[valid], ids[:, -keep:][valid])
    return out


def packed_call(model):
    """`prompt_aug.packing`'s call without TRL: the backbone on a packed row (position ids, no mask, no cache)
    and the tiled head on its labelled positions; entry j of the (1, T - 1) result scores token j + 1, as
    TRL's fused head (the trainer's `fused_head_call`) returns it."""

    def call(inputs: dict) -> tuple[torch.Tensor, None]:
        hidden = model.model(
            input_ids=inputs["input_ids"], position_ids=inputs["position_ids"], use_cache=False
        ).last_hidden_state[:, :-1]
        labels = inputs["labels"][:, 1:]
        valid = labels != IGNORE_INDEX
        out = hidden.new_zeros(valid.shape, dtype=torch.float32)
        out[valid] = head_logps(model, hidden[valid], labels[valid])
        return out, None

    return call


def forward(model, mode: str, batch: dict, rows_per_call: int, counts: dict, pad_multiple: int | None):
    """Per-token log-probs of ``batch``'s completions, (rows, completion width), in ``mode``'s layout: one
    call per ``rows_per_call`` rows (padded, trimmed or packed). Counts calls and tokens in ``counts``."""
    ids = torch.cat([batch["prompt_ids"], batch["completion_ids"]], dim=1)
    mask = torch.cat([batch["prompt_mask"], batch["completion_mask"]], dim=1)
    keep = batch["completion_ids"].size(1)
    counts["real"] += int(mask.sum())
    if mode == "trim":

        def score(i: torch.Tensor, m: torch.Tensor, k: int) -> tuple[torch.Tensor]:
            counts["calls"] += 1
            counts["processed"] += i.numel()
            return (token_logps(model, i, m, k),)

        (logps,) = chunked_forward(score, ids, mask, keep, rows_per_chunk=rows_per_call)
        return logps
    pieces = []
    share = mode == "packed-shared"
    # As the trainer does: the rows' lengths (and prompts) read back once for all of the call's packs.
    on_host = host_rows(ids, mask, keep, share) if mode.startswith("packed") else None
    for s in range(0, ids.size(0), rows_per_call):
        part_ids, part_mask = ids[s : s + rows_per_call], mask[s : s + rows_per_call]
        if mode == "padded":
            counts["calls"] += 1
            counts["processed"] += part_ids.numel()
            pieces.append(token_logps(model, part_ids, part_mask, keep))
        else:  # packed: the padded call's tokens as the budget, so each micro-batch is one call
            out = packed_forward(
                packed_call(model), part_ids, part_mask, keep, max_tokens=part_ids.numel(),
                pad_to_multiple_of=pad_multiple, share_prompts=share,
                rows_on_host=on_host.take(slice(s, s + rows_per_call)),
            )  # fmt: skip
            counts["calls"] += out.calls
            counts["processed"] += out.processed_tokens
            pieces.append(out.log_probs)
    return torch.cat(pieces)


def dapo_loss(logps: torch.Tensor, batch: dict, normalizer: torch.Tensor) -> torch.Tensor:
    """TRL's dapo loss of a micro-batch (epsilon 0.2 / 0.28): clipped ratio x advantage over its tokens."""
    ratio = torch.exp(logps - batch["old_per_token_logps"])
    advantages = batch["advantages"][:, None]
    per_token = -torch.min(ratio * advantages, ratio.clamp(0.8, 1.28) * advantages)
    return (per_token * batch["completion_mask"]).sum() / normalizer


class Profiles:
    """``torch.profiler`` around each phase of the rounds it is switched on for; each phase's table (top CUDA
    kernels and CPU ops by self time) goes to ``directory/profile.txt``, one file for every mode and phase of
    the run, and its top rows are kept for the summary."""

    def __init__(self, directory: Path | None, device: torch.device, rows: int = 25) -> None:
        self.directory, self.device, self.rows = directory, device, rows
        self.on = False
        self.label = ""
        self.written = False  # the file is started afresh by this run's first table
        self.tops: dict[tuple[str, str, str], list[tuple[str, float]]] = {}  # (mode, round, phase) -> top

    @contextlib.contextmanager
    def phase(self, mode: str, phase: str) -> Iterator[None]:
        if not self.on or self.directory is None:
            yield
            return
        from torch.profiler import ProfilerActivity, profile

        cuda = self.device.type == "cuda"
        activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
        with profile(activities=activities) as prof:
            yield
        events = prof.key_averages()
        tables = [("cpu", "self_cpu_time_total")] + ([("cuda", "self_device_time_total")] if cuda else [])
        text = []
        for kind, key in tables:
            total = sum(getattr(e, key, 0.0) for e in events) / 1e3
            text.append(
                f"== {mode}, {self.label}, {phase}: top {kind} by self time ({total:.1f} ms in all)\n"
            )
            text.append(events.table(sort_by=key, row_limit=self.rows))
            top = sorted(events, key=lambda e: -getattr(e, key, 0.0))[:6]
            self.tops[(mode, self.label, f"{phase} ({kind}, {total:.0f} ms in all)")] = [
                (e.key, getattr(e, key, 0.0) / 1e3) for e in top
            ]
        self.directory.mkdir(parents=True, exist_ok=True)
        with open(self.directory / "profile.txt", "a" if self.written else "w") as out:  # one file for all
            out.write("\n".join(text) + "\n")
        self.written = True

    def summary(self) -> list[str]:
        """The top ops of each profiled phase, the round of new lengths then the same round again, in ms."""
        lines = []
        for (mode, label, phase), top in self.tops.items():
            cells = "; ".join(f"{op[:48]} {ms:.1f}" for op, ms in top)
            lines.append(f"profile {mode}, {label}, {phase}, ms: {cells}")
        return lines


def train_round(
    model, optimizer, round_: dict, shape: dict, mode: str, device: torch.device, seed: int,
    pad_multiple: int | None, profiles: Profiles | None = None,
) -> dict:  # fmt: skip
    """The old-log-prob pass and the round's optimizer steps; returns timings, peak memory, token counts,
    losses and the old log-probs."""
    profiles = profiles or Profiles(None, device)
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    autocast = torch.autocast(device.type, dtype=torch.bfloat16, enabled=device.type == "cuda")
    micro, accumulation, rows = shape["micro_batch"], shape["accumulation"], shape["rows"]
    steps_per_generation = rows // micro
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats()
    counts = {"calls": 0, "real": 0, "processed": 0}
    times = {"old log-probs": 0.0, "forward + backward": 0.0, "optimizer": 0.0}
    # TRL computes the old log-probs with the model in training mode, without gradients (Qwen2 has no
    # dropout); staying in one mode also keeps transformers' compiled flex attention from being rebuilt.
    model.train()
    sync()
    start = time.perf_counter()
    with profiles.phase(mode, "old log-probs"), torch.no_grad(), autocast:
        old = forward(model, mode, round_, micro, counts, pad_multiple)
    round_ = {**round_, "old_per_token_logps": old}
    sync()
    times["old log-probs"] = time.perf_counter() - start
    # TRL shuffles the round and cuts it into micro-batches; trim regroups them within each optimizer step.
    order = torch.randperm(rows, generator=torch.Generator().manual_seed(seed + 1)).to(device)
    shuffled = {k: v[order] if v.ndim else v for k, v in round_.items()}
    batches = [{k: v[i * micro : (i + 1) * micro] if v.ndim else v for k, v in shuffled.items()}
               for i in range(steps_per_generation)]  # fmt: skip
    segments = optimizer_step_segments(0, steps_per_generation, 1, accumulation)
    if mode == "trim":
        batches = regroup(batches, segments)
    elif mode in ("packed-balanced", "packed-shared"):
        batches = regroup(batches, segments, balance=True, share_prompts=mode == "packed-shared")
    normalizer = round_["num_items_in_batch"] * accumulation / steps_per_generation
    losses = []
    steps = steps_per_generation // accumulation
    with profiles.phase(mode, "forward + backward"):
        for step in range(steps):
            total = 0.0
            sync()
            start = time.perf_counter()
            for batch in batches[step * accumulation : (step + 1) * accumulation]:
                with autocast:
                    logps = forward(model, mode, batch, micro, counts, pad_multiple)
                    loss = dapo_loss(logps, batch, normalizer)
                loss.backward()
                total += loss.item()
            sync()
            times["forward + backward"] += time.perf_counter() - start
            start = time.perf_counter()
            if step < steps - 1:  # the last step is timed (and profiled) as the optimizer phase below
                optimizer.step()
                optimizer.zero_grad(set_to_none=True)
                sync()
                times["optimizer"] += time.perf_counter() - start
            losses.append(total)
    with profiles.phase(mode, "optimizer"):
        start = time.perf_counter()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        sync()
        times["optimizer"] += time.perf_counter() - start
    peak = torch.cuda.max_memory_allocated() / 2**30 if device.type == "cuda" else float("nan")
    return {"times": times, "peak_gib": peak, "losses": losses, "old": old.float().cpu(), **counts}


def attention_of(mode: str, device: torch.device) -> str:
    """The attention implementation ``mode`` runs with on ``device``."""
    if MODES[mode] == "default":
        return packed_attention(device.type, varlen_kernel() is not None, "sdpa")[0]
    return MODES[mode]


def unavailable(mode: str, device: torch.device) -> str | None:
    """Why ``mode`` cannot run here, or None."""
    if mode == "packed-varlen":
        chosen, why = packed_attention(device.type, varlen_kernel() is not None, "sdpa")
        if chosen != VARLEN_ATTENTION:
            return why
    if mode == "packed-flex":
        if device.type != "cuda":
            return "flex_attention has no backward on CPU"
        if importlib.util.find_spec("torch.nn.attention.flex_attention") is None:
            return "this torch has no flex_attention"
    if mode == "packed-flash":
        if device.type != "cuda":
            return "flash attention needs a GPU"
        if importlib.util.find_spec("flash_attn") is None:
            return "flash_attn is not importable"
    return None


def round_seconds(result: dict) -> float:
    return sum(result["times"].values())


def _attention_lines() -> set[str]:
    """A set that fills with the packed attention's log lines (`prompt_aug.varlen`'s: which path ran, and
    why) until cleared."""
    lines: set[str] = set()

    class Collect(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            message = record.getMessage()
            if message.startswith("packed attention:"):
                lines.add(message)

    logging.getLogger("prompt_aug").addHandler(Collect(logging.INFO))
    return lines


class Stopped(Exception):
    """The bench was told to stop (SIGTERM, as ``timeout`` sends) in the middle of its rounds."""


def _stop(signum: int, frame: object) -> None:
    raise Stopped(signal.Signals(signum).name)


def ratio_table(results: dict[str, list[dict]], labels: list[str]) -> list[str]:
    """Per mode: mean seconds of the rounds of new lengths after the first (the first when the run has only
    one), the repeated round's, peak memory, and their ratios to padded's and to each other. Each round has
    lengths of its own, so ``new/padded`` is over the rounds of new lengths both ran (a mode or padded cut
    short by the budget, a stop or a failure is compared on the rounds it has). A mode that stopped after
    its first round, which warms up, has no time of new lengths: nan, marked."""
    planned = sum(not label.endswith("again") for label in labels)

    def fresh_rounds(rs: list[dict]) -> list[dict]:
        return [r for r, label in zip(rs, labels, strict=False) if not label.endswith("again")]

    def new_rounds(rs: list[dict]) -> list[dict]:
        return fresh_rounds(rs) if planned == 1 else fresh_rounds(rs)[1:]

    def new_ratio(rs: list[dict], base: list[dict]) -> float:
        shared = min(len(new_rounds(rs)), len(new_rounds(base)))
        if not shared:
            return float("nan")
        return mean(new_rounds(rs)[:shared]) / mean(new_rounds(base)[:shared])

    def again(rs: list[dict]) -> dict | None:
        return rs[-1] if len(rs) == len(labels) and labels[-1].endswith("again") else None

    def mean(rs: list[dict]) -> float:
        return sum(round_seconds(r) for r in rs) / len(rs) if rs else float("nan")

    base = results.get("padded")
    base_again = round_seconds(again(base)) if base and again(base) else float("nan")
    head = (
        f"{'mode':>16} {'new s':>8} {'again s':>8} {'new/padded':>11} {'again/padded':>13} {'new/again':>10}"
    )
    lines = [f"{head} {'peak GiB':>9}"]
    for mode, rs in results.items():
        fresh, repeat = mean(new_rounds(rs)), again(rs)
        repeat_s = round_seconds(repeat) if repeat else float("nan")
        peak = max(r["peak_gib"] for r in rs)
        to_padded = new_ratio(rs, base) if base else float("nan")
        cells = f"{to_padded:>11.2f} {repeat_s / base_again:>13.2f} {fresh / repeat_s:>10.2f}"
        warm_up_only = planned > 1 and len(fresh_rounds(rs)) == 1
        note = "  (warm-up round only)" if warm_up_only else ""
        lines.append(f"{mode:>16} {fresh:>8.2f} {repeat_s:>8.2f} {cells} {peak:>9.1f}{note}")
    return lines


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tiny", action="store_true", help="a tiny model and round, on CPU")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--modes", default=None,
        help=f"comma-separated, of {', '.join(MODES)} (default: {','.join(DEFAULT_MODES)}; --tiny: all)",
    )  # fmt: skip
    parser.add_argument("--rounds", type=int, default=None, help="rounds of new lengths (then one repeat)")
    parser.add_argument("--pad-to-multiple-of", type=int, default=64, help="packed lengths; 0 for none")
    parser.add_argument(
        "--budget_s", type=float, default=240.0,
        help="start no mode or round that would end past this many seconds, counted from the end of the "
        "imports (estimated from the rounds run so far); what is skipped is printed. 0: no budget",
    )  # fmt: skip
    parser.add_argument(
        "--profile", type=Path, default=None, metavar="DIR",
        help="after each mode's timed rounds, two more under the profiler, not timed: new lengths (seed: "
        "the last round's + 1), then that round again; each phase's tables go to DIR/profile.txt",
    )  # fmt: skip
    parser.add_argument(
        "--profile_modes", default=None,
        help="comma-separated: the modes --profile profiles (default: every mode run)",
    )  # fmt: skip
    args = parser.parse_args(argv)
    profile_modes = None
    if args.profile_modes is not None:
        profile_modes = [m.strip() for m in args.profile_modes.split(",") if m.strip()]
        if bad := [m for m in profile_modes if m not in MODES]:
            parser.error(f"--profile_modes: unknown {', '.join(bad)}; choose among {', '.join(MODES)}")
        if args.profile is None:
            parser.error("--profile_modes: names the modes --profile profiles, and --profile is not given; "
                         "add --profile DIR")  # fmt: skip
    began = time.perf_counter()
    # The packed attention's one line per model (varlen kernel or SDPA fallback) goes to the log.
    logging.basicConfig(level=logging.WARNING, format="%(message)s")
    logging.getLogger("prompt_aug").setLevel(logging.INFO)
    chosen = args.modes or ",".join(MODES if args.tiny else DEFAULT_MODES)
    modes = [m.strip() for m in chosen.split(",") if m.strip()]
    if unknown := [m for m in modes if m not in MODES]:
        parser.error(f"unknown modes {unknown}; choose among {', '.join(MODES)}")
    shape = TINY if args.tiny else PAPER
    rounds = args.rounds or shape["rounds"]
    pad_multiple = args.pad_to_multiple_of or None
    if not args.tiny and not torch.cuda.is_available():  # the paper's 1.5B shapes would grind on the CPU
        parser.error("torch sees no GPU here: the paper's shapes need one; --tiny runs every mode on the CPU")
    device = torch.device("cuda" if not args.tiny else "cpu")
    config = Qwen2Config(
        **shape["model"], max_position_embeddings=4096 + 1024, rope_theta=10000.0, tie_word_embeddings=True,
        attn_implementation="sdpa",
    )  # fmt: skip
    torch.manual_seed(args.seed)
    with torch.device(device):
        model = Qwen2ForCausalLM(config)
    if device.type == "cuda":
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    # A copy on the host (.cpu() alone would alias the weights on CPU, which training then changes).
    start_weights = {k: v.detach().to("cpu", copy=True) for k, v in model.state_dict().items()}
    seeds = [args.seed + r for r in range(rounds)] + [args.seed + rounds - 1]
    labels = [f"seed {s}" for s in seeds[:-1]] + [f"seed {seeds[-1]} again"]
    profiles = Profiles(args.profile, device)

    name = torch.cuda.get_device_name() if device.type == "cuda" else "CPU"
    params = sum(p.numel() for p in model.parameters())
    print(f"device: {name}; model: {params / 1e6:,.1f} M parameters; torch {torch.__version__}; rounds of "
          f"{shape['rows']} rows, prompts {shape['prompt'][0]}-{shape['prompt'][1]}, completions to "
          f"{shape['cap']}; packed lengths to a multiple of {pad_multiple}")  # fmt: skip
    for seed in seeds[:-1]:
        lengths = build_round(shape, seed, torch.device("cpu"))["completion_mask"].sum(1).float()
        print(f"  seed {seed}: completions mean {lengths.mean():.0f}, {int((lengths == shape['cap']).sum())} "
              "at the cap")  # fmt: skip
    for mode in MODES:
        if mode not in modes:
            print(f"{mode}: skipped (not in --modes)")
    phases = ["old log-probs", "forward + backward", "optimizer"]
    header = (f"{'round':>14} " + " ".join(f"{p + ' s':>20}" for p in phases)
              + f" {'total s':>9} {'peak GiB':>9} {'real share':>11} {'calls':>6}")  # fmt: skip
    results: dict[str, list[dict]] = {}
    ran: dict[str, list[str]] = {}  # per mode, the packed attention's lines: which path really ran
    attention_lines = _attention_lines()
    skipped: list[str] = []
    longest = 0.0  # the longest round so far, the estimate for a mode's first round

    def over_budget(estimate: float, what: str, lost: str) -> bool:
        """Whether a round estimated at ``estimate`` s would end past --budget_s; if so, says ``what`` is
        skipped and why, then, in a line starting with !!!, that the run lacks ``lost`` (also listed last)."""
        spent = time.perf_counter() - began
        if args.budget_s <= 0 or spent + estimate <= args.budget_s:
            return False
        print(f"{what} skipped (--budget_s {args.budget_s:g}: {spent:.0f} s spent, a round estimated at "
              f"{estimate:.1f} s)")  # fmt: skip
        print(f"!!! {lost} not run: past --budget_s, so this run lacks it")
        skipped.append(lost)
        return True

    # A step limit (timeout sends SIGTERM) ends the rounds, not the bench: what ran is still summarised.
    main_thread = threading.current_thread() is threading.main_thread()  # where signals can be handled
    previous = signal.signal(signal.SIGTERM, _stop) if main_thread else None
    try:
        for mode in modes:
            if reason := unavailable(mode, device):
                print(f"{mode}: skipped ({reason})")
                continue
            if over_budget(longest, f"{mode}:", f"{mode}: every round"):
                continue
            attention = attention_of(mode, device)
            try:
                model.set_attn_implementation(register() if attention == VARLEN_ATTENTION else attention)
            except (ImportError, ValueError) as error:
                print(f"{mode}: skipped (attention {attention!r}: {str(error).splitlines()[0]})")
                continue
            results[mode], optimizer = [], None
            attention_lines.clear()
            try:
                model.load_state_dict(start_weights)
                model.zero_grad(set_to_none=True)  # a mode that failed mid-step may have left gradients
                optimizer = torch.optim.AdamW(model.parameters(), lr=1e-6)
                print(f"\n{mode} (attention {attention})\n{header}")
                for index, (seed, label) in enumerate(zip(seeds, labels, strict=True)):
                    estimate = round_seconds(results[mode][-1]) if results[mode] else longest
                    if over_budget(estimate, f"{label:>14}", f"{mode}: {', '.join(labels[index:])}"):
                        break
                    round_ = build_round(shape, seed, device)
                    r = train_round(
                        model, optimizer, round_, shape, mode, device, seed, pad_multiple, profiles
                    )
                    results[mode].append(r)
                    longest = max(longest, round_seconds(r))
                    cells = " ".join(f"{r['times'][p]:>20.2f}" for p in phases)
                    print(f"{label:>14} {cells} {round_seconds(r):>9.2f} {r['peak_gib']:>9.1f} "
                          f"{r['real'] / r['processed']:>11.3f} {r['calls']:>6}", flush=True)  # fmt: skip
                profiled = profile_modes is None or mode in profile_modes
                if args.profile is not None and profiled and len(results[mode]) == len(seeds):
                    # Two more rounds, profiled (the profiler's overhead kept out of the timed rounds above):
                    # lengths no round of the mode has seen, then the same round again.
                    fresh = seeds[-1] + 1
                    for label in (f"seed {fresh} profiled", f"seed {fresh} profiled again"):
                        profiled_estimate = 4 * round_seconds(results[mode][-1])  # the profiler: 2-3x
                        if over_budget(profiled_estimate, f"{label:>24}", f"{mode}: {label}"):
                            break
                        profiles.on, profiles.label = True, label
                        round_ = build_round(shape, fresh, device)
                        r = train_round(
                            model, optimizer, round_, shape, mode, device, fresh, pad_multiple, profiles
                        )
                        profiles.on = False
                        print(f"{label:>24} {round_seconds(r):>9.2f} s with the profiler on", flush=True)
            except Stopped:
                raise
            except Exception as error:  # noqa: BLE001 (out of memory, a kernel error, a signature: that mode
                # ends, the others run, and the summary has what ran)
                profiles.on = False
                traceback.print_exc()
                message = (str(error).strip().splitlines() or [""])[0]
                print(f"{mode}: failed ({type(error).__name__}: {message}); its rounds before that are kept")
                skipped.append(f"{mode}: the rest, after {type(error).__name__}")
                optimizer = None
            finally:  # a mode that a stop cut short has rounds in the summary: say what it ran too
                ran[mode] = sorted(attention_lines) or ["the model's own attention (no line of prompt_aug's)"]
            if not results[mode]:
                del results[mode]
            del optimizer
            if device.type == "cuda":
                with contextlib.suppress(RuntimeError):  # after a sticky CUDA error: the summary still prints
                    torch.cuda.empty_cache()

    except Stopped as stop:
        print(f"\nstopped by {stop} after {time.perf_counter() - began:.0f} s: the summary of the rounds run")
        skipped.append(f"the rounds after that: stopped by {stop}")
    finally:
        if main_thread:
            signal.signal(signal.SIGTERM, previous)
        profiles.on = False
    results = {mode: rs for mode, rs in results.items() if rs}
    print()
    losses = {mode: [x for r in rs for x in r["losses"]] for mode, rs in results.items()}
    for mode, values in losses.items():
        print(f"{mode} loss per optimizer step: " + ", ".join(f"{x:.6f}" for x in values))
    if "padded" in results:
        mask = build_round(shape, seeds[0], torch.device("cpu"))["completion_mask"].bool()
        for mode in results:
            if mode == "padded":
                continue
            n = min(len(losses[mode]), len(losses["padded"]))
            reference = torch.tensor(losses["padded"][:n])
            scale = reference.abs().mean()
            gap = (torch.tensor(losses[mode][:n]) - reference).abs().max()
            old = (results[mode][0]["old"] - results["padded"][0]["old"])[mask].abs()
            print(f"{mode} vs padded: losses differ by at most {gap:.3g} ({gap / scale:.2g} of their mean "
                  f"size, {n} steps); first round's old log-probs by {old.max():.3g} at most, "
                  f"{old.mean():.3g} on average")  # fmt: skip
        print()
        for line in ratio_table(results, labels):
            print(line)
        # The first round of each mode warms up (kernel selection, compilation); the others are compared.
        steady = slice(1, None) if len(seeds) > 1 else slice(None)
        for mode in results:
            rounds_run = len(results[mode][steady])
            if mode != "padded" and rounds_run and rounds_run == len(results["padded"][steady]):
                base = sum(round_seconds(r) for r in results["padded"][steady])
                ratio = sum(round_seconds(r) for r in results[mode][steady]) / base
                print(f"{mode}/padded training-side time: {ratio:.2f} (rounds after the first)")
    for mode, lines in ran.items():
        # A packed mode on CUDA that should have run the varlen kernel and ran a fallback: its times are not
        # the kernel's (the first H100 call timed the fallback without noticing).
        expected = device.type == "cuda" and attention_of(mode, device) == VARLEN_ATTENTION
        fallback = expected and lines != ["packed attention: varlen"]
        print(f"{'!!! ' if fallback else ''}{mode} ran: {'; '.join(lines)}"
              + (" (not the varlen kernel: its times are a fallback's)" if fallback else ""))  # fmt: skip
    for line in profiles.summary():
        print(line)
    if skipped:
        print("not run (--budget_s, a stop or a failure): " + "; ".join(skipped))
    print(f"bench time: {time.perf_counter() - began:.0f} s")
    return results


if __name__ == "__main__":
    main()
