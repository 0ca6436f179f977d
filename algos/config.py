"""The ``algo.*`` section of every builtin learner, declared without torch so that a run config is checked before
anything heavy is imported (graftzoo.contract.registry). Each learner module sets ``Config`` to its section here; the
formulas the keys control are in docs/algorithms.md.

A section is a frozen pydantic model (graftzoo.contract.schema): choices are ``Literal``, bounds are pydantic's, a
rule between keys or against the run (``LearnerFacts``) is ``check``; values derived from other keys are resolved
once, while validating (``model_validator``).
"""
from __future__ import annotations

import os
from typing import Annotated, ClassVar, Literal, Optional

from pydantic import Field, field_validator, model_validator

from graftzoo.contract.config import (MAX_BATCH, MAX_N, MAX_PROMPTS, MAX_STEPS, MAX_TEMPERATURE, MAX_TOKENS,
                                      AlgoSection, LearnerFacts)
from graftzoo.contract.errors import ConfigError
from graftzoo.contract.registry import register_config
from graftzoo.contract.schema import Int, key

Estimator = Literal["grpo", "rloo"]
LossAgg = Literal["token-mean", "seq-mean-token-sum", "seq-mean-token-mean", "seq-mean-token-sum-norm"]
SGTGate = Literal["all_fail", "threshold"]
ContrastTemplate = Literal["spec", "compact"]
EMBEDDERS = ("hashed_ngrams", "policy_hidden")   # the builtin ExTra embedders (graftzoo.algos.embedders)
Clip = Annotated[list[float], Field(min_length=2, max_length=2)]


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


@register_config("grpo")
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


@register_config("dr_grpo")
class DrGRPOConfig(LearnerConfig):
    """Dr.GRPO (docs/algorithms.md#dr-grpo): no std normalisation, sum over N * max response length."""
    std_normalize: bool = key(False, "divide group advantages by the group's std")
    loss_agg: LossAgg = key("seq-mean-token-sum-norm", "loss aggregation: sum / (N * max_response_length)")


@register_config("rloo")
class RLOOConfig(LearnerConfig):
    """RLOO (docs/algorithms.md#rloo): the leave-one-out baseline."""
    estimator: Estimator = key("rloo", "advantage estimator")


@register_config("dapo")
class DAPOConfig(LearnerConfig):
    """DAPO (docs/algorithms.md#dapo). Its clip-higher (0.28, dual clip 10) is the preset configs/algos/dapo.yaml,
    which sets the shared ``optim.clip``: never a private default that a comparison would silently inherit."""
    dynamic_sampling: bool = key(True, "refill the batch with prompts whose group is mixed")
    max_gen_batches: Int = key(10, "generation batches per step before giving up (0: unlimited)", ge=0,
                                le=10_000)
    on_shortfall: Literal["keep", "error"] = key("keep", "keep (train on what was found) | error (verl raises)")
    overlong_cache_len: Int = key(0, "soft overlong buffer in tokens (0 = shaping off)", ge=0, le=MAX_TOKENS)
    overlong_penalty: float = key(1.0, "overlong penalty at the hard limit")


@register_config("gspo")
class GSPOConfig(LearnerConfig):
    """GSPO (docs/algorithms.md#gspo). It clips a *sequence* ratio, another quantity than the token ratio the shared
    ``optim.clip`` bounds, so its clip is a key of its own, ``seq_clip`` (the GSPO paper's scale)."""
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


@register_config("hacpo")
class HACPOConfig(GSPOConfig):
    """HACPO (docs/algorithms.md#hacpo). ``self_clip`` is the GSPO-scale clip of self samples, HACPO's own by design
    (the shared ``optim.clip`` does not apply); a grid marks a HACPO row ``clip: own``."""

    needs_peer: ClassVar[bool] = True

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


@register_config("hora")
class HORAConfig(LearnerConfig):
    """HORA (docs/algorithms.md#hora): a probe, then extra rollouts where the posterior says they help most."""
    n0: Optional[Int] = key(None, "rollouts per prompt before allocation (null: max(2, rollout.n // 2))", ge=1,
                             le=MAX_N)
    cap: Optional[Int] = key(None, "most extra rollouts per prompt, m_max (null: 3 * rollout.n)", ge=0,
                              le=3 * MAX_N)
    a0: float = key(1.0, "Beta prior of every prompt's success rate", gt=0)
    b0: float = key(1.0, "Beta prior of every prompt's failure rate", gt=0)
    rounds: Int = key(1, "allocation rounds after the probe (posteriors refreshed)", ge=1, le=MAX_N)
    posterior_source: Literal["probe", "history"] = key("probe", "what the posterior is built from")
    history_decay: float = key(1.0, "history: old counts are multiplied by this at every visit", gt=0, le=1)
    skip_saturated: bool = key(False, "give no extra rollouts to prompts with only successes so far")

    def probe_size(self, G: int) -> int:
        return max(2, G // 2) if self.n0 is None else int(self.n0)

    def extra_cap(self, G: int) -> int:
        return 3 * G if self.cap is None else int(self.cap)

    def check(self, run: LearnerFacts) -> None:
        G = run.n
        if not 2 <= self.probe_size(G) <= G:
            raise ConfigError(f"config key 'algo.n0' must be in [2, rollout.n={G}] (groups of one have no "
                              f"baseline), got {self.probe_size(G)}")


@register_config("extra")
class ExTraConfig(LearnerConfig):
    """ExTra (docs/algorithms.md#extra). The paper runs' DAPO-style clip is the preset configs/algos/extra.yaml (the
    shared optim.clip)."""
    novelty_alpha: float = key(0.1, "novelty bonus weight alpha (paper runs; the released script uses 0.01)")
    novelty_mode: Literal["after_norm", "before_norm"] = key("after_norm", "where the bonus enters the advantage")
    novelty_lambda: float = key(1.0, "before_norm: gamma = exp(-lambda * reward-variance EMA)", ge=0)
    variance_momentum: float = key(0.1, "before_norm: EMA momentum", ge=0, le=1)
    memory_size: Int = key(16, "rollout embeddings kept per prompt (>= rollout.n)", ge=1, le=100 * MAX_N)
    memory_prompts: Int = key(100_000, "prompts with memories (least recently seen dropped beyond)", ge=1,
                               le=10 * MAX_PROMPTS)
    embedder: str = key("hashed_ngrams", "hashed_ngrams | policy_hidden | local sentence-transformers dir")
    embed_tokens: Int = key(512, "embed the last N response tokens", ge=1, le=MAX_TOKENS)
    prefix_regen: bool = key(True, "regenerate from prefixes of hard prompts' rollouts")
    regen_warmup_steps: Int = key(30, "mining and regeneration start after this many steps", ge=0, le=MAX_STEPS)
    hard_pass_rate: Optional[float] = key(None, "hard iff pass rate <= this (null: 1/G)", ge=0, le=1)
    fallback_cut_chars: str = key("", "no newline: cut after these tokens (\"\" = no prefix)")
    prefix_min_gap: Int = key(32, "tokens between kept cut points", ge=1, le=MAX_TOKENS)
    max_prefixes: Int = key(15, "cut points per rollout", ge=1, le=MAX_TOKENS)
    prefix_memory: Int = key(128, "prefixes kept per prompt", ge=1, le=100 * MAX_N)
    tau: float = key(0.1, "smoothing temperature of the prefix selection", gt=0, le=MAX_TEMPERATURE)
    regen_batch_size: Int = key(16, "guided prompts per step (they replace the batch's last rows)", ge=0,
                                 le=MAX_BATCH)
    queue_size: Int = key(512, "guided prompts waiting (most recent kept)", ge=1, le=MAX_PROMPTS)

    def group_needed(self, run: LearnerFacts) -> Optional[str]:
        return ("its advantage is GRPO's group advantage, 0 for a group of one response or of identical ones; only "
                "the novelty bonus of revisited prompts would remain")

    def check(self, run: LearnerFacts) -> None:
        if self.estimator != "grpo" or not self.std_normalize:
            raise ConfigError("ExTra's novelty bonus is defined on std-normalized GRPO advantages "
                              "(docs/algorithms.md#extra-novelty-bonus): config keys 'algo.estimator' must be grpo "
                              "and 'algo.std_normalize' true")
        if self.memory_size < run.n:
            raise ConfigError(f"config key 'algo.memory_size'={self.memory_size} is below rollout.n={run.n}: the "
                              "novelty memory could never warm up")
        if self.embedder not in EMBEDDERS and not os.path.isdir(self.embedder):
            raise ConfigError(f"config key 'algo.embedder' must be one of {' | '.join(EMBEDDERS)} or a local "
                              f"sentence-transformers model directory, got {self.embedder!r}")


@register_config("om_grpo")
class OMGRPOConfig(LearnerConfig):
    """OM-GRPO (docs/algorithms.md#om-grpo): label-free, rewarded by the group's consensus."""

    label_free: ClassVar[bool] = True  # never reads gold: may train on the unlabelled rows of task.label_free

    beta_kl: float = key(0.005, "k3 KL to the initial policy", ge=0)
    answer_grad_scale: float = key(0.0, "loss weight of answer-span tokens (0 = OM-GRPO, 1 = vanilla)", ge=0, le=1)
    mask_kl: bool = key(True, "mask the KL term like the policy term")
    mask_all_boxed: bool = key(False, "mask every \\boxed{} content, not only the last")
    answer_format: Literal["boxed", "any"] = key("boxed", "boxed | any (the verifier's extractor, e.g. after '=')")
    format_weight: float = key(1.0, "weight of the format reward")
    contrast: bool = key(True, "contrast-augmented reward")
    contrast_max_new_tokens: Int = key(64, "response limit of the contrast judgement", ge=1, le=MAX_TOKENS)
    contrast_template: ContrastTemplate = key("spec", "the judgement prompt: spec wording | compact (tiny models)")
    contrast_temperature: float = key(1.0, "sampling temperature of the contrast judgement", gt=0,
                                      le=MAX_TEMPERATURE)
    ttt: bool = key(False, "test-time training on the held-out evaluation prompts")

    def check(self, run: LearnerFacts) -> None:
        if run.n < 2:
            raise ConfigError("config key 'rollout.n' must be >= 2 for OM-GRPO: a group of one has a trivial "
                              "consensus")


@register_config("sgt")
class SGTConfig(LearnerConfig):
    """SGT (docs/algorithms.md#sgt); the GRPO keys are the base's."""

    needs_peer: ClassVar[bool] = True

    gate: SGTGate = key("all_fail", "which learner groups are rescued")
    tau: float = key(0.0, "threshold gate: rescue when c_L / G <= tau", ge=0, lt=1)
    k_inj: Int = key(1, "rescue responses per prompt, at most", ge=1, le=MAX_N)
    mode: Literal["augment", "aux_nll"] = key("augment", "augment the group | an auxiliary NLL term")
    lam: float = key(1.0, "aux_nll weight")

    def group_needed(self, run: LearnerFacts) -> Optional[str]:
        """augment: a rescued success joins the learner's group, whose advantages are recomputed (a group of one gets
        0; identical responses still learn from a rescue); aux_nll: the NLL of the rescued successes learns alone."""
        if self.mode == "aux_nll" and self.lam != 0:
            return None
        if self.mode == "aux_nll":
            return GROUP_WHY + " (and algo.lam=0 turns the rescue NLL off)"
        if run.n < 2:
            return ("rescued peer successes join the learner's group and its advantages are recomputed there: a group "
                    "of one response gets advantage 0 and the update is 0")
        return None


def token_ratio_error(where: str) -> ConfigError:
    return ConfigError(f"algo.token_ratio=cross_aligned (T2) needs per-token peer log-probs and character offsets, "
                       f"which {where} lack (a trajectory store keeps only their sums); use algo.token_ratio="
                       f"learner_old or none")


@register_config("graft")
class GRAFTConfig(LearnerConfig):
    """GRAFT (docs/algorithms.md#graft) with its defaults (docs/algorithms.md#graft-defaults)."""

    needs_peer: ClassVar[bool] = True

    delta: float = key(0.8, "compatibility floor", ge=0)
    weight: Literal["min_s_1", "one"] = key("min_s_1", "weight of an admitted peer response: min(s, 1) | 1")
    select: Literal["complementary", "random_count_matched", "sgt_rescue"] = key(
        "complementary", "complementary: learner all-fail + peer mixed, whole peer group; random_count_matched: as "
                         "many prompts at random; sgt_rescue: successes only (\"SGT + GRAFT how\")")
    balance: Literal["cap_pvar", "symmetric", "none"] = key(
        "none", "extension: cap_pvar = cap ranked by p(1-p), symmetric = the same cap both directions")
    max_peer_frac: float = key(1.0, "extension, balance=cap_pvar|symmetric: cap floor(rho_max * |B_t|)", ge=0, le=1)
    admission: Literal["gate", "random_count_matched", "all"] = key("gate", "which grafted responses are admitted")
    token_ratio: Literal["learner_old", "cross_aligned", "none"] = key("learner_old", "T1 | T2 | none")
    peer_position: Literal["last", "first", "uniform"] = key("last", "where grafted groups go in the minibatches")
    peer_minibatches: Literal["replace_slots", "separate"] = key("replace_slots", "grafted groups in slots | apart")
    renorm_adv_after_gate: bool = key(False, "recompute advantages over the admitted responses")
    k_inj: Int = key(1, "select=sgt_rescue: SGT's k_inj, peer successes per rescued prompt, at most", ge=1, le=MAX_N)

    def group_needed(self, run: LearnerFacts) -> Optional[str]:
        """A stored peer's groups may be larger and keep their advantages; an online peer samples as the learner.
        ``sgt_rescue`` injects an all-success peer group's successes into identical failures (n >= 2 learns)."""
        if run.peer_source in ("stored", "mixed") or (self.select == "sgt_rescue" and run.n >= 2):
            return None
        return ("its own advantage compares a prompt's responses, and it grafts only mixed peer groups, which an "
                "online peer sampling as the learner never has: every advantage is 0 and the update is 0")

    def check(self, run: LearnerFacts) -> None:
        if self.peer_position == "uniform" and self.peer_minibatches == "separate":
            raise ConfigError("config key 'algo.peer_position'=uniform spreads grafted groups over the own "
                              "minibatches; it needs algo.peer_minibatches=replace_slots (separate: use last|first)")
        if self.token_ratio == "cross_aligned" and run.peer_source == "stored":
            raise token_ratio_error("the rollouts of a stored peer (peer.source=stored)")
        if self.balance == "none" and float(self.max_peer_frac) != 1.0:
            raise ConfigError("config key 'algo.max_peer_frac' caps the grafted groups only with the extension "
                              "algo.balance=cap_pvar|symmetric (default none: every candidate, as sourced)")
        if self.select == "sgt_rescue" and self.balance != "none":
            raise ConfigError("algo.select=sgt_rescue (SGT's rescue set) has no cap: algo.balance must stay none")
