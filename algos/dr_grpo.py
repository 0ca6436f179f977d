"""Dr. GRPO [dr_grpo] (docs/algorithms.md#dr-grpo): no std normalization, constant-normalizer aggregation."""

from graftzoo.algos.base import Learner
from graftzoo.algos.config import DrGRPOConfig
from graftzoo.contract.registry import register_algo


@register_algo("dr_grpo")
class DrGRPO(Learner):
    Config = DrGRPOConfig
