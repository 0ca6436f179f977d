"""Prompt batches: the same prompts for every model of a pair, a deterministic function of (seed, step).

A procedural task with ``task.size: null`` is an endless stream (fresh prompts every step, from the task's env:
``stream(n, start)``, its ``generate``); any other dataset is walked in a per-epoch seeded permutation. The cursor is the step number, so
resuming needs only the step. A finite set that a step must repeat prompts of (``task.prompts_per_step`` above its
size), or that the run passes over ``MANY_PASSES`` times or more, is said in one warning.
"""
from __future__ import annotations

import logging
import math
import random

from typing import Callable, Optional

from graftzoo.contract.config import RunConfig

log = logging.getLogger(__name__)
MANY_PASSES = 10  # run.steps x task.prompts_per_step this many times the training set: said (run.epochs: asked for)


class PromptSampler:
    def __init__(self, cfg: RunConfig, dataset=None, exclude_ids=(), stream: Optional[Callable] = None):
        """``dataset``: the finite training set; else ``stream(n, start)`` gives prompts ``start .. start + n - 1``
        of the task's endless stream (``MathReasoningEnv.generate``)."""
        task = cfg.task
        self.seed = int(cfg.run.seed)
        self.per_step = int(task.prompts_per_step)
        self.stream = dataset is None
        if self.stream and stream is None:
            raise ValueError("a prompt sampler needs a dataset or a stream (a procedural env's generate)")
        self.generate = stream
        self.task = task
        self.dataset = dataset
        self._extra = 0
        self._last_perm = (None, [])
        if not self.stream and exclude_ids:  # e.g. the validation slice of eval.select=val_avg
            excluded = set(exclude_ids)
            self.dataset = [p for p in dataset if p.id not in excluded]
        if not self.stream and len(self.dataset) == 0:
            raise ValueError("the training dataset is empty")
        if not self.stream:
            self._warn_repeats(cfg)

    def _warn_repeats(self, cfg: RunConfig) -> None:
        n, per = len(self.dataset), self.per_step
        if per > n:
            log.warning("%d training prompts, %d per step (task.prompts_per_step): every step repeats %d of them; "
                        "lower task.prompts_per_step or give more data", n, per, min(per - n, n))
        elif not cfg.run.epochs and cfg.run.steps * per >= MANY_PASSES * n:
            log.warning("%d training prompts, %d per step, %d steps (run.steps): the run trains on each prompt about "
                        "%.0f times; give more data or fewer steps", n, per, cfg.run.steps, cfg.run.steps * per / n)

    @property
    def steps_per_epoch(self) -> int:
        return 10**9 if self.stream else max(1, math.ceil(len(self.dataset) / self.per_step))

    def _perm(self, epoch: int) -> list:
        if self._last_perm[0] != epoch:  # one shuffle per epoch, not per step
            idx = list(range(len(self.dataset)))
            random.Random(f"{self.seed}:{epoch}").shuffle(idx)
            self._last_perm = (epoch, idx)
        return self._last_perm[1]

    def batch(self, step: int):
        """(prompts, epoch) of a step."""
        if self.stream:
            return self.generate(self.per_step, start=step * self.per_step), 0
        epoch, k = divmod(step, self.steps_per_epoch)
        perm = self._perm(epoch)
        chosen = [perm[(k * self.per_step + j) % len(perm)] for j in range(self.per_step)]
        return [self.dataset[i] for i in chosen], epoch

    def extra(self, step: int, k: int) -> list:
        """Refill prompts (DAPO dynamic sampling), disjoint from the step's batch, deterministic per call order."""
        self._extra += 1
        if self.stream:
            start = 10**9 + (step * 1000 + self._extra) * self.per_step
            return self.generate(k, start=start)
        rng = random.Random(f"{self.seed}:extra:{step}:{self._extra}")
        return [self.dataset[rng.randrange(len(self.dataset))] for _ in range(k)]

    def start_step(self, step: int):
        self._extra = 0
