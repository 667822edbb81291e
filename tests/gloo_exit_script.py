"""Run by tests/test_gloo_exit.py under ``torch.distributed.run`` (2 processes, gloo): the end of a DDP run,
with rank 1's gloo worker still holding a tensor that Python has let go of, as at the end of training
(the collapse guard's last broadcast comes a few milliseconds before the ranks leave).

Rank 1 leaves at once; rank 0 joins the broadcast a second later (as when it writes the final model), so the
worker releases the tensor while rank 1 is already on its way out. Rank 1's last exit handler holds the GIL
for ``GLOO_EXIT_HOLD_S`` seconds right before Python finalizes, which makes the release land in that window
every time instead of once in many runs. Each rank prints the threads it has left after
`prompt_aug.train.close_process_group`.
"""

from __future__ import annotations

import atexit
import ctypes
import os
import time

if os.environ.get("RANK") == "1":  # registered first, so it runs last, just before Python finalizes
    atexit.register(ctypes.PyDLL(None).sleep, int(os.environ.get("GLOO_EXIT_HOLD_S", "4")))  # keeps the GIL

import torch
import torch.distributed as dist
from native_threads import thread_names  # this script's folder, tests/, is on sys.path

from prompt_aug.train import close_process_group


def main() -> None:
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    model = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(2, 2))
    trainer = {"model": model}
    trainer["self"] = trainer  # a reference cycle holds the DDP wrapper, as our trainer does
    del model, trainer
    if rank == 0:
        time.sleep(1)
        dist.broadcast(torch.zeros(8), src=0)
    else:
        tensor = torch.zeros(8)
        dist.broadcast(tensor, src=0, async_op=True)  # gloo's worker finishes it once rank 0 joins
        del tensor  # from here the worker holds the last reference; dropping it will take the GIL
    close_process_group()
    print(f"rank {rank} threads after close: {thread_names()}", flush=True)


if __name__ == "__main__":
    main()
