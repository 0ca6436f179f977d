"""The RLOO learner: the algorithm, its section and its metrics are graftzoo.algos.rloo."""
from graftzoo.algos.base import Learner
from graftzoo.algos.rloo import RLOOConfig
from graftzoo.contract.registry import register_algo


@register_algo("rloo")
class RLOO(Learner):
    Config = RLOOConfig
