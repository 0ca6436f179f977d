"""GRPO [grpo] (docs/algorithms.md#grpo): the Learner defaults, registered under its name."""
from __future__ import annotations

from typing import ClassVar

from graftzoo.algos.config import LearnerConfig
from graftzoo.contract.registry import register_config


@register_config("grpo")
class GRPOConfig(LearnerConfig):
    """GRPO's section: the keys every learner shares, with their defaults (``LearnerConfig``). A report compares
    against GRPO's rows when no baseline is named."""

    report_baseline: ClassVar[bool] = True
