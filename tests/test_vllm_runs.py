"""Runs with the vLLM engine core in its own process (rollout.vllm.multiprocessing=true, weights streamed to it in
memory, graftzoo.training.weight_stream), driven as a researcher drives them from Python: the run trains to the
end with the engine's log-probs following the updates, no weight file is written (``weight_sync: disk``, the
fallback, is the one that writes one, and says so), and no engine process outlives a run that ends, fails or is
interrupted: the processes are counted while the run holds its engine and again once ``train`` has returned or
raised, with the Python session still alive (vLLM's own exit hooks would hide a leak in a process that exits)."""
import json
import logging
import os
import signal

import psutil
import pytest
import safetensors.torch
from transformers import PreTrainedModel

from graftzoo.contract.config import load_config
from graftzoo.contract.errors import NonFiniteError
from graftzoo.training.preemption import Interrupted
from graftzoo.contract.registry import get_algo
from graftzoo.training import models as models_module
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


@pytest.fixture
def engine_processes(monkeypatch):
    """The processes the run's engines started (seen after each train step), and the processes before the run.
    The test holds every engine the trainer builds, so that only the trainer's own shutdown can end its process
    (not the garbage collector)."""
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
    yield seen, children()
    for engine in held:  # a failed test leaves no process to the rest of the session
        engine.close()


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


def test_the_engine_process_trains_with_the_run_and_ends_with_it(tmp_path, engine_processes, monkeypatch):
    seen, before = engine_processes
    written = weights_written(monkeypatch)
    run = train(load_config(pair="micro", algo="grpo", overrides=[*ONE_MODEL, f"run.out_dir={tmp_path}",
                                                                  "run.name=x", "run.steps=2"]))
    assert len(seen) == 2 and all(engines(s - before) for s in seen)  # an engine process served every step
    assert children() - before == set()
    rows = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    steps = [r for r in rows if r.get("time/weight_sync") is not None]
    assert len(steps) == 2 and all(r["rollout/logp_diff_max"] <= 1e-5 for r in steps), steps  # streamed, fp32
    assert written == []  # the weights went to the engine's process in memory


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
