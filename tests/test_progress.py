"""The progress display: the training bar keeps step/total and the time left visible in an 80-column terminal; the
long waits (warm-up, loading, evaluation) as rich rows on a terminal and plain lines elsewhere; the libraries kept
quiet."""
import io
import re
import sys
import time
import warnings

import click
import pytest
from rich.console import Console

from graftzoo.apps.progress import ProgressPrinter, model_info, short_model
from graftzoo.contract import output
from graftzoo.contract.output import Wait, fmt_duration, line_due, time_left
from graftzoo.training.eval_runner import eval_answers, evaluating

ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")
METS = {"tiny-qwen-char-with-a-long-name": {"reward/acc": 0.25, "groups/all_fail": 0.5, "perf/tokens_per_s": 1200.0},
        "org/tiny-gpt2-pair": {"reward/acc": 0.75, "groups/all_fail": 0.125, "perf/tokens_per_s": 34.0}}


def _frames(buf: io.StringIO) -> list:
    """The drawn lines, escape codes removed (each redraw starts with a carriage return)."""
    text = ANSI.sub("", buf.getvalue())
    return [f for line in text.splitlines() for f in line.split("\r") if f.strip()]


def test_step_and_eta_fit_in_80_columns():
    buf = io.StringIO()
    bar = ProgressPrinter("graft on tiny", console=Console(width=80, file=buf, force_terminal=True))
    for step in range(3):
        bar(step, 10, METS)
        time.sleep(0.05)  # rich estimates the time left from the speed of the last updates
    bar.close()
    last = _frames(buf)[-1]
    assert len(last) <= 80
    assert re.match(r"\s*3/10 \d+:\d\d ", last), last           # step/total, then the time left, first
    assert "graft on tiny" in last and "tiny-qwen-c… r=0.25 af=0.50" in last
    assert last.rstrip().endswith("…")                           # the rest is cut, not wrapped
    assert bar.bar is None


def test_model_info_is_compact():
    assert short_model("org/tiny-gpt2-pair") == "tiny-gpt2-p…" and short_model("micro") == "micro"
    assert model_info(METS) == "tiny-qwen-c… r=0.25 af=0.50 | tiny-gpt2-p… r=0.75 af=0.12 | 1234 tok/s"
    assert model_info({"m": {"reward/acc": None, "groups/all_fail": None, "perf/tokens_per_s": None}}) == "m r=0.00 af=0.00"


# ---------------------------------------------------------------------------------------------
# the long waits (graftzoo.contract.output) and their display
# ---------------------------------------------------------------------------------------------

class Clock:
    def __init__(self):
        self.t = 0.0

    def __call__(self):
        return self.t


def test_time_left_and_when_a_plain_line_is_due():
    assert time_left(30, 120, 45.0) == 135.0                      # 30 of 120 steps in 45 s: 135 s left
    assert time_left(0, 120, 5.0) is None and time_left(3, None, 5.0) is None
    # 60 steps one at a time: a line at each tenth
    due = [d for d in range(1, 61) if line_due(d, 60, 0.0, 6 * ((d - 1) // 6), d - 1)]
    assert due == [6, 12, 18, 24, 30, 36, 42, 48, 54, 60]
    # 24 answers in 3 passes of 8: none from the count, one once 15 s passed without a line
    assert not line_due(8, 24, 10.0, 0, 0) and line_due(8, 24, 15.0, 0, 0)
    assert [fmt_duration(s) for s in (4.4, 59.6, 61, 3725)] == ["4 s", "1:00", "1:01", "1:02:05"]


def test_a_wait_in_plain_lines_start_progress_time_left_end():
    lines, clock = [], Clock()
    w = Wait("warm-up of m", 60, "steps", note="once", emit=lines.append, clock=clock)
    for step in range(1, 61):
        clock.t += 0.5
        w.update(step, f"loss {1 / step:.2f}")
    w.finish("60 steps")
    assert lines[0] == "warm-up of m ... (once)" and lines[-1] == "warm-up of m: done in 30 s | 60 steps"
    assert lines[1] == "warm-up of m: 6/60 steps, 27 s left | loss 0.17"   # 3 s for 6 steps: 27 s for 54
    assert len(lines) == 11
    quick = []
    with Wait("loading model m", emit=quick.append, clock=Clock()):
        pass
    assert quick == ["loading model m ..."]          # a short wait without progress: its start line only
    failed = []
    with pytest.raises(RuntimeError), Wait("evaluating m", 24, emit=failed.append, clock=Clock()):
        raise RuntimeError("boom")
    assert failed[-1] == "evaluating m: stopped after 0 s"
    resumed, clock = [], Clock()
    w = Wait("training", 20, "steps", emit=resumed.append, start=10, clock=clock)
    clock.t = 16.0
    w.update(12)
    assert resumed[-1] == "training: 12/20 steps, 1:04 left"   # the pace of this process's 2 steps, not of 12


def test_an_evaluation_counts_the_answers_its_engine_generates():
    request = {"k": 2, "seeds": 1, "greedy": True}
    assert eval_answers(8, request) == 24                          # 8 prompts × (2 × 1 + 1)
    assert eval_answers(8, {**request, "greedy": False, "seeds": 3}) == 48

    class Engine:
        max_new_tokens = 7

        def generate(self, prompts, n, **kw):
            return [[p] * n for p in prompts]

    shown = []
    with output.showing(Recorder(shown)), evaluating("evaluating m on heldout", Engine(), request, 8) as engine:
        assert engine.max_new_tokens == 7                 # the engine's own attributes
        engine.generate(list(range(8)), 2)
        engine.generate(list(range(8)), 1)
    assert shown == [("start", "evaluating m on heldout", 24, "answers", "8 problems, 3 answers each"),
                     ("update", 16), ("update", 24), ("finish",)]


class Recorder:
    """A display that records what it is asked to show."""

    def __init__(self, shown):
        self.shown = shown

    def start(self, what, total=None, unit="", note=""):
        self.shown.append(("start", what, total, unit, note))
        rec = self

        class Row:
            def update(self, done, info=""):
                rec.shown.append(("update", done))

            def finish(self, info="", failed=False):
                rec.shown.append(("finish",))

            def __enter__(self):
                return self

            def __exit__(self, *exc):
                self.finish()
        return Row()


def test_waits_share_the_terminal_display_with_the_training_bar():
    """An evaluation every few steps runs while the training bar is drawn: its row joins the same live display
    (rich allows one), its start and end stay as lines; the display stops when the bar ends."""
    buf = io.StringIO()
    bar = ProgressPrinter("grpo on micro", console=Console(width=100, file=buf, force_terminal=True))
    with output.showing(bar):
        bar(0, 3, METS)
        with output.wait("evaluating m on the held-out split after step 1", 24, "answers") as w:
            assert bar.bar is not None and len(bar.bar.tasks) == 2
            w.update(8)
        assert len(bar.bar.tasks) == 1
        bar(1, 3, METS)
        bar(2, 3, METS)
    assert bar.bar is None
    frames = _frames(buf)
    assert "evaluating m on the held-out split after step 1 ..." in frames
    assert any(re.match(r"\s*8/24 .*evaluating m", f) for f in frames), frames
    assert any(f.startswith("grpo on micro: 3/3 steps in ") for f in frames), frames


def test_elsewhere_the_training_is_plain_lines_never_wrapped():
    buf = io.StringIO()
    bar = ProgressPrinter("grpo on micro", console=Console(width=80, file=buf))   # a pipe: no terminal
    for step in range(20):
        bar(step, 20, METS)
    bar.close()
    text = buf.getvalue()
    assert "\x1b" not in text and "\r" not in text
    lines = text.splitlines()
    assert lines[0] == "training grpo on micro ..."
    steps = [int(m) for m in re.findall(r"^training grpo on micro: (\d+)/20 steps, (?:\d+ s|\d+:\d\d) left \| "
                                         r"tiny-qwen-c… r=0.25 af=0.50 \| tiny-gpt2-p… r=0.75 af=0.12 \| 1234 tok/s$",
                                         text, re.M)]
    assert set(range(2, 20, 2)) <= set(steps) and all(len(line) > 80 for line in lines[1:-1])  # none cut
    assert len(lines) == len(steps) + 2 and lines[-1].startswith("training grpo on micro: done in ")


def test_quiet_libraries_hides_their_warnings_not_ours_and_debug_shows_them():
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with output.quiet_libraries():
            warnings.warn_explicit("noise", UserWarning, "x.py", 1, module="transformers.modeling_utils")
            warnings.warn_explicit("ours", UserWarning, "x.py", 1, module="graftzoo.training.trainer")
            assert not output.libraries_shown()
        with output.quiet_libraries(debug=True):
            warnings.warn_explicit("shown", UserWarning, "x.py", 1, module="transformers.modeling_utils")
            assert output.libraries_shown()
    assert [str(w.message) for w in caught] == ["ours", "shown"]
    assert not output.libraries_shown()


def test_results_piped_to_a_file_stay_in_it_while_the_terminal_shows_a_wait(monkeypatch):
    """`graftzoo eval ... > results.txt` on a terminal: the evaluation's result lines (stdout) go to the file, not
    into the live display on stderr."""
    piped = io.StringIO()
    monkeypatch.setattr(sys, "stdout", piped)
    buf = io.StringIO()
    with output.showing(ProgressPrinter(console=Console(width=80, file=buf, force_terminal=True))):
        with output.wait("evaluating m on heldout", 16, "answers") as w:
            w.update(8)
            click.echo("m  heldout  avg@1 50.0")
    assert piped.getvalue() == "m  heldout  avg@1 50.0\n" and "avg@1" not in buf.getvalue()
