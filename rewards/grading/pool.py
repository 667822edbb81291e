"""A process pool for grading with hard limits: whatever a task does, `GraderPool.map` returns.

Layout::

    trainer process (any thread)  --pipe-->  server process  --pipes-->  N worker processes

* Each task runs in a worker under a **hard wall-clock limit**: the server kills (SIGKILL) a worker that
  overruns, reaps it, forks a replacement and reports the task as ``TIMEOUT``. Inside the worker a
  **soft CPU-time limit** (half the hard one, ``SIGPROF``) interrupts slow Python code first, so the
  worker survives; the hard kill is for C code that never returns to the interpreter (``10**10**10``).
  A kernel ``RLIMIT_CPU`` backstop and ``PR_SET_PDEATHSIG`` make sure no worker outlives the server.
* Each worker has a **memory cap** (``RLIMIT_AS``); a ``MemoryError`` is reported as ``ERROR`` and
  the worker is replaced. A worker that dies mid-task (segfault, OOM kill, ``kill -9``) is replaced and
  its task retried once, then reported as ``ERROR``.
* Tasks go to workers in small chunks and results stream back one by one, so a batch costs a few
  round trips, not one per task, while the time limit still applies per task.

Why not `multiprocessing.Pool` / `ProcessPoolExecutor`: neither can kill one overrunning task (a
killed worker breaks the whole executor). Why this start method: ``fork`` from the trainer is unsafe
once torch, CUDA or other threads are initialised (a lock held by another thread stays locked in the
child). multiprocessing's ``spawn`` and ``forkserver`` are safe, but re-import the user's ``__main__``
(a training script importing torch) in every worker, and ``forkserver``'s server is a process-wide
singleton. So the server is a fresh interpreter started by ``subprocess`` (fork+exec: nothing of the
trainer is inherited, as with ``spawn``); it imports math-verify once, warms it up, never starts a
thread, and forks workers from itself (as a ``forkserver`` does), so a replacement for a killed worker
is ready in milliseconds with SymPy already imported.

The trainer side holds one pool per process (per rank under torchrun), created lazily by
`get_pool` and reused; callers from several threads take turns. The pool is shut down at interpreter
exit (the server is told to stop, kills and reaps its workers, and exits).

The server and its workers never outlive the trainer process that started them, however it ends
(exception, SIGTERM, SIGKILL), even when it has children of its own:

* A child the trainer forks later (DataLoader workers, a vLLM engine, ``multiprocessing``'s ``fork``)
  inherits the trainer's end of the request pipe, and while any copy of it is open the server would
  never see EOF. An at-fork hook closes those copies in every child forked from Python; ``exec``-ed
  children never get them (``os.pipe`` makes them close-on-exec).
* For children forked by C code, where no hook runs, the server watches its parent besides the pipe:
  ``PR_SET_PDEATHSIG`` (Linux) signals it as soon as its parent dies, and it checks ``os.getppid()``
  at least once a second. The kernel sends that signal when the *thread* that started the server
  exits, which need not be the process's death (a pool started from a short-lived thread), so the
  server exits only once its parent process has changed (it was re-parented).
* Each worker is SIGKILLed by the kernel when the server (single-threaded) dies.
"""

from __future__ import annotations

import atexit
import ctypes
import importlib
import logging
import math
import os
import pickle
import resource
import signal
import subprocess
import sys
import threading
import time
import weakref
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from multiprocessing.connection import Connection, wait
from multiprocessing.reduction import ForkingPickler
from typing import Any

import psutil

logger = logging.getLogger(__name__)

OK, TIMEOUT, ERROR = "ok", "timeout", "error"
Outcome = tuple[str, Any]  # (OK, value) | (TIMEOUT, None) | (ERROR, "ExceptionName")

_ENV_PREFIX = "PROMPT_AUG_GRADER_"
_STARTUP_TIMEOUT_S = 120.0  # importing SymPy on a loaded machine can take a while
_CRASH_RETRIES = 1
_MAX_CHUNK = 16
_PARENT_POLL_S = 1.0  # the server checks this often that its parent still lives (besides the signal)
_PARENT_DEATH_SIGNAL = signal.SIGUSR1  # PR_SET_PDEATHSIG's signal to the server (a handler checks it)


def _default_workers() -> int:
    """Workers per process: the CPUs this process may use, shared between the local ranks, at most 4."""
    try:
        cpus = len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        cpus = os.cpu_count() or 1
    local_ranks = int(os.environ.get("LOCAL_WORLD_SIZE", "1") or 1)
    return max(1, min(4, cpus // max(1, local_ranks)))


@dataclass(frozen=True)
class PoolConfig:
    """Limits of a `GraderPool`.

    Attributes:
        workers: Worker processes.
        time_limit_s: Hard wall-clock limit per task; the soft CPU limit is half of it.
        memory_mb: Address-space cap per worker (``RLIMIT_AS``), in MiB.
        preload: Module imported by the server before forking workers.
        initializer: ``"module:function"`` the server calls once after the import (e.g. a warm-up).
    """

    workers: int = 0  # 0: `_default_workers()`
    time_limit_s: float = 2.0
    memory_mb: int = 2048
    preload: str = "rewards.grading.grade"
    initializer: str = "rewards.grading.grade:worker_init"

    def __post_init__(self) -> None:
        if not self.time_limit_s > 0:  # NaN too: every task would time out
            raise ValueError(
                f"grader time limit must be above 0 s, got {self.time_limit_s} "
                f"({_ENV_PREFIX}TIME_LIMIT_S or time_limit_s)"
            )
        if not self.memory_mb > 0:
            raise ValueError(
                f"grader memory cap must be above 0 MiB, got {self.memory_mb} "
                f"({_ENV_PREFIX}MEMORY_MB or memory_mb)"
            )

    @classmethod
    def from_env(cls, **overrides: Any) -> PoolConfig:
        """Defaults, then ``PROMPT_AUG_GRADER_{WORKERS,TIME_LIMIT_S,MEMORY_MB}``, then ``overrides``."""
        values: dict[str, Any] = {}
        for name, cast in (("workers", int), ("time_limit_s", float), ("memory_mb", int)):
            raw = os.environ.get(_ENV_PREFIX + name.upper())
            if raw:
                try:
                    values[name] = cast(raw)
                except ValueError:
                    kind = "a whole number" if cast is int else "a number"
                    raise ValueError(f"{_ENV_PREFIX}{name.upper()}={raw!r}: give {kind}") from None
        values.update({k: v for k, v in overrides.items() if v is not None})
        config = cls(**values)
        if config.workers <= 0:
            config = cls(**{**values, "workers": _default_workers()})
        return config


class GraderPool:
    """Runs ``fn(task)`` for many tasks in worker processes under hard limits (see the module doc).

    >>> pool = GraderPool(PoolConfig(workers=1, time_limit_s=5, preload="math", initializer=""))
    >>> pool.map("math:factorial", [3, 4, -1])
    [('ok', 6), ('ok', 24), ('error', 'ValueError')]
    >>> pool.close()
    """

    def __init__(self, config: PoolConfig | None = None):
        self.config = config or PoolConfig.from_env()
        self._lock = threading.Lock()
        self._pid = os.getpid()
        self._process: subprocess.Popen | None = None
        self._requests: Connection | None = None
        self._replies: Connection | None = None
        _POOLS.add(self)

    # -- trainer side -------------------------------------------------------------------------------

    def map(self, fn: str, tasks: Sequence[Any]) -> list[Outcome]:
        """``[(status, value), ...]`` for ``fn(task)`` of each task, in order; ``fn`` is ``"module:name"``.

        Never raises because of a task and always returns: each task takes at most the time limit
        (plus one retry if its worker crashed), and if the server itself stops answering it is
        restarted and the remaining tasks are reported as ``ERROR``. An exception that interrupts the
        wait (a signal handler's, ``KeyboardInterrupt``) propagates, and the server is stopped: its late
        reply would otherwise be read as the next batch's (the next call starts a new one).
        """
        tasks = list(tasks)
        if not tasks:
            return []
        with self._lock:
            if self._pid != os.getpid():  # a forked copy of a pool: the server belongs to the parent
                self._forget()
            request = ForkingPickler.dumps(("map", fn, tasks))  # before any byte is sent: may raise
            for attempt in range(2):  # a server that died is restarted and the batch retried once
                self._ensure_started()
                deadline = self._batch_deadline(len(tasks))
                try:
                    answered, reply = self._exchange(request, deadline)
                except (EOFError, OSError) as err:
                    logger.error("grader server died (%s); restarting it", type(err).__name__)
                    self._stop_server(graceful=False)
                    continue
                if answered:
                    return reply
                logger.error("grader server did not answer within %.0f s; restarting it", deadline)
                self._stop_server(graceful=False)
                break
            return [(ERROR, "GraderServerFailure")] * len(tasks)

    def worker_pids(self) -> list[int]:
        """Process ids of the current workers (starts the pool if needed)."""
        with self._lock:
            self._ensure_started()
            return self._exchange(ForkingPickler.dumps(("pids",)), None)[1]

    def _exchange(self, request: memoryview, timeout: float | None) -> tuple[bool, Any]:
        """Send one pickled request to the running server and wait up to ``timeout`` seconds (``None``:
        no limit) for its reply: ``(True, reply)``, or ``(False, None)`` if none came.

        The exchange is all or nothing: if anything interrupts it (a signal handler's exception, a
        ``KeyboardInterrupt``: these propagate), the server is stopped, so that no reply to this request,
        nor part of one, nor of a request sent in part, is ever read as another request's.
        """
        try:
            self._requests.send_bytes(request)
            if timeout is not None and not self._replies.poll(timeout):
                return False, None
            return True, self._replies.recv()
        except (EOFError, OSError):
            raise
        except BaseException:
            self._stop_server(graceful=False)
            raise

    def close(self) -> None:
        """Stop the server and its workers (after a batch in flight); the pool starts again if used later."""
        with self._lock:
            self._stop_server(graceful=True)

    def _batch_deadline(self, n: int) -> float:
        rounds = math.ceil(n / self.config.workers) * (1 + _CRASH_RETRIES)
        return rounds * (self.config.time_limit_s + 0.5) + 30.0

    def _ensure_started(self) -> None:
        if self._process is not None and self._process.poll() is None:
            return
        self._stop_server(graceful=False)
        # os.pipe's descriptors are close-on-exec: only the server gets its two ends (pass_fds), no other
        # program this process runs gets any. Forked children get copies, which `_after_fork_in_child` closes.
        request_read, request_write = os.pipe()
        reply_read, reply_write = os.pipe()
        cfg = self.config
        code = (
            "from rewards.grading.pool import _serve; "
            f"_serve({request_read}, {reply_write}, {cfg.workers}, {cfg.time_limit_s!r}, {cfg.memory_mb}, "
            f"{cfg.preload!r}, {cfg.initializer!r}, parent_pid={os.getpid()})"
        )
        # Grading is single-threaded Python (SymPy); a BLAS or OpenMP pool in the workers would only contend
        # with the trainer's torch threads for the same cores.
        env = {**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1"}
        paths = [os.path.abspath(p or os.curdir) for p in sys.path]
        env["PYTHONPATH"] = os.pathsep.join(paths + ([env["PYTHONPATH"]] if env.get("PYTHONPATH") else []))
        try:
            self._process = subprocess.Popen(
                [sys.executable, "-c", code],
                pass_fds=(request_read, reply_write),
                stdin=subprocess.DEVNULL,
                env=env,
                close_fds=True,
            )
        finally:
            os.close(request_read)
            os.close(reply_write)
        self._requests = Connection(request_write, readable=False)
        self._replies = Connection(reply_read, writable=False)
        try:
            if not self._replies.poll(_STARTUP_TIMEOUT_S):
                self._stop_server(graceful=False)
                raise RuntimeError(f"grader server did not start within {_STARTUP_TIMEOUT_S:.0f} s")
            ready = self._replies.recv()
        except EOFError:
            code = self._process.wait()
            self._stop_server(graceful=False)
            raise RuntimeError(
                f"grader server failed to start (exit code {code}); see its stderr above"
            ) from None
        except BaseException:
            self._stop_server(graceful=False)  # interrupted: its "ready" must not answer a later request
            raise
        logger.debug("grader server %s up: %s", self._process.pid, ready)

    def _forget(self) -> None:
        # In a forked child: drop the parent's server without touching it; close only our fd copies, so
        # that the server sees EOF when the parent's own copies close, whether or not this child lives on.
        for conn in (self._requests, self._replies):
            if conn is not None:
                try:
                    conn.close()
                except OSError:
                    pass
        if self._process is not None:
            _FOREIGN_SERVERS.append(self._process)  # not ours to wait for, nor to warn about when collected
        self._process = self._requests = self._replies = None
        self._pid = os.getpid()

    def _stop_server(self, graceful: bool) -> None:
        process, self._process = self._process, None
        if graceful and process is not None and self._requests is not None:
            try:  # the server stops on this even if a child forked by C code still holds a copy of the pipe
                self._requests.send(("stop",))
            except (OSError, ValueError):
                pass
        for conn in (self._requests, self._replies):
            if conn is not None:
                try:
                    conn.close()  # the server sees EOF, kills and reaps its workers, and exits
                except OSError:
                    pass
        self._requests = self._replies = None
        if process is None:
            return
        try:
            process.wait(timeout=2.0 if graceful else 0.2)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


_POOL: GraderPool | None = None
_POOL_LOCK = threading.Lock()
_POOLS: weakref.WeakSet[GraderPool] = weakref.WeakSet()  # every pool of this process, for the fork hook
_FOREIGN_SERVERS: list[subprocess.Popen] = []  # in a forked child: handles on the parent's servers


def get_pool() -> GraderPool:
    """This process's pool, created on first use from `PoolConfig.from_env` (one per torchrun rank)."""
    global _POOL
    if _POOL is None:
        with _POOL_LOCK:
            if _POOL is None:
                _POOL = GraderPool(PoolConfig.from_env())
    return _POOL


def configure(
    workers: int | None = None, time_limit_s: float | None = None, memory_mb: int | None = None
) -> GraderPool:
    """Replace this process's pool with one of the given limits (the old one is shut down).

    >>> configure(time_limit_s=3.0).config.time_limit_s
    3.0
    """
    global _POOL
    with _POOL_LOCK:
        old, _POOL = (
            _POOL,
            GraderPool(PoolConfig.from_env(workers=workers, time_limit_s=time_limit_s, memory_mb=memory_mb)),
        )
    if old is not None:
        old.close()
    return _POOL


def _shutdown() -> None:
    pool = _POOL
    if pool is not None and pool._pid == os.getpid():
        pool._stop_server(graceful=True)


def _after_fork_in_child() -> None:
    # A forked child (e.g. a DataLoader worker) must not use, lock or stop the parent's pools, nor hold
    # their pipes open: a child that outlives the parent would keep its servers waiting for EOF.
    global _POOL_LOCK
    _POOL_LOCK = threading.Lock()
    for pool in list(_POOLS):
        pool._lock = threading.Lock()
        pool._forget()


atexit.register(_shutdown)
if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)


# -- server side ------------------------------------------------------------------------------------


def _resolve(path: str) -> Callable[[Any], Any]:
    module, _, name = path.partition(":")
    return getattr(importlib.import_module(module), name)


class _Worker:
    """The server's handle on one forked worker: its pipes and the tasks it holds."""

    def __init__(self, pid: int, tasks: Connection, results: Connection):
        self.pid = pid
        self.tasks = tasks
        self.results = results
        self.queue: deque[int] = deque()  # indices sent and not yet answered, current first
        self.started = 0.0  # when the current task began

    def close(self) -> None:
        for conn in (self.tasks, self.results):
            try:
                conn.close()
            except OSError:
                pass


class _Server:
    def __init__(
        self,
        requests: Connection,
        replies: Connection,
        workers: int,
        time_limit_s: float,
        memory_mb: int,
        parent_pid: int | None = None,
    ):
        self.parent_pid = os.getppid() if parent_pid is None else parent_pid
        self.requests = requests
        self.replies = replies
        self.size = workers
        self.limit = time_limit_s
        self.memory_mb = memory_mb
        self.workers: list[_Worker] = []

    def fork_worker(self) -> _Worker:
        task_read, task_write = os.pipe()
        result_read, result_write = os.pipe()
        server_pid = os.getpid()
        pid = os.fork()
        if pid == 0:  # the worker: keep only its own two pipe ends
            try:
                keep = {task_read, result_write}
                for fd in [self.requests.fileno(), self.replies.fileno(), task_write, result_read] + [
                    fd for w in self.workers for fd in (w.tasks.fileno(), w.results.fileno())
                ]:
                    if fd not in keep:
                        os.close(fd)
                _worker_loop(
                    Connection(task_read, writable=False),
                    Connection(result_write, readable=False),
                    self.limit,
                    self.memory_mb,
                    server_pid,
                )
            finally:
                os._exit(0)
        os.close(task_read)
        os.close(result_write)
        worker = _Worker(pid, Connection(task_write, readable=False), Connection(result_read, writable=False))
        self.workers.append(worker)
        return worker

    def retire(self, worker: _Worker) -> None:
        """Kill and reap ``worker`` (no zombie), and fork its replacement."""
        try:
            os.kill(worker.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        try:
            os.waitpid(worker.pid, 0)
        except ChildProcessError:
            pass
        worker.close()
        self.workers.remove(worker)
        self.fork_worker()

    def map(self, fn: str, tasks: list[Any]) -> list[Outcome]:
        n = len(tasks)
        results: list[Outcome | None] = [None] * n
        pending = deque(range(n))
        crashes: dict[int, int] = {}
        while pending or any(w.queue for w in self.workers):
            now = time.monotonic()
            for worker in self.workers:
                if pending and not worker.queue:
                    size = max(1, min(_MAX_CHUNK, len(pending) // (4 * self.size)))
                    chunk = [pending.popleft() for _ in range(min(size, len(pending)))]
                    try:
                        worker.tasks.send((fn, [(i, tasks[i]) for i in chunk]))
                    except (OSError, ValueError):  # the worker died while idle: replace, keep the tasks
                        pending.extendleft(reversed(chunk))
                        self.retire(worker)
                        break
                    worker.queue.extend(chunk)
                    worker.started = now
            busy = [w for w in self.workers if w.queue]
            if not busy:
                continue
            timeout = max(0.0, min(w.started + self.limit for w in busy) - time.monotonic())
            ready = wait([w.results for w in busy] + [self.requests], min(timeout, _PARENT_POLL_S))
            if self.requests in ready or os.getppid() != self.parent_pid:
                raise SystemExit(0)  # the trainer stops us, closed its end or died
            for worker in [w for w in busy if w.results in ready]:
                try:
                    index, status, value = worker.results.recv()
                except (EOFError, OSError, ValueError, TypeError):
                    self._crashed(worker, pending, crashes, results)
                    continue
                worker.queue.remove(index)
                results[index] = (status, value)
                worker.started = time.monotonic()
                if status == ERROR and value == "MemoryError":
                    self._requeue_rest(worker, pending)
                    self.retire(worker)  # its heap may be fragmented or near the cap
            now = time.monotonic()
            for worker in [w for w in self.workers if w.queue and now >= w.started + self.limit]:
                results[worker.queue.popleft()] = (TIMEOUT, None)
                self._requeue_rest(worker, pending)
                self.retire(worker)
        return results  # type: ignore[return-value]

    def _requeue_rest(self, worker: _Worker, pending: deque[int]) -> None:
        pending.extendleft(reversed(worker.queue))
        worker.queue.clear()

    def _crashed(self, worker: _Worker, pending: deque[int], crashes: dict[int, int], results: list) -> None:
        current = worker.queue.popleft()
        crashes[current] = crashes.get(current, 0) + 1
        if crashes[current] > _CRASH_RETRIES:
            results[current] = (ERROR, "WorkerCrashed")
        else:
            worker.queue.appendleft(current)
        self._requeue_rest(worker, pending)
        self.retire(worker)

    def shutdown(self) -> None:
        for worker in list(self.workers):
            try:
                os.kill(worker.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        for worker in self.workers:
            try:
                os.waitpid(worker.pid, 0)
            except ChildProcessError:
                pass
            worker.close()
        self.workers.clear()


def _set_parent_death_signal(signum: int) -> None:
    """Linux: have the kernel send ``signum`` when our parent (strictly: the thread that forked us) dies."""
    try:
        ctypes.CDLL(None, use_errno=True).prctl(1, int(signum))  # PR_SET_PDEATHSIG = 1
    except (OSError, AttributeError):
        pass


def _watch_parent(parent_pid: int | None) -> int:
    """Make the server exit when its parent process dies; returns the pid it watches."""
    watched = os.getppid()
    if parent_pid is not None and watched != parent_pid and not psutil.pid_exists(parent_pid):
        raise SystemExit(0)  # the trainer died before we got here
    exiting = False

    def on_parent_death(signum: int, frame: Any) -> None:
        # Also sent when only the trainer's thread that started us ended: the kernel then gave us to
        # another of its threads, and getppid() (the process) is unchanged. Otherwise we were re-parented.
        nonlocal exiting
        if not exiting and os.getppid() != watched:
            exiting = True
            raise SystemExit(0)

    signal.signal(_PARENT_DEATH_SIGNAL, on_parent_death)
    _set_parent_death_signal(_PARENT_DEATH_SIGNAL)
    if os.getppid() != watched:  # it died before the signal was set up
        raise SystemExit(0)
    return watched


def _serve(
    request_fd: int,
    reply_fd: int,
    workers: int,
    time_limit_s: float,
    memory_mb: int,
    preload: str,
    initializer: str,
    parent_pid: int | None = None,
) -> None:
    """The server's main loop (runs in the fresh interpreter started by `GraderPool` in ``parent_pid``)."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the trainer's business; we stop on EOF
    parent_pid = _watch_parent(parent_pid)
    requests = Connection(request_fd, writable=False)
    replies = Connection(reply_fd, readable=False)
    if preload:
        importlib.import_module(preload)
    if initializer:
        _resolve(initializer)()
    server = _Server(requests, replies, workers, time_limit_s, memory_mb, parent_pid)
    try:
        for _ in range(workers):
            server.fork_worker()
        replies.send(("ready", os.getpid()))
        while True:
            try:
                if not requests.poll(_PARENT_POLL_S):
                    if os.getppid() != parent_pid:
                        break  # the trainer died (a process it forked may still hold the pipe open)
                    continue
                message = requests.recv()
            except (EOFError, OSError):
                break
            if message[0] == "map":
                replies.send(server.map(message[1], message[2]))
            elif message[0] == "pids":
                replies.send([w.pid for w in server.workers])
            elif message[0] == "stop":
                break
    except (SystemExit, BrokenPipeError, EOFError):
        pass
    finally:
        server.shutdown()
        os._exit(0)


# -- worker side ------------------------------------------------------------------------------------


class SoftTimeout(BaseException):
    """Raised in a worker when a task used up its CPU-time budget (a BaseException, so that library
    code catching `Exception` cannot swallow it)."""


_ARMED = False


def _on_sigprof(signum: int, frame: Any) -> None:
    if _ARMED:
        raise SoftTimeout


def _die_with_parent(server_pid: int | None = None) -> None:
    signal.signal(_PARENT_DEATH_SIGNAL, signal.SIG_DFL)  # the server's handler is not for us
    _set_parent_death_signal(signal.SIGKILL)  # when the server (our parent, single-threaded) dies
    parent = os.getppid()
    if parent == 1 or (server_pid is not None and parent != server_pid):  # it died before that was set
        os._exit(0)


def _arm_cpu_backstop(limit_s: float) -> None:
    # The kernel kills us (SIGXCPU) if this task's CPU time ever passes the hard limit, server or not.
    usage = resource.getrusage(resource.RUSAGE_SELF)
    soft = math.ceil(usage.ru_utime + usage.ru_stime + limit_s) + 1
    _, hard = resource.getrlimit(resource.RLIMIT_CPU)
    if hard != resource.RLIM_INFINITY:
        soft = min(soft, hard)
    resource.setrlimit(resource.RLIMIT_CPU, (soft, hard))


def _worker_loop(
    tasks: Connection, results: Connection, time_limit_s: float, memory_mb: int, server_pid: int | None = None
) -> None:
    global _ARMED
    _die_with_parent(server_pid)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGPROF, _on_sigprof)
    if memory_mb > 0:
        cap = memory_mb * 1024 * 1024
        _, hard = resource.getrlimit(resource.RLIMIT_AS)
        resource.setrlimit(
            resource.RLIMIT_AS, (cap if hard == resource.RLIM_INFINITY else min(cap, hard), hard)
        )
    functions: dict[str, Callable[[Any], Any]] = {}
    while True:
        try:
            fn_path, chunk = tasks.recv()
        except (EOFError, OSError):
            return
        fn = functions.get(fn_path) or functions.setdefault(fn_path, _resolve(fn_path))
        for index, task in chunk:
            _arm_cpu_backstop(time_limit_s)
            status, value = ERROR, None
            try:
                _ARMED = True
                signal.setitimer(signal.ITIMER_PROF, time_limit_s / 2)
                value = fn(task)
                status = OK
            except SoftTimeout:
                status = TIMEOUT
            except BaseException as err:  # noqa: BLE001 - a task must never take the worker down
                status, value = ERROR, type(err).__name__
            finally:
                _ARMED = False
                signal.setitimer(signal.ITIMER_PROF, 0)
            try:
                results.send((index, status, value))
            except (OSError, ValueError):
                return
            except (
                pickle.PicklingError,
                TypeError,
                AttributeError,
                RecursionError,
            ) as err:  # unpicklable value
                results.send((index, ERROR, type(err).__name__))
            if value == "MemoryError":
                return
