"""GSPO [gspo] (docs/algorithms.md#gspo): sequence-level ratio and clipping."""
from __future__ import annotations

from typing import ClassVar, Literal

from pydantic import field_validator
from graftzoo.algos.config import LearnerConfig, LossAgg, clip_pair
from graftzoo.contract.config import LearnerFacts
from graftzoo.contract.registry import register_config
from graftzoo.contract.schema import key


@register_config("gspo")
class GSPOConfig(LearnerConfig):
    """GSPO (docs/algorithms.md#gspo). It clips a *sequence* ratio, another quantity than the token ratio the shared
    ``optim.clip`` bounds, so its clip is a key of its own, ``seq_clip`` (the GSPO paper's scale)."""
    own_clip_keys: ClassVar[tuple] = ("seq_clip",)

    loss_agg: LossAgg = key("seq-mean-token-mean", "loss aggregation")
    ratio_form: Literal["token", "sequence"] = key("token", "token (GSPO-token, verl) | sequence")
    seq_clip: list = key(lambda: [3e-4, 4e-4], "sequence-ratio clip [eps_low, eps_high]")

    @field_validator("seq_clip", mode="before")
    @classmethod
    def _seq_clip(cls, v):
        return clip_pair("algo.seq_clip", v)

    def effective_clip(self, run: LearnerFacts) -> dict:
        lo, hi = (float(x) for x in self.seq_clip)
        return {"eps_low": lo, "eps_high": hi, "dual_clip_c": None, "ratio": "sequence"}
