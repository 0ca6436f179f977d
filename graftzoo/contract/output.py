"""What graftzoo prints while it works, and what it keeps the libraries from printing
(docs/guide.md#what-a-command-prints).

A long wait (a tiny model's warm-up, loading a model, an evaluation) is reported with ``wait(what, total)``: one
status line when it starts, its progress while it runs, a line when it ends. The layers below the commands call
``wait``; a command chooses how it is shown with ``showing``: graftzoo.apps.progress draws rich bars where stderr
is a terminal; anywhere else (a pipe, a log file, CI) it is plain lines on the ``graftzoo`` logger (stderr under
the command, nothing in a library user's process unless they configure logging): the start, then a line each
``PLAIN_EVERY`` of the total (for a wait that advances in smaller steps) or each ``PLAIN_EVERY_S`` seconds,
whichever comes first (``line_due``), with the time left at the pace so far (``time_left``), then the end with its
time (left out for a wait that took under ``SHORT_S`` seconds and printed no progress). ``detail=False``
(``run.progress: false``) keeps the start and end lines only.

``quiet_libraries``: the third-party libraries' progress bars ("Loading weights", shard bars), their logging below
errors (transformers' advisory warnings) and their Python warnings off, in this process and, through the
environment, in the child processes it starts; graftzoo's own warnings (the ``graftzoo`` logger) still show.
``graftzoo --debug`` leaves the libraries alone.

Light: no torch, no rich (``graftzoo --help`` imports it).
"""
from __future__ import annotations

import contextlib
import importlib
import logging
import os
import sys
import time
import warnings
from typing import Callable, Optional

log = logging.getLogger("graftzoo")

PLAIN_EVERY = 0.1      # a plain progress line at each tenth of the total ...
PLAIN_EVERY_S = 15.0   # ... or after this many seconds without one
SHORT_S = 5.0          # a wait shorter than this that printed no progress line gets no end line


def time_left(done: float, total: Optional[float], elapsed: float) -> Optional[float]:
    """Seconds left at the pace so far: ``elapsed / done * (total - done)`` (docs/guide.md#what-a-command-prints);
    None without a total or before the first unit is done. Example: 30 of 120 steps in 45 s leave 135 s."""
    if total is None or done <= 0:
        return None
    return max(0.0, elapsed / done * (total - done))


def line_due(done: float, total: Optional[float], since_s: float, last_done: float, prev_done: float,
             every: float = PLAIN_EVERY, every_s: float = PLAIN_EVERY_S) -> bool:
    """Whether a plain progress line is due at ``done`` (docs/guide.md#what-a-command-prints): ``every_s`` seconds
    passed since the last line (``last_done``), or ``done`` crossed a multiple of ``every`` × ``total`` in a step
    smaller than that (from ``prev_done``, the previous update): a wait that advances in big steps (an evaluation's
    few passes) gets its lines from the clock only. Example: 60 steps one at a time, a line at 6, 12, ..., 54; 24
    answers in 3 passes of 8, a line only once 15 s passed."""
    if since_s >= every_s:
        return True
    if not total or done <= last_done:
        return False
    step = every * total
    return int(done // step) > int(last_done // step) and done - prev_done < step


def fmt_duration(seconds: float) -> str:
    """``12 s`` below a minute, ``M:SS`` below an hour, ``H:MM:SS`` above."""
    s = int(round(seconds))
    if s < 60:
        return f"{s} s"
    h, rest = divmod(s, 3600)
    return f"{h}:{rest // 60:02d}:{rest % 60:02d}" if h else f"{rest // 60}:{rest % 60:02d}"


class Wait:
    """One long wait shown as plain lines on the ``graftzoo`` logger (module docstring). ``update(done, info)``
    reports progress (``done`` of ``total`` ``unit``; ``info``: a short text such as the loss); ``finish(info)``
    ends it (a ``with`` block finishes it, and says so when it stops on an error). ``start``: the units done before
    it began (a resumed run's steps: the pace counts the rest only); ``clock``: a test's clock."""

    def __init__(self, what: str, total: Optional[float] = None, unit: str = "", note: str = "",
                 detail: bool = True, emit: Optional[Callable[[str], None]] = None, start: float = 0,
                 clock: Callable[[], float] = time.monotonic):
        self.what, self.total, self.unit, self.detail = what, total, unit, detail
        self.emit = emit or log.info
        self.clock = clock
        self.t0 = self.last_t = clock()
        self.base = self.done = self.last_done = start
        self.lines = 0
        self.closed = False
        self.start_line(note)

    def start_line(self, note: str) -> None:
        self.emit(f"{self.what} ..." + (f" ({note})" if note else ""))

    def progress_text(self, done: float, info: str = "") -> str:
        """``3/10 steps, 0:45 left | info``."""
        text = f"{done:g}/{self.total:g}" if self.total is not None else f"{done:g}"
        text += f" {self.unit}" if self.unit else ""
        left = time_left(done - self.base, None if self.total is None else self.total - self.base,
                         self.clock() - self.t0)
        if left is not None and done < (self.total or 0):
            text += f", {fmt_duration(left)} left"
        return text + (f" | {info}" if info else "")

    def update(self, done: float, info: str = "") -> None:
        now = self.clock()
        unfinished = self.total is None or done < self.total   # the end line says the rest
        if self.detail and unfinished and line_due(done, self.total, now - self.last_t, self.last_done, self.done):
            self.emit(f"{self.what}: {self.progress_text(done, info)}")
            self.last_t, self.last_done = now, done
            self.lines += 1
        self.done = done

    def finish(self, info: str = "", failed: bool = False) -> None:
        if self.closed:
            return
        self.closed = True
        took = self.clock() - self.t0
        if failed:
            self.emit(f"{self.what}: stopped after {fmt_duration(took)}")
        elif took >= SHORT_S or self.lines:
            self.emit(f"{self.what}: done in {fmt_duration(took)}" + (f" | {info}" if info else ""))

    def __enter__(self) -> "Wait":
        return self

    def __exit__(self, kind, value, tb) -> None:
        self.finish(failed=kind is not None)


_DISPLAY: dict = {"display": None, "detail": True}   # what ``showing`` installed, for the whole process


def wait(what: str, total: Optional[float] = None, unit: str = "", note: str = "") -> Wait:
    """A wait reported to the display ``showing`` installed (plain lines by default); use it as a context."""
    state = _DISPLAY
    display = state["display"]
    if display is not None and not hasattr(display, "start"):  # a factory: made at the first wait
        display = state["display"] = display()
    if display is not None and state["detail"]:
        return display.start(what, total=total, unit=unit, note=note)
    return Wait(what, total, unit, note, detail=state["detail"])


@contextlib.contextmanager
def showing(display=None, detail: bool = True):
    """While active, ``wait`` reports to ``display`` (an object whose ``start(what, total=, unit=, note=)`` returns
    a ``Wait``-like object, or a function that makes one at the first wait; None: plain lines); ``detail=False``:
    start and end lines only, no display."""
    saved = dict(_DISPLAY)
    _DISPLAY.update(display=display, detail=detail)
    try:
        yield
    finally:
        _DISPLAY.update(saved)


class StderrHandler(logging.StreamHandler):
    """A logging handler on whatever ``sys.stderr`` is when a record is written (a command's stderr, or a test's
    capture of it), one message per line."""

    def __init__(self):
        super().__init__()
        self.setFormatter(logging.Formatter("%(message)s"))

    @property
    def stream(self):
        return sys.stderr

    @stream.setter
    def stream(self, value):  # StreamHandler sets it once; the current sys.stderr is always used
        pass


def log_to_stderr(logger: Optional[logging.Logger] = None) -> None:
    """Give the ``graftzoo`` logger (once) a handler that prints its INFO and above on stderr, one line each."""
    logger = logger or log
    if not logger.handlers:
        logger.addHandler(StderrHandler())
        logger.setLevel(logging.INFO)
        logger.propagate = False


# the libraries' settings that quiet them, read when they are imported (here and in child processes)
QUIET_ENV = {"HF_HUB_DISABLE_PROGRESS_BARS": "1", "TRANSFORMERS_VERBOSITY": "error",
             "TRANSFORMERS_NO_ADVISORY_WARNINGS": "1", "WANDB_SILENT": "true"}
# the packages whose Python warnings are hidden unless --debug (graftzoo's own warnings are log lines)
NOISY = r"(transformers|huggingface_hub|torch|tokenizers|safetensors|accelerate|wandb|pydantic|gymnasium|vllm|ray)\b"


def _quiet_loaded() -> Callable[[], None]:
    """Quiet transformers and huggingface_hub where they are imported already (the settings of QUIET_ENV only act at
    import); returns what restores them."""
    undo = []
    if "transformers" in sys.modules:
        hf = importlib.import_module("transformers.utils.logging")
        level, bars = hf.get_verbosity(), hf.is_progress_bar_enabled()
        hf.set_verbosity_error()
        hf.disable_progress_bar()
        undo.append(lambda: (hf.set_verbosity(level), hf.enable_progress_bar() if bars else None))
    if "huggingface_hub" in sys.modules:
        hub = importlib.import_module("huggingface_hub.utils")
        hub_bars = not hub.are_progress_bars_disabled()
        hub.disable_progress_bars()
        undo.append(lambda: hub.enable_progress_bars() if hub_bars else None)
    return lambda: [f() for f in undo]


_LIBRARIES = {"shown": False}   # inside quiet_libraries(debug=True)


def libraries_shown() -> bool:
    """Whether the libraries' own output is asked for (``graftzoo --debug``): code that quiets a library call by
    call (a model load's "Loading weights" bar) leaves it then."""
    return _LIBRARIES["shown"]


@contextlib.contextmanager
def quiet_libraries(debug: bool = False, every_warning: bool = False):
    """Unless ``debug``: the libraries' progress bars, logging below errors and Python warnings off (module
    docstring), in this process and, through the environment (``QUIET_ENV``, where not set already), in the child
    processes it starts; restored on exit. ``every_warning``: every Python warning off, children included
    (``PYTHONWARNINGS=ignore``; the demo, which prints its own progress only); otherwise only those of the
    ``NOISY`` packages."""
    if debug:
        _LIBRARIES["shown"] = True
        try:
            yield
        finally:
            _LIBRARIES["shown"] = False
        return
    env = {**QUIET_ENV, **({"PYTHONWARNINGS": "ignore"} if every_warning else {})}
    saved = {k: os.environ.get(k) for k in env}
    for k, v in env.items():
        os.environ.setdefault(k, v)
    restore = _quiet_loaded()
    try:
        with warnings.catch_warnings():
            if every_warning:
                warnings.simplefilter("ignore")
            else:
                warnings.filterwarnings("ignore", module=NOISY)
            yield
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
        restore()


__all__ = ["QUIET_ENV", "StderrHandler", "Wait", "fmt_duration", "libraries_shown", "line_due", "log_to_stderr",
           "quiet_libraries", "showing", "time_left", "wait"]
