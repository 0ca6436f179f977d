"""GRAFT [graft] (spec algos_peer §4, keys §6): Gated Replacement of Answer-Failed groups with peer Trajectories.

Per step, for each learner (all decisions under theta_old, before any update):

1. **Which** (``select``, ``balance``, ``max_peer_frac``): prompts where the learner's group is all-fail
   and the peer's group is mixed (§4.3 step 2), capped at ``floor(max_peer_frac * |B_t|)`` and ranked by
   the peer's outcome balance ``p(1-p)`` (step 3a); ``balance=symmetric`` caps both directions at
   ``min(|C^A|, |C^B|, cap)`` (step 3b), ``balance=none`` takes every candidate. ``select=random_count_matched``
   replaces as many prompts, drawn at random (§4.4.4). ``select=sgt_rescue`` is "SGT + GRAFT how" (§4.4.4):
   SGT's rescue set (learner all-fail, peer has a verified success; SGT has no cap, so ``balance`` is not
   applied), only the peer's successes are transferred; from a mixed peer group they keep their peer
   advantages, from an all-success peer group (zero peer advantage) up to ``sgt_k_inj`` of them are injected
   into the learner's group, whose GRPO advantages are recomputed (the §3.2 augmentation fallback).
2. **Replacement** (step 4): the peer group takes the learner group's slot (the slot count is kept), its
   responses re-tokenized by XT (``ctx.localize``) and carrying the advantages the peer computed, reused as
   they are (``renorm_adv_after_gate`` recomputes them over the admitted responses instead).
3. **Gate and weight** (step 5, §4.4.1): ``s = exp(clip(l_L - l_P, -10, 10))`` from the learner's theta_old mean
   log-prob of the re-tokenized text and the peer's behaviour mean log-prob (EOS excluded on both sides);
   ``w = 1[s >= delta] * min(s, 1)`` (``weight=one``: ``w = 1[s >= delta]``). ``admission=all`` admits every
   grafted response with ``min(s, 1)``; ``admission=random_count_matched`` admits as many as the gate, at random.
   Rejected responses leave the loss and its denominator.
4. **Token ratio** (§4.4.3): ``learner_old`` (T1) is PPO clipping against the learner's theta_old log-probs of the
   grafted text; ``cross_aligned`` (T2) uses the peer's per-token log-probs mapped onto learner tokens by
   character offsets; ``none`` drops clipping for grafted tokens (own tokens keep it).
5. **Order** (step 6): grafted slots ``last`` / ``first`` / ``uniform`` over ``optim.minibatches``
   (``peer_minibatches=replace_slots``), or in minibatches of their own after (or before) the own ones
   (``peer_minibatches=separate``).

``xt.append_eos_if_stopped`` and ``xt.overflow`` (spec §4.5) act inside ``ctx.localize``.
"""
from __future__ import annotations

import copy
import math
from dataclasses import dataclass
from typing import Optional

import torch

from graftzoo.algos.base import (Learner, LearnerConfig, MiniBatch, StepContext, TrainBatch, log_s_stats,
                                 require_peer)
from graftzoo.algos.functional import (align_peer_logprobs, compatibility_weights, graft_balance, graft_cap,
                                       graft_candidates, group_advantages, peer_order,
                                       random_count_matched_admission, random_count_matched_prompts,
                                       ratio_surrogate, separate_minibatches, sgt_augment, symmetric_cap)
from graftzoo.core.config import ConfigError
from graftzoo.core.registry import register_algo
from graftzoo.core.types import Group

CHOICES = {
    "weight": ("min_s_1", "one"),
    "select": ("complementary", "random_count_matched", "sgt_rescue"),
    "balance": ("cap_pvar", "symmetric", "none"),
    "admission": ("gate", "random_count_matched", "all"),
    "token_ratio": ("learner_old", "cross_aligned", "none"),
    "peer_position": ("last", "first", "uniform"),
    "peer_minibatches": ("replace_slots", "separate"),
}


@dataclass
class GRAFTConfig(LearnerConfig):
    """``algo.*`` keys of GRAFT: the spec's ``graft.*`` keys (algos_peer §6) with its defaults (§4.4.2, §4.6)."""

    eps_high: float = 0.28
    delta: float = 0.8                       # compatibility floor
    weight: str = "min_s_1"                  # min_s_1 | one
    select: str = "complementary"            # complementary | random_count_matched | sgt_rescue (SGT + GRAFT how)
    balance: str = "cap_pvar"                # cap_pvar | symmetric | none
    max_peer_frac: float = 0.25              # rho_max: cap = floor(rho_max * |B_t|)
    admission: str = "gate"                  # gate | random_count_matched | all
    token_ratio: str = "learner_old"         # learner_old (T1) | cross_aligned (T2) | none
    peer_position: str = "last"              # last | first | uniform
    peer_minibatches: str = "replace_slots"  # replace_slots | separate
    renorm_adv_after_gate: bool = False
    sgt_k_inj: int = 1                       # select=sgt_rescue: successes injected from an all-success peer group

    def __post_init__(self):
        for key, allowed in CHOICES.items():
            if getattr(self, key) not in allowed:
                raise ConfigError(f"algo.{key} (spec graft.{key}) must be one of {'|'.join(allowed)}, "
                                  f"got {getattr(self, key)!r}")
        if not 0.0 <= float(self.max_peer_frac) <= 1.0:
            raise ConfigError(f"algo.max_peer_frac must be in [0, 1], got {self.max_peer_frac}")
        if float(self.delta) < 0:
            raise ConfigError(f"algo.delta must be >= 0, got {self.delta}")
        if int(self.sgt_k_inj) < 1:
            raise ConfigError(f"algo.sgt_k_inj must be >= 1, got {self.sgt_k_inj}")
        if self.peer_position == "uniform" and self.peer_minibatches == "separate":
            raise ConfigError("algo.peer_position=uniform spreads grafted groups over the own minibatches; "
                              "it needs algo.peer_minibatches=replace_slots (separate: use last|first)")


def token_ratio_error(where: str) -> ConfigError:
    return ConfigError(f"algo.token_ratio=cross_aligned (spec graft.token_ratio, T2) needs per-token peer log-probs "
                       f"and character offsets, which {where} lack (a stored trajectory store keeps only their "
                       f"sums); use algo.token_ratio=learner_old or none")


def char_offsets(tokenizer, ids: list, text: str) -> list:
    """``(start, end)`` character span in ``text`` of each token of ``ids`` (the tokenization of ``text``).

    The tokenizer's offset mapping when re-encoding ``text`` gives back ``ids`` (or a prefix of them: a
    truncated response); otherwise spans from incremental decoding. Spans are made non-decreasing.
    """
    spans = None
    if getattr(tokenizer, "is_fast", False):
        enc = tokenizer(text, add_special_tokens=False, return_offsets_mapping=True)
        if list(enc["input_ids"][:len(ids)]) == list(ids):
            spans = [tuple(o) for o in enc["offset_mapping"][:len(ids)]]
    if spans is None:
        spans, prev = [], 0
        for i in range(len(ids)):
            end = len(tokenizer.decode(list(ids[:i + 1]), skip_special_tokens=True,
                                       clean_up_tokenization_spaces=False))
            spans.append((prev, max(prev, end)))
            prev = max(prev, end)
    out, lo, hi = [], 0, 0
    for a, b in spans:
        lo = max(lo, int(a))
        hi = max(hi, int(b), lo)
        out.append((lo, hi))
    return out


@register_algo("graft")
class GRAFT(Learner):
    """GRPO on the learner's own groups, with all-fail groups replaced by gated, weighted peer groups."""

    Config = GRAFTConfig

    def __init__(self, cfg: GRAFTConfig, run_cfg: dict):
        super().__init__(cfg, run_cfg)
        require_peer(self.name, run_cfg)
        source = run_cfg["peer"]["source"]
        if cfg.token_ratio == "cross_aligned" and source == "stored":
            raise token_ratio_error("the rollouts of a stored peer (peer.source=stored)")

    # ---- rollouts: T2 needs character offsets of the generated tokens on the peer side ------------
    def collect(self, ctx: StepContext, prompts) -> list:
        groups = super().collect(ctx, prompts)
        if self.cfg.token_ratio == "cross_aligned":
            for g in groups:
                for r in g.rollouts:
                    r.meta["char_offsets"] = char_offsets(ctx.policy.tokenizer, r.body_ids, r.text)
        return groups

    # ---- the exchange ------------------------------------------------------------------------
    def exchange(self, ctx: StepContext, groups, peer: Optional[dict]) -> list:
        require_peer(self.name, ctx.cfg, peer)
        c = self.cfg
        pgs = [peer.get(g.prompt.id) for g in groups]
        plans = self._select(ctx, groups, pgs)        # {slot: (peer rollout indices, "replace" | "augment")}
        picked = {}
        for x, (idx, _) in plans.items():
            picked[x] = copy.copy(pgs[x])
            picked[x].rollouts = [pgs[x].rollouts[i] for i in idx]
            picked[x].advantages = [(pgs[x].advantages or [0.0] * pgs[x].n)[i] for i in idx]
        local = dict(zip(plans, ctx.localize([picked[x] for x in plans]))) if plans else {}

        # compatibility, admission and weights over all grafted responses of the step
        flat = [(x, j, r) for x in plans for j, r in enumerate(local[x].rollouts)]
        live = [not r.meta.get("dropped") for _, _, r in flat]
        ell_l = [r.mean_logp for _, _, r in flat]
        ell_p = [r.meta["origin_mean_logp"] for _, _, r in flat]
        s, w_gate = compatibility_weights(ell_l, ell_p, float(c.delta), c.weight)
        _, w_free = compatibility_weights(ell_l, ell_p, 0.0, c.weight)  # min(s, 1) (or 1) without the floor
        admit = [bool(a) and ok for a, ok in zip((w_gate > 0).tolist(), live)]
        if c.admission == "all":
            admit = list(live)
        elif c.admission == "random_count_matched":
            admit = random_count_matched_admission(admit, ctx.rng, eligible=live)
        weights = [float(wi) if a else 0.0 for wi, a in zip(w_free.tolist(), admit)]
        if c.token_ratio == "cross_aligned":
            for (x, j, r) in flat:
                self._align(ctx, picked[x].rollouts[j], r)

        slots = list(groups)
        pos = 0
        for x, (idx, how) in plans.items():
            lg, k = local[x], len(local[x].rollouts)
            wx, ax = weights[pos:pos + k], admit[pos:pos + k]
            pos += k
            slots[x] = self._augment(ctx, groups[x], lg, wx, ax) if how == "augment" else self._replace(lg, wx, ax)
        self._log(ctx, flat, s, admit, live, slots, plans)
        return self._order(ctx, slots)

    def _select(self, ctx: StepContext, groups, pgs) -> dict:
        """Slots that receive peer data: {slot: (indices of the peer responses to transfer, how)}."""
        c = self.cfg
        lc, lG = [g.num_correct for g in groups], [g.n for g in groups]
        pc = [None if p is None else p.num_correct for p in pgs]
        pG = [0 if p is None else p.n for p in pgs]
        if c.select == "sgt_rescue":
            plans = {}
            for x, (g, p) in enumerate(zip(groups, pgs)):
                if p is None or not g.all_fail or p.num_correct == 0:
                    continue
                succ = [i for i, r in enumerate(p.rollouts) if r.correct]
                if p.mixed:
                    plans[x] = (succ, "replace")
                else:  # all-success: zero peer advantage, the positive signal comes from augmentation (§3.2)
                    plans[x] = (sorted(ctx.rng.sample(succ, min(int(c.sgt_k_inj), len(succ), g.n))), "augment")
            return plans
        cands = graft_candidates(lc, pc, lG, pG)
        p = [0.0 if n is None or G == 0 else n / G for n, G in zip(pc, pG)]
        if c.balance == "none":
            chosen = graft_balance(cands, p, len(cands), ctx.rng, "none")
        else:
            cap = graft_cap(len(groups), float(c.max_peer_frac))
            if c.balance == "symmetric":  # the other direction: peer all-fail, learner mixed
                other = graft_candidates([0 if n is None else n for n in pc], lc,
                                         [0 if n is None else G for n, G in zip(pc, pG)], lG)
                cap = symmetric_cap(len(cands), len(other), cap)
            chosen = graft_balance(cands, p, cap, ctx.rng, "cap_pvar")
        if c.select == "random_count_matched":
            avail = [x for x, q in enumerate(pgs) if q is not None]
            chosen = [avail[i] for i in random_count_matched_prompts(len(avail), len(chosen), ctx.rng)]
        return {x: (list(range(pgs[x].n)), "replace") for x in chosen}

    def _replace(self, lg: Group, weights: list, admit: list) -> Group:
        """The localized peer group in the learner's slot, with reused (or renormalized) peer advantages."""
        adv = [float(r.meta["advantage"]) if "advantage" in r.meta else float(a)
               for r, a in zip(lg.rollouts, lg.advantages or [0.0] * lg.n)]
        if self.cfg.renorm_adv_after_gate:
            keep = [i for i, a in enumerate(admit) if a]
            adv = [0.0] * lg.n
            if keep:
                new = group_advantages(torch.tensor([lg.rollouts[i].reward for i in keep], dtype=torch.float64),
                                       torch.zeros(len(keep), dtype=torch.long),
                                       std_normalize=self.cfg.std_normalize, eps=self.cfg.adv_eps)
                for i, a in zip(keep, new.tolist()):
                    adv[i] = a
        out = copy.copy(lg)
        out.advantages, out.weights, out.source = adv, list(weights), "peer"
        out.meta = {**lg.meta, "graft": "replace"}
        return out

    def _augment(self, ctx: StepContext, own: Group, lg: Group, weights: list, admit: list) -> Group:
        """SGT + GRAFT how, all-success peer group: admitted peer successes replace own failures (§3.2 step 3)."""
        inj = [(r, wi) for r, wi, a in zip(lg.rollouts, weights, admit) if a]
        if not inj:
            return own
        pos, _, adv = sgt_augment(own.rewards, [r.correct for r in own.rollouts], [r.reward for r, _ in inj],
                                  ctx.rng, self.cfg.adv_eps)
        rolls, ws = list(own.rollouts), [1.0] * own.n
        for p, (r, wi) in zip(pos, inj):
            rolls[p], ws[p] = r, wi
            r.meta["graft_injected"] = True
        return Group(own.prompt, own.model_id, rolls, adv.tolist(), "peer", ws, {**own.meta, "graft": "augment"})

    def _align(self, ctx: StepContext, origin, r):
        """T2: the peer's per-token log-probs mapped onto the learner's tokens (spec §4.4.3)."""
        if "char_offsets" not in origin.meta or "stored_step" in origin.meta:
            raise token_ratio_error(f"the peer's rollouts (model {origin.model_id}, prompt {origin.prompt_id})")
        peer_body = origin.body_ids
        peer_lp = list(origin.logprobs)[:len(peer_body)]
        body = r.body_ids
        aligned = align_peer_logprobs(char_offsets(ctx.policy.tokenizer, body, r.text), origin.meta["char_offsets"],
                                      peer_lp)
        if len(body) < len(r.token_ids):  # the learner's EOS: the peer's EOS log-prob, else the learner's own
            ended = len(peer_body) < len(origin.token_ids) and len(origin.logprobs) == len(origin.token_ids)
            aligned.append(float(origin.logprobs[-1]) if ended else float(r.logprobs[-1]))
        r.meta["aligned_logp"] = aligned

    def _order(self, ctx: StepContext, slots: list) -> list:
        """Grafted slots last / first / spread over the minibatches (spec §4.3 step 6)."""
        own = [g for g in slots if g.source == "own"]
        grafted = [g for g in slots if g.source != "own"]
        if self.cfg.peer_minibatches == "separate":
            return own + grafted  # schedule() puts the peer minibatches after (or before) the own ones
        order = peer_order(len(own), len(grafted), self.cfg.peer_position, int(ctx.cfg["optim"]["minibatches"]))
        both = own + grafted
        return [both[i] for i in order]

    def _log(self, ctx: StepContext, flat, s, admit, live, slots, plans):
        scored = [float(v) for v, ok in zip(s.tolist(), live) if ok]
        n_adm = sum(admit)
        ctx.log("peer/rescued_groups", sum(1 for x in plans if slots[x].source != "own"))
        ctx.log("peer/admitted", n_adm)
        ctx.log("peer/rejected", len(flat) - n_adm)
        log_s_stats(ctx, scored)
        for key, want in (("peer/admit_rate_succ", True), ("peer/admit_rate_fail", False)):
            sel = [a for (_, _, r), a in zip(flat, admit) if bool(r.correct) == want]
            ctx.log(key, sum(sel) / len(sel) if sel else None)

    # ---- batch, schedule and loss -------------------------------------------------------------
    def build_batch(self, ctx: StepContext, slots) -> TrainBatch:
        batch = super().build_batch(ctx, slots)
        for row in batch.rows:
            g = slots[row.slot]
            if g.meta.get("graft") == "augment":  # own responses of an augmented group stay own
                row.is_peer = bool(row.rollout.meta.get("graft_injected"))
                if not row.is_peer:
                    row.kl_mask = list(row.rollout.meta.get("kl_mask", row.loss_mask))
            if row.is_peer and self.cfg.token_ratio == "cross_aligned":
                row.old_logp = list(row.rollout.meta["aligned_logp"])
        return batch

    def schedule(self, ctx: StepContext, batch: TrainBatch) -> list:
        if self.cfg.peer_minibatches == "replace_slots":
            return super().schedule(ctx, batch)
        n_slots = len(batch.groups)
        n_peer = sum(1 for g in batch.groups if g.source != "own")
        n_own = n_slots - n_peer
        size = max(1, math.ceil(n_slots / max(1, int(ctx.cfg["optim"]["minibatches"]))))
        chunks = separate_minibatches(n_own, n_peer, size)
        k_own = math.ceil(n_own / size)
        if self.cfg.peer_position == "first":
            chunks = chunks[k_own:] + chunks[:k_own]
        out = []
        for _ in range(int(ctx.cfg["optim"].get("epochs", 1))):
            for chunk in chunks:
                members = set(chunk)
                idx = [i for i, r in enumerate(batch.rows) if r.slot in members]
                if idx:
                    out.append(idx)
        return out

    def surrogate(self, logp: torch.Tensor, mb: MiniBatch):
        tok, info = super().surrogate(logp, mb)
        if self.cfg.token_ratio != "none" or not bool(mb.is_peer.any()):
            return tok, info
        # w/o token-level ratio (spec §4.4.4): unclipped w * rho * A for grafted tokens, own tokens clipped
        ratio = torch.exp((logp - mb.old_logp).clamp(min=-20.0, max=20.0))
        free, _ = ratio_surrogate(ratio, mb.advantages, math.inf, math.inf)
        peer = mb.is_peer.unsqueeze(1)
        info = dict(info)
        for key in ("clipped_low", "clipped_high", "dual_clipped"):
            info[key] = info[key] & ~peer
        return torch.where(peer, free, tok), info
