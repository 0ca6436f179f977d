"""GSPO [gspo] (spec algos_single §1.5, algos_peer §1.3): sequence-level ratio and clipping."""
from dataclasses import dataclass
from typing import Literal

from graftzoo.algos.base import Learner, LearnerConfig, LossAgg, MiniBatch, Surrogate
from graftzoo.algos.functional import gspo_sequence_ratio, gspo_token_ratio, ratio_surrogate
from graftzoo.core.registry import register_algo


@dataclass
class GSPOConfig(LearnerConfig):
    eps_low: float = 3e-4
    eps_high: float = 4e-4
    loss_agg: LossAgg = "seq-mean-token-mean"
    ratio_form: Literal["token", "sequence"] = "token"   # token (GSPO-token, verl) | sequence


@register_algo("gspo")
class GSPO(Learner):
    Config = GSPOConfig

    def surrogate(self, ctx, logp, mb: MiniBatch) -> Surrogate:
        c = self.cfg
        if c.ratio_form == "sequence":
            ratio = gspo_sequence_ratio(logp, mb.old_logp, mb.loss_mask).unsqueeze(1).expand_as(logp)
        elif c.ratio_form == "token":
            ratio = gspo_token_ratio(logp, mb.old_logp, mb.loss_mask)
        else:
            raise ValueError(f"algo.ratio_form must be token|sequence, got {c.ratio_form!r}")
        return Surrogate(*ratio_surrogate(ratio, mb.advantages, c.eps_low, c.eps_high, None))
