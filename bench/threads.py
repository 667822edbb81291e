"""Torch threads on a small CPU box: generation and a training pass, with the other core idle or busy.

On 2 cores, a second busy process (another test, a grading worker, a parallel job) makes torch's 2-thread
kernels wait on each other: each parallel region runs at the pace of the thread that shares its core. This
bench times, for 1 and 2 torch threads, with the other core idle and with one busy-looping process beside it:

* ``generate``: HF ``generate`` of a batch of completions (sampled, fixed length);
* ``fwd+bwd``: one forward and backward pass over the same batch.

Each is timed after an untimed one of its own (a short generation; a forward and backward pass of the same
batch), so that neither includes the interpreter's first-call costs.

    python bench/threads.py                       # the learning demo's model (built in code)
    python bench/threads.py --model DIR           # any local model folder, e.g. the fetched SmolLM2

Each cell runs in a fresh interpreter with ``OMP_NUM_THREADS`` set, so nothing leaks between settings.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]

_CELL = r"""
import json, sys, time, torch
from transformers import AutoModelForCausalLM, AutoTokenizer
path, batch, new, prompt_len = sys.argv[1], *map(int, sys.argv[2:5])
tok = AutoTokenizer.from_pretrained(path)
model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
ids = torch.randint(10, min(len(tok), 1000), (batch, prompt_len))
model.generation_config.eos_token_id = None  # fixed length: every row generates `new` tokens
kw = dict(max_new_tokens=new, min_new_tokens=new, do_sample=True, pad_token_id=tok.pad_token_id or 0)
model.generate(ids[:2, :8], **{**kw, "max_new_tokens": 4, "min_new_tokens": 4})  # warm-up
t = time.perf_counter(); out = model.generate(ids, **kw); gen = time.perf_counter() - t
model(out, labels=out).loss.backward(); model.zero_grad(set_to_none=True)  # warm-up: the first backward
t = time.perf_counter(); model(out, labels=out).loss.backward(); fb = time.perf_counter() - t
print(json.dumps({"threads": torch.get_num_threads(), "tokens_per_s": batch * new / gen, "fwd_bwd_s": fb}))
"""


def cell(model: str, threads: int, busy: bool, batch: int, new: int, prompt_len: int) -> dict:
    env = {**os.environ, "OMP_NUM_THREADS": str(threads), "MKL_NUM_THREADS": str(threads)}
    neighbour = subprocess.Popen([sys.executable, "-c", "while True: pass"]) if busy else None
    try:
        done = subprocess.run(
            [sys.executable, "-c", _CELL, model, str(batch), str(new), str(prompt_len)],
            check=False, env=env, capture_output=True, text=True, timeout=1800,
        )  # fmt: skip
    finally:
        if neighbour is not None:
            neighbour.kill()
            neighbour.wait()
    if done.returncode != 0:
        raise SystemExit(f"bench/threads.py: the cell failed:\n{done.stderr[-2000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--model", help="a local model folder (default: the learning demo's model, built here)"
    )
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--new_tokens", type=int, default=48)
    parser.add_argument("--prompt_len", type=int, default=64)
    args = parser.parse_args()
    model = args.model
    if model is None:
        sys.path.insert(0, str(REPO))
        from prompt_aug.demo.smoke import build_tiny_model

        model = str(
            build_tiny_model(Path(tempfile.mkdtemp()) / "small-random-qwen2", name="small-random-qwen2")
        )
    print(f"model {model}, batch {args.batch}, {args.new_tokens} new tokens, prompt {args.prompt_len} tokens")
    print("| torch threads | other core | generate (tokens/s) | fwd+bwd (s) |\n|---|---|---|---|")
    for busy in (False, True):
        for threads in (1, 2):
            r = cell(model, threads, busy, args.batch, args.new_tokens, args.prompt_len)
            where = "busy (1 spinning process)" if busy else "idle"
            print(f"| {threads} | {where} | {r['tokens_per_s']:.1f} | {r['fwd_bwd_s']:.2f} |", flush=True)


if __name__ == "__main__":
    main()
