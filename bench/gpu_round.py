"""The training side of one GRPO round at the paper's shapes, with TRL's padding and trimmed (issue 20).

Per process, as in recipes/qwen2.5-math-1.5b/prompt_aug.yaml: 128 rows (16 micro-batches of 8, 4 per
optimizer step, so the old-log-prob pass runs), prompts of 100-300 tokens (at most 1,024), completions up
to 3,072 with a long-tailed mix (one row in 16 at the cap, mean about a quarter of it), dapo's loss,
AdamW, bf16 autocast over float32 weights, gradient checkpointing, SDPA attention. The model has
Qwen2.5-Math-1.5B's architecture (hidden 1536, 28 layers, 12 heads, 2 KV heads, intermediate 8960,
vocabulary 151,936, tied embeddings) with random weights built from that config: no download.

Padded is what TRL 1.16 runs: the shuffled round cut into micro-batches of 8, every one (and every chunk
of the old-log-prob pass) at the round's longest prompt plus longest completion. Trimmed is
``trim_padding``: `prompt_aug.padding`'s regrouping within each optimizer step and chunked, trimmed
forward passes, the same code the trainer runs. Both start from the same weights and train on the same
round; the losses of each optimizer step are printed side by side.

Needs torch and transformers only (not TRL, datasets or math-verify). Prints the time of each phase
(old log-probs, forward + backward, optimizer) and the peak GPU memory for both.

    python bench/gpu_round.py                # one GPU (about 3 minutes on an H100)
    python bench/gpu_round.py --tiny         # a tiny model and round, on CPU (seconds)
"""

from __future__ import annotations

import argparse
import copy
import sys
import time
from pathlib import Path

sys.path.insert(
    0, str(Path(__file__).resolve().parents[1])
)  # this checkout's prompt_aug, not an installed one

import torch
from transformers import Qwen2Config, Qwen2ForCausalLM

from prompt_aug.padding import chunked_forward, long_tailed_lengths, optimizer_step_segments, regroup

PAPER = {
    "model": {"hidden_size": 1536, "num_hidden_layers": 28, "num_attention_heads": 12,
              "num_key_value_heads": 2, "intermediate_size": 8960, "vocab_size": 151936},
    "rows": 128, "micro_batch": 8, "accumulation": 4, "prompt": (100, 300), "cap": 3072,
}  # fmt: skip
TINY = {
    "model": {"hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
              "intermediate_size": 128, "vocab_size": 1000},
    "rows": 32, "micro_batch": 4, "accumulation": 2, "prompt": (8, 24), "cap": 64,
}  # fmt: skip
CHUNK_OVERHEAD_TOKENS = 128  # as PromptAugGRPOTrainer.chunk_overhead_tokens


def build_round(shape: dict, seed: int, device: torch.device) -> dict:
    """One process's round as TRL lays it out: left-padded prompts, right-padded completions, advantages."""
    generator = torch.Generator().manual_seed(seed)
    rows, cap, vocab = shape["rows"], shape["cap"], shape["model"]["vocab_size"]
    low, high = shape["prompt"]
    prompt_lengths = torch.randint(low, high + 1, (rows,), generator=generator)
    completion_lengths = torch.tensor(long_tailed_lengths(rows, cap, generator))
    width_p, width_c = int(prompt_lengths.max()), int(completion_lengths.max())
    positions_p, positions_c = torch.arange(width_p), torch.arange(width_c)
    prompt_mask = (positions_p[None] >= width_p - prompt_lengths[:, None]).long()
    completion_mask = (positions_c[None] < completion_lengths[:, None]).long()
    batch = {
        "prompt_ids": torch.randint(10, vocab, (rows, width_p), generator=generator) * prompt_mask,
        "prompt_mask": prompt_mask,
        "completion_ids": torch.randint(10, vocab, (rows, width_c), generator=generator) * completion_mask,
        "completion_mask": completion_mask,
        "advantages": torch.randn(rows, generator=generator),
    }
    batch["num_items_in_batch"] = completion_mask.sum().float()
    return {k: v.to(device) for k, v in batch.items()}


def token_logps(model, ids: torch.Tensor, mask: torch.Tensor, keep: int) -> torch.Tensor:
    """Log-probs of the last ``keep`` tokens (0 where masked), the LM head run only on real tokens in tiles
    under checkpointing, as TRL's fused head does, so the (tokens, vocabulary) logits are never all held."""
    hidden = model.model(input_ids=ids, attention_mask=mask).last_hidden_state[:, -keep - 1 : -1]
    labels, valid = ids[:, -keep:], mask[:, -keep:].bool()
    weight = model.get_output_embeddings().weight
    states, targets = hidden[valid], labels[valid]

    def tile(h: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
        logits = (h @ weight.T).float()
        return logits.gather(-1, t[:, None]).squeeze(-1) - logits.logsumexp(-1)

    pieces = [
        torch.utils.checkpoint.checkpoint(
            tile, states[i : i + 1024], targets[i : i + 1024], use_reentrant=False
        )
        for i in range(0, states.size(0), 1024)
    ]
    out = hidden.new_zeros(valid.shape, dtype=torch.float32)
    out[valid] = torch.cat(pieces) if pieces else out[valid]
    return out


def forward(model, batch: dict, trimmed: bool, max_rows: int) -> torch.Tensor:
    """Per-token log-probs of ``batch``'s completions: one call per ``max_rows`` rows at full width
    (padded), or `chunked_forward`'s trimmed chunks of rows of similar length."""
    ids = torch.cat([batch["prompt_ids"], batch["completion_ids"]], dim=1)
    mask = torch.cat([batch["prompt_mask"], batch["completion_mask"]], dim=1)
    keep = batch["completion_ids"].size(1)
    if trimmed:
        (logps,) = chunked_forward(
            lambda i, m, k: (token_logps(model, i, m, k),), ids, mask, keep, max_rows * ids.size(1),
            CHUNK_OVERHEAD_TOKENS,
        )  # fmt: skip
        return logps
    return torch.cat([token_logps(model, ids[s : s + max_rows], mask[s : s + max_rows], keep)
                      for s in range(0, ids.size(0), max_rows)])  # fmt: skip


def dapo_loss(logps: torch.Tensor, batch: dict, normalizer: torch.Tensor) -> torch.Tensor:
    """TRL's dapo loss of a micro-batch (epsilon 0.2 / 0.28): clipped ratio x advantage over its tokens."""
    ratio = torch.exp(logps - batch["old_per_token_logps"])
    advantages = batch["advantages"][:, None]
    per_token = -torch.min(ratio * advantages, ratio.clamp(0.8, 1.28) * advantages)
    return (per_token * batch["completion_mask"]).sum() / normalizer


def train_round(model, round_: dict, shape: dict, trimmed: bool, device: torch.device) -> dict:
    """The old-log-prob pass and the round's optimizer steps; returns timings, peak memory and losses."""
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    autocast = torch.autocast(device.type, dtype=torch.bfloat16, enabled=device.type == "cuda")
    micro, accumulation, rows = shape["micro_batch"], shape["accumulation"], shape["rows"]
    steps_per_generation = rows // micro
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-6)
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats()
    times = {"old log-probs": 0.0, "forward + backward": 0.0, "optimizer": 0.0}
    sync()
    start = time.perf_counter()
    model.eval()
    with torch.no_grad(), autocast:
        round_ = {**round_, "old_per_token_logps": forward(model, round_, trimmed, micro)}
    sync()
    times["old log-probs"] = time.perf_counter() - start
    # TRL shuffles the round and cuts it into micro-batches; trimmed regroups them within each step.
    order = torch.randperm(rows, generator=torch.Generator().manual_seed(1)).to(device)
    shuffled = {k: v[order] if v.ndim else v for k, v in round_.items()}
    batches = [{k: v[i * micro : (i + 1) * micro] if v.ndim else v for k, v in shuffled.items()}
               for i in range(steps_per_generation)]  # fmt: skip
    if trimmed:
        batches = regroup(batches, optimizer_step_segments(0, steps_per_generation, 1, accumulation))
    normalizer = round_["num_items_in_batch"] * accumulation / steps_per_generation
    model.train()
    losses = []
    for step in range(steps_per_generation // accumulation):
        total = 0.0
        sync()
        start = time.perf_counter()
        for batch in batches[step * accumulation : (step + 1) * accumulation]:
            with autocast:
                loss = dapo_loss(forward(model, batch, trimmed, micro), batch, normalizer)
            loss.backward()
            total += loss.item()
        sync()
        times["forward + backward"] += time.perf_counter() - start
        start = time.perf_counter()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        sync()
        times["optimizer"] += time.perf_counter() - start
        losses.append(total)
    peak = torch.cuda.max_memory_allocated() / 2**30 if device.type == "cuda" else float("nan")
    real = int(round_["prompt_mask"].sum() + round_["completion_mask"].sum())
    return {"times": times, "peak_gib": peak, "losses": losses, "real": real}


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tiny", action="store_true", help="a tiny model and round, on CPU")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    shape = TINY if args.tiny else PAPER
    device = torch.device("cuda" if torch.cuda.is_available() and not args.tiny else "cpu")
    config = Qwen2Config(
        **shape["model"], max_position_embeddings=4096 + 1024, rope_theta=10000.0, tie_word_embeddings=True,
        attn_implementation="sdpa",
    )  # fmt: skip
    torch.manual_seed(args.seed)
    with torch.device(device):
        model = Qwen2ForCausalLM(config)
    if device.type == "cuda":
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    start_weights = copy.deepcopy({k: v.detach().cpu() for k, v in model.state_dict().items()})
    round_ = build_round(shape, args.seed, device)
    results = {}
    for name, trimmed in (("padded", False), ("trimmed", True)):
        model.load_state_dict(start_weights)
        results[name] = train_round(model, round_, shape, trimmed, device)
    name = torch.cuda.get_device_name() if device.type == "cuda" else "CPU"
    params = sum(p.numel() for p in model.parameters())
    lengths = round_["completion_mask"].sum(1).float()
    print(f"device: {name}; model: {params / 1e6:,.1f} M parameters; round: {shape['rows']} rows, prompts "
          f"{shape['prompt'][0]}-{shape['prompt'][1]}, completions mean {lengths.mean():.0f} "
          f"of cap {shape['cap']} "
          f"({int((lengths == shape['cap']).sum())} at the cap); torch {torch.__version__}")  # fmt: skip
    phases = list(results["padded"]["times"])
    print(f"{'':8} " + " ".join(f"{p + ' s':>20}" for p in phases) + f" {'total s':>9} {'peak GiB':>9}")
    for name, r in results.items():
        cells = " ".join(f"{r['times'][p]:>20.2f}" for p in phases)
        print(f"{name:8} {cells} {sum(r['times'].values()):>9.2f} {r['peak_gib']:>9.1f}")
    for name in results:
        print(f"{name} loss per optimizer step: " + ", ".join(f"{x:.6f}" for x in results[name]["losses"]))
    ratio = sum(results["trimmed"]["times"].values()) / sum(results["padded"]["times"].values())
    print(f"trimmed/padded training-side time: {ratio:.2f}")
    return results


if __name__ == "__main__":
    main()
