"""Graceful preemption: SIGTERM (what a cluster scheduler sends) and SIGINT (Ctrl-C).

The first signal asks the run to stop: the trainer finishes the step in progress, writes a checkpoint of it, sets
the run's status to "interrupted" and raises :class:`Interrupted` (exit code 128 + signal: 143 for SIGTERM, 130 for
SIGINT). A second signal stops at once (the step in progress is abandoned; the last checkpoint stays the resume
point). Rerunning the same command resumes.
"""
from __future__ import annotations

import logging
import signal
import threading
from typing import Optional

log = logging.getLogger("graftzoo")

SIGNALS = (signal.SIGTERM, signal.SIGINT)


class Interrupted(KeyboardInterrupt):
    """The run stopped on a signal. ``checkpoint``: the checkpoint to resume from (None when none was written)."""

    def __init__(self, signum: int, step: int, checkpoint=None, at_once: bool = False):
        self.signum, self.step, self.checkpoint = signum, step, checkpoint
        self.exit_code = 128 + int(signum)
        name = signal.Signals(signum).name
        if at_once:
            text = f"stopped at once on a second {name}"
        else:
            text = f"interrupted by {name} after step {step}"
        text += (f"; checkpoint {checkpoint}; rerun the same command to resume" if checkpoint is not None
                 else "; no checkpoint yet: a rerun starts from the beginning")
        super().__init__(text)


class StopRequest:
    """Context manager: while active (main thread only), the first SIGTERM / SIGINT sets ``signum`` and the
    second raises :class:`Interrupted` where the program is. Previous handlers are restored on exit."""

    def __init__(self):
        self.signum: Optional[int] = None
        self.last_checkpoint = None   # kept current by the trainer, for the at-once message
        self.step = -1
        self._previous: dict = {}

    def __enter__(self) -> "StopRequest":
        if threading.current_thread() is threading.main_thread():
            for s in SIGNALS:
                self._previous[s] = signal.signal(s, self._handle)
        return self

    def _handle(self, signum, frame):
        if self.signum is not None:
            raise Interrupted(signum, self.step, self.last_checkpoint, at_once=True)
        self.signum = signum
        log.warning("received %s: finishing the current step, then saving a checkpoint and stopping "
                    "(send it again to stop at once)", signal.Signals(signum).name)

    def __exit__(self, *exc) -> None:
        for s, handler in self._previous.items():
            signal.signal(s, handler)
        self._previous = {}
