"""The training progress bar keeps step/total and the time left visible in an 80-column terminal."""
import io
import re
import time

from rich.console import Console

from graftzoo.apps.progress import ProgressPrinter, model_info, short_model

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
