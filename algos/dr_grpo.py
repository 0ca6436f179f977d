"""Dr. GRPO [dr_grpo] (spec algos_single §1.2): no std normalization, constant-normalizer aggregation."""
from dataclasses import dataclass

from graftzoo.algos.base import Learner, LearnerConfig, LossAgg
from graftzoo.contract.registry import register_algo


@dataclass
class DrGRPOConfig(LearnerConfig):
    std_normalize: bool = False
    loss_agg: LossAgg = "seq-mean-token-sum-norm"   # sum / (N * max_response_length)


@register_algo("dr_grpo")
class DrGRPO(Learner):
    Config = DrGRPOConfig
