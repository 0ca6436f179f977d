"""An advantage estimator is a pure function, registered by name (as verl's are): from the rewards of a step's groups
(``AdvantageInputs``) to one advantage per response.

    @register_estimator("grpo")
    def grpo_estimator(x: AdvantageInputs, cfg) -> torch.Tensor: ...

A learner names its estimator (``Learner.estimator``; by default the ``algo.estimator`` key: ``grpo`` or ``rloo``);
the base learner builds the inputs (``Learner.advantage_inputs``, which a learner extends with per-response tensors
of its own, as ExTra adds its novelty scores) and returns the groups with the estimator's advantages
(docs/architecture.md#add-an-algorithm). ``cfg`` is the learner's ``algo.*`` section.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import torch

from graftzoo.algos.functional import group_advantages, rloo_advantages
from graftzoo.contract.registry import FunctionRegistry


@dataclass(frozen=True)
class AdvantageInputs:
    """The responses of a step's groups, flattened in group order. ``[N]``: N responses."""

    rewards: torch.Tensor    # [N] float64: the (shaped) reward of each response
    index: torch.Tensor      # [N] long: the group of each response
    correct: torch.Tensor    # [N] bool: each response's verdict
    extra: dict = field(default_factory=dict)   # name -> [N] tensor a learner adds (ExTra: "novelty", "ema")


ESTIMATORS = FunctionRegistry("advantage estimator")
register_estimator = ESTIMATORS.register
"""``@register_estimator(name)``: register a advantage estimator under ``name`` (a taken name is an error naming both)."""
get_estimator = ESTIMATORS.lookup


@register_estimator("grpo")
def grpo_estimator(x: AdvantageInputs, cfg) -> torch.Tensor:
    """Group-relative advantage (docs/algorithms.md#group-advantage; ``algo.std_normalize: false`` is Dr. GRPO's)."""
    return group_advantages(x.rewards, x.index, std_normalize=cfg.std_normalize, eps=cfg.adv_eps)


@register_estimator("rloo")
def rloo_estimator(x: AdvantageInputs, cfg) -> torch.Tensor:
    """Leave-one-out advantage (docs/algorithms.md#rloo)."""
    return rloo_advantages(x.rewards, x.index)
