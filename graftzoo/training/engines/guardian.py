"""Processes that die with the process that started them, however it ends (kill -9 included).

vLLM's engine core runs in a process of its own (``rollout.vllm.multiprocessing``) and does not watch its parent:
a trainer killed with SIGKILL would leave it, its workers and what they hold (host memory, a GPU) behind.
``guard(pids)`` starts a small watcher process holding the read end of a pipe whose write end only the starting
process holds. When that process ends, for any reason, the pipe reaches end-of-file and the watcher kills the
guarded processes and their descendants (each checked by its start time, so that a reused PID is never hit). A
process that closes its engines first closes the pipe itself (``Guard.close``): what is still alive then is
killed the same way. docs/reliability.md#engines-and-their-processes.
"""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import time


def _stat(pid) -> list:
    """The fields of ``/proc/PID/stat`` after the command name (state, parent pid, ...), [] when it is gone."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return []


def start_time(pid: int):
    """The start time of ``pid`` in clock ticks since boot, None when it has ended (gone, or a zombie waiting for
    its parent)."""
    fields = _stat(pid)
    return int(fields[19]) if len(fields) > 19 and fields[0] not in ("Z", "X") else None


def parents() -> dict:
    """pid -> parent pid of every process this one can see."""
    out = {}
    for name in os.listdir("/proc"):
        fields = _stat(name) if name.isdigit() else []
        if len(fields) > 1:
            out[int(name)] = int(fields[1])
    return out


def process_name(pid: int) -> str:
    """The name a process shows (vLLM titles its own: ``VLLM::EngineCore``, ``VLLM::Worker``)."""
    for path, sep in ((f"/proc/{pid}/cmdline", "\0"), (f"/proc/{pid}/comm", "\n")):
        try:
            with open(path) as f:
                name = f.read().split(sep)[0].strip()
            if name:
                return name
        except OSError:
            pass
    return "?"


def descendants(pids: list) -> list:
    """``pids`` and every process below them."""
    children: dict = {}
    for pid, ppid in parents().items():
        children.setdefault(ppid, []).append(pid)
    out, todo = [], list(pids)
    while todo:
        pid = todo.pop()
        out.append(pid)
        todo += children.get(pid, [])
    return out


class Guard:
    """The watcher of ``guard``: ``close()`` ends it, killing what it guards that is still alive."""

    def __init__(self, proc: subprocess.Popen):
        self.proc = proc

    def close(self, timeout: float = 10.0) -> None:
        if self.proc.stdin is not None and not self.proc.stdin.closed:
            self.proc.stdin.close()
        try:
            self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


def guard(pids: list) -> Guard:
    """Start the watcher of ``pids`` (module docstring); None of them is touched while this process lives."""
    return Guard(subprocess.Popen([sys.executable, "-I", __file__, *map(str, pids)], stdin=subprocess.PIPE,
                                  stdout=subprocess.DEVNULL, close_fds=True, start_new_session=True))


def end_processes(victims: dict, wait: float = 0.0, grace: float = 2.0) -> None:
    """End the processes of ``victims`` (pid -> start time, ``start_time``) that are still the processes seen then
    (a reused pid is never hit): ``wait`` seconds for them to end by themselves, then SIGTERM, a moment
    (``grace`` seconds) to end cleanly, then SIGKILL."""
    def living():
        return [p for p, t in victims.items() if t is not None and start_time(p) == t]

    deadline = time.monotonic() + wait
    while time.monotonic() < deadline and living():
        time.sleep(0.05)
    for sig in (signal.SIGTERM, signal.SIGKILL):
        for pid in living():
            try:
                os.kill(pid, sig)
            except ProcessLookupError:
                pass
        deadline = time.monotonic() + grace
        while time.monotonic() < deadline and living():
            time.sleep(0.05)


def main(pids: list) -> None:
    """Wait for end-of-file on stdin, then kill ``pids`` and their descendants that are the processes seen at the
    start (the descendants as they are at that moment: those started later are theirs)."""
    born = {pid: start_time(pid) for pid in pids}
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # a Ctrl-C to the terminal is the trainer's to handle
    while sys.stdin.buffer.read(65536):
        pass
    alive = [pid for pid in pids if born[pid] is not None and start_time(pid) == born[pid]]
    end_processes({pid: start_time(pid) for pid in descendants(alive)})


if __name__ == "__main__":
    main([int(a) for a in sys.argv[1:]])
