"""Faults a new user meets, driven through the ``graftzoo`` command: a run directory belongs to one run, a changed
config is refused on resume, a diverging run fails loudly, signals stop a run cleanly and a rerun resumes it exactly,
checkpoints load safely and survive corruption, and every anticipated error is one line naming its culprit (no
traceback). In real subprocesses where the process is the point (signals, a second process on the run directory, a
plugin on PYTHONPATH, a full disk, another user); the rest through click's runner in this process
(``helpers.cli_here``: the same command, its stderr and log lines, without an interpreter start per call)."""
import json
import os
import pickle
import shlex
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
import yaml

from graftzoo.training.run.checkpoint import list_checkpoints
from graftzoo.contract.config import load_config
from graftzoo.training.run.rundir import RunDirError
from graftzoo.training.trainer import Trainer, train
from helpers import cli_here, one_line_error, plugin_site

ENV = dict(os.environ, PYTHONUNBUFFERED="1", WANDB_MODE="offline", HF_HUB_OFFLINE="1")
MICRO = ["train", "--algo", "grpo", "--pair", "micro", "--no-track"]
MODELS = ("micro-qwen-char", "micro-gpt2-pair")


def train_args(out, *sets, name="x"):
    args = [*MICRO, "--set", f"run.out_dir={out}", "--set", f"run.name={name}", "--set", "run.eval_at_end=false"]
    for s in sets:
        args += ["--set", s]
    return args




def metric_rows(run_dir):
    return [json.loads(x) for x in (Path(run_dir) / "metrics.jsonl").read_text().splitlines() if x.strip()]


def stored_config(run_dir) -> dict:
    return yaml.safe_load((Path(run_dir) / "config.yaml").read_text())


def summary(run_dir) -> dict:
    return json.loads((Path(run_dir) / "summary.json").read_text())


def final_weights(run_dir) -> dict:
    ck = list_checkpoints(run_dir)[-1]
    return {m: torch.load(ck / f"{m}.pt", weights_only=True)["policy"]["model"] for m in MODELS}


# ------------------------------------------------------------------------------------------------
# 1. --no-resume into a run directory; 2. resume with a changed config
# ------------------------------------------------------------------------------------------------

def test_no_resume_over_a_run_is_refused_and_overwrite_moves_it_aside(tmp_path):
    assert cli_here(*train_args(tmp_path, "run.steps=3")).returncode == 0
    run = tmp_path / "x"
    old_ckpts = [p.name for p in list_checkpoints(run)]
    res = cli_here(*train_args(tmp_path, "run.steps=2"), "--no-resume")
    one_line_error(res, 2, str(run), "--overwrite")
    assert [p.name for p in list_checkpoints(run)] == old_ckpts  # nothing touched

    res = cli_here(*train_args(tmp_path, "run.steps=2"), "--overwrite")
    assert res.returncode == 0, res.stderr[-3000:]
    aside = [p for p in tmp_path.iterdir() if p.name.startswith("x.replaced-")]
    assert len(aside) == 1 and [p.name for p in list_checkpoints(aside[0])] == old_ckpts  # the old run, intact
    assert [p.name for p in list_checkpoints(run)] == ["step_000000", "step_000001"]  # the new run's own
    assert sorted({r["step"] for r in metric_rows(run)}) == [0, 1]
    stored = sorted(int(p.stem.split("_")[1]) for p in (run / "store" / MODELS[0]).glob("step_*.parquet"))
    assert stored == [0, 1]


def test_resume_with_a_changed_config_is_refused_unless_allowed(tmp_path):
    assert cli_here(*train_args(tmp_path, "run.steps=1", "run.save_every=1")).returncode == 0
    run = tmp_path / "x"
    res = cli_here(*train_args(tmp_path, "run.steps=2", "optim.lr=5e-4", "run.seed=3"))
    line = one_line_error(res, 2, "optim.lr: 0.0001 -> 0.0005", "run.seed: 0 -> 3", "--allow-config-change")
    assert "run.steps" not in line  # a longer run is not a change of identity
    assert len(metric_rows(run)) == 2 and stored_config(run)["optim"]["lr"] == 1e-4  # nothing touched

    res = cli_here(*train_args(tmp_path, "run.steps=2", "optim.lr=5e-4"), "--allow-config-change", "optim.lr")
    assert res.returncode == 0, res.stderr[-3000:]
    assert "continuing from step_000000 under a changed config" in res.stderr
    lrs = {r["step"]: r["lr"] for r in metric_rows(run)}
    assert lrs[0] == pytest.approx(1e-4) and lrs[1] == pytest.approx(5e-4)  # the optimizer uses the new lr
    assert stored_config(run)["optim"]["lr"] == 5e-4


# ------------------------------------------------------------------------------------------------
# 3. a diverging run; values that cannot train
# ------------------------------------------------------------------------------------------------

@pytest.mark.slow
def test_a_diverging_run_fails_before_the_update_and_keeps_nan_visible(tmp_path):
    site = plugin_site(tmp_path)
    args = [a if a != "grpo" else "no_eps" for a in train_args(tmp_path, "run.steps=4", "run.save_every=1")]
    res = subprocess.run([sys.executable, "-m", "graftzoo.apps.cli", *args], capture_output=True, text=True,
                         env=dict(ENV, PYTHONPATH=str(site)), timeout=300)
    one_line_error(res, 1, "non-finite loss", "step 0")
    run = tmp_path / "x"
    s = summary(run)
    assert s["status"] == "failed" and "non-finite loss" in s["error"]
    raw = (run / "metrics.jsonl").read_text()
    assert '"loss": NaN' in raw  # visible, not null
    assert list_checkpoints(run) == []  # nothing of the bad update is saved


@pytest.mark.parametrize("override,key", [
    ("rollout.temperature=0", "rollout.temperature"),
    ("run.steps=[1,2", "run.steps"),
    ("optim.minibatches=100", "optim.minibatches"),
    ("eval.k=0", "eval.k"),
])
def test_values_that_cannot_train_are_one_line_errors_before_any_model_is_built(tmp_path, override, key):
    res = cli_here(*train_args(tmp_path, override))
    one_line_error(res, 2, key)
    assert not (tmp_path / "x").exists()


def test_a_peer_algorithm_without_a_peer_fails_before_models_are_built(tmp_path):
    t = time.perf_counter()
    res = cli_here("train", "--algo", "graft", "--pair", "micro", "--no-track", "--set", f"run.out_dir={tmp_path}")
    one_line_error(res, 2, "--peer")
    assert not any(tmp_path.iterdir())
    print(f"graft without --peer rejected in {time.perf_counter() - t:.1f} s")


def test_data_file_and_option_errors_are_one_line(tmp_path):
    bad = tmp_path / "broken.jsonl"
    bad.write_text('{"question": "1+1?", "answer": "2"}\n{"question": "2+2?"\n')
    res = cli_here(*MICRO, "--set", f"run.out_dir={tmp_path}", "--set", "task.env=graftzoo/MathReasoning-v0",
                   "--set", f"task.dataset={bad}")
    one_line_error(res, 2, "task.dataset", "broken.jsonl:2")
    res = cli_here(*MICRO, "--peer", "stored:")
    one_line_error(res, 2, "stored")
    run = tmp_path / "garbled"
    run.mkdir()
    (run / "config.yaml").write_text("run: {steps: [1, 2\n")
    (run / "checkpoints" / "step_000000").mkdir(parents=True)
    res = cli_here("eval", "--ckpt", run)
    one_line_error(res, 1, "garbled/config.yaml", "invalid YAML")


# ------------------------------------------------------------------------------------------------
# 5. two processes; 6. signals
# ------------------------------------------------------------------------------------------------

def _start(tmp_path, *sets):
    cmd = [sys.executable, "-m", "graftzoo.apps.cli", *train_args(tmp_path, *sets)]
    return subprocess.Popen(cmd, env=ENV, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)


def _wait_for_step(run_dir, step, proc, limit=240):
    deadline = time.time() + limit
    while time.time() < deadline:
        if (run_dir / "metrics.jsonl").exists() and any(r["step"] >= step for r in metric_rows(run_dir)):
            return
        assert proc.poll() is None, proc.communicate()
        time.sleep(0.1)
    raise AssertionError(f"no step {step} within {limit} s")


@pytest.mark.slow
def test_lock_then_sigterm_checkpoints_and_the_rerun_equals_an_uninterrupted_run(tmp_path):
    steps = ["run.steps=30", "run.save_every=7"]
    proc = _start(tmp_path, *steps)
    run = tmp_path / "x"
    try:
        _wait_for_step(run, 1, proc)
        # a second process on the same run directory (this one, through the Python API: refused at once, while the
        # run is surely still going; the CLI prints the same message as its one Error: line)
        with pytest.raises(RunDirError, match=f"in use by pid {proc.pid}"):
            Trainer(load_config(pair="micro", algo="grpo", overrides=[
                f"run.out_dir={tmp_path}", "run.name=x", "run.track=false", "run.eval_at_end=false", *steps]))
        os.kill(proc.pid, signal.SIGTERM)
        _, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    assert proc.returncode == 143, err[-3000:]
    assert "interrupted by SIGTERM" in err and "Traceback" not in err
    s = summary(run)
    assert s["status"] == "interrupted"
    done = max(r["step"] for r in metric_rows(run))
    assert list_checkpoints(run)[-1].name == f"step_{done:06d}"  # the last completed step is saved
    assert done < 29

    res = cli_here(*train_args(tmp_path, *steps))  # rerun the same command: resumes
    assert res.returncode == 0, res.stderr[-3000:]
    assert "took over the lock" not in res.stderr  # the interrupted run released it cleanly
    ref = train(load_config(pair="micro", algo="grpo", overrides=[
        f"run.out_dir={tmp_path}", "run.name=ref", "run.track=false", "run.eval_at_end=false", *steps]))
    a, b = final_weights(run), final_weights(ref)
    assert all(torch.equal(a[m][k], b[m][k]) for m in MODELS for k in a[m])


@pytest.mark.slow
def test_second_sigint_stops_at_once_and_a_stale_lock_is_taken_over(tmp_path):
    run = tmp_path / "x"
    run.mkdir()
    (run / ".lock").write_text(json.dumps({"pid": 999999, "host": "gone", "since": "yesterday"}))
    proc = _start(tmp_path, "run.steps=200", "run.save_every=100")
    try:
        _wait_for_step(run, 0, proc)
        os.kill(proc.pid, signal.SIGINT)
        os.kill(proc.pid, signal.SIGINT)
        _, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    assert "took over the lock left by pid 999999 on host gone" in err
    assert proc.returncode == 130, err[-3000:]
    assert "Traceback" not in err
    assert summary(run)["status"] == "interrupted"


# ------------------------------------------------------------------------------------------------
# 4. safe loading; 7. corruption
# ------------------------------------------------------------------------------------------------

class _Planted:
    def __init__(self, marker):
        self.marker = marker

    def __reduce__(self):
        return (os.system, (f"touch {self.marker}",))


def test_a_planted_pickle_does_not_run_on_eval(tmp_path):
    assert cli_here(*train_args(tmp_path, "run.steps=1")).returncode == 0
    ck = list_checkpoints(tmp_path / "x")[-1]
    marker = tmp_path / "pwned"
    with open(ck / f"{MODELS[0]}.pt", "wb") as f:
        pickle.dump({"policy": _Planted(marker)}, f)
    res = cli_here("eval", "--ckpt", ck, "--limit", "2")
    one_line_error(res, 1, f"{MODELS[0]}.pt")
    assert not marker.exists()


def test_corrupt_latest_checkpoint_torn_metrics_and_leftovers_resume_from_the_intact_one(tmp_path):
    assert cli_here(*train_args(tmp_path, "run.steps=3", "run.save_every=1", "run.keep_checkpoints=3")).returncode == 0
    run = tmp_path / "x"
    latest = list_checkpoints(run)[-1]
    data = (latest / f"{MODELS[1]}.pt").read_bytes()
    (latest / f"{MODELS[1]}.pt").write_bytes(data[: len(data) // 2])  # truncated
    with open(run / "metrics.jsonl", "a") as f:
        f.write('{"step": 3, "model": "micro-qw')  # torn by a kill
    leftover = run / "checkpoints" / ".tmp-step_000003-12345"
    leftover.mkdir()
    (leftover / "x.pt").write_bytes(b"0" * 1000)

    res = cli_here(*train_args(tmp_path, "run.steps=4", "run.save_every=1", "run.keep_checkpoints=3"))
    assert res.returncode == 0, res.stderr[-3000:]
    assert latest.name in res.stderr and "torn last line" in res.stderr and ".tmp-step_000003" in res.stderr
    assert not leftover.exists()
    assert list(run.glob("checkpoints/*corrupt*")), "the corrupt checkpoint is kept aside, not deleted"
    steps = [(r["step"], r["model"]) for r in metric_rows(run)]
    assert steps == list(dict.fromkeys(steps)) and [s for s, _ in steps] == sorted(s for s, _ in steps)
    assert {s for s, _ in steps} == {0, 1, 2, 3}
    ref = train(load_config(pair="micro", algo="grpo", overrides=[
        f"run.out_dir={tmp_path}", "run.name=ref", "run.track=false", "run.eval_at_end=false", "run.steps=4"]))
    a, b = final_weights(run), final_weights(ref)
    assert all(torch.equal(a[m][k], b[m][k]) for m in MODELS for k in a[m])


def test_corrupt_store_meta_names_the_file(tmp_path):
    assert cli_here(*train_args(tmp_path, "run.steps=1")).returncode == 0
    (tmp_path / "x" / "store" / "meta.json").write_text("{not json")
    res = cli_here(*train_args(tmp_path, "run.steps=2"))
    one_line_error(res, 1, "meta.json")


# ------------------------------------------------------------------------------------------------
# 9. disk full, read-only run directory
# ------------------------------------------------------------------------------------------------

@pytest.mark.slow
@pytest.mark.skipif(os.geteuid() != 0 or not shutil.which("unshare"), reason="needs root to mount a small tmpfs")
def test_a_full_disk_is_one_line_naming_the_run_directory(tmp_path):
    """The run directory on a 400 KiB tmpfs (in a private mount namespace): the first checkpoint fills it."""
    out = tmp_path / "small"
    out.mkdir()
    inner = " ".join(shlex.quote(a) for a in [sys.executable, "-m", "graftzoo.apps.cli",
                                               *train_args(out, "run.steps=3", "run.save_every=1")])
    script = f"mount -t tmpfs -o size=400k tmpfs {shlex.quote(str(out))} && {inner}; rc=$?; " \
             f"cat {shlex.quote(str(out / 'x' / 'summary.json'))}; exit $rc"
    res = subprocess.run(["unshare", "-m", "--propagation", "private", "sh", "-c", script], env=ENV,
                         capture_output=True, text=True, timeout=300)
    if "mount:" in res.stderr and "Error:" not in res.stderr:
        pytest.skip(f"cannot mount a tmpfs here: {res.stderr.strip()[:200]}")
    one_line_error(res, 1, str(out / "x"), "no space left on device")
    assert '"status": "failed"' in res.stdout  # the summary still says what happened


@pytest.mark.slow
@pytest.mark.skipif(os.geteuid() != 0 or not shutil.which("setpriv"),
                    reason="needs root to drop to an unprivileged user (root ignores directory permissions)")
def test_a_read_only_run_directory_is_one_line(tmp_path):
    out = tmp_path / "out"
    (out / "x").mkdir(parents=True)
    home = tmp_path / "home"
    home.mkdir()
    for p in (tmp_path, out, home):
        p.chmod(0o777)
    (out / "x").chmod(0o555)
    cmd = ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", sys.executable, "-m", "graftzoo.apps.cli",
           *train_args(out, "run.steps=1")]
    env = dict(ENV, HOME=str(home), TMPDIR=str(home))
    res = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300)
    if "Permission denied" in res.stderr and "import" in res.stderr.lower() and "Error:" not in res.stderr:
        pytest.skip("the unprivileged user cannot read the installation")
    one_line_error(res, 1, str(out / "x"))
