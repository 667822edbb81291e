"""A rank leaves a 2-process gloo run cleanly although gloo still holds a tensor that Python has dropped.

The hazard: a gloo worker thread releases the last reference to a collective's tensor while Python is
finalizing; taking the GIL then ends the thread with ``pthread_exit`` inside a ``noexcept`` destructor
(``~AsyncWork`` → ``TensorImpl::decref_pyobject`` → ``gil_scoped_acquire`` → ``take_gil`` →
``PyThread_exit_thread`` → ``std::terminate``), and the rank aborts at exit with "terminate called without an
active exception" after training and saving. tests/gloo_exit_script.py makes that timing happen on every
run: `close_process_group` must join gloo's workers before Python finalizes, so the run exits 0 with no
abort and no gloo thread left; `destroy_process_group` alone does not. Nor may the exit hang, as it does
where the DDP wrapper is collected without handles kept on the group, or gloo's workers are joined with
the GIL held.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
SCRIPT = REPO / "tests" / "gloo_exit_script.py"


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads thread names from /proc")
def test_rank_exits_cleanly_when_gloo_releases_a_tensor_during_shutdown():
    cmd = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        "--nproc_per_node",
        "2",
        str(SCRIPT),
    ]
    env = {"OMP_NUM_THREADS": "1", "PYTHONPATH": str(REPO), "GLOO_EXIT_HOLD_S": "4"}
    try:
        proc = subprocess.run(
            cmd, check=False, cwd=REPO, env={**os.environ, **env}, capture_output=True, text=True, timeout=900
        )
    except subprocess.TimeoutExpired as err:  # the hang a GIL-holding join of gloo's workers would cause
        pytest.fail(f"the 2-process gloo run did not end in {err.timeout:.0f} s (a rank hung at exit)")
    out = proc.stdout + proc.stderr
    assert "terminate called" not in out, out[-3000:]
    assert proc.returncode == 0, out[-3000:]
    for rank in (0, 1):
        line = next(
            (ln for ln in out.splitlines() if ln.startswith(f"rank {rank} threads after close:")), None
        )
        assert line is not None, out[-3000:]
        assert "gloo" not in line, line  # pt_gloo_runloop and gloo_tcp_loop were joined before Python exits
