"""RLOO [rloo] (docs/algorithms.md#rloo): leave-one-out baseline advantages."""
from __future__ import annotations

from graftzoo.algos.config import Estimator, LearnerConfig
from graftzoo.contract.registry import register_config
from graftzoo.contract.schema import key


@register_config("rloo")
class RLOOConfig(LearnerConfig):
    """RLOO (docs/algorithms.md#rloo): the leave-one-out baseline."""
    estimator: Estimator = key("rloo", "advantage estimator")
