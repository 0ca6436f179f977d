"""GRPO [grpo] (docs/algorithms.md#grpo): the Learner defaults, registered under its name."""
from __future__ import annotations

from graftzoo.algos.config import LearnerConfig
from graftzoo.contract.registry import register_config


GRPOConfig = register_config("grpo")(LearnerConfig)
"""GRPO's section: the keys every learner shares, with their defaults (``LearnerConfig``)."""
