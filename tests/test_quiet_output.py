"""What `graftzoo train` prints when its output goes to a pipe (a log file, CI): the summary's held-out score before ->
after training, as metrics.jsonl has them; a status line as each long wait starts (the warm-up, loading a model,
each evaluation) and the warm-up's progress (steps done / total, time left); none of the libraries' progress bars
or warnings, while graftzoo's own warnings still show; every line whole, without control characters.

One run of the micro pair, as a user starts it (a child process, stderr a pipe, none of the settings that quiet the
libraries, an empty model cache so that the warm-up runs), shared by the module."""
import json
import os
import re
import subprocess
import sys

import pytest

from graftzoo.api import summary_lines
from graftzoo.eval.evaluate import fmt_score

MODELS = ("micro-qwen-char", "micro-gpt2-pair")
ARGS = ["train", "--algo", "grpo", "--pair", "micro", "--set", "run.steps=1", "--set", "eval.size=4",
        "--set", "run.eval_at_start=true", "--set", "run.progress=true"]
# what the libraries print when nothing quiets them
NOISE = ("Loading checkpoint shards", "Loading weights", "attention_mask", "[transformers]", "it/s]", "Warning:",
         "FutureWarning", "UserWarning", "wandb:")
# each line graftzoo prints on stderr while training the micro pair starts with one of these
OURS = ("loading model ", "warm-up of ", "evaluating ", "training grpo on micro", "placement of model ")


def _env(tmp_path) -> dict:
    env = {k: v for k, v in os.environ.items()
           if k not in ("TRANSFORMERS_VERBOSITY", "HF_HUB_DISABLE_PROGRESS_BARS", "PYTHONWARNINGS", "GRAFTZOO_DEBUG",
                        "WANDB_SILENT", "TRANSFORMERS_NO_ADVISORY_WARNINGS", "COLUMNS")}
    env.update(GRAFTZOO_CACHE=str(tmp_path / "cache"), WANDB_MODE="offline", PYTHONUNBUFFERED="1")
    return env


def _graftzoo(args, env, cwd):
    return subprocess.run([sys.executable, "-m", "graftzoo.apps.cli", *args], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=600)


@pytest.fixture(scope="module")
def ran(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("quiet")
    run_dir = tmp / "run"
    out = _graftzoo([*ARGS, "--run-dir", str(run_dir)], _env(tmp), tmp)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    return out, run_dir, tmp


def _metrics(run_dir) -> list:
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


def test_the_summary_shows_the_held_out_score_before_and_after_training(ran):
    out, run_dir, _ = ran
    rows = _metrics(run_dir)
    for m in MODELS:
        evals = [r for r in rows if r["model"] == m and r.get("eval/avg") is not None]
        before, after = evals[0], evals[-1]
        assert before["step"] == -1 and after["step"] == 1   # step -1: before training; run.steps: the final one
        got = re.search(rf"^  {m}\s+held-out avg@2 (\S+) -> (\S+) \(([+-]\d+\.\d)\)  greedy (\S+) -> (\S+) ",
                        out.stdout, re.M)
        assert got, out.stdout
        assert got.group(1, 2) == (fmt_score(before["eval/avg"]), fmt_score(after["eval/avg"]))
        assert got.group(3) == f"{100 * (after['eval/avg'] - before['eval/avg']):+.1f}"
        assert got.group(4, 5) == (fmt_score(before["eval/greedy"]), fmt_score(after["eval/greedy"]))


def test_no_library_bars_or_warnings_and_our_own_warnings_still_show(ran):
    out, run_dir, tmp = ran
    text = out.stdout + out.stderr
    assert not [n for n in NOISE if n in text], text[-3000:]
    again = _graftzoo([*ARGS, "--run-dir", str(run_dir)], _env(tmp), tmp)   # a finished run: a warning of ours
    assert again.returncode == 0 and "this run is finished (summary.json says done), nothing to do" in again.stderr
    assert not [n for n in NOISE if n in again.stdout + again.stderr], again.stderr


def test_each_long_wait_says_when_it_starts(ran):
    err = ran[0].stderr.splitlines()
    for m in MODELS:
        assert f"loading model {m} ... (kind tiny)" in err, err
        for when in ("before training", "after training"):
            assert f"evaluating {m} on the held-out split {when} ... (4 problems, 3 answers each)" in err, err
    # the order a user sees: each model loaded, both evaluated before training, trained, both evaluated after it
    first = [next(i for i, line in enumerate(err) if line.startswith(p)) for p in
             ("loading model micro-gpt2-pair", "evaluating micro-qwen-char on the held-out split before",
              "training grpo on micro", "evaluating micro-qwen-char on the held-out split after")]
    assert first == sorted(first), err


def test_the_first_warm_up_shows_steps_done_of_total_and_the_time_left(ran):
    err = ran[0].stderr.splitlines()
    for m in MODELS:
        assert any(line.startswith(f"warm-up of {m} ... (once: cached in ") for line in err), err
        done = [int(x) for x in re.findall(rf"^warm-up of {m}: (\d+)/60 steps, (?:\d+ s|\d+:\d\d) left \| loss \d",
                                            "\n".join(err), re.M)]
        assert set(range(6, 60, 6)) <= set(done) and done == sorted(set(done)), err   # a line each tenth of 60 steps
        assert any(re.match(rf"warm-up of {m}: done in .* \| 60 steps, greedy probe add ", line) for line in err), err


def test_piped_output_is_whole_lines_without_control_characters(ran):
    out, run_dir, _ = ran
    assert "\x1b" not in out.stdout + out.stderr and "\r" not in out.stdout + out.stderr
    assert out.stdout.splitlines() == summary_lines(run_dir)   # the summary as written, no line cut at 80 columns
    strays = [line for line in out.stderr.splitlines() if not line.startswith(OURS)]
    assert not strays, strays   # a wrapped line would leave a fragment that starts with none of them
    long = [line for line in out.stderr.splitlines() if line.startswith("placement of model")]
    assert len(long) == 2 and all(len(line) > 120 and line.endswith("freed after it") for line in long), long
