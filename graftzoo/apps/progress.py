"""The training progress bar of ``graftzoo train`` (rich).

Step/total and the time left come first, so an 80-column terminal always shows them; the run's label and the
per-model figures (reward accuracy, all-fail fraction, tokens/s) follow in one column that takes the width left
and is cut with an ellipsis where it does not fit.
"""
from __future__ import annotations

from typing import Optional

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn
from rich.table import Column

from graftzoo.contract import metrics as M


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


class ProgressPrinter:
    """A rich progress bar: step/total, time left, a short bar, then the label and per-model info (``close`` stops
    it, also when the run ends early). ``console``: where it draws (default: the terminal)."""

    def __init__(self, label: str, console: Optional[Console] = None):
        self.label, self.console, self.bar, self.task = label, console, None, None

    def _make(self, total: int):
        self.bar = Progress(MofNCompleteColumn(), TimeRemainingColumn(compact=True, elapsed_when_finished=True),
                            BarColumn(bar_width=12),
                            TextColumn("[bold]{task.description}[/] {task.fields[info]}",
                                       table_column=Column(no_wrap=True, overflow="ellipsis", ratio=1)),
                            console=self.console, transient=False, expand=True)
        self.bar.start()
        self.task = self.bar.add_task(self.label, total=total, info="")

    def __call__(self, step, total, mets):
        if self.bar is None:
            self._make(total)
        self.bar.update(self.task, completed=step + 1, info=model_info(mets))
        self.bar.refresh()
        if step + 1 >= total:
            self.close()

    def close(self):
        if self.bar is not None:
            self.bar.stop()
            self.bar = None
