"""GRAFT [graft] (docs/algorithms.md#graft, keys docs/algorithms.md#peer-exchange): Gated Replacement of Answer-Failed groups with peer Trajectories.

Per step, for each learner (all decisions under theta_old, before any update):

1. **Which** (``select``; docs/algorithms.md#graft-which-groups): every prompt where the learner's group is all-fail and the peer's
   group is mixed is replaced by the **whole** peer group, successes and failures with their peer advantages:
   the sourced "balanced exchange", with no cap. ``select=random_count_matched`` replaces as many prompts,
   drawn at random ("Count-matched random prompt selection", docs/algorithms.md#graft-ablations). ``select=sgt_rescue`` is "w/o balanced
   exchange", the same configuration as "SGT + GRAFT how" (docs/algorithms.md#graft-ablations): SGT's rescue set (learner all-fail, peer
   has a verified success), only the peer's successes are transferred, at most ``k_inj`` (SGT's ``algo.k_inj``)
   per prompt, drawn at random; from a mixed peer group they keep their peer advantages, from an all-success peer
   group (zero peer advantage) they are injected into the learner's group, whose GRPO advantages are recomputed
   (the docs/algorithms.md#sgt augmentation, as plain SGT does).
   EXTENSIONS, not in the sourced method and off by default (``balance=none``, ``max_peer_frac=1``):
   ``balance=cap_pvar`` caps the replaced prompts at ``floor(max_peer_frac * |B_t|)``, ranked by the peer's
   outcome balance ``p(1-p)``; ``balance=symmetric`` caps both directions at ``min(|C^A|, |C^B|, cap)``.
2. **Replacement** (step 4): the peer group takes the learner group's slot (the slot count is kept), its
   responses re-tokenized by XT (``ctx.localize``) and carrying the advantages the peer computed, reused as
   they are (``renorm_adv_after_gate`` recomputes them over the admitted responses instead).
3. **Gate and weight** (step 5, docs/algorithms.md#graft-compatibility-gate): ``s = exp(clip(l_L - l_P, -10, 10))`` from the learner's theta_old mean
   log-prob of the re-tokenized text and the peer's behaviour mean log-prob (EOS excluded on both sides);
   ``w = 1[s >= delta] * min(s, 1)`` (``weight=one``: ``w = 1[s >= delta]``). ``admission=all`` admits every
   grafted response with ``min(s, 1)``; ``admission=random_count_matched`` admits as many as the gate, at random.
   Rejected responses leave the loss and its denominator.
4. **Token ratio** (docs/algorithms.md#graft-loss-and-token-ratio): ``learner_old`` (T1) is PPO clipping against the learner's theta_old log-probs of the
   grafted text; ``cross_aligned`` (T2) uses the peer's per-token log-probs mapped onto learner tokens by
   character offsets; ``none`` drops clipping for grafted tokens (own tokens keep it).
5. **Order** (step 6): grafted slots ``last`` / ``first`` / ``uniform`` over ``optim.minibatches``
   (``peer_minibatches=replace_slots``), or in minibatches of their own after (or before) minibatches of the
   own *informative* groups (``peer_minibatches=separate``; own groups with zero advantages are left out).

``xt.append_eos_if_stopped`` and ``xt.overflow`` (docs/algorithms.md#graft-edge-cases) and ``xt.lossy``
(docs/algorithms.md#exchange-rules-for-real-vocabularies) act inside ``ctx.localize``.

In a population (two or more peers, docs/algorithms.md#populations) each all-fail prompt takes one informative peer
group, the one ``peer_choice`` picks (``compatible``: the highest mean compatibility under theta_old); the grafted
groups of all peers together go last.
"""
from __future__ import annotations

from typing import ClassVar, Literal, Optional

from graftzoo.algos.config import LearnerConfig
from graftzoo.contract.config import LearnerFacts, MAX_N
from graftzoo.contract.errors import ConfigError
from graftzoo.contract.peer_sources import peer_source_kind
from graftzoo.contract.registry import register_config
from graftzoo.contract.schema import Int, key


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
    peer_choice: Literal["compatible", "informative", "random"] = key(
        "compatible", "a population (two or more peers): which informative peer group an all-fail prompt takes: the "
                      "highest mean compatibility s | the largest p(1-p) | at random (docs/algorithms.md#populations)")

    def group_needed(self, run: LearnerFacts) -> Optional[str]:
        """A stored peer's groups may be larger and keep their advantages; an online peer samples as the learner.
        ``sgt_rescue`` injects an all-success peer group's successes into identical failures (n >= 2 learns)."""
        kind = peer_source_kind(run.peer_source)
        if (kind is not None and kind.reads_run) or (self.select == "sgt_rescue" and run.n >= 2):
            return None
        return ("its own advantage compares a prompt's responses, and it grafts only mixed peer groups, which an "
                "online peer sampling as the learner never has: every advantage is 0 and the update is 0")

    def check(self, run: LearnerFacts) -> None:
        if self.peer_position == "uniform" and self.peer_minibatches == "separate":
            raise ConfigError("config key 'algo.peer_position'=uniform spreads grafted groups over the own "
                              "minibatches; it needs algo.peer_minibatches=replace_slots (separate: use last|first)")
        kind = peer_source_kind(run.peer_source)
        if self.token_ratio == "cross_aligned" and kind is not None and kind.reads_run and not kind.live:
            raise token_ratio_error(f"the rollouts of a {run.peer_source} peer (peer.source={run.peer_source})")
        if self.balance == "none" and float(self.max_peer_frac) != 1.0:
            raise ConfigError("config key 'algo.max_peer_frac' caps the grafted groups only with the extension "
                              "algo.balance=cap_pvar|symmetric (default none: every candidate, as sourced)")
        if self.select == "sgt_rescue" and self.balance != "none":
            raise ConfigError("algo.select=sgt_rescue (SGT's rescue set) has no cap: algo.balance must stay none")
