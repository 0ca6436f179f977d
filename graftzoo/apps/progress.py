"""The progress display of the commands (rich): ``graftzoo train``'s training bar, and the long waits of every
command (graftzoo.contract.output: a tiny model's warm-up, loading a model, an evaluation).

Where stderr is a terminal, one live rich display: the training bar puts step/total and the time left first, so an
80-column terminal always shows them; the run's label and the per-model figures (reward accuracy, all-fail
fraction, tokens/s) follow in one column that takes the width left and is cut with an ellipsis where it does not
fit. A wait is a row of its own while it runs (count and time left where it has a total, a pulsing bar where it
has none), its start and end printed as lines above the display. Anywhere else (a pipe, a log file, CI) the same
progress is plain lines (``graftzoo.contract.output.Wait``), never wrapped, without control characters.
"""
from __future__ import annotations

import sys
import threading
import time
from typing import Optional

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn
from rich.table import Column
from rich.text import Text

from graftzoo.contract import metrics as M
from graftzoo.contract.output import Wait, fmt_duration

REDRAW_S = 0.1  # rich's own refresh period (10 per second)


def short_model(model_id: str, width: int = 12) -> str:
    """A model id shortened for the bar: the part after the last "/", at most ``width`` characters."""
    name = model_id.rsplit("/", 1)[-1]
    return name if len(name) <= width else name[:width - 1] + "…"


def model_info(mets: dict) -> str:
    """One compact text for the metrics of a step: per model ``name r=0.25 af=0.50`` (reward accuracy, all-fail
    fraction), then the tokens/s of all models together."""
    parts = [f"{short_model(m)} r={v.get(M.REWARD_ACC) or 0:.2f} af={v.get(M.GROUPS_ALL_FAIL) or 0:.2f}"
             for m, v in mets.items()]
    toks = [v[M.PERF_TOKENS_PER_S] for v in mets.values() if v.get(M.PERF_TOKENS_PER_S) is not None]
    return " | ".join(parts + ([f"{sum(toks):.0f} tok/s"] if toks else []))


def stdout_is_terminal() -> bool:
    """Whether stdout is a terminal: the live display then prints stdout's lines above itself (on its own
    stream, the same screen); a stdout piped to a file is left to write to it."""
    return bool(getattr(sys.stdout, "isatty", lambda: False)())


def stderr_console() -> Console:
    """The console of the progress display: stderr, its lines never wrapped (a pipe is not cut at 80 columns)."""
    return Console(stderr=True, soft_wrap=True)


class CountColumn(MofNCompleteColumn):
    """done/total; nothing for a wait without a total (its bar pulses)."""

    def render(self, task) -> Text:
        return Text("") if task.total is None else super().render(task)


class Row(Wait):
    """A wait drawn as a row of the live display (``ProgressPrinter.start``); its start and end lines as a plain
    ``Wait``'s, printed above the display."""

    def __init__(self, printer: "ProgressPrinter", what: str, total=None, unit: str = "", note: str = ""):
        self.printer = printer
        super().__init__(what, total, unit, note, emit=printer.say)
        self.task = printer.add_row(what, total)

    def update(self, done, info: str = "") -> None:
        self.done = done
        self.printer.update_row(self.task, done, info)

    def finish(self, info: str = "", failed: bool = False) -> None:
        if not self.closed:
            self.printer.remove_row(self.task)
        super().finish(info, failed)


class ProgressPrinter:
    """The progress display (module docstring). Called as ``(step, total, metrics per model)`` it is the trainer's
    progress callback (the training bar, labelled ``label``); ``start(what, total=, unit=, note=)`` shows a wait
    (the display that ``graftzoo.contract.output.showing`` takes); ``close`` stops it, also when the run ends early.
    ``console``: where it draws (default: stderr); a console that is no terminal gets plain lines."""

    def __init__(self, label: str = "", console: Optional[Console] = None):
        self.label, self.console = label, console or stderr_console()
        self.rich = self.console.is_terminal
        self.bar: Optional[Progress] = None   # the live display, while something is drawn
        self.drawn = 0.0   # when update_row last redrew the display (time.monotonic)
        self.task = None                      # the training bar's row (terminal)
        self.training: Optional[Wait] = None  # the training's plain lines (elsewhere)
        self.lock = threading.RLock()

    def say(self, line: str) -> None:
        """One plain line (above the live display, if one is drawn)."""
        self.console.print(line, markup=False, highlight=False, soft_wrap=True)

    def _live(self) -> Progress:
        if self.bar is None:
            self.bar = Progress(CountColumn(), TimeRemainingColumn(compact=True, elapsed_when_finished=True),
                                BarColumn(bar_width=12),
                                TextColumn("[bold]{task.description}[/] {task.fields[info]}",
                                           table_column=Column(no_wrap=True, overflow="ellipsis", ratio=1)),
                                console=self.console, transient=True, expand=True,
                                redirect_stdout=stdout_is_terminal())   # results piped to a file stay in it
            self.bar.start()
        return self.bar

    def _stop_if_idle(self) -> None:
        if self.bar is not None and not self.bar.tasks:
            self.bar.stop()
            self.bar = None

    def add_row(self, what: str, total) -> int:
        with self.lock:
            return self._live().add_task(what, total=total, info="")

    def update_row(self, task: int, done, info: str = "") -> None:
        with self.lock:
            if self.bar is not None:
                now = time.monotonic()  # a warm-up updates every step: redraw at most every REDRAW_S, rich's own
                redraw = now - self.drawn >= REDRAW_S  # refresh draws what comes between
                self.drawn = now if redraw else self.drawn
                self.bar.update(task, completed=done, info=info, refresh=redraw)

    def remove_row(self, task: int) -> None:
        with self.lock:
            if self.bar is not None:
                self.bar.remove_task(task)
                self._stop_if_idle()

    def start(self, what: str, total=None, unit: str = "", note: str = "") -> Wait:
        """A wait shown by this display: a row on a terminal, plain lines elsewhere."""
        if self.rich:
            return Row(self, what, total, unit, note)
        return Wait(what, total, unit, note, emit=self.say)

    def __call__(self, step, total, mets):
        with self.lock:
            last = step + 1 >= total
            if not self.rich:
                if self.training is None:   # its clock starts now, after the first step of this process
                    self.training = Wait(f"training {self.label}", total, "steps", emit=self.say, start=step + 1)
                self.training.update(step + 1, model_info(mets))
                if last:
                    self.training.finish()
                return
            bar = self._live()
            if self.task is None:
                self.task = bar.add_task(self.label, total=total, info="", completed=step)
            bar.update(self.task, completed=step + 1, info=model_info(mets))
            bar.refresh()
            if last:
                self.close()

    def close(self):
        """End the training bar (on a terminal its last state stays, as a line); the display stops once no wait is
        shown."""
        with self.lock:
            if self.task is not None and self.bar is not None:
                t = self.bar.tasks[[x.id for x in self.bar.tasks].index(self.task)]
                self.say(f"{self.label}: {t.completed:g}/{t.total:g} steps in {fmt_duration(t.elapsed or 0)}"
                         + (f" | {t.fields['info']}" if t.fields.get("info") else ""))
                self.bar.remove_task(self.task)
            if self.training is not None:
                self.training.closed = True   # ended early: no "done" line
            self.task = self.training = None
            self._stop_if_idle()
