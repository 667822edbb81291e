"""The grading pool's server and workers die with the process that owns the pool, however it dies.

Each test runs a small "trainer" script in a subprocess: it starts a `GraderPool`, grades through it, and
then starts children of its own that live on, as a trainer's DataLoader workers, vLLM engine or helper
tools do: a ``multiprocessing`` fork child, a plain ``os.fork`` child, a child forked by C code (libc's
``fork`` through ctypes, so that no Python at-fork hook runs in it) and a ``subprocess.Popen`` sleeper.
The forked ones inherit the trainer's file descriptors. The trainer is then killed (SIGTERM, SIGKILL) or
dies of an uncaught exception, and the pool's processes, identified by pid and start time, must be gone
within 5 s. The lingering children are not the pool's; each test kills them when it ends.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import pytest

from rewards.grading import pool as grader_pool

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc (Linux)")

EXIT_WITHIN_S = 5.0  # the pool's processes must be gone this long after the trainer died
STARTUP_CEILING_S = 120.0  # a loaded 2-core machine imports SymPy slowly; this only bounds a hang

TRAINER = textwrap.dedent(
    r"""
    import ctypes, json, multiprocessing, os, subprocess, sys, time

    from rewards import grade
    from rewards.grading.pool import GraderPool, PoolConfig, get_pool

    how, out = sys.argv[1], sys.argv[2]
    # The process's own pool (what the rewards use; shut down at exit) and one made directly.
    assert grade("so it is \\boxed{\\sqrt{4}}", "2").correct
    assert get_pool().map("math:factorial", [3]) == [("ok", 6)]
    pool = GraderPool(PoolConfig(workers=2, time_limit_s=10.0, preload="math", initializer=""))
    assert pool.map("math:factorial", [3, 4, 5]) == [("ok", 6), ("ok", 24), ("ok", 120)]
    pools = [[p._process.pid, *p.worker_pids()] for p in (get_pool(), pool)]

    def sleep_forever():
        time.sleep(3600)
        os._exit(0)

    others = {}
    mp_child = multiprocessing.get_context("fork").Process(target=time.sleep, args=(3600,), daemon=True)
    mp_child.start()
    others["multiprocessing_fork"] = mp_child.pid
    pid = os.fork()
    if pid == 0:
        sleep_forever()
    others["os_fork"] = pid
    pid = ctypes.CDLL(None, use_errno=True).fork()  # as C code forks: Python's at-fork hooks do not run
    if pid == 0:
        sleep_forever()
    others["c_fork"] = pid
    others["popen"] = subprocess.Popen(
        [sys.executable, "-c", "import time; time.sleep(3600)"], stdin=subprocess.DEVNULL
    ).pid
    with open(out + ".tmp", "w") as f:
        json.dump({"pools": pools, "others": others}, f)
    os.rename(out + ".tmp", out)
    if how == "exception":
        while not os.path.exists(out + ".go"):  # the test reads the pids first
            time.sleep(0.01)
        raise RuntimeError("the trainer crashed")
    time.sleep(3600)
    """
)


def _start_time(pid: int) -> int | None:
    """The process's start time (clock ticks since boot), or None if it is gone or a zombie."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except (FileNotFoundError, ProcessLookupError):
        return None
    fields = stat[stat.rindex(")") + 2 :].split()  # after "pid (comm) "
    if fields[0] in ("Z", "X"):
        return None
    return int(fields[19])


def _children(pid: int) -> list[int]:
    try:
        text = Path(f"/proc/{pid}/task/{pid}/children").read_text()
    except (FileNotFoundError, ProcessLookupError):
        return []
    return [int(p) for p in text.split()]


def _alive(procs: dict[int, int]) -> list[int]:
    """Those of ``{pid: start_time}`` that still run (a reused pid has another start time)."""
    return [pid for pid, start in procs.items() if _start_time(pid) == start]


def _pipes(pid: int) -> set[str]:
    try:
        fds = os.listdir(f"/proc/{pid}/fd")
    except (FileNotFoundError, PermissionError):
        return set()
    links = set()
    for fd in fds:
        try:
            link = os.readlink(f"/proc/{pid}/fd/{fd}")
        except OSError:
            continue
        if link.startswith("pipe:"):
            links.add(link)
    return links


def _kill(procs: dict[int, int]) -> None:
    for pid in _alive(procs):
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


@pytest.mark.parametrize("how", ["SIGTERM", "SIGKILL", "exception"])
def test_pool_dies_with_its_trainer_while_forked_children_live_on(how, tmp_path):
    out = tmp_path / "pids.json"
    log = tmp_path / "trainer.log"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path), "OMP_NUM_THREADS": "1"}
    pool: dict[int, int] = {}
    others: dict[int, int] = {}
    with open(log, "wb") as log_file:
        trainer = subprocess.Popen(
            [sys.executable, "-c", TRAINER, "exception" if how == "exception" else "sleep", str(out)],
            stdin=subprocess.DEVNULL,
            stdout=log_file,
            stderr=subprocess.STDOUT,
            env=env,
        )
    try:
        deadline = time.monotonic() + STARTUP_CEILING_S
        while not out.exists():
            assert trainer.poll() is None or out.exists(), log.read_text()[-3000:]
            assert time.monotonic() < deadline, "the trainer script did not start"
            time.sleep(0.05)
        pids = json.loads(out.read_text())
        others = {pid: _start_time(pid) for pid in pids["others"].values()}
        servers = [server for server, *_ in pids["pools"]]
        members = {
            pid for server, *workers in pids["pools"] for pid in [server, *workers, *_children(server)]
        }
        pool = {pid: _start_time(pid) for pid in members}
        assert len(pool) == 6 and None not in pool.values(), (pids, pool)
        assert None not in others.values(), pids
        server_pipes = set().union(*map(_pipes, servers))

        if how == "exception":
            Path(f"{out}.go").touch()
        else:
            trainer.send_signal(getattr(signal, how))
        trainer.wait(timeout=30)  # an uncaught exception exits after atexit's shutdown of the pool
        died = time.monotonic()
        while _alive(pool) and time.monotonic() < died + EXIT_WITHIN_S:
            time.sleep(0.02)
        took = time.monotonic() - died
        left = _alive(pool)
        holders = {name: pid for name, pid in pids["others"].items() if _pipes(pid) & server_pipes}
        assert not left, (
            f"{len(left)} of the pool's processes outlived the trainer by {EXIT_WITHIN_S:.0f} s: {left}; "
            f"children of the trainer holding the server's pipes: {holders}"
        )
        print(f"{how}: the pool's {len(pool)} processes were gone {took:.2f} s after the trainer died")
        # The trainer's other children are not the pool's (multiprocessing's atexit ends its daemon child).
        lasting = {pid for name, pid in pids["others"].items() if name != "multiprocessing_fork"}
        assert lasting <= set(_alive(others)), "the trainer's other children are not the pool's"
    finally:
        if trainer.poll() is None:
            trainer.kill()
            trainer.wait()
        _kill(others)
        _kill(pool)


def test_the_server_outlives_the_thread_that_started_it():
    # The parent-death signal fires when the *thread* that forked the server exits; the server must
    # tell that apart from the trainer's death and keep serving.
    pool = grader_pool.GraderPool(
        grader_pool.PoolConfig(workers=1, time_limit_s=10.0, preload="math", initializer="")
    )
    try:
        first: list = []
        starter = threading.Thread(target=lambda: first.append(pool.map("math:factorial", [5])))
        starter.start()
        starter.join(timeout=STARTUP_CEILING_S)
        assert first == [[("ok", 120)]]
        server = pool._process.pid
        time.sleep(1.5)  # past the server's polling interval too
        assert pool._process.poll() is None
        assert pool.map("math:factorial", [6]) == [("ok", 720)]
        assert pool._process.pid == server
    finally:
        pool.close()


def test_a_forked_child_closes_its_copy_of_the_pools_pipes():
    pool = grader_pool.GraderPool(
        grader_pool.PoolConfig(workers=1, time_limit_s=10.0, preload="math", initializer="")
    )
    try:
        assert pool.map("math:factorial", [4]) == [("ok", 24)]
        parent_fds = {pool._requests.fileno(), pool._replies.fileno()}
        read, write = os.pipe()
        pid = os.fork()
        if pid == 0:  # pragma: no cover - runs in the child
            still_open = [fd for fd in parent_fds if _fd_open(fd)]
            os.write(write, json.dumps(still_open).encode())
            os._exit(0)
        os.close(write)
        try:
            still_open = json.loads(os.read(read, 4096))
        finally:
            os.close(read)
            os.waitpid(pid, 0)
        assert still_open == []
        assert pool.map("math:factorial", [5]) == [("ok", 120)]  # the parent's pool is untouched
    finally:
        pool.close()


def _fd_open(fd: int) -> bool:
    try:
        os.fstat(fd)
    except OSError:
        return False
    return True
