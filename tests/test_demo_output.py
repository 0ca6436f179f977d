"""What `graftzoo demo` prints: its own progress only (the libraries' warnings and progress bars only with --debug;
the quick demo's whole output is checked in tests/test_packaging.py, where the installed wheel runs it), and a
progress bar per run whose clock counts from that run's start."""
import io
import os
import warnings
from types import SimpleNamespace

from rich.console import Console
from rich.progress import TimeElapsedColumn

from graftzoo.apps.demo import QUIET_ENV, RunBars, quiet_libraries

# what the libraries print when the demo does not quiet them
NOISE = ("attention_mask", "Writing model shards", "Loading weights", "Warning", "it/s]")


def _cell(name, steps=2):
    return SimpleNamespace(name=name, config=lambda: SimpleNamespace(run=SimpleNamespace(steps=steps)))


def test_each_bar_counts_from_its_own_run_start():
    clock = [0.0]
    bars = RunBars([_cell("a"), _cell("b")], Console(file=io.StringIO()), get_time=lambda: clock[0])
    a, b = (bars.progress.tasks[bars.tasks[n]] for n in "ab")
    assert a.elapsed is None and b.elapsed is None  # nothing started: no clock yet
    bars.echo("[new] a")
    clock[0] = 400.0
    bars.echo("[done] a (400 s)")
    bars.echo("[resume] b (training resumes from its last checkpoint (step 1))")
    clock[0] = 446.0
    assert b.elapsed == 46.0 and str(TimeElapsedColumn().render(b)) == "0:00:46"  # not 0:07:26, the grid's time
    bars.echo("[FAILED] b (46 s): training failed")
    clock[0] = 900.0
    assert (a.elapsed, b.elapsed) == (400.0, 46.0)  # each stops when its run ends
    out = bars.progress.console.file.getvalue()
    assert "[done] a (400 s)" in out and "[FAILED] b" in out  # printed as text, not eaten as rich markup


def test_debug_leaves_the_libraries_alone_and_quiet_is_undone_on_exit(monkeypatch):
    for k in QUIET_ENV:
        monkeypatch.delenv(k, raising=False)
    with quiet_libraries(debug=True):
        assert not any(k in os.environ for k in QUIET_ENV)
    monkeypatch.setenv("PYTHONWARNINGS", "default")  # a user's setting is kept
    with quiet_libraries():
        assert os.environ["HF_HUB_DISABLE_PROGRESS_BARS"] == "1" and os.environ["PYTHONWARNINGS"] == "default"
        warnings.warn("hidden")  # no error, not shown
    assert "HF_HUB_DISABLE_PROGRESS_BARS" not in os.environ and os.environ["PYTHONWARNINGS"] == "default"
