"""The base of the learners that train on a peer's rollouts (GRAFT, HACPO, SGT): what only they need, kept out of
the single-model ``Learner``: the peer they must meet at exchange time, the rows whose tokens carry the KL term,
the compatibility statistics of the responses they take (docs/algorithms.md#cross-tokenizer-exchange) and the
group augmentation SGT and GRAFT's `select: sgt_rescue` share (docs/algorithms.md#sgt)."""
from __future__ import annotations

import statistics
from typing import Optional

import torch

from graftzoo.algos.base import Learner, StepContext
from graftzoo.algos.functional import compatibility_score, sgt_augment
from graftzoo.contract import metrics as M
from graftzoo.contract.config import LearnerFacts, needs_peer_error
from graftzoo.contract.types import Group, Rollout


class PeerLearner(Learner):
    """A learner that exchanges with a peer source (``peer.source``: online, stored or mixed)."""

    kl_roles: tuple = ("own",)
    """Rows whose tokens carry the KL term (HACPO's ``kl_on_cross`` adds "peer")."""

    def kl_tokens(self, r: Rollout, loss_mask: list) -> list:
        """An own response's KL tokens (``Learner.kl_tokens``); a peer response's are its loss mask when its role
        is in ``kl_roles``."""
        if r.role == "own" or r.role not in self.kl_roles:
            return super().kl_tokens(r, loss_mask)
        return list(loss_mask)


def peer_groups(peer) -> dict:
    """What a learner's ``exchange`` is handed, as {peer model id: {prompt id: Group}} in population order (the
    step hands it so; docs/algorithms.md#populations). A plain {prompt id: Group} is one peer's groups, named by
    their model; None stays None (no peer source)."""
    if not peer:
        return peer
    first = next(iter(peer.values()))
    return {first.model_id: dict(peer)} if isinstance(first, Group) else dict(peer)


def pooled_group(groups: list) -> Optional[Group]:
    """The groups several peers gave one prompt as one group (their responses and advantages in population order;
    SGT's union of the peers' successes, docs/algorithms.md#populations); None without any."""
    groups = [g for g in groups if g is not None]
    if len(groups) <= 1:
        return groups[0] if groups else None
    return Group(groups[0].prompt, groups[0].model_id, [r for g in groups for r in g.rollouts],
                 [a for g in groups for a in (g.advantages or [0.0] * g.n)], "peer")


def require_peer(name: str, run: LearnerFacts, peer=()):
    """The error for a peer-exchange learner that meets no peer at exchange time (``peer`` None); a run
    config without a peer source is refused at load (``needs_peer``, graftzoo.contract.config)."""
    if run.peer_source == "none" or peer is None:
        raise needs_peer_error(name)


def log_compatibility(ctx: StepContext, rollouts):
    """``peer/s_*`` of localized peer responses: ``s = exp(l_L - l_P)`` under theta_old
    (docs/algorithms.md#cross-tokenizer-exchange)."""
    if rollouts:
        s = compatibility_score(torch.tensor([r.mean_logp for r in rollouts], dtype=torch.float64),
                                torch.tensor([r.origin.mean_logp for r in rollouts], dtype=torch.float64))
        log_s_stats(ctx, s.tolist())


def log_by_peer(ctx: StepContext, peers: dict, admitted: list, rescued: Optional[list] = None):
    """With two or more peers (docs/algorithms.md#populations): the admitted peer responses by the model that
    generated them (``peer/admitted/<P>``) and, given ``rescued`` (the localized peer groups that took or joined an
    own slot), the own groups each peer's responses reached (``peer/rescued_groups/<P>``)."""
    if not peers or len(peers) < 2:
        return
    for p in peers:
        ctx.log(M.PEER_ADMITTED_FROM.of(peer=p), sum(1 for r in admitted if r.origin is not None and r.origin.model_id == p))
        if rescued is not None:
            ctx.log(M.PEER_RESCUED_FROM.of(peer=p), sum(1 for g in rescued
                                                        if any(r.origin is not None and r.origin.model_id == p for r in g.rollouts)))


def group_compatibility(g: Group) -> Optional[float]:
    """The mean compatibility ``s = exp(l_L - l_P)`` under theta_old of a localized peer group's carried responses
    (``peer_choice: compatible``, docs/algorithms.md#populations); None when none was carried."""
    kept = [r for r in g.rollouts if not r.dropped]
    if not kept:
        return None
    s = compatibility_score(torch.tensor([r.mean_logp for r in kept], dtype=torch.float64),
                            torch.tensor([r.origin.mean_logp for r in kept], dtype=torch.float64))
    return float(s.mean())


def log_s_stats(ctx: StepContext, s: list):
    """``peer/s_*``: statistics of the compatibility scores s of this step's peer responses."""
    if s:
        ctx.log(M.PEER_S_MEAN, statistics.fmean(s))
        ctx.log(M.PEER_S_MEDIAN, statistics.median(s))
        ctx.log(M.PEER_S_MIN, min(s))
        ctx.log(M.PEER_S_MAX, max(s))


def augment_group(own: Group, injected: list, rng, eps: float, weights=None, source=None) -> Group:
    """``own`` with ``injected`` peer successes (localized, role "peer") in place of as many of its failed
    responses, chosen at random, and GRPO advantages recomputed on the augmented group (docs/algorithms.md#sgt
    step 3). ``weights`` are the injected responses' loss weights (default 1); ``source`` the slot's source
    (default: the own group's)."""
    pos, _, adv = sgt_augment(own.rewards, [r.correct for r in own.rollouts], [r.reward for r in injected],
                              rng, eps)
    rolls, ws = list(own.rollouts), [1.0] * own.n
    for p, r, w in zip(pos, injected, weights or [1.0] * len(injected)):
        rolls[p], ws[p] = r, w
    return Group(own.prompt, own.model_id, rolls, adv.tolist(), source or own.source,
                 None if weights is None else ws)
