"""Rollouts generated ahead of the update (``rollout.max_staleness: k``, docs/scaling.md#asynchronous-rollouts).

With k >= 1, while step t updates, every model's engine generates (and the verifier scores) the batches of the
steps after t up to t + k that are not yet in; the weights reach an engine at step boundaries only, after its
batches ahead are in. So the rollouts of step s are decoded by policy version max(0, s - k), always: the schedule
is fixed by the step index, not by timing, and a seeded run repeats exactly. What runs ahead is a learner's
``collect`` (allocate, generate, score) of the step's own prompts, with the step's context and seeds; theta_old,
advantages, the store, the peer exchange and the update wait for the step itself (graftzoo.training.learning.step).

Where the generation runs: in a background thread of this process while the update runs (``overlap``) when every
engine decodes apart from the training model (a vLLM engine core in a process of its own; on Ray, rollout workers
apart from the training ranks, ``ray.rollout_workers``); otherwise (an engine that decodes with the training model
itself, Ray worker groups whose ranks decode and train and take one call at a time, a learner whose collect runs
the training model: ``Learner.collect_reads_policy``, the offload layout, which moves the models between devices)
just before the update. Both give the same rollouts; only the wall time differs. How long the generation overlapped
each model's update is logged per step (``async/overlap_s``: ``Ahead.overlap_s``).

A checkpoint holds the batches ahead as plain data (``state_dict``): a kill and a resume continue with the very
rollouts the interrupted run would have trained on, which no weights the checkpoint holds could decode again. The
last step collects the k batches after the run's end too (during its update, as every step does), so that its
last checkpoint holds them and a finished run extended to more steps trains what a longer run trains.
"""
from __future__ import annotations

import logging
import random
import threading
import time
from dataclasses import asdict, dataclass
from typing import Callable, Optional

from graftzoo.contract.types import Group, Origin, Prompt, Rollout

log = logging.getLogger("graftzoo")


@dataclass
class Collected:
    """One step's rollouts collected ahead: its prompts and epoch, each model's step context (its rng and the
    metrics the collect logged) and its groups (generated, scored; no theta_old, no advantages yet)."""

    step: int
    epoch: int
    prompts: list
    ctxs: dict
    groups: dict


def overlaps(k: int, layout: str, engines_apart: bool, collect_reads_policy: bool) -> bool:
    """Whether the batches ahead are collected while the models update (module docstring): k >= 1, not the offload
    layout, every engine decoding in a process the update does not use and no learner's collect running the training
    model. The trainer asks it of the built run, ``graftzoo plan`` of the config (graftzoo.training.planner.memory)."""
    return k >= 1 and layout != "offload" and engines_apart and not collect_reads_policy


def steps_ahead(step: int, k: int, ready) -> list:
    """The steps whose rollouts are collected while step ``step`` updates: after it, up to ``step + k``, those not
    ``ready``; past the run's last step too, as a longer run collects them, so that the run's last checkpoint holds
    them and a rerun with more steps trains exactly the steps a longer run would have (docs/reliability.md)."""
    return [s for s in range(step + 1, step + k + 1) if s not in ready]


class Ahead:
    """The batches collected ahead (step -> ``Collected``) and the collect in flight."""

    def __init__(self, k: int, overlap: bool):
        self.k, self.overlap = int(k), bool(overlap)
        self.ready: dict = {}
        self._thread: Optional[threading.Thread] = None
        self._error: Optional[BaseException] = None
        self._done: dict = {}
        self._spans: dict = {}  # model -> (start, end) of the last launch's collect of its rollouts

    def take(self, step: int) -> Optional[Collected]:
        return self.ready.pop(step, None)

    def launch(self, steps: list, collect: Callable, models: list) -> None:
        """``collect(s, finished)`` for each of ``steps`` in order, in a background thread with ``overlap``, else
        now; ``collect`` calls ``finished(m)`` once model ``m``'s rollouts of its step are in (``wait(m)``)."""
        self._done = {m: threading.Event() for m in models}
        last = steps[-1] if steps else None
        started = time.perf_counter()
        self._spans = {}

        def finished_last(m: str):
            self._spans[m] = (started, time.perf_counter())
            self._done[m].set()

        def body():
            try:
                for s in steps:
                    self.ready[s] = collect(s, finished_last if s == last else (lambda m: None))
            except BaseException as e:  # noqa: BLE001 - raised on the trainer's thread by wait
                self._error = e
            finally:
                for e in self._done.values():
                    e.set()

        if not self.overlap or not steps:
            body()
            self.wait()
            return
        # a daemon: a collect blocked in an engine the run has closed never keeps the process alive
        self._thread = threading.Thread(target=body, name="graftzoo-ahead", daemon=True)
        self._thread.start()

    def overlap_s(self, model: str, start: float, end: float) -> float:
        """Seconds of ``[start, end]`` (``time.perf_counter``: a model's update) during which the last launch was
        collecting ``model``'s rollouts ahead: 0 where the collect ran before the update."""
        span = self._spans.get(model)
        if span is None:
            return 0.0
        return max(0.0, min(span[1], end) - max(span[0], start))

    def wait(self, model: Optional[str] = None) -> None:
        """Until model ``model``'s rollouts ahead are in (every model's: None); a failure of the collect is raised
        here, on the trainer's thread."""
        if model is not None and model in self._done:
            self._done[model].wait()
        elif self._thread is not None:
            self._thread.join()
            self._thread = None
        if self._error is not None:
            error, self._error = self._error, None
            raise error

    # ---- checkpoints: plain data (torch.load(weights_only=True) reads it back) -----------------------------------
    def state_dict(self) -> dict:
        """The batches ahead as plain data; the collect must be over (``wait``)."""
        return {str(s): {"epoch": c.epoch, "prompts": [asdict(p) for p in c.prompts],
                         "models": {m: {"groups": [asdict(g) for g in c.groups[m]],
                                        "metrics": plain(c.ctxs[m].metrics), "rng": c.ctxs[m].rng.getstate()}
                                    for m in c.groups}}
                for s, c in self.ready.items()}

    def load_state_dict(self, state: dict, context: Callable) -> None:
        """The batches of ``state_dict``; ``context(step, epoch, model, index)`` builds each model's step context. A
        batch older than this run's k allows (``rollout.max_staleness`` lowered on resume) is dropped, said once: its
        step collects anew in its turn."""
        self.ready = {}
        for s, d in state.items():
            version = min((r["policy_version"] for md in d["models"].values() for g in md["groups"]
                           for r in g["rollouts"]), default=int(s))
            if int(s) - version > self.k:
                log.warning("step %s: its rollouts, collected ahead by policy version %d, are older than "
                            "rollout.max_staleness=%d allows: dropped, the step collects anew", s, version, self.k)
                continue
            ctxs, groups = {}, {}
            for i, (m, md) in enumerate(d["models"].items()):
                ctx = ctxs[m] = context(int(s), d["epoch"], m, i)
                ctx.metrics.update(md["metrics"])
                ctx.rng = random.Random()
                ctx.rng.setstate(_tuples(md["rng"]))
                groups[m] = [group_of(g) for g in md["groups"]]
            self.ready[int(s)] = Collected(int(s), d["epoch"], [Prompt(**p) for p in d["prompts"]], ctxs, groups)


def group_of(d: dict) -> Group:
    """A ``Group`` from ``asdict`` data."""
    rolls = [Rollout(**{**r, "origin": Origin(**r["origin"]) if r.get("origin") else None}) for r in d["rollouts"]]
    return Group(**{**d, "prompt": Prompt(**d["prompt"]), "rollouts": rolls})


def plain(value):
    """``value`` with numpy scalars as Python numbers and its keys as plain str (a step's metrics, keyed by
    ``Metric``)."""
    if isinstance(value, dict):
        return {str(k): plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return type(value)(plain(v) for v in value)
    return value.item() if hasattr(value, "item") and not isinstance(value, (int, float, bool, str)) else value


def _tuples(value):
    return tuple(_tuples(v) for v in value) if isinstance(value, (list, tuple)) else value
