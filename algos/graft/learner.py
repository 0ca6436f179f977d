"""The GRAFT learner and its policy loss: the algorithm, its section and its metrics are graftzoo.algos.graft."""
from __future__ import annotations

from dataclasses import replace
import math
import statistics
from typing import Optional

import torch

from graftzoo.algos.base import StepContext, TrainBatch
from graftzoo.algos.functional import (align_peer_logprobs, compatibility_weights, group_advantages,
                                      ratio_surrogate, sgt_rescue)
from graftzoo.algos.graft.formulas import (choose_peer, graft_balance, graft_cap, graft_candidates, peer_order,
                                           random_count_matched_admission, random_count_matched_prompts,
                                           separate_minibatches, symmetric_cap)
from graftzoo.algos.graft import GRAFTConfig, token_ratio_error
from graftzoo.algos.losses import LossInputs, PolicyLoss, clipped_loss, register_loss
from graftzoo.algos.peer import (PeerLearner, augment_group, group_compatibility, log_by_peer, log_s_stats,
                                peer_groups, require_peer)
from graftzoo.contract import metrics as M
from graftzoo.contract.registry import register_algo
from graftzoo.contract.types import Group, Rollout



@register_algo("graft")
class GRAFT(PeerLearner):
    """GRPO on the learner's own groups, with all-fail groups replaced by gated, weighted peer groups."""

    Config = GRAFTConfig
    loss = "graft"

    # ---- rollouts: T2 needs character offsets of the generated tokens on the peer side ------------
    def collect(self, ctx: StepContext, prompts) -> list:
        groups = super().collect(ctx, prompts)
        if self.cfg.token_ratio == "cross_aligned":
            for g in groups:
                g.rollouts[:] = [replace(r, char_offsets=ctx.policy.char_offsets(r.body_ids, r.text))
                                 for r in g.rollouts]
        return groups

    # ---- the exchange ------------------------------------------------------------------------
    def exchange(self, ctx: StepContext, groups, peer: Optional[dict]) -> list:
        require_peer(self.name, ctx.run, peer)
        c = self.cfg
        peers = peer_groups(peer)
        pgs, scored = self._peer_choice(ctx, groups, peers)  # one peer group per slot; those the choice localized
        plans = self._select(ctx, groups, pgs)        # {slot: (peer rollout indices, "replace" | "augment")}
        picked = {x: Group(pgs[x].prompt, pgs[x].model_id, [pgs[x].rollouts[i] for i in idx],
                           [(pgs[x].advantages or [0.0] * pgs[x].n)[i] for i in idx], "peer")
                  for x, (idx, _) in plans.items()}
        todo = [x for x in plans if x not in scored]
        local = dict(zip(todo, ctx.localize([picked[x] for x in todo]))) if todo else {}
        for x, (idx, _) in plans.items():
            if x in scored:  # localized (and scored) once, by the choice: the chosen responses of it
                lg = scored[x]
                local[x] = replace(lg, rollouts=[lg.rollouts[i] for i in idx],
                                   advantages=[(lg.advantages or [0.0] * lg.n)[i] for i in idx], source="peer")
        local = {x: local[x] for x in plans}

        # compatibility, admission and weights over all grafted responses of the step
        flat = [(x, j, r) for x in plans for j, r in enumerate(local[x].rollouts)]
        live = [not r.dropped for _, _, r in flat]
        ell_l = [r.mean_logp for _, _, r in flat]
        ell_p = [r.origin.mean_logp for _, _, r in flat]
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
                local[x].rollouts[j] = replace(r, old_logp=aligned_old_logp(ctx.policy, picked[x].rollouts[j], r))

        slots = list(groups)
        pos = 0
        for x, (idx, how) in plans.items():
            lg, k = local[x], len(local[x].rollouts)
            wx, ax = weights[pos:pos + k], admit[pos:pos + k]
            pos += k
            if how == "augment":  # SGT + GRAFT how, all-success peer group: admitted successes injected (docs/algorithms.md#sgt)
                inj = [(r, w) for r, w, a in zip(lg.rollouts, wx, ax) if a]
                if inj:
                    slots[x] = augment_group(groups[x], [r for r, _ in inj], ctx.rng, c.adv_eps,
                                             weights=[w for _, w in inj], source="peer")
            else:
                slots[x] = self._replace(lg, wx, ax)
        self._log(ctx, flat, s, admit, live, slots, plans)
        log_by_peer(ctx, peers, [r for (_, _, r), a in zip(flat, admit) if a],
                    [local[x] for x in plans if slots[x].source != "own"])
        return self._order(ctx, slots)

    def _peer_choice(self, ctx: StepContext, groups, peers: dict) -> tuple[list, dict]:
        """The one peer group per slot that the rest of the exchange works on (docs/algorithms.md#populations), and
        {slot: the chosen group localized} for the slots whose choice localized its candidates. One peer: its
        group of each prompt. Several: where the learner's group is all-fail, the eligible group (informative;
        with ``select: sgt_rescue``, one with a success) that ``algo.peer_choice`` picks (``choose_peer``;
        ``compatible`` scores every eligible group of those prompts under theta_old first, one ``localize``);
        elsewhere the first peer's group in population order."""
        maps = list(peers.values())
        if len(maps) <= 1:
            return [(maps[0] if maps else {}).get(g.prompt.id) for g in groups], {}
        c = self.cfg
        mixed_only = c.select != "sgt_rescue"
        offered = [[p.get(g.prompt.id) for p in maps] for g in groups]
        pgs = [next((q for q in row if q is not None), None) for row in offered]
        dead = [x for x, g in enumerate(groups) if g.all_fail]

        def eligible(q) -> bool:
            return q is not None and (q.mixed if mixed_only else q.num_correct > 0)
        local: dict = {}
        if c.peer_choice == "compatible":
            want = [(x, j) for x in dead for j, q in enumerate(offered[x]) if eligible(q)]
            local = dict(zip(want, ctx.localize([offered[x][j] for x, j in want]))) if want else {}
        scored = {}
        for x in dead:
            s_mean = [group_compatibility(local[(x, j)]) if (x, j) in local else None for j in range(len(maps))]
            j = choose_peer([q.num_correct if q is not None else None for q in offered[x]],
                            [q.n if q is not None else 0 for q in offered[x]], s_mean, c.peer_choice, ctx.rng,
                            mixed_only)
            if j is not None:
                pgs[x] = offered[x][j]
                if (x, j) in local:
                    scored[x] = local[(x, j)]
        return pgs, scored

    def _select(self, ctx: StepContext, groups, pgs) -> dict:
        """Slots that receive peer data: {slot: (indices of the peer responses to transfer, how)}."""
        c = self.cfg
        lc, lG = [g.num_correct for g in groups], [g.n for g in groups]
        pc = [None if p is None else p.num_correct for p in pgs]
        pG = [0 if p is None else p.n for p in pgs]
        if c.select == "sgt_rescue":
            # SGT's rescue set (docs/algorithms.md#sgt): up to k_inj of the peer's successes per prompt, drawn at
            # random, from a mixed peer group as from an all-success one; from a mixed group they keep their peer
            # advantages, from an all-success group (zero peer advantage) they are injected by augmentation
            succ = [None if p is None else [i for i, r in enumerate(p.rollouts) if r.correct] for p in pgs]
            k_inj = min([int(c.k_inj), *lG])  # never more than a learner group's failures
            rescue = sgt_rescue(lc, lG, succ, ctx.rng, k_inj)
            return {x: (idx, "augment" if len(succ[x]) == pgs[x].n else "replace") for x, idx in rescue.items()}
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
        adv = [float(a) for a in lg.advantages or [0.0] * lg.n]
        if self.cfg.renorm_adv_after_gate:
            keep = [i for i, a in enumerate(admit) if a]
            adv = [0.0] * lg.n
            if keep:
                new = group_advantages(torch.tensor([lg.rollouts[i].reward for i in keep], dtype=torch.float64),
                                       torch.zeros(len(keep), dtype=torch.long),
                                       std_normalize=self.cfg.std_normalize, eps=self.cfg.adv_eps)
                for i, a in zip(keep, new.tolist()):
                    adv[i] = a
        return Group(lg.prompt, lg.model_id, lg.rollouts, adv, "peer", list(weights))

    def _order(self, ctx: StepContext, slots: list) -> list:
        """Grafted slots last / first / spread over the minibatches (docs/algorithms.md#graft-peer-last-order)."""
        own = [g for g in slots if g.source == "own"]
        grafted = [g for g in slots if g.source != "own"]
        if self.cfg.peer_minibatches == "separate":
            return own + grafted  # slot_chunks() puts the peer minibatches after (or before) the own ones
        order = peer_order(len(own), len(grafted), self.cfg.peer_position, ctx.run.minibatches)
        both = own + grafted
        return [both[i] for i in order]

    def _log(self, ctx: StepContext, flat, s, admit, live, slots, plans):
        scored = [float(v) for v, ok in zip(s.tolist(), live) if ok]
        n_adm = sum(admit)
        ctx.log(M.PEER_RESCUED_GROUPS, sum(1 for x in plans if slots[x].source != "own"))
        ctx.log(M.PEER_ADMITTED, n_adm)
        ctx.log(M.PEER_REJECTED, len(flat) - n_adm)
        if flat:
            ctx.log(M.PEER_ADMIT_RATE, n_adm / len(flat))
        log_s_stats(ctx, scored)
        log_s_spread(ctx, scored, [float(v) for v, a in zip(s.tolist(), admit) if a])
        for want, rate, count in ((True, M.PEER_ADMIT_RATE_SUCC, M.PEER_ADMITTED_SUCC),
                                  (False, M.PEER_ADMIT_RATE_FAIL, M.PEER_ADMITTED_FAIL)):
            sel = [a for (_, _, r), a in zip(flat, admit) if bool(r.correct) == want]
            ctx.log(rate, sum(sel) / len(sel) if sel else None)
            ctx.log(count, sum(sel))  # admitted grafted responses that are correct / incorrect

    # ---- schedule and loss -------------------------------------------------------------------
    def slot_chunks(self, ctx: StepContext, batch: TrainBatch) -> list:
        """``peer_minibatches=separate`` (docs/algorithms.md#graft-peer-last-order, alternative): the own *informative* groups (some
        non-zero advantage) in minibatches, then the grafted slots in minibatches of their own; own groups
        with zero advantages (no gradient) are in no minibatch."""
        if self.cfg.peer_minibatches == "replace_slots":
            return super().slot_chunks(ctx, batch)
        own = [i for i, g in enumerate(batch.groups) if g.source == "own" and any(g.advantages or [])]
        peer = [i for i, g in enumerate(batch.groups) if g.source != "own"]
        size = max(1, math.ceil(len(batch.groups) / max(1, ctx.run.minibatches)))
        chunks = [[(own + peer)[j] for j in c] for c in separate_minibatches(len(own), len(peer), size)]
        k_own = math.ceil(len(own) / size)
        return chunks[k_own:] + chunks[:k_own] if self.cfg.peer_position == "first" else chunks


def log_s_spread(ctx: StepContext, scored: list, admitted: list):
    """The spread of the compatibility scores beyond ``peer/s_*`` (docs/algorithms.md#graft-compatibility-gate): the
    10th and 90th percentiles of every scored grafted response, and the mean, min and max of the admitted ones."""
    if scored:
        q = statistics.quantiles(scored, n=10, method="inclusive") if len(scored) > 1 else [scored[0]] * 9
        ctx.log(M.PEER_S_Q10, q[0])
        ctx.log(M.PEER_S_Q90, q[-1])
    if admitted:
        ctx.log(M.PEER_S_ADMITTED_MEAN, statistics.fmean(admitted))
        ctx.log(M.PEER_S_ADMITTED_MIN, min(admitted))
        ctx.log(M.PEER_S_ADMITTED_MAX, max(admitted))


@register_loss("graft")
def graft_loss(x: LossInputs, cfg: GRAFTConfig, clip: dict) -> PolicyLoss:
    """The clipped surrogate (``clipped_loss``) on every row; with ``token_ratio: none``
    (docs/algorithms.md#graft-ablations) grafted tokens take the unclipped ``w * rho * A`` instead."""
    pg = clipped_loss(x, cfg, clip)
    if cfg.token_ratio != "none" or not bool(x.is_peer.any()):
        return pg
    ratio = torch.exp((x.logp - x.old_logp).clamp(min=-20.0, max=20.0))
    free, _ = ratio_surrogate(ratio, x.advantages, math.inf, math.inf)
    peer = x.is_peer.unsqueeze(1)
    return PolicyLoss(torch.where(peer, free, pg.token_loss), pg.ratio, pg.clipped_low & ~peer,
                      pg.clipped_high & ~peer, pg.dual_clipped & ~peer)


def aligned_old_logp(policy, generated: Rollout, r: Rollout) -> list:
    """T2: the peer's per-token log-probs of ``generated`` mapped onto the learner's tokens of ``r`` (its
    localized copy) by character offsets (docs/algorithms.md#graft-loss-and-token-ratio); the learner's EOS takes the peer's EOS log-prob,
    else the learner's own. A stored rollout (``origin`` set) has no per-token log-probs."""
    if generated.char_offsets is None or generated.origin is not None:
        raise token_ratio_error(f"the peer's rollouts (model {generated.model_id}, prompt {generated.prompt_id})")
    peer_body = generated.body_ids
    peer_lp = list(generated.old_logprobs)[:len(peer_body)]
    body = r.body_ids
    aligned = align_peer_logprobs(policy.char_offsets(body, r.text), generated.char_offsets, peer_lp)
    if len(body) < len(r.token_ids):
        ended = len(peer_body) < len(generated.token_ids) and len(generated.old_logprobs) == len(generated.token_ids)
        aligned.append(float(generated.old_logprobs[-1]) if ended else float(r.old_logprobs[-1]))
    return aligned
