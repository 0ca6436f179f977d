"""GSPO [gspo] (docs/algorithms.md#gspo): sequence-level ratio and clipping."""

from graftzoo.algos.base import Learner, MiniBatch, Surrogate
from graftzoo.algos.functional import gspo_sequence_ratio, gspo_token_ratio, ratio_surrogate
from graftzoo.algos.config import GSPOConfig
from graftzoo.contract.registry import register_algo



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
        return Surrogate(*ratio_surrogate(ratio, mb.advantages, self.clip["eps_low"], self.clip["eps_high"], None))
