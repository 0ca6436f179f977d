"""What keeps a vLLM engine's processes out of the process that starts them
(docs/reliability.md#engines-and-their-processes).

vLLM starts its engine core (``rollout.vllm.multiprocessing``) and the core's workers with multiprocessing's ``spawn``,
sets environment variables in the starting process for them (``VLLM_WORKER_MULTIPROC_METHOD``, ``LD_PRELOAD``,
``LOCAL_WORLD_SIZE``, ...), and its processes share memory through ring buffers in ``/dev/shm``. Four things here
keep all of that inside the engine's life:

- **The caller's main module stays out of the engine's processes** (``main_left_out``). multiprocessing prepares a
  spawned child from the parent's ``__main__``: a script is re-run by path, a ``python -m`` module imported by name,
  and a heredoc's ``<stdin>`` looked for as a file. A script without an ``if __name__ == "__main__":`` guard then
  runs its top level again in the engine core (a second ``train()``, the script's own clean-up twice). While vLLM
  starts its processes the preparation leaves the main module out, so any script works: unguarded, ``python -m``,
  ``python -c``, a heredoc, a notebook kernel (the verifier's workers are interpreters run by path for the same
  reason, graftzoo.envs.verify_pool).
- **The environment comes back as it was** (``hold_environment``, ``note_environment``, ``release_environment``,
  ``environment_kept``). An engine notes every variable that its start (graftzoo's settings, vLLM's import and its
  configuration) changed; when the last engine or ``graftzoo.train`` call holding the environment lets it go,
  each noted variable is put back to its old value or removed.
- **A failed start names its cause** (``OutputTail``). An engine process that fails prints its exception to the
  output it inherited, and vLLM's own error says only "Engine core initialization failed. See root cause above".
  While vLLM starts its processes, this process's stdout and stderr are pipes that a thread forwards, unchanged,
  to where they went before; the engine's processes keep them for life, and the last lines stay at hand
  (``cause``: the last exception line).
- **vLLM's shared memory is released** (``register``, ``release_shared_memory``). A ring buffer's creator removes
  it when the object is collected; an engine process ended by a signal at shutdown (the engine core ends its
  workers, vLLM its engine core, the guardian whatever is left) never does, and multiprocessing's resource tracker
  warns of the "leaked shared_memory" when the Python session exits. ``register`` (a vLLM general plugin, entry
  point ``graftzoo_shared_memory``) writes down each ring buffer an engine's process creates, and the engine's
  ``close`` ends what of its processes still lives and removes the buffers left behind.
"""
from __future__ import annotations

import functools
import logging
import os
import re
import sys
import threading
import time
from collections import deque
from contextlib import contextmanager
from multiprocessing import resource_tracker, shared_memory, spawn
from typing import Mapping, Optional

from graftzoo.training.engines.guardian import end_processes, start_time

SHM_ENV = "GRAFTZOO_VLLM_SHM_RECORD"  # the file an engine's processes write their ring buffers' names to

log = logging.getLogger(__name__)


# ---- the caller's main module ---------------------------------------------------------------------------------

_MAIN_KEYS = ("init_main_from_name", "init_main_from_path")  # what spawn's preparation says of the main module
_main_lock = threading.Lock()
_main_depth = 0
_real_preparation = None


def _preparation_without_main(name):
    """multiprocessing's preparation data for a spawned child, without its main module."""
    data = _real_preparation(name)
    for key in _MAIN_KEYS:
        data.pop(key, None)
    return data


@contextmanager
def main_left_out():
    """The processes that multiprocessing spawns (or starts from its fork server) while the block runs are prepared
    without this process's ``__main__``: they neither re-run the caller's script nor import its module. Everything
    a child needs comes by reference to installed modules (vLLM's engine core, graftzoo's worker extension). Blocks
    may nest and overlap across threads: the first one in installs, the last one out restores."""
    global _main_depth, _real_preparation
    with _main_lock:
        if _main_depth == 0:
            _real_preparation = spawn.get_preparation_data
            spawn.get_preparation_data = _preparation_without_main
        _main_depth += 1
    try:
        yield
    finally:
        with _main_lock:
            _main_depth -= 1
            if _main_depth == 0:
                spawn.get_preparation_data = _real_preparation
                _real_preparation = None


# ---- the environment ------------------------------------------------------------------------------------------

_env_lock = threading.Lock()
_env_holders = 0
_env_before: dict = {}  # name -> its value before the first noted change (None: it was not set)


def hold_environment() -> None:
    """One more holder of the environment: the variables noted meanwhile are put back when the last one lets go."""
    global _env_holders
    with _env_lock:
        _env_holders += 1


def note_environment(before: Mapping[str, str]) -> None:
    """Note each variable whose value differs from ``before`` (a copy of ``os.environ`` taken earlier) as changed,
    to be put back to its value in ``before`` (the first value noted for it stands). Nothing is noted while no one
    holds the environment."""
    now = dict(os.environ)
    with _env_lock:
        if _env_holders == 0:
            return
        for name in before.keys() | now.keys():
            if before.get(name) != now.get(name):
                _env_before.setdefault(name, before.get(name))


def release_environment() -> None:
    """One holder fewer; the last one puts every noted variable back to its old value, or removes it."""
    global _env_holders
    with _env_lock:
        _env_holders = max(0, _env_holders - 1)
        if _env_holders:
            return
        noted = dict(_env_before)
        _env_before.clear()
    for name, value in noted.items():
        if value is None:
            os.environ.pop(name, None)
        elif os.environ.get(name) != value:
            os.environ[name] = value


@contextmanager
def environment_kept():
    """The environment as it was before the block, after it (``os.environ``: what the block set is removed, what
    it changed put back), once no engine started inside it is still open."""
    hold_environment()
    before = dict(os.environ)
    try:
        yield
    finally:
        note_environment(before)
        release_environment()


# ---- the output of the engine's processes ---------------------------------------------------------------------

# an exception's last line, ``ValueError: ...``, ``pkg.mod.SomeError``; vLLM's log prefixes are taken off first
_ERROR_LINE = re.compile(r"^(?:[A-Za-z_]\w*\.)*[A-Z]\w*(?:Error|Exception|Exit|Interrupt|Failure)(?::\s.*)?$")
_PREFIXES = (re.compile(r"^\([^)]*\)\s+"),  # (EngineCore pid=123)
             re.compile(r"^(?:DEBUG|INFO|WARNING|ERROR|CRITICAL)\s+\d\d-\d\d [\d:.]+\s+\[[^\]]*\]\s*"))


def error_line(line: str) -> Optional[str]:
    """``line`` without vLLM's log prefixes when it is an exception's last line (``ValueError: ...``), else None."""
    line = line.strip()
    for prefix in _PREFIXES:
        line = prefix.sub("", line, count=1)
    return line if _ERROR_LINE.match(line) else None


class OutputTail:
    """While open, this process's stdout and stderr (file descriptors 1 and 2) are pipes that a thread each forwards,
    byte for byte, to where they went before; the processes started meanwhile inherit the pipes and keep them for
    life (their output still goes where it went, through the thread, until they end). ``lines``: the last ``keep``
    lines of both, in the order read. A descriptor that is not open is left alone."""

    def __init__(self, keep: int = 80):
        self.keep = keep
        self._lines: deque = deque(maxlen=keep)
        self._lock = threading.Lock()
        self._saved: dict = {}  # fd -> a copy of where it went before
        self._threads: list = []

    def __enter__(self) -> "OutputTail":
        for stream in (sys.stdout, sys.stderr):
            _flush(stream)
        for fd in (1, 2):
            try:
                saved = os.dup(fd)
            except OSError:
                continue
            read, write = os.pipe()
            os.dup2(write, fd)
            os.close(write)
            self._saved[fd] = saved
            thread = threading.Thread(target=self._pump, args=(read, os.dup(saved)), daemon=True,
                                      name=f"graftzoo-engine-output-{fd}")
            thread.start()
            self._threads.append(thread)
        return self

    def __exit__(self, *exc) -> None:
        for stream in (sys.stdout, sys.stderr):
            _flush(stream)
        for fd, saved in self._saved.items():
            os.dup2(saved, fd)
            os.close(saved)
        self._saved.clear()

    def _pump(self, read: int, out: int) -> None:
        partial = b""
        try:
            while True:
                chunk = os.read(read, 65536)
                if not chunk:
                    break
                _write_all(out, chunk)
                *whole, partial = (partial + chunk).split(b"\n")
                with self._lock:
                    self._lines.extend(line.decode("utf-8", "replace") for line in whole)
                partial = partial[-4096:]
        except OSError:
            pass
        finally:
            if partial:
                with self._lock:
                    self._lines.append(partial.decode("utf-8", "replace"))
            os.close(read)
            os.close(out)

    def settle(self, timeout: float = 3.0) -> None:
        """Wait until every process that holds the pipes has ended (their last words read), or ``timeout``."""
        deadline = time.monotonic() + timeout
        for thread in self._threads:
            thread.join(max(0.0, deadline - time.monotonic()))

    def lines(self) -> list:
        with self._lock:
            return list(self._lines)

    def cause(self) -> Optional[str]:
        """The last exception line written (``ValueError: ...``, vLLM's log prefix taken off), None without one."""
        for line in reversed(self.lines()):
            found = error_line(line)
            if found:
                return found
        return None


def _flush(stream) -> None:
    try:
        stream.flush()
    except (AttributeError, OSError, ValueError):
        pass


def _write_all(fd: int, data: bytes) -> None:
    while data:
        try:
            data = data[os.write(fd, data):]
        except OSError:  # the output went away (a closed terminal): the tail is still kept
            return


# ---- shared memory --------------------------------------------------------------------------------------------

def register() -> bool:
    """The vLLM general plugin (vLLM runs it in each process it starts, before the queues are made): in a process
    started with ``SHM_ENV`` set, every shared-memory ring buffer that vLLM creates is written down in that file,
    one ``pid start-time name`` line each. Returns whether it does."""
    if not os.environ.get(SHM_ENV):
        return False
    try:
        from vllm.distributed.device_communicators import shm_broadcast
    except ImportError:  # a vLLM without shared-memory queues: nothing to release
        return False
    ring = getattr(shm_broadcast, "ShmRingBuffer", None)
    if ring is None:
        log.warning("this vLLM has no ShmRingBuffer: its shared memory is not released at close")
        return False
    if getattr(ring.__init__, "graftzoo_records", False):
        return True
    init = ring.__init__

    @functools.wraps(init)
    def recording_init(self, *args, **kwargs):
        init(self, *args, **kwargs)
        path = os.environ.get(SHM_ENV)
        memory = getattr(self, "shared_memory", None)
        if path and getattr(self, "is_creator", False) and memory is not None:
            pid = os.getpid()
            with open(path, "a", encoding="utf-8") as f:
                f.write(f"{pid} {start_time(pid)} {memory.name}\n")

    recording_init.graftzoo_records = True
    ring.__init__ = recording_init
    return True


@contextmanager
def recording_shared_memory(path: str):
    """``SHM_ENV`` set to ``path`` while the block starts an engine's processes (they inherit it), this process's
    value put back after."""
    before = os.environ.get(SHM_ENV)
    os.environ[SHM_ENV] = path
    try:
        yield
    finally:
        if before is None:
            os.environ.pop(SHM_ENV, None)
        else:
            os.environ[SHM_ENV] = before


def recorded(path: str) -> list:
    """``(pid, start time, name)`` of each ring buffer written down in ``path`` (``register``)."""
    out = []
    try:
        with open(path, encoding="utf-8") as f:
            for line in f:
                pid, born, name = (line.split() + ["", "", ""])[:3]
                if pid.isdigit() and name:
                    out.append((int(pid), int(born) if born.isdigit() else None, name))
    except OSError:
        pass
    return out


def release_shared_memory(path: str, grace: float = 5.0) -> list:
    """After an engine was shut down: its processes that created a ring buffer (written down in ``path``) and still
    live are given ``grace`` seconds to end, then ended (checked by start time: a reused pid is never hit); then
    each of their buffers still in place is removed, and the resource tracker told so. Returns the names
    removed."""
    records = recorded(path)
    end_processes({pid: born for pid, born, _ in records if born is not None}, wait=grace)
    removed = []
    for _, _, name in records:
        try:
            memory = shared_memory.SharedMemory(name=name)
        except (FileNotFoundError, ValueError):  # its creator removed it
            continue
        except OSError as e:
            log.warning("vLLM's shared memory %s could not be opened to be released: %s", name, e)
            continue
        memory.close()
        try:
            memory.unlink()  # also unregisters it from the resource tracker, which would warn at exit
        except FileNotFoundError:
            resource_tracker.unregister(memory._name, "shared_memory")  # noqa: SLF001 - the name it registered
            continue
        removed.append(name)
    return removed
