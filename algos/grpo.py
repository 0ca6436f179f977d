"""GRPO [grpo] (docs/algorithms.md#grpo): the Learner defaults, registered under its name."""
from graftzoo.algos.base import Learner
from graftzoo.contract.registry import register_algo


@register_algo("grpo")
class GRPO(Learner):
    """Group-relative advantages, token-level clipped surrogate, token-mean aggregation."""
