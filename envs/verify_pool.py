"""The verifier's process pool: math-verify calls run in a bounded pool of worker processes
(``graftzoo.envs.verifier`` decides what reaches it: only pairs that the fast path and the verdict
cache could not answer; ``graftzoo.envs.verify_worker`` is what runs inside a worker).

Each call has a soft timer inside the worker and a hard wall-clock kill in the caller; a killed
or dead worker is replaced and the call gets status "timeout". A batch sends each distinct pair
once and keeps the answers of one gold on the worker that parsed that gold.

Workers come from the "forkserver" start method (the trainer has torch threads, so fork is
unsafe); the forkserver preloads math_verify once, so a new worker imports nothing and only
spends about a second on warm-up, while the other workers carry on. The pool starts on first use
and is shut down at exit (``close_pool``). As with any spawn/forkserver pool, workers import the
main module, so a script must guard its entry point with ``if __name__ == "__main__":``.
"""
from __future__ import annotations

import atexit
import logging
import multiprocessing as mp
import multiprocessing.connection
import os
import threading
import time
from collections import deque

from graftzoo.envs.verify_worker import worker_main

__all__ = ["DEFAULT_WORKERS", "close_pool", "configure_pool", "run_tasks"]

DEFAULT_WORKERS = 2
STARTUP_TIMEOUT_S = 120.0
MAX_FAILED_STARTS = 3
SOFT_TIMEOUT_FRACTION = 0.8  # the worker interrupts itself first; the hard kill is the backstop

log = logging.getLogger(__name__)


def _context():
    if "forkserver" in mp.get_all_start_methods():
        ctx = mp.get_context("forkserver")
        ctx.set_forkserver_preload(["math_verify", "graftzoo.envs.verify_worker"])
        return ctx
    return mp.get_context("spawn")


class _Worker:
    def __init__(self, ctx):
        self.conn, child = ctx.Pipe()
        self.proc = ctx.Process(target=worker_main, args=(child,), daemon=True,
                                name="graftzoo-verifier")
        self.proc.start()
        child.close()
        self.ready = False
        self.task: int | None = None
        self.deadline = time.monotonic() + STARTUP_TIMEOUT_S

    def kill(self) -> None:
        if self.proc.is_alive():
            self.proc.kill()
        self.proc.join(timeout=5)
        self.conn.close()


class _Schedule:
    """Task order for one pool run: tasks are grouped by their first answer (the gold), and a
    worker keeps taking tasks of the gold it already parsed, then claims an unclaimed gold, and
    only when every gold is claimed shares one (no worker idles while work is queued)."""

    def __init__(self, tasks: list[tuple[str, str, str]]):
        self._tasks = tasks
        self._groups: dict[str, deque[int]] = {}
        for i, task in enumerate(tasks):
            self._groups.setdefault(task[1], deque()).append(i)
        self._owner: dict[str, int] = {}
        self._current: dict[int, str] = {}

    def __bool__(self) -> bool:
        return bool(self._groups)

    def take(self, slot: int) -> int:
        key = self._current.get(slot)
        if key not in self._groups:
            key = next((g for g in self._groups if g not in self._owner), next(iter(self._groups)))
            self._owner[key], self._current[slot] = slot, key
        group = self._groups[key]
        i = group.popleft()
        if not group:
            del self._groups[key]
            self._owner.pop(key, None)
        return i

    def put_back(self, i: int) -> None:
        self._groups.setdefault(self._tasks[i][1], deque()).appendleft(i)


class _Pool:
    """Bounded pool of math-verify workers with a hard wall-clock kill per call."""

    def __init__(self, workers: int):
        self._ctx = _context()
        self._workers = [_Worker(self._ctx) for _ in range(workers)]
        self._lock = threading.Lock()
        self._failed_starts = 0
        self.pid = os.getpid()

    def run(self, tasks: list[tuple[str, str, str]], timeout: float) -> list[tuple[str, bool]]:
        """Run tasks on free workers; return (status, verdict) per task, in order."""
        with self._lock:
            if not self._workers:
                raise RuntimeError("graftzoo verifier: the worker pool was closed during this call")
            results: list = [None] * len(tasks)
            queue = _Schedule(tasks)
            ws = self._workers
            while queue or any(w.task is not None for w in ws):
                now = time.monotonic()
                for k, w in enumerate(ws):
                    if w.ready and w.task is None and queue:
                        i = queue.take(k)
                        try:
                            w.conn.send((tasks[i], SOFT_TIMEOUT_FRACTION * timeout))
                        except OSError:  # died while idle: retry the task on a fresh worker
                            queue.put_back(i)
                            ws[k] = self._replace(w)
                            continue
                        w.task, w.deadline = i, now + timeout
                waiting = [w for w in ws if not w.ready or w.task is not None]
                wait_s = max(0.0, min(w.deadline for w in waiting) - now)
                readable = mp.connection.wait([w.conn for w in waiting], timeout=wait_s)
                for k, w in enumerate(ws):
                    if w not in waiting:
                        continue
                    if w.conn in readable:
                        try:
                            msg = w.conn.recv()
                        except (EOFError, OSError):
                            ws[k] = self._replace(w)
                            if w.task is not None:
                                log.warning("verifier worker died (exit code %s); replaced", w.proc.exitcode)
                                results[w.task] = ("unparsable", False)
                            continue
                        if msg == "ready":
                            w.ready, self._failed_starts = True, 0
                        else:
                            results[w.task], w.task = msg, None
                    elif time.monotonic() >= w.deadline:
                        ws[k] = self._replace(w)
                        if w.task is not None:
                            results[w.task] = ("timeout", False)
            return results

    def _replace(self, w: _Worker) -> _Worker:
        """Kill ``w`` (hung or dead) and start a fresh worker in its place; raise when workers keep
        dying before they are ready (a broken install, or an unguarded main script)."""
        w.kill()
        if not w.ready:
            self._failed_starts += 1
            if self._failed_starts >= MAX_FAILED_STARTS:
                raise RuntimeError(
                    f"graftzoo verifier: {self._failed_starts} math-verify workers in a row died while starting "
                    f"(last exit code {w.proc.exitcode}); is math-verify importable, and is the main script "
                    "guarded by `if __name__ == '__main__':`?")
            log.warning("verifier worker died while starting (exit code %s); retrying", w.proc.exitcode)
        return _Worker(self._ctx)

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


def configure_pool(workers: int) -> None:
    """Set the number of math-verify worker processes (default 2); restarts the pool."""
    global _POOL_SIZE
    if not isinstance(workers, int) or workers < 1:
        raise ValueError(f"configure_pool: workers must be a positive int, got {workers!r}")
    close_pool()
    _POOL_SIZE = workers


def close_pool() -> None:
    """Stop the worker processes (registered with atexit; the next call starts a new pool)."""
    global _POOL
    with _POOL_LOCK:
        if _POOL is not None:
            _POOL.close()
            _POOL = None


atexit.register(close_pool)


def run_tasks(tasks: list[tuple[str, str, str]], timeout: float) -> list[tuple[str, bool]]:
    """(status, verdict) of each task (``("verify", gold, pred)`` or ``("equiv", x, y)``), in order,
    computed by the pool's workers under a hard wall-clock ``timeout`` (seconds) per task."""
    return _pool().run(tasks, timeout)
