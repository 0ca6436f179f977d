"""The ``algo.*`` keys every learner shares (``LearnerConfig``, with GRPO's defaults) and what the algorithms'
sections build on; each algorithm declares its own section in its package (graftzoo.algos.<name>), without torch,
so that a run config is checked before anything heavy is imported (graftzoo.contract.registry). The formulas the
keys control are in docs/algorithms.md.

A section is a frozen pydantic model (graftzoo.contract.schema): choices are ``Literal``, bounds are pydantic's, a
rule between keys or against the run (``LearnerFacts``) is ``check``; values derived from other keys are resolved
once, while validating (``model_validator``).
"""
from __future__ import annotations

from typing import Literal, Optional

from graftzoo.contract.config import AlgoSection, LearnerFacts
from graftzoo.contract.errors import ConfigError
from graftzoo.contract.schema import key

Estimator = Literal["grpo", "rloo"]
LossAgg = Literal["token-mean", "seq-mean-token-sum", "seq-mean-token-mean", "seq-mean-token-sum-norm"]


GROUP_WHY = ("its advantage compares the responses of a prompt with each other: a group of one response, or of "
             "identical ones, gets advantage 0 and the update is 0")


def clip_pair(key_name: str, value) -> list:
    """``[eps_low, eps_high]`` checked (eps_low in [0, 1], eps_high >= 0) and made floats; ConfigError naming the
    key."""
    ok = isinstance(value, (list, tuple)) and len(value) == 2 and all(
        isinstance(x, (int, float)) and not isinstance(x, bool) for x in value)
    if not ok or not 0 <= value[0] <= 1 or value[1] < 0:
        raise ConfigError(f"config key '{key_name}' must be [eps_low in [0, 1], eps_high >= 0], got {value!r}")
    return [float(x) for x in value]


class LearnerConfig(AlgoSection):
    """``algo.*`` keys shared by every learner, with GRPO's defaults (docs/algorithms.md#grpo)."""

    estimator: Estimator = key("grpo", "advantage estimator")
    std_normalize: bool = key(True, "divide group advantages by the group's std (false = Dr.GRPO)")
    adv_eps: float = key(1e-6, "epsilon of the std normalisation", ge=0, le=1)
    loss_agg: LossAgg = key("token-mean", "loss aggregation (docs/algorithms.md#loss-aggregation)")
    beta_kl: float = key(0.0, "k3 KL to the initial policy, own tokens only", ge=0)
    entropy_coeff: float = key(0.0, "entropy bonus coefficient")
    mask_truncated: bool = key(False, "zero the loss of responses that hit max length (DAPO overlong filter)")
    drop_dead_groups: bool = key(False, "drop zero-advantage groups from the loss denominator")

    def group_needed(self, run: LearnerFacts) -> Optional[str]:
        """The base learner (GRPO and every learner built on its advantage) compares a prompt's responses."""
        return GROUP_WHY
