"""The Dr. GRPO learner: the algorithm, its section and its metrics are graftzoo.algos.dr_grpo."""
from graftzoo.algos.base import Learner
from graftzoo.algos.dr_grpo import DrGRPOConfig
from graftzoo.contract.registry import register_algo


@register_algo("dr_grpo")
class DrGRPO(Learner):
    Config = DrGRPOConfig
