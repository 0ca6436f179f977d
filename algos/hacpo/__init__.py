"""HACPO [hacpo] (docs/algorithms.md#hacpo): heterogeneous agents trained on the pooled rollouts.

Each learner trains on its own G responses per prompt (GSPO, the base) and on the peer's G responses
to the same prompt (cross samples, localized into its tokenizer, docs/algorithms.md#cross-tokenizer-exchange), ordered self first,
cross last. Cross samples get four corrections:

1. capability-aware advantage: the group baseline is a capability-weighted mean over all 2G rewards
   (docs/algorithms.md#hacpo-capability-aware-advantage, with the code's uniform-reward and binary-baseline guards);
2. capability discrepancy coefficient: the cross advantage is scaled by ``P^_peer / P^_self`` (docs/algorithms.md#hacpo-capability-aware-advantage);
3. exponential importance sampling ``c * sg[c]^alpha`` on the cross sequence ratio (docs/algorithms.md#hacpo-cross-sample-loss);
4. stepwise clipping of the cross ratio to ``[lower + u*step, 1]`` at optimizer update ``u`` (docs/algorithms.md#hacpo-cross-sample-loss).

The capabilities are sliding-window accuracies (docs/algorithms.md#hacpo-capability-aware-advantage) kept as learner state, so a checkpoint
resumes them. The KL term (``beta_kl``, 0.001 as in the run scripts) covers self samples only
unless ``kl_on_cross``. ``select=graft_which`` ("HACPO + GRAFT which", GRAFT's Table 8) pools only the
prompts GRAFT would replace (learner all-fail, peer mixed; ``graft_candidates``); default ``all``.
"""
from __future__ import annotations

from typing import ClassVar, Literal, Optional

from pydantic import model_validator
from graftzoo.algos.config import clip_pair
from graftzoo.algos.gspo import GSPOConfig
from graftzoo.contract.config import LearnerFacts, MAX_STEPS
from graftzoo.contract.errors import ConfigError
from graftzoo.contract.metrics import Metric
from graftzoo.contract.registry import register_config
from graftzoo.contract.schema import Int, key


# ---- its metrics (docs/metrics.md) ----
HACPO_CAPABILITY_SELF = Metric("hacpo/capability_self", "fraction", "the learner's capability estimate P^_self "
                               "(windowed accuracy)", "HACPO")
HACPO_CAPABILITY_PEER = Metric("hacpo/capability_peer", "fraction", "the peer's capability estimate P^_peer",
                               "HACPO")
HACPO_OMEGA = Metric("hacpo/omega", "value", "the discrepancy coefficient omega of the peer's samples", "HACPO")
HACPO_CROSS_LOWER = Metric("hacpo/cross_lower", "ratio", "the stepwise clip floor of the cross samples", "HACPO")


@register_config("hacpo")
class HACPOConfig(GSPOConfig):
    """HACPO (docs/algorithms.md#hacpo). ``self_clip`` is the GSPO-scale clip of self samples, HACPO's own by design
    (the shared ``optim.clip`` does not apply); a grid marks a HACPO row ``clip: own``."""

    needs_peer: ClassVar[bool] = True
    own_clip_keys: ClassVar[tuple] = ("self_clip",)

    alpha: float = key(1.0, "exponential importance-sampling power", ge=0)
    cross_clip_lower: float = key(0.8, "cross clip floor 1 - delta at update 0", gt=0, le=1)
    cross_clip_step: float = key(0.025, "floor increase per optimizer update (delta_step)", ge=0, le=1)
    capability_window: Int = key(5, "K, steps of the capability estimate", ge=1, le=MAX_STEPS)
    ratio_clamp: list = key(lambda: [0.1, 10.0], "clamp of the cross-sample ratio [low <= 1, high >= 1]")
    self_clip: list = key(lambda: [3e-4, 4e-4], "GSPO clip of self samples [eps_low, eps_high]")
    uniform_reward_guard: bool = key(True, "the reference code's guard of uniform-reward groups")
    binary_baseline_guard: bool = key(True, "the reference code's guard of binary baselines")
    kl_on_cross: bool = key(False, "KL on cross samples too (the reference code: self samples only)")
    beta_kl: float = key(0.001, "k3 KL to the initial policy", ge=0)
    select: Literal["all", "graft_which"] = key("all", "graft_which: \"HACPO + GRAFT which\"")

    @model_validator(mode="before")
    @classmethod
    def _resolve(cls, data):
        """``self_clip`` is copied into GSPO's ``seq_clip``, which may not be set apart from it."""
        if not isinstance(data, dict):
            return data
        data = dict(data)
        self_clip = clip_pair("algo.self_clip", data.get("self_clip", [3e-4, 4e-4]))
        seq = data.get("seq_clip")
        if seq is not None and [float(x) for x in clip_pair("algo.seq_clip", seq)] not in ([3e-4, 4e-4], self_clip):
            raise ConfigError(f"HACPO clips self samples with config key 'algo.self_clip'={self_clip}; "
                              f"set that key instead of algo.seq_clip ({list(seq)})")
        clamp = data.get("ratio_clamp", [0.1, 10.0])
        if not (isinstance(clamp, (list, tuple)) and len(clamp) == 2
                and all(isinstance(x, (int, float)) and not isinstance(x, bool) for x in clamp)
                and 0 < clamp[0] <= 1 <= clamp[1]):
            raise ConfigError(f"config key 'algo.ratio_clamp' must be [low <= 1, high >= 1], got {clamp}")
        data.update(self_clip=self_clip, seq_clip=list(self_clip), ratio_clamp=[float(x) for x in clamp])
        return data

    def group_needed(self, run: LearnerFacts) -> Optional[str]:
        """None: the advantage is over the pooled own + peer responses of a prompt, which differ between the models."""
        return None

    def check(self, run: LearnerFacts) -> None:
        if self.estimator != "grpo" or not self.std_normalize:
            raise ConfigError("HACPO's advantage is its own capability-aware form (docs/algorithms.md#hacpo): "
                              "config keys 'algo.estimator' must stay grpo and 'algo.std_normalize' true")

    def effective_clip(self, run: LearnerFacts) -> dict:
        """HACPO's self samples are clipped with its explicit ``algo.self_clip`` (GSPO scale), not ``optim.clip``."""
        lo, hi = (float(x) for x in self.self_clip)
        return {"eps_low": lo, "eps_high": hi, "dual_clip_c": None, "ratio": "sequence"}
