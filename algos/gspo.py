"""GSPO [gspo] (spec algos_single §1.5, algos_peer §1.3): sequence-level ratio and clipping."""
from dataclasses import dataclass, field
from typing import Literal

from graftzoo.algos.base import Learner, LearnerConfig, LossAgg, MiniBatch, Surrogate
from graftzoo.algos.functional import gspo_sequence_ratio, gspo_token_ratio, ratio_surrogate
from graftzoo.contract.registry import register_algo
from graftzoo.contract.schema import ConfigError


@dataclass
class GSPOConfig(LearnerConfig):
    """``algo.*`` keys of GSPO. It clips a *sequence* ratio, a different quantity from the token ratio the shared
    ``optim.clip`` bounds, so its clip is a key of its own: ``seq_clip`` = [eps_low, eps_high] (the GSPO paper's
    scale); ``optim.clip`` does not apply."""

    loss_agg: LossAgg = "seq-mean-token-mean"
    ratio_form: Literal["token", "sequence"] = "token"   # token (GSPO-token, verl) | sequence
    seq_clip: list[float] = field(default_factory=lambda: [3e-4, 4e-4])  # sequence-ratio clip [eps_low, eps_high]

    def check(self, run_cfg: dict) -> None:
        super().check(run_cfg)
        self.seq_clip = clip_pair("algo.seq_clip", self.seq_clip)

    def effective_clip(self, run_cfg: dict) -> dict:
        lo, hi = (float(x) for x in self.seq_clip)
        return {"eps_low": lo, "eps_high": hi, "dual_clip_c": None, "ratio": "sequence"}


def clip_pair(key: str, value) -> list:
    """``[eps_low, eps_high]`` checked (eps_low in [0, 1], eps_high >= 0) and made floats; ConfigError naming ``key``."""
    ok = isinstance(value, (list, tuple)) and len(value) == 2 and all(
        isinstance(x, (int, float)) and not isinstance(x, bool) for x in value)
    if not ok or not 0 <= value[0] <= 1 or value[1] < 0:
        raise ConfigError(f"config key '{key}' must be [eps_low in [0, 1], eps_high >= 0], got {value!r}")
    return [float(x) for x in value]


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
