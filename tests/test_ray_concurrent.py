"""The two models of a pair stepping at once (``ray.concurrent_models``): their generate / score / theta_old phase and
their update / weight-sync phase run in one driver thread per model, with the sequential step's metrics.

In-process and fast: ``Trainer.train_step`` over a backend that says its models may run at once and whose calls
wait (as a remote call does) before they run; the phases overlap in time, the metrics are the sequential ones, a
failure surfaces as itself without waiting for the other model. On Ray, the same seeded run with
``ray.concurrent_models`` off and on gives the same metrics (tests/test_ray_backend.py, beside the run it shares).
"""
import threading
import time
from functools import partial

import pytest
import torch

from graftzoo.contract.config import load_config
from graftzoo.distributed.errors import WorkerError
from graftzoo.eval.compute import ComputeMeter
from graftzoo.training import trainer as trainer_mod
from graftzoo.training.planner.build import InProcess
from graftzoo.training.trainer import Trainer
from test_ray_backend import SKIP_KEYS

DELAY = 0.2  # seconds every call of the fake backend waits before it runs (a remote call in flight)
SETS = ["task.difficulty=1", "rollout.n=8", "run.track=false"]  # groups with mixed outcomes: the pair trains


class SleepyBackend(InProcess):
    """The in-process models as Ray worker groups look from the driver: every engine and policy call first waits
    ``DELAY`` s (the driver thread idle), then runs under one lock (one model computes at a time, as on a busy
    machine), with its model's own torch RNG stream (seeded by ``engine.seed``): the driver's global RNG is left
    alone, as a group's engine leaves it. Each call's (model, name, start, end) is recorded in ``calls``;
    ``fail[(model, name)]``: an exception that call raises after its wait."""

    concurrent_models = True

    def __init__(self):
        super().__init__()
        self.calls, self.fail, self.lock = [], {}, threading.Lock()
        self.rng: dict = {}

    def build(self, cfg, specs, train_ids, seed, run_dir=None):
        policies, engines, refs = super().build(cfg, specs, train_ids, seed)
        for m in policies:
            self.rng[m] = torch.get_rng_state()
            engines[m].seed = self.seeder(m)
            for obj, name in ((engines[m], "generate"), (engines[m], "sync_weights"),
                              (policies[m], "score_sequences"), (policies[m], "update")):
                setattr(obj, name, self.remote(m, name, getattr(obj, name)))
        return policies, engines, refs

    def seeder(self, m: str):
        """``engine.seed`` of model ``m``: its own stream, the driver's global RNG untouched."""
        def seed(s: int) -> None:
            self.rng[m] = torch.Generator().manual_seed(s).get_state()
        return seed

    def remote(self, m: str, name: str, fn):
        def call(*args, **kwargs):
            t0 = time.perf_counter()
            time.sleep(DELAY)
            try:
                if (m, name) in self.fail:
                    raise self.fail[m, name]
                with self.lock, torch.random.fork_rng():
                    torch.set_rng_state(self.rng[m])
                    out = fn(*args, **kwargs)
                    self.rng[m] = torch.get_rng_state()
                return out
            finally:
                self.calls.append((m, name, t0, time.perf_counter()))
        return call


def overlap(calls: list, name: str) -> float:
    """Seconds during which both models were inside a ``name`` call (0: one after the other)."""
    spans = {}
    for m, n, a, b in calls:
        if n == name:
            spans.setdefault(m, []).append((a, b))
    (one, two) = spans.values()
    return sum(max(0.0, min(b1, b2) - max(a1, a2)) for a1, b1 in one for a2, b2 in two)


def steps(monkeypatch, tmp_path, concurrent: bool, algo: str = "graft", n_steps: int = 2, extra=()):
    """``n_steps`` train_steps of a micro pair over ``SleepyBackend`` (models at once or not); the trainer, the
    backend and the steps' metrics, wall-clock keys left out."""
    backend = SleepyBackend()
    backend.concurrent_models = concurrent
    monkeypatch.setitem(trainer_mod.BACKENDS, "inprocess", lambda: backend)
    cfg = load_config(pair="micro", algo=algo, overrides=[
        f"run.out_dir={tmp_path}", "run.name=c" if concurrent else "run.name=s", *SETS, *extra])
    tr = Trainer(cfg)
    try:
        assert tr.concurrent == concurrent
        out = []
        for s in range(n_steps):
            mets = tr.train_step(s)
            out.append({m: {k: v for k, v in met.items() if not k.startswith(SKIP_KEYS)} for m, met in mets.items()})
        return tr, backend, out
    finally:
        tr.close()


def test_the_models_phases_overlap_and_the_metrics_are_the_sequential_ones(monkeypatch, tmp_path):
    """GRAFT with online exchange: the two models' generate calls and their update calls overlap in time (they never
    do one model after the other); every non-wall-clock metric equals the sequential step's, exactly; each model's
    compute phases are recorded under that model."""
    online = ["peer.source=online"]
    _, seq_backend, seq = steps(monkeypatch, tmp_path, concurrent=False, extra=online)
    tr, backend, conc = steps(monkeypatch, tmp_path, concurrent=True, extra=online)
    assert overlap(seq_backend.calls, "generate") == 0 and overlap(seq_backend.calls, "update") == 0
    assert overlap(backend.calls, "generate") > DELAY / 2
    assert overlap(backend.calls, "update") > DELAY / 2
    assert conc == seq
    assert any(met["loss"] for step in seq for met in step.values())   # it trained on something
    assert any(met.get("tokens/peer_share") for step in seq for met in step.values())   # and exchanged
    phases = tr.meter.summary()["models"]
    assert sorted(phases) == sorted(tr.model_ids)
    for m in tr.model_ids:
        assert {"generate", "score", "logprob", "update"} <= set(phases[m]["phases"])


def test_refills_from_the_sampler_are_drawn_in_model_order(monkeypatch, tmp_path):
    """DAPO's dynamic sampling asks the shared sampler for more prompts from both models' threads: the refills are
    the sequential step's (the later model waits for the earlier one's phase), so the metrics are equal."""
    asked = []
    extra = trainer_mod.PromptSampler.extra

    def spy(self, step, k):
        asked.append(threading.current_thread().name)
        return extra(self, step, k)

    monkeypatch.setattr(trainer_mod.PromptSampler, "extra", spy)
    bounded = ["algo.max_gen_batches=3"]
    _, _, seq = steps(monkeypatch, tmp_path, concurrent=False, algo="dapo", n_steps=1, extra=bounded)
    n_seq = len(asked)
    _, _, conc = steps(monkeypatch, tmp_path, concurrent=True, algo="dapo", n_steps=1, extra=bounded)
    assert conc == seq
    assert n_seq > 0 and {"graftzoo-micro-qwen-char", "graftzoo-micro-gpt2-pair"} <= set(asked[n_seq:])


def wrapped_trainer(monkeypatch, tmp_path, name: str, wrap) -> tuple:
    """A GRAFT trainer on the sleeping concurrent backend whose first model's generate runs through
    ``wrap(generate, *args, **kwargs)``; (trainer, backend)."""
    backend = SleepyBackend()
    monkeypatch.setitem(trainer_mod.BACKENDS, "inprocess", lambda: backend)
    cfg = load_config(pair="micro", algo="graft", overrides=[
        f"run.out_dir={tmp_path}", f"run.name={name}", *SETS, "peer.source=online"])
    tr = Trainer(cfg)
    tr.engines["micro-qwen-char"].generate = partial(wrap, tr.engines["micro-qwen-char"].generate)
    return tr, backend


def test_a_failure_in_one_models_thread_surfaces_as_itself_without_waiting(monkeypatch, tmp_path):
    """A worker that dies during one model's generate: train_step raises that WorkerError itself, before the other
    model's phase has ended."""
    err = WorkerError("model 'micro-gpt2-pair': worker rank 0 (pid 4242) died during generate: killed")
    def very_slow(generate, *a, **kw):
        time.sleep(3.0)
        return generate(*a, **kw)

    tr, backend = wrapped_trainer(monkeypatch, tmp_path, "f", very_slow)
    backend.fail["micro-gpt2-pair", "generate"] = err
    t = time.perf_counter()
    try:
        with pytest.raises(WorkerError) as got:
            tr.train_step(0)
    finally:
        tr.close()
    assert got.value is err
    assert time.perf_counter() - t < 2.0
    for thread in threading.enumerate():  # the other model's thread ends on its own (here: before the next test)
        if thread.name.startswith("graftzoo-"):
            thread.join(30)


def test_a_thread_drawing_from_the_drivers_global_rng_fails_the_step(monkeypatch, tmp_path):
    """A model whose phase draws from the process's global torch RNG while the models run at once would make the
    seeded run depend on timing: the step fails, naming the setting that turns the concurrency off."""
    def drawing(generate, *a, **kw):
        torch.rand(1)
        return generate(*a, **kw)

    tr, _ = wrapped_trainer(monkeypatch, tmp_path, "g", drawing)
    try:
        with pytest.raises(RuntimeError, match="ray.concurrent_models=false"):
            tr.train_step(0)
    finally:
        tr.close()


def test_per_thread_cpu_does_not_count_the_other_models_work():
    """Two models' overlapping phases: the one that waits is charged almost no CPU, the one that computes its own
    CPU; the process clock would charge the waiting phase the other's work as well."""
    for per_thread in (True, False):
        meter = ComputeMeter(gpus=0, per_thread=per_thread)
        started, burnt = threading.Event(), threading.Event()

        def waiting():
            with meter.phase("a", "generate"):
                started.set()
                burnt.wait()

        def computing():
            started.wait()
            with meter.phase("b", "generate"):
                end = time.thread_time() + 0.3
                while time.thread_time() < end:
                    pass
            burnt.set()

        threads = [threading.Thread(target=f) for f in (waiting, computing)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        cpu = {m: v["total"]["cpu_s"] for m, v in meter.summary()["models"].items()}
        assert cpu["b"] >= 0.29
        if per_thread:
            assert cpu["a"] < 0.05
        else:
            assert cpu["a"] >= 0.29   # the process clock: the double count that per_thread avoids
