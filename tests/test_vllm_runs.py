"""Runs with the vLLM engine core in its own process (rollout.vllm.multiprocessing=true, weights streamed to it in
memory, graftzoo.training.engines.weight_stream), driven as a researcher drives them from Python: the run trains to the
end with the engine's log-probs following the updates, no weight file is written (``weight_sync: disk``, the
fallback, is the one that writes one, and says so), and no engine process outlives a run that ends, fails or is
interrupted: the processes are counted while the run holds its engine and again once ``train`` has returned or
raised, with the Python session still alive (vLLM's own exit hooks would hide a leak in a process that exits)."""
import contextlib
import json
import logging
import os
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import psutil
import pytest
import safetensors.torch
from transformers import PreTrainedModel

from graftzoo.contract.config import load_config
from graftzoo.contract.errors import NonFiniteError
from graftzoo.training.run.preemption import Interrupted
from graftzoo.contract.registry import get_algo
from graftzoo.training.planner import build as models_module
from graftzoo.training.learning import step as step_module
from graftzoo.training.trainer import Trainer, train

pytestmark = pytest.mark.slow  # real processes: see pytest.ini

ONE_MODEL = ["pair.train=[micro-qwen-char]", "rollout.engine=vllm", "rollout.vllm.kv_cache_gb=0.0625",
             "rollout.vllm.multiprocessing=true", "run.track=false", "run.eval_at_end=false"]


# processes that live with this Python session by design: the verifier's worker pool and Python's resource tracker
RESIDENT = ("verify_worker.py", "multiprocessing.resource_tracker")


def children() -> set:
    """(pid, command line) of this session's live descendants, except the resident ones."""
    out = set()
    for p in psutil.Process().children(recursive=True):
        try:
            cmd = " ".join(p.cmdline())
            if p.status() != psutil.STATUS_ZOMBIE and not any(r in cmd for r in RESIDENT):
                out.add((p.pid, cmd[:120]))
        except psutil.NoSuchProcess:
            pass
    return out


def engines(procs: set) -> set:
    return {cmd for _, cmd in procs if "VLLM" in cmd}


@contextlib.contextmanager
def watched_engines(monkeypatch):
    """The processes the run's engines started (seen after each train step), and the processes before the run.
    Every engine the trainer builds is held, so that only the trainer's own shutdown can end its process (not the
    garbage collector)."""
    seen, held = [], []
    build = models_module.build_engine

    def holding_build(*a, **kw):
        held.append(build(*a, **kw))
        return held[-1]

    monkeypatch.setattr(models_module, "build_engine", holding_build)
    step = Trainer.train_step

    def counting_step(self, s):
        out = step(self, s)
        seen.append(children())
        return out

    monkeypatch.setattr(Trainer, "train_step", counting_step)
    try:
        yield seen, children()
    finally:
        for engine in held:  # a failed test leaves no process to the rest of the session
            engine.close()


@pytest.fixture
def engine_processes(monkeypatch):
    with watched_engines(monkeypatch) as watched:
        yield watched


def weights_written(monkeypatch) -> list:
    """Spy on every way this process writes model weights to a file: transformers' ``save_pretrained`` and
    safetensors' ``save_file``."""
    written = []

    def spy(real, what):
        def call(*a, **kw):
            written.append(what)
            return real(*a, **kw)
        return call

    monkeypatch.setattr(PreTrainedModel, "save_pretrained", spy(PreTrainedModel.save_pretrained, "save_pretrained"))
    monkeypatch.setattr(safetensors.torch, "save_file", spy(safetensors.torch.save_file, "save_file"))
    return written


def engine_cpu_s(procs: set) -> float:
    """CPU seconds (user + system) the engine's processes among ``procs`` have used so far."""
    total = 0.0
    for pid, cmd in procs:
        if "VLLM" in cmd:
            with contextlib.suppress(psutil.NoSuchProcess):
                t = psutil.Process(pid).cpu_times()
                total += t.user + t.system
    return total


@pytest.fixture(scope="module")
def plain(tmp_path_factory):
    """One uninterrupted 3-step run with the engine core in its own process, watched (``watched_engines``, the
    weight-file spy, the engine's CPU time while idle after step 0): the test below reads what was watched, the
    killed-engine test compares its resumed run's metrics with this run's."""
    out = tmp_path_factory.mktemp("plain")
    with pytest.MonkeyPatch.context() as mp, watched_engines(mp) as (seen, before):
        written = weights_written(mp)
        idle = []  # CPU seconds of the engine's processes in a second with nothing asked of them, after step 0
        step = Trainer.train_step

        def idle_after_first_step(self, s):
            res = step(self, s)
            if s == 0:
                procs = children() - before
                time.sleep(0.2)
                cpu = engine_cpu_s(procs)
                time.sleep(1.0)
                idle.append(engine_cpu_s(procs) - cpu)
            return res

        mp.setattr(Trainer, "train_step", idle_after_first_step)
        run = train(load_config(pair="micro", algo="grpo", overrides=[*ONE_MODEL, f"run.out_dir={out}",
                                                                      "run.name=x", "run.steps=3"]))
        left = children() - before
    return {"run": run, "seen": [s - before for s in seen], "left": left, "written": written, "idle": idle}


def test_the_engine_process_trains_with_the_run_and_ends_with_it(plain):
    seen = plain["seen"]
    assert len(seen) == 3 and all(engines(s) for s in seen)  # an engine process served every step
    assert plain["left"] == set()
    rows = [json.loads(x) for x in (plain["run"] / "metrics.jsonl").read_text().splitlines()]
    steps = [r for r in rows if r.get("time/weight_sync") is not None]
    assert len(steps) == 3 and all(r["rollout/logp_diff_max"] <= 1e-5 for r in steps), steps  # streamed, fp32
    assert plain["written"] == []  # the weights went to the engine's process in memory
    # rollout.vllm.poll_sleep_us auto (CPU): between calls the engine's processes sleep. vLLM's own queue spins a
    # core for a second after each message (the weight sync ended the step): 0.6-0.8 CPU-s here
    idle = plain["idle"]
    assert idle[0] < 0.25, f"the idle engine used {idle[0]:.2f} CPU-s in 1 s"


def test_a_failed_run_ends_its_engine_process(tmp_path, engine_processes, monkeypatch):
    seen, before = engine_processes
    learner = get_algo("grpo")
    advantages = learner.advantages

    def nan_after_first_step(self, ctx, groups):
        groups = advantages(self, ctx, groups)
        if ctx.step >= 1:
            for g in groups:
                g.advantages = [float("nan")] * len(g.rollouts)
        return groups

    monkeypatch.setattr(learner, "advantages", nan_after_first_step)
    with pytest.raises(NonFiniteError):
        train(load_config(pair="micro", algo="grpo", overrides=[*ONE_MODEL, f"run.out_dir={tmp_path}",
                                                                "run.name=x", "run.steps=3"]))
    assert len(seen) == 1 and engines(seen[0] - before)
    assert children() - before == set()


def test_an_interrupted_run_ends_its_engine_process_and_the_disk_fallback_says_why(tmp_path, engine_processes,
                                                                                    monkeypatch, caplog):
    """SIGTERM during step 1: the run finishes the step, checkpoints, stops and ends its engine process. The run
    syncs its weights through the disk fallback (``weight_sync: disk``): it says why, writes the folder, and the
    engine follows the weights as closely as the stream does."""
    seen, before = engine_processes
    written = weights_written(monkeypatch)
    step = Trainer.train_step  # the counting one

    def sigterm_during_step_one(self, s):
        if s == 1:
            os.kill(os.getpid(), signal.SIGTERM)  # the run's handler finishes the step, checkpoints and stops
        return step(self, s)

    monkeypatch.setattr(Trainer, "train_step", sigterm_during_step_one)
    with caplog.at_level(logging.INFO, logger="graftzoo"), pytest.raises(Interrupted):
        train(load_config(pair="micro", algo="grpo", overrides=[*ONE_MODEL, "rollout.vllm.weight_sync=disk",
                                                                f"run.out_dir={tmp_path}", "run.name=x",
                                                                "run.steps=50"]))
    assert len(seen) == 2 and all(engines(s - before) for s in seen)
    assert children() - before == set()
    assert json.loads((tmp_path / "x" / "summary.json").read_text())["status"] == "interrupted"
    assert "save_pretrained" in written
    assert any("rollout.vllm.weight_sync=disk" in r.getMessage() for r in caplog.records)
    rows = [json.loads(x) for x in (tmp_path / "x" / "metrics.jsonl").read_text().splitlines()]
    synced = [r for r in rows if r.get("time/weight_sync") is not None]
    assert synced and all(r["rollout/logp_diff_max"] <= 1e-5 for r in synced), synced


def test_rollouts_ahead_overlap_the_update_and_the_schedule_not_the_timing_decides_them(tmp_path, monkeypatch):
    """rollout.max_staleness=1 with the engine core in its own process: the next step's rollouts are collected in a
    thread of their own while the update runs (``Trainer.ahead.overlap``); with the engine in this process they are
    collected before the update. Both runs decode every step's rollouts with the same weights (version
    max(0, s - 1)), so their seeded metrics are equal. The last step collects step 3's rollouts too (a run extended
    to more steps trains on them: docs/reliability.md#what-a-rerun-may-change)."""
    threads = []
    collect_ahead = step_module.collect_ahead

    def spied(run, s, finished):
        threads.append(threading.current_thread().name)
        return collect_ahead(run, s, finished)

    monkeypatch.setattr(step_module, "collect_ahead", spied)
    got = {}
    for mp in (True, False):
        threads.clear()
        tr = Trainer(load_config(pair="micro", algo="grpo", overrides=[
            *ONE_MODEL, f"rollout.vllm.multiprocessing={str(mp).lower()}", "rollout.max_staleness=1", "run.steps=3",
            f"run.out_dir={tmp_path}", f"run.name=mp-{mp}"]))
        try:
            assert tr.ahead.overlap is mp
            got[mp] = [{k: v for k, v in met.items() if not k.startswith(("time/", "perf/", "async/overlap_s"))}
                       for s in range(3) for met in tr.train_step(s).values()]
        finally:
            tr.close()
        # steps 1, 2 and 3: the last step collects the step after the run's end too, as a longer run does
        assert threads == (["graftzoo-ahead"] * 3 if mp else [threading.main_thread().name] * 3)
    assert [r["async/staleness_max"] for r in got[True]] == [0, 1, 1]
    assert any(r["async/is_weight_mean"] not in (None, 1.0) for r in got[True])
    assert got[True] == got[False]


# ---- an engine process that dies, a trainer that is killed: through the command, in real processes ----------

CLI = [sys.executable, "-m", "graftzoo.apps.cli", "train", "--algo", "grpo", "--pair", "micro", "--no-track",
       *[a for s in [*ONE_MODEL, "run.progress=false", "run.save_every=1"] for a in ("--set", s)]]


def wait_for(p: subprocess.Popen, path: Path, what: str, timeout: float = 240, log=None) -> None:
    """Until ``path`` exists; the run's output in the failure (``log``: the file it goes to, else its pipes)."""
    deadline = time.time() + timeout
    while not path.exists() and p.poll() is None and time.time() < deadline:
        time.sleep(0.2)
    if not path.exists():
        p.kill()
        out = log.read_text() if log else "".join(p.communicate())
        pytest.fail(f"{what} never came (exit {p.returncode}):\n{out[-3000:]}")


def engine_pids(p: subprocess.Popen) -> dict:
    """pid -> psutil.Process of the vLLM processes below ``p``."""
    return {c.pid: c for c in psutil.Process(p.pid).children(recursive=True) if "VLLM" in " ".join(c.cmdline())}


def test_a_killed_engine_core_fails_the_run_in_seconds_with_one_line_and_the_rerun_resumes(tmp_path, plain):
    """kill -9 of the engine core (its own process) mid-run: the run stops within seconds with one line naming the
    model, the engine and the signal (vLLM's client alone waits for the dead process forever), the summary says
    failed, and the same command resumes from the last checkpoint to the metrics of a run never interrupted."""
    cmd = [*CLI, "--set", f"run.out_dir={tmp_path}", "--set", "run.name=x", "--set", "run.steps=3"]
    p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    # the kill lands two steps before the end: the run still has engine calls to make, however fast it goes
    wait_for(p, tmp_path / "x" / "checkpoints" / "step_000000" / "manifest.json", "the step-0 checkpoint")
    core = [c for c in engine_pids(p).values() if "EngineCore" in " ".join(c.cmdline())]
    assert core, "no engine core process"
    core[0].kill()
    t = time.time()
    try:
        out, err = p.communicate(timeout=120)
    except subprocess.TimeoutExpired:  # a hang: the run's processes end, its output in the failure
        for c in psutil.Process(p.pid).children(recursive=True):
            c.kill()
        p.kill()
        out, err = p.communicate()
        pytest.fail(f"the run did not end within 120 s of its engine core's death:\n{(out + err)[-3000:]}")
    assert p.returncode == 1, (out + err)[-3000:]
    assert time.time() - t < 30
    lines = [x for x in err.splitlines() if x.startswith("Error:")]
    assert len(lines) == 1 and "Traceback" not in err, err[-3000:]
    assert re.search(r"model 'micro-qwen-char': the vLLM engine died while it \w+.*VLLM::EngineCore \(pid \d+\) "
                     r"was killed by SIGKILL", lines[0]), lines
    assert json.loads((tmp_path / "x" / "summary.json").read_text())["status"] == "failed"
    rerun = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert rerun.returncode == 0, rerun.stderr[-3000:]
    assert "resuming from step_00000" in rerun.stderr, rerun.stderr[-3000:]
    got, want = step_rows(tmp_path / "x"), step_rows(plain["run"])   # the same settings, never interrupted
    assert sorted(got) == sorted(want) == [0, 1, 2]
    for s, row in want.items():
        for k in ("loss", "reward/mean", "rollout/logp_diff_max"):
            assert got[s][k] == pytest.approx(row[k], rel=1e-6, abs=1e-7), (s, k)


def step_rows(run: Path) -> dict:
    rows = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    return {r["step"]: r for r in rows if r.get("step", -1) >= 0 and r.get("loss") is not None}


def test_a_killed_trainer_takes_its_engine_processes_along(tmp_path):
    """kill -9 of the trainer: its engine core and the core's workers end within seconds (they are tied to the
    trainer's life), instead of holding memory (a GPU) for minutes."""
    cmd = [*CLI, "--set", f"run.out_dir={tmp_path}", "--set", "run.name=x", "--set", "run.steps=50"]
    log = tmp_path / "log"
    with open(log, "w") as f:  # not a pipe: a process that outlives the trainer would hold it open
        p = subprocess.Popen(cmd, stdout=f, stderr=subprocess.STDOUT)
    wait_for(p, tmp_path / "x" / "checkpoints" / "step_000001" / "manifest.json", "the step-1 checkpoint", log=log)
    engines = engine_pids(p)
    assert any("EngineCore" in " ".join(c.cmdline()) for c in engines.values()), engines
    p.kill()
    p.wait()
    deadline = time.time() + 20
    while time.time() < deadline and any(c.is_running() and c.status() != psutil.STATUS_ZOMBIE
                                         for c in engines.values()):
        time.sleep(0.2)
    alive = [c for c in engines.values() if c.is_running() and c.status() != psutil.STATUS_ZOMBIE]
    for c in alive:  # a failed test leaves nothing behind
        c.kill()
    assert not alive, f"engine processes outlived the killed trainer: {[c.pid for c in alive]}"
