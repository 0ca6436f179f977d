"""RLOO [rloo] (spec algos_single §1.4): leave-one-out baseline advantages."""
from dataclasses import dataclass

from graftzoo.algos.base import Estimator, Learner, LearnerConfig
from graftzoo.contract.registry import register_algo


@dataclass
class RLOOConfig(LearnerConfig):
    estimator: Estimator = "rloo"


@register_algo("rloo")
class RLOO(Learner):
    Config = RLOOConfig
