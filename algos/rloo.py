"""RLOO [rloo] (docs/algorithms.md#rloo): leave-one-out baseline advantages."""

from graftzoo.algos.base import Learner
from graftzoo.algos.config import RLOOConfig
from graftzoo.contract.registry import register_algo


@register_algo("rloo")
class RLOO(Learner):
    Config = RLOOConfig
