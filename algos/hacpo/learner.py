"""The HACPO learner and its policy loss: the algorithm, its section and its metrics are graftzoo.algos.hacpo."""
from __future__ import annotations

from dataclasses import replace
from typing import Optional

import torch

from graftzoo.algos.base import StepContext
from graftzoo.algos.functional import sequence_mean_logp
from graftzoo.algos.graft.formulas import graft_candidates
from graftzoo.algos.hacpo.formulas import (capability_estimate, cross_sequence_ratio, hacpo_advantages,
                                           hacpo_cross_loss, hacpo_discrepancy, hacpo_omegas, stepwise_lower_bound)
from graftzoo.algos.hacpo import (HACPOConfig, HACPO_CAPABILITY_PEER, HACPO_CAPABILITY_SELF, HACPO_CROSS_LOWER,
                                  HACPO_OMEGA)
from graftzoo.algos.gspo.learner import gspo_loss
from graftzoo.algos.losses import LossInputs, PolicyLoss, register_loss
from graftzoo.algos.peer import PeerLearner, log_by_peer, log_compatibility, peer_groups, require_peer
from graftzoo.contract import metrics as M
from graftzoo.contract.config import LearnerFacts
from graftzoo.contract.registry import register_algo
from graftzoo.contract.types import Group

SELF, PEER = 0, 1  # source ids in the pooled group (docs/algorithms.md#hacpo-capability-aware-advantage: agent k = the learner, j = the peer;
# a population's peers are PEER, PEER + 1, ... in population order)


def accuracy(groups) -> Optional[float]:
    """Fraction of responses with reward > 0 (the code's per-step accuracy, docs/algorithms.md#hacpo-capability-aware-advantage)."""
    rolls = [r for g in groups for r in g.rollouts]
    return sum(1.0 for r in rolls if r.reward > 0) / len(rolls) if rolls else None


def content_mask(r) -> list:
    """1 per response token, 0 on a final EOS: the cross ratio compares EOS-free means (docs/algorithms.md#cross-tokenizer-exchange)."""
    body = len(r.body_ids)
    return [1.0] * body + [0.0] * (len(r.token_ids) - body)


@register_algo("hacpo")
class HACPO(PeerLearner):
    Config = HACPOConfig
    loss = "hacpo"

    def __init__(self, cfg: HACPOConfig, run: LearnerFacts):
        super().__init__(cfg, run)
        self.history: dict = {"self": [], "peer": []}   # per-step accuracies, newest last (docs/algorithms.md#hacpo-capability-aware-advantage)
        self.kl_roles = ("own", "peer") if cfg.kl_on_cross else ("own",)

    # ---- capability ------------------------------------------------------------------------
    def _push(self, key: str, acc: Optional[float]):
        if acc is not None:
            self.history[key] = (self.history.get(key, []) + [acc])[-int(self.cfg.capability_window):]

    def capabilities(self, n_peers: int = 1) -> tuple:
        """(P^_self, [P^_peer of each peer]): window means including the current step
        (docs/algorithms.md#hacpo-capability-aware-advantage); a pair's ``capabilities()`` is (P^_self, P^_peer)."""
        k = int(self.cfg.capability_window)
        peers = [capability_estimate(self.history.get(peer_key(j), []), k) for j in range(n_peers)]
        return capability_estimate(self.history["self"], k), (peers[0] if n_peers == 1 else peers)

    # ---- exchange: pooled groups, capability-aware advantages, self first then cross --------
    def exchange(self, ctx: StepContext, groups, peer: Optional[dict]) -> list:
        """The pooled group of each prompt holds the learner's responses and every peer's (agent 0 the learner,
        agents 1.. its peers in population order: docs/algorithms.md#populations); cross responses follow the own
        ones, peer by peer."""
        require_peer(self.name, ctx.run, peer)
        c = self.cfg
        by_peer = peer_groups(peer)
        peers = list(by_peer.values())
        offered = [[p[g.prompt.id] for g in groups if g.prompt.id in p] for p in peers]
        self._push("self", accuracy(groups))
        for j, gs in enumerate(offered):
            self._push(peer_key(j), accuracy(gs))
        p_self, p_peer = self.capabilities(len(peers))
        p_peers = [p_peer] if len(peers) == 1 else p_peer
        base_w, grad_coef = hacpo_omegas([p_self, *p_peers], SELF, tuple(c.ratio_clamp))
        if c.select == "graft_which" and groups:  # only GRAFT's prompts are pooled; capabilities see every group
            offered = []
            for p in peers:
                pgs = [p.get(g.prompt.id) for g in groups]
                pc, pn = zip(*[(None, 0) if q is None else (q.num_correct, q.n) for q in pgs])
                offered.append([pgs[x] for x in graft_candidates([g.num_correct for g in groups], pc,
                                                                  [g.n for g in groups], pn)])
        flat = ctx.localize([g for gs in offered for g in gs])
        cross, pos = [], 0  # per peer: prompt id -> its localized group
        for gs in offered:
            cross.append({g.prompt.id: g for g in flat[pos:pos + len(gs)]})
            pos += len(gs)

        rewards, index, source = [], [], []
        for gi, g in enumerate(groups):
            pooled = [(r.reward, SELF) for r in g.rollouts]
            for j, cj in enumerate(cross):
                if g.prompt.id in cj:
                    pooled += [(r.reward, PEER + j) for r in cj[g.prompt.id].rollouts]
            rewards += [x for x, _ in pooled]
            source += [s for _, s in pooled]
            index += [gi] * len(pooled)
        src = torch.tensor(source, dtype=torch.long)
        adv = hacpo_advantages(torch.tensor(rewards, dtype=torch.float64), torch.tensor(index, dtype=torch.long),
                               src, SELF, base_w, eps=c.adv_eps, uniform_reward_guard=c.uniform_reward_guard,
                               binary_baseline_guard=c.binary_baseline_guard)
        adv = hacpo_discrepancy(adv, src, SELF, grad_coef).tolist()

        own, grafted, pos = [], [[] for _ in cross], 0
        for g in groups:
            own.append(Group(g.prompt, g.model_id, g.rollouts, adv[pos:pos + g.n], g.source, g.weights))
            pos += g.n
            for j, cj in enumerate(cross):
                if g.prompt.id in cj:
                    pg = cj[g.prompt.id]
                    rolls = [replace(r, loss_mask=content_mask(r)) for r in pg.rollouts]
                    grafted[j].append(Group(pg.prompt, pg.model_id, rolls, adv[pos:pos + pg.n], "peer",
                                            [1.0] * pg.n))
                    pos += pg.n
        grafted = [g for gs in grafted for g in gs]  # self first, then each peer's cross samples in model order
        omega = float(grad_coef[PEER:].mean())
        self._log_exchange(ctx, own, grafted, p_self, sum(p_peers) / len(p_peers), omega)
        log_by_peer(ctx, by_peer, [r for g in grafted for r in g.rollouts if not r.dropped])
        return own + grafted

    @staticmethod
    def _log_exchange(ctx, own, grafted, p_self, p_peer, omega):
        kept = [r for g in grafted for r in g.rollouts if not r.dropped]
        ctx.log(M.PEER_ADMITTED, len(kept))
        ctx.log(M.PEER_REJECTED, sum(g.n for g in grafted) - len(kept))
        peer_solved = {g.prompt.id for g in grafted if g.num_correct > 0}
        ctx.log(M.PEER_RESCUED_GROUPS, sum(1 for g in own if g.all_fail and g.prompt.id in peer_solved))
        log_compatibility(ctx, kept)
        ctx.log(HACPO_CAPABILITY_SELF, p_self)
        ctx.log(HACPO_CAPABILITY_PEER, p_peer)
        ctx.log(HACPO_OMEGA, omega)

    # ---- state -------------------------------------------------------------------------------
    def state_dict(self) -> dict:
        return {"history": {k: list(v) for k, v in self.history.items()}}

    def load_state_dict(self, state: dict):
        hist = state.get("history", {})
        self.history = {"self": [], "peer": [], **{k: list(v) for k, v in hist.items()}}


def peer_key(j: int) -> str:
    """The capability history's key of the learner's ``j``-th peer (population order): ``peer``, ``peer2``, ..."""
    return "peer" if j == 0 else f"peer{j + 1}"


def cross_lower(cfg: HACPOConfig, update: int) -> float:
    """The stepwise cross clip floor at the step's optimizer update ``update``
    (docs/algorithms.md#hacpo-cross-sample-loss)."""
    return stepwise_lower_bound(update, cfg.cross_clip_lower, cfg.cross_clip_step)


@register_loss("hacpo")
def hacpo_loss(x: LossInputs, cfg: HACPOConfig, clip: dict) -> PolicyLoss:
    """GSPO on self rows (``clip``: ``algo.self_clip``); on cross rows one clipped exponential-IS value per
    sequence (docs/algorithms.md#hacpo-cross-sample-loss), with the clip floor of update ``x.update``."""
    own = gspo_loss(x, cfg, clip)
    lo = cross_lower(cfg, x.update)
    own.metrics[HACPO_CROSS_LOWER] = lo
    peer = x.is_peer
    if not bool(peer.any()):
        return own
    s = cross_sequence_ratio(sequence_mean_logp(x.logp, x.loss_mask), x.origin_mean_logp.to(x.logp.dtype))
    cross = hacpo_cross_loss(s, x.advantages, lo, cfg.alpha)  # [B]: one value per sequence
    pm = peer.unsqueeze(1).expand_as(own.token_loss)

    def wide(v):  # a sequence's value on each of its tokens, for the token-level clip metrics
        return v.unsqueeze(1).expand_as(own.token_loss)

    return PolicyLoss(own.token_loss, torch.where(pm, wide(s.detach()), own.ratio.expand_as(own.token_loss)),
                      torch.where(pm, wide(s.detach() < lo), own.clipped_low),
                      torch.where(pm, wide(s.detach() > 1.0), own.clipped_high), own.dual_clipped & ~pm,
                      seq_loss=cross, seq_rows=peer, metrics=own.metrics)
