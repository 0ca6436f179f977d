"""The GRPO learner: the algorithm, its section and its metrics are graftzoo.algos.grpo."""
from graftzoo.algos.base import Learner
from graftzoo.algos.grpo import GRPOConfig
from graftzoo.contract.registry import register_algo


@register_algo("grpo")
class GRPO(Learner):
    """Group-relative advantages, token-level clipped surrogate, token-mean aggregation."""

    Config = GRPOConfig
