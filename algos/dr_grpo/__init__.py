"""Dr. GRPO [dr_grpo] (docs/algorithms.md#dr-grpo): no std normalization, constant-normalizer aggregation."""
from __future__ import annotations

from graftzoo.algos.config import LearnerConfig, LossAgg
from graftzoo.contract.registry import register_config
from graftzoo.contract.schema import key


@register_config("dr_grpo")
class DrGRPOConfig(LearnerConfig):
    """Dr.GRPO (docs/algorithms.md#dr-grpo): no std normalisation, sum over N * max response length."""
    std_normalize: bool = key(False, "divide group advantages by the group's std")
    loss_agg: LossAgg = key("seq-mean-token-sum-norm", "loss aggregation: sum / (N * max_response_length)")
