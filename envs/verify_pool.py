"""The verifier's process pool: math-verify calls run in a bounded pool of worker processes
(``graftzoo.envs.verifier`` decides what reaches it: only pairs that the fast path and the verdict
cache could not answer; ``graftzoo.envs.verify_worker`` is what runs inside a worker).

Each call has a soft timer inside the worker and a hard wall-clock kill in the caller; a killed
or dead worker is replaced and the call gets status "timeout" (the calls waiting behind it in its
pipe run on another worker). A batch is one pool run: it sends each distinct pair once, keeps the
answers of one gold on the worker that parsed that gold, and keeps ``PIPELINE_DEPTH`` calls in each
worker's pipe, so that a worker starts its next call without waiting for the caller to be
scheduled. A batch may also have a time budget: when it is spent, the calls not yet started and the
ones still running get status ``EXPIRED`` (the verifier reports them as "timeout" but does not cache
them: they never had their full time).

Workers are fresh interpreters that run ``verify_worker.py`` by path and talk over a socket pair
(``subprocess`` with ``pass_fds``; no multiprocessing start method): they never import the
caller's ``__main__``, so the verifier works from any script (unguarded, ``python -m``,
``python -c``, a heredoc on stdin), and they import math-verify but none of graftzoo's packages.
A new worker needs about 2 s of CPU (interpreter, math-verify import, first-use costs) before it
says ``READY`` and takes calls, while the others carry on; it then warms its parser (``WARM`` when
done, about 1 s, cut short by the first call it gets). Workers die with the caller: they exit at
end of file on their pipe, on Linux the kernel kills them when the caller exits (PR_SET_PDEATHSIG, for workers started from the main
thread), and ``close_pool`` runs at exit. The pool starts on first use, or earlier with
``start_pool``: the environments and ``reward_fn`` call it when they are built, so the workers
import and warm math-verify in the background while the caller loads its model, and the first
symbolic answer does not wait for them.

The pool's size and the batch budget can follow the machine and the batch (docs/verifier.md#scaling-with-the-batch):
``auto_workers`` sizes the pool from the CPUs this process may run on, ``start_pool(workers=)`` resizes a running
pool in place (between batches; callers that share it, such as ``reward_fn``, keep working), and ``auto_budget``
gives a batch's budget from its number of calls, the per-call timeout and the pool's size.
"""
from __future__ import annotations

import atexit
import logging
import math
import multiprocessing.connection
import os
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections import deque

from graftzoo.envs import verify_worker

__all__ = ["AUTO", "DEFAULT_WORKERS", "EXPIRED", "auto_budget", "auto_workers", "available_cpus", "close_pool",
           "configure_pool", "pool_size", "resolve_workers", "run_tasks", "start_pool", "wait_ready"]

DEFAULT_WORKERS = 2  # the pool's size until a caller asks for another (configure_pool, start_pool(workers=))
AUTO = "auto"  # a worker count or a budget computed from the machine and the batch
MAX_AUTO_WORKERS = 16  # auto_workers' ceiling: each worker holds its own interpreter, sympy and math-verify
AUTO_BUDGET_BASE_S = 10.0  # auto_budget's allowance for workers still starting and for replacing killed ones
STARTUP_TIMEOUT_S = 120.0
MAX_FAILED_STARTS = 3
SOFT_TIMEOUT_FRACTION = 0.8  # the worker interrupts itself first; the hard kill is the backstop
PIPELINE_DEPTH = 2  # tasks sent to a worker ahead: the next one waits in its pipe, not on the caller
READY, WARM = "ready", "warm"  # a worker's messages after its start-up and after its parser warm-up
EXPIRED = "expired"  # status of a call cut short or never started because the batch's budget ran out
WORKER_SCRIPT = os.path.abspath(verify_worker.__file__)
STDERR_TAIL_CHARS = 2000

log = logging.getLogger(__name__)


class _Worker:
    """One worker process, our end of its pipe, and a file that collects its stdout and stderr."""

    def __init__(self):
        if not sys.executable:
            raise RuntimeError("graftzoo verifier: sys.executable is unknown; cannot start math-verify workers")
        mine, theirs = socket.socketpair()
        self.output = tempfile.TemporaryFile()
        deathsig = threading.current_thread() is threading.main_thread()  # PDEATHSIG follows the starting thread
        try:
            self.proc = subprocess.Popen(
                [sys.executable, WORKER_SCRIPT, str(theirs.fileno()), str(os.getpid()), "1" if deathsig else "0"],
                pass_fds=(theirs.fileno(),), stdin=subprocess.DEVNULL, stdout=self.output, stderr=self.output)
        except BaseException:
            mine.close()
            self.output.close()
            raise
        finally:
            theirs.close()
        self.conn = multiprocessing.connection.Connection(mine.detach())
        self.ready = False
        self.warm = False
        self.tasks: deque[int] = deque()  # sent to it, in order: the first one is running
        self.cut = False  # the running task's limit was cut by the batch budget
        self.deadline = time.monotonic() + STARTUP_TIMEOUT_S

    def kill(self) -> None:
        """Stop the process and close the pipe; keep the end of its output in ``self.tail``."""
        if self.proc.poll() is None:
            self.proc.kill()
        try:
            self.proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            pass
        self.conn.close()
        try:
            self.output.seek(max(0, self.output.seek(0, os.SEEK_END) - STDERR_TAIL_CHARS))
            self.tail = self.output.read().decode(errors="replace").strip() or "(no output)"
        except (OSError, ValueError):
            self.tail = "(output unavailable)"
        self.output.close()


_RELATION = ("=", "<", ">", "\\le", "\\ge", "\\ne")


def _cost(task: tuple) -> int:
    """A rough rank of a task's cost: a comparison of relations (sympy ``solve``, tens of
    milliseconds) first, then the length of the answers to parse; reading an answer in prose
    (``"text"``, well under a millisecond) last."""
    kind, a, b = task[0], task[1], task[2]
    if kind == "text":
        return 0
    texts = [t for t in (a,) + (b if isinstance(b, tuple) else (b,)) if isinstance(t, str)]
    relation = any(r in t for t in texts for r in _RELATION)
    return (1_000_000 if relation else 0) + sum(len(t) for t in texts)


class _Schedule:
    """Task order for one pool run: tasks are grouped by their first answer (the gold), and a
    worker keeps taking tasks of the gold it already parsed, then claims an unclaimed gold, and
    only when every gold is claimed shares one (no worker idles while work is queued)."""

    def __init__(self, tasks: list[tuple]):
        self._tasks = tasks
        groups: dict[str, deque[int]] = {}
        for i, task in enumerate(tasks):
            groups.setdefault(task[1], deque()).append(i)
        # the costliest golds are claimed first (longest job first), so that a slow comparison does
        # not start last and leave the other workers idle at the end of the run
        self._groups = dict(sorted(groups.items(), key=lambda kv: -max(_cost(tasks[i]) for i in kv[1])))
        self._owner: dict[str, int] = {}
        self._current: dict[int, str] = {}
        self._left = len(tasks)

    def __bool__(self) -> bool:
        return self._left > 0

    def __len__(self) -> int:
        return self._left

    def take(self, slot: int) -> int:
        key = self._current.get(slot)
        if key not in self._groups:
            key = next((g for g in self._groups if g not in self._owner), next(iter(self._groups)))
            self._owner[key], self._current[slot] = slot, key
        group = self._groups[key]
        i = group.popleft()
        self._left -= 1
        if not group:
            del self._groups[key]
            self._owner.pop(key, None)
        return i

    def put_back(self, i: int) -> None:
        self._groups.setdefault(self._tasks[i][1], deque()).appendleft(i)
        self._left += 1

    def drain(self) -> list[int]:
        """Every task not taken yet (the schedule is empty afterwards)."""
        left = [i for group in self._groups.values() for i in group]
        self._groups.clear()
        self._left = 0
        return left


class _Pool:
    """Bounded pool of math-verify workers with a hard wall-clock kill per call."""

    def __init__(self, workers: int):
        self._workers: list[_Worker] = []
        self._lock = threading.Lock()
        self._failed_starts = 0
        self.pid = os.getpid()
        try:
            for _ in range(workers):
                self._workers.append(_Worker())
        except BaseException:
            self.close()
            raise

    def run(self, tasks: list[tuple], timeout: float,
            budget: float | None = None) -> list[tuple[str, bool]]:
        """Run tasks on free workers; return (status, verdict) per task, in order. Each call may take
        ``timeout`` seconds; all of them together ``budget`` seconds (None: no limit), after which
        unfinished calls get status ``EXPIRED``. Each worker has up to ``PIPELINE_DEPTH`` tasks in
        its pipe, so that it starts the next one as soon as it answers; a task's hard deadline
        counts from the moment the worker is seen to start it, never earlier."""
        with self._lock:
            if not self._workers:
                raise RuntimeError("graftzoo verifier: the worker pool was closed during this call")
            results: list = [None] * len(tasks)
            queue = _Schedule(tasks)
            ws = self._workers
            end = math.inf if budget is None else time.monotonic() + budget
            while queue or any(w.tasks for w in ws):
                now = time.monotonic()
                if now >= end:
                    self._expire(queue, results)
                    break
                for k in range(len(ws)):
                    self._feed(k, tasks, queue, results, timeout, end, now)
                waiting = [w for w in ws if not w.ready or w.tasks]
                wait_s = max(0.0, min([w.deadline for w in waiting] + [end]) - now)
                readable = multiprocessing.connection.wait([w.conn for w in waiting], timeout=wait_s)
                for k, w in enumerate(ws):
                    if w not in waiting:
                        continue
                    if w.conn in readable:
                        msg = self._receive(k)
                        if msg is None:
                            self._requeue(w, queue, results, ("unparsable", False))
                        elif msg not in (READY, WARM):
                            results[w.tasks.popleft()] = (EXPIRED, False) if msg[0] == "timeout" and w.cut else msg
                            if w.tasks:
                                self._start_clock(w, timeout, end, time.monotonic())
                    elif time.monotonic() >= w.deadline:
                        ws[k] = self._replace(w)
                        self._requeue(w, queue, results, (EXPIRED if w.cut else "timeout", False))
            return results

    def _feed(self, k: int, tasks: list, queue: _Schedule, results: list, timeout: float, end: float,
              now: float) -> None:
        """Send worker ``k`` a task when it is ready and idle, and more, up to ``PIPELINE_DEPTH``, while
        the queue holds a task for every worker (near the end of a run a task waiting in one
        worker's pipe could not move to another that is idle)."""
        w = self._workers[k]
        while w.ready and queue and (not w.tasks or len(w.tasks) < PIPELINE_DEPTH and len(queue) >= len(self._workers)):
            i = queue.take(k)
            limit = min(timeout, end - now)
            try:
                w.conn.send((tasks[i], SOFT_TIMEOUT_FRACTION * limit))
            except OSError:  # it died: retry the task on a fresh worker
                queue.put_back(i)
                self._workers[k] = self._replace(w)
                self._requeue(w, queue, results, ("unparsable", False))
                return
            w.tasks.append(i)
            if len(w.tasks) == 1:
                self._start_clock(w, timeout, end, now)

    @staticmethod
    def _start_clock(w: _Worker, timeout: float, end: float, now: float) -> None:
        """The first task in ``w``'s pipe starts now: its hard deadline, cut to the batch's end."""
        limit = min(timeout, end - now)
        w.deadline, w.cut = now + limit, limit < timeout

    @staticmethod
    def _requeue(w: _Worker, queue: _Schedule, results: list, outcome: tuple) -> None:
        """``w`` was killed or died: its running task gets ``outcome``, the ones still waiting in its
        pipe go back to the front of the queue."""
        if not w.tasks:
            return
        if outcome[0] == "unparsable":
            log.warning("verifier worker died (exit code %s); replaced. Its output ended with:\n%s",
                        w.proc.returncode, w.tail)
        results[w.tasks.popleft()] = outcome
        while w.tasks:
            queue.put_back(w.tasks.pop())

    def _receive(self, k: int):
        """The next message of worker ``k``: ``READY`` (its first; it is marked ready), ``WARM`` (its
        parser warm-up is over) or a task's answer; None when the worker died (it is replaced)."""
        w = self._workers[k]
        try:
            msg = w.conn.recv()
        except (EOFError, OSError):
            self._workers[k] = self._replace(w)
            return None
        if msg == READY:
            w.ready = True
        elif msg == WARM:
            w.warm, self._failed_starts = True, 0
        return msg

    def wait_ready(self) -> None:
        """Block until every worker has finished its start-up and its parser warm-up (one that dies
        or hangs is replaced)."""
        with self._lock:
            ws = self._workers
            while any(not w.warm for w in ws):
                waiting = [w for w in ws if not w.warm]
                wait_s = max(0.0, min(w.deadline for w in waiting) - time.monotonic())
                readable = multiprocessing.connection.wait([w.conn for w in waiting], timeout=wait_s)
                for k, w in enumerate(ws):
                    if w.warm:
                        continue
                    if w.conn in readable:
                        self._receive(k)
                    elif time.monotonic() >= w.deadline:
                        ws[k] = self._replace(w)

    def _expire(self, queue: _Schedule, results: list) -> None:
        """The budget is spent: unstarted tasks expire, running ones are killed (their workers replaced)."""
        for i in queue.drain():
            results[i] = (EXPIRED, False)
        for k, w in enumerate(self._workers):
            if w.tasks:
                for i in w.tasks:
                    results[i] = (EXPIRED, False)
                self._workers[k] = self._replace(w)

    def _replace(self, w: _Worker) -> _Worker:
        """Kill ``w`` (hung, dead or cut off) and start a fresh worker in its place; raise when
        workers keep dying (or hanging) before they are ready."""
        w.kill()
        if not w.warm and not w.tasks:  # it died or hung before its warm-up was over
            self._failed_starts += 1
            hung = w.proc.returncode == -signal.SIGKILL and time.monotonic() >= w.deadline
            why = f"did not start within {STARTUP_TIMEOUT_S:.0f} s" if hung else \
                f"died while starting (exit code {w.proc.returncode})"
            if self._failed_starts >= MAX_FAILED_STARTS:
                raise RuntimeError(
                    f"graftzoo verifier: {self._failed_starts} math-verify workers in a row failed to start; "
                    f"the last one {why}. Its output ended with:\n{w.tail}")
            log.warning("verifier worker %s; retrying. Its output ended with:\n%s", why, w.tail)
        return _Worker()

    def resize(self, workers: int) -> None:
        """Start or stop workers until there are ``workers`` of them; waits for a batch that is running."""
        with self._lock:
            while len(self._workers) > workers:
                self._workers.pop().kill()
            while len(self._workers) < workers:
                self._workers.append(_Worker())

    def close(self) -> None:
        with self._lock:
            for w in self._workers:
                w.kill()
            self._workers = []


_POOL: _Pool | None = None
_POOL_SIZE = DEFAULT_WORKERS
_POOL_LOCK = threading.Lock()


def _pool() -> _Pool:
    global _POOL
    with _POOL_LOCK:
        if _POOL is None or _POOL.pid != os.getpid():  # none yet, or inherited through fork
            _POOL = _Pool(_POOL_SIZE)
        return _POOL


def _check_workers(name: str, workers) -> None:
    if isinstance(workers, bool) or not isinstance(workers, int) or workers < 1:
        raise ValueError(f"{name}: workers must be a positive int, got {workers!r}")


def configure_pool(workers: int) -> None:
    """Set the number of math-verify worker processes (default 2); restarts the pool."""
    global _POOL_SIZE
    _check_workers("configure_pool", workers)
    close_pool()
    _POOL_SIZE = workers


def pool_size() -> int:
    """The number of worker processes the pool runs (or will run when it starts)."""
    return _POOL_SIZE


def available_cpus() -> int:
    """The CPUs this process may run on: its CPU affinity (``os.sched_getaffinity``, which a container's or
    ``taskset``'s CPU set limits) where the platform has one, else ``os.cpu_count()``; at least 1."""
    if hasattr(os, "sched_getaffinity"):
        return max(1, len(os.sched_getaffinity(0)))
    return max(1, os.cpu_count() or 1)


def auto_workers(cpus: int | None = None) -> int:
    """The pool size of ``workers: auto`` on ``cpus`` CPUs (default ``available_cpus()``): half of them, the other
    half left to the trainer (its torch threads, the rollout engine, tokenizers, a second model's update running
    while one model is scored), at least 1 and at most ``MAX_AUTO_WORKERS`` (each worker costs about 2 s of CPU to
    start and its own interpreter's memory). 1 CPU: 1; 2 CPUs: 1; 16 CPUs: 8 (docs/verifier.md#scaling-with-the-batch)."""
    cpus = available_cpus() if cpus is None else cpus
    return max(1, min(MAX_AUTO_WORKERS, cpus // 2))


def resolve_workers(workers) -> int | None:
    """A worker setting as a count: ``"auto"`` -> ``auto_workers()``, a positive int as it is, None stays None
    (the pool keeps its size)."""
    if workers is None:
        return None
    if workers == AUTO:
        return auto_workers()
    _check_workers("verifier", workers)
    return workers


def auto_budget(calls: int, timeout: float, workers: int) -> float:
    """The wall-clock budget (s) of ``budget: auto`` for a batch of ``calls`` math-verify calls on ``workers``
    workers, each call limited to ``timeout`` seconds (docs/verifier.md#scaling-with-the-batch)::

        budget = AUTO_BUDGET_BASE_S + timeout * ceil(calls / workers)

    The second term is the time the calls take when the workers share them evenly and every one of them runs to
    its own timeout: a batch whose calls end within their limits is not cut. The base (10 s) covers workers still
    starting (about 2 s of CPU each) and a few replacements of killed workers. What the budget cuts is a batch whose
    hung calls keep killing workers: each replacement adds about 2 s, which would otherwise add up without bound.
    1024 calls, a 2 s timeout, 8 workers: 10 + 2 * 128 = 266 s."""
    return AUTO_BUDGET_BASE_S + timeout * math.ceil(max(0, calls) / max(1, workers))


def close_pool() -> None:
    """Stop the worker processes (registered with atexit; the next call starts a new pool)."""
    global _POOL
    with _POOL_LOCK:
        if _POOL is not None:
            if _POOL.pid == os.getpid():  # a forked child leaves its parent's workers alone
                _POOL.close()
            _POOL = None


atexit.register(close_pool)


def start_pool(workers: int | str | None = None) -> None:
    """Start the worker processes now if they are not running, without waiting for them: each one
    imports math-verify and warms its parser in the background (a few seconds of CPU), so that
    the first call finds them ready. ``workers`` (a count or ``"auto"``: ``auto_workers()``) sets the pool's size:
    a running pool of another size starts or stops workers in place, between batches (its other users keep it);
    None keeps the size it has. Best effort: a start that fails here (no permission to run the
    interpreter, no processes left) is left to the first call, which starts the pool and reports why;
    building an environment never fails on it."""
    global _POOL_SIZE
    size = resolve_workers(workers)
    if size is not None:
        _POOL_SIZE = size
    try:
        pool = _pool()
        if size is not None:
            pool.resize(size)
    except OSError:
        return


def wait_ready() -> None:
    """Start the pool if needed and block until all of its workers are ready to take calls (a
    trainer may call this at start-up so that its first steps do not share the CPUs with worker
    start-up; verify calls do not need it)."""
    _pool().wait_ready()


def run_tasks(tasks: list[tuple], timeout: float,
              budget: float | None = None) -> list[tuple[str, bool]]:
    """(status, verdict) of each task (``("verify", gold, pred, options)``, ``("equiv", x, y, options)`` or
    ``("extract", text, "", ())``: see ``verify_worker``), in order,
    computed by the pool's workers under a hard wall-clock ``timeout`` (seconds) per task and, when
    ``budget`` is not None, a wall-clock limit (seconds) for all of them: calls that did not finish
    within it get status ``EXPIRED``."""
    return _pool().run(tasks, timeout, budget)
