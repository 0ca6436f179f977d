"""RLOO [rloo] (spec algos_single §1.4): leave-one-out baseline advantages."""

from graftzoo.algos.base import Learner
from graftzoo.algos.config import RLOOConfig
from graftzoo.contract.registry import register_algo


@register_algo("rloo")
class RLOO(Learner):
    Config = RLOOConfig
