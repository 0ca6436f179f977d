"""CISPO [cispo] (docs/algorithms.md#cispo): GRPO's advantages with a clipped, detached importance-sampling weight
on every token's log-prob, so a token whose ratio is clipped still carries a gradient (PPO's clip drops it)."""
from __future__ import annotations

from graftzoo.algos.config import LearnerConfig
from graftzoo.contract.registry import register_config


@register_config("cispo")
class CISPOConfig(LearnerConfig):
    """CISPO (docs/algorithms.md#cispo): GRPO's keys; the IS weight is clipped at the run's shared ``optim.clip``
    (a preset may widen it, as MiniMax-M1 does: no lower bound, a tuned upper one)."""
