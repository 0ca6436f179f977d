"""Diagnostics of a step: the complementarity of a pair (always, ``complementarity``) and the opt-in diagnostics of
the transfer path (``run.diagnostics: true``): what a step's peer-source rows do to the learner, for chasing a peer
exchange that does not help. Generic: they read the step's ``TrainBatch`` (each row's role, weight, advantage and
its rollout's correctness), never the algorithm's name.

Per model and step (keys ``diag/*`` of ``metrics.jsonl``, absent when off):

- ``grad_norm_own`` / ``grad_norm_peer`` / ``grad_share_peer``: the norms of the gradients of the learner's own loss
  (``graftzoo.training.models.loss.micro_batch_loss``: the same loss, weights and denominators as the update) at theta_old over the step's whole
  batch, split into the own rows' part and the peer-source rows' part, and ``||g_peer|| / (||g_own|| + ||g_peer||)``
  (``grad_norm_split``).
- ``peer_succ_logp_before`` / ``_after`` / ``_delta``: the learner's mean per-token log-prob of the admitted peer-source
  rows that are correct, under theta_old and after the step's optimizer steps; ``own_succ_logp_*`` the same for its
  own correct rows with a positive advantage, as the comparison (``success_rows``, ``mean_response_logp``).

None where there are no such rows. The step calls ``before_update`` before ``Policy.update`` and ``after_update``
after it; neither changes what the update sees (no gradients left behind, the RNG state restored, the batch's rows
untouched), so a run trains bit-identically with diagnostics on or off. In-process models only (``run.backend:
ray`` keeps the model in its worker ranks and is refused at load).

Always on, for every co-trained pair or peer exchange (the trainer calls it): ``complementarity``
(``peer/solved_all_fail_frac``, ``peer/mixed_on_all_fail_frac``, ``peer/all_fail_count``), what the peer knows of
the learner's all-fail prompts.
The names, units and meanings of every metric: graftzoo/contract/metrics.py (docs/metrics.md).
"""
from __future__ import annotations

import math
from typing import Optional

import torch

from graftzoo.contract import metrics as M
from graftzoo.contract.batch import TrainBatch
from graftzoo.training.models.loss import denominators, micro_batch_loss

SOURCES = ("own", "peer")


def row_source(row) -> str:
    """``own`` for a response the learner sampled itself, ``peer`` for one that came from the peer (role ``peer``,
    or ``aux``: SGT's NLL rows hold peer successes too)."""
    return "own" if row.role == "own" else "peer"


def split_by_source(ctx, learner, batch: TrainBatch, schedule: list, budget, device) -> dict:
    """The step's minibatches (``schedule``: row indices of each) cut into micro-batches of the own rows and of the
    peer-source rows with non-zero weight: ``{source: [(minibatch index, micro-batches)]}``. Every micro-batch carries
    its whole minibatch's loss denominators (``graftzoo.training.models.loss.denominators``), as ``optim.max_tokens_per_micro`` micro-batches do,
    so the gradients of the two parts add up to the minibatch's gradient (``graftzoo.training.models.loss.optimize``)."""
    out = {s: [] for s in SOURCES}
    for u, idx in enumerate(schedule):
        norm = denominators(ctx, learner, batch.minibatch(idx))
        for s in SOURCES:
            part = [i for i in idx if row_source(batch.rows[i]) == s and batch.rows[i].weight != 0]
            if not part:
                continue
            micros = batch.micro_batches(part, budget)
            for mb in micros:
                mb.norm = norm
            out[s].append((u, [mb.to(device) for mb in micros]))
    return out


def grad_share(own: Optional[float], peer: Optional[float]) -> Optional[float]:
    """``||g_peer|| / (||g_own|| + ||g_peer||)``: the peer-source rows' share of the update's gradient norm; None
    without peer rows (``peer`` None) or without any gradient."""
    if peer is None:
        return None
    total = (own or 0.0) + peer
    return peer / total if total > 0 else None


def accumulate_part(ctx, policy, learner, part: list, base_from_forward: bool) -> None:
    """Add to the parameters' gradients those of the step's loss (``micro_batch_loss``) over ``part``
    (``[(minibatch index, micro-batches)]``, one source of ``split_by_source``) under the current weights,
    ``ctx.update`` set to each minibatch's index as the update sets it (HACPO reads it). With ``base_from_forward``
    each micro-batch's ratio base is taken from its own loss forward, as the update's first minibatch takes it:
    every forward here runs at theta_old (no optimizer step in between) (docs/algorithms.md#notation-and-conventions)."""
    for u, micros in part:
        ctx.update = u
        for mb in micros:
            loss, _ = micro_batch_loss(ctx, policy, learner, mb, base_from_forward)
            loss.backward()
            del loss


def grad_norm_split(ctx, policy, learner, batch: TrainBatch, schedule: list, budget, base_from_forward: bool) -> dict:
    """``diag/grad_norm_own``, ``diag/grad_norm_peer``, ``diag/grad_share_peer`` (``grad_share``): the norm of the
    gradient of the step's loss at theta_old (the current weights, before the update) summed over the step's
    minibatches, from the own rows and from the peer-source rows (``split_by_source``, ``accumulate_part``); None for
    a source without rows. Leaves no gradient behind and restores the RNG state and ``ctx.update``: the update that
    follows sees exactly what it would see without it."""
    parts = split_by_source(ctx, learner, batch, schedule, budget, policy.device)
    norms = {s: None for s in SOURCES}
    dev = policy.device
    was_update = ctx.update
    try:
        with torch.random.fork_rng(devices=[dev.index or 0] if dev.type == "cuda" else []):
            for s, part in parts.items():
                if not part:
                    continue
                policy.zero_grad()
                accumulate_part(ctx, policy, learner, part, base_from_forward)
                grads = [p.grad for p in policy.model.parameters() if p.grad is not None]
                norms[s] = float(torch.nn.utils.get_total_norm(grads)) if grads else 0.0
    finally:
        policy.zero_grad()
        ctx.update = was_update
    return {M.DIAG_GRAD_NORM_OWN: norms["own"], M.DIAG_GRAD_NORM_PEER: norms["peer"],
            M.DIAG_GRAD_SHARE_PEER: grad_share(norms["own"], norms["peer"])}


def success_rows(batch: TrainBatch) -> dict:
    """The rows whose log-prob the diagnostics follow across an update: ``peer``, the admitted (weight > 0)
    peer-source rows whose response is correct; ``own``, the learner's own correct rows with a positive advantage.
    Rows without a trained token (loss mask all 0) or without their rollout are left out."""
    out = {s: [] for s in SOURCES}
    for r in batch.rows:
        if r.rollout is None or not r.rollout.correct or r.weight <= 0 or not any(w > 0 for w in r.loss_mask):
            continue
        s = row_source(r)
        if s == "peer" or r.advantage > 0:
            out[s].append(r)
    return out


def mean_response_logp(policy, rows: list) -> Optional[float]:
    """The mean over ``rows`` of each row's length-normalized log-prob ``sum_t m_t logp_t / sum_t m_t`` of its
    trained response tokens (``m``: the loss mask; ``sequence_mean_logp``'s formula) under the policy's current
    weights, by the training forward code without gradient (``Policy.score_sequences``). None without rows."""
    if not rows:
        return None
    lps, _ = policy.score_sequences([r.prompt_ids for r in rows], [r.response_ids for r in rows])
    vals = [math.fsum(x * m for x, m in zip(lp, r.loss_mask)) / max(1.0, math.fsum(r.loss_mask))
            for r, lp in zip(rows, lps)]
    return math.fsum(vals) / len(vals)


def before_update(ctx, policy, learner, batch: TrainBatch, schedule: list, budget, base_from_forward: bool) -> dict:
    """The diagnostics measured at theta_old, before ``Policy.update``: the gradient split (``grad_norm_split``)
    and ``diag/{own,peer}_succ_logp_before`` (``success_rows``, ``mean_response_logp``)."""
    out = grad_norm_split(ctx, policy, learner, batch, schedule, budget, base_from_forward)
    for s, rows in success_rows(batch).items():
        out[M.SUCC_LOGP[s, "before"]] = mean_response_logp(policy, rows)
    return out


def after_update(policy, batch: TrainBatch, before: dict) -> dict:
    """``before`` (``before_update``'s metrics) with ``diag/{own,peer}_succ_logp_after`` (a fresh forward pass
    after the update's optimizer steps) and ``_delta`` = after - before (None when either is)."""
    out = dict(before)
    for s, rows in success_rows(batch).items():
        after = mean_response_logp(policy, rows)
        was = before.get(M.SUCC_LOGP[s, "before"])
        out[M.SUCC_LOGP[s, "after"]] = after
        out[M.SUCC_LOGP[s, "delta"]] = None if after is None or was is None else after - was
    return out


def complementarity(groups, peers: dict) -> dict:
    """What the peers know of the learner's all-fail prompts (Fig. 1 right; docs/algorithms.md#populations): among
    ``groups`` (the learner's own groups of the step) those with no correct response, the fraction whose prompt some
    peer solved at least once and the fraction where some peer's group is mixed (``comp(L, *)``), and their count;
    with two or more peers also each peer's own fraction, ``comp(L, P)`` (``peer/comp/<P>``). ``peers``: peer model
    id -> {prompt id: that peer's Group}. The fractions are None without all-fail groups. Pure: reads the groups,
    changes nothing."""
    dead = [g for g in groups if g.all_fail]
    out = {M.PEER_ALL_FAIL_COUNT: len(dead)}
    maps = list(peers.values())

    def frac(hit) -> Optional[float]:
        return sum(1 for g in dead if hit(g.prompt.id)) / len(dead) if dead else None
    out[M.PEER_SOLVED_ALL_FAIL_FRAC] = frac(lambda pid: any(pid in p and p[pid].num_correct > 0 for p in maps))
    out[M.PEER_MIXED_ON_ALL_FAIL_FRAC] = frac(lambda pid: any(pid in p and p[pid].mixed for p in maps))
    if len(peers) >= 2:
        for peer, p in peers.items():
            out[M.PEER_COMP.of(peer=peer)] = frac(lambda pid: pid in p and p[pid].mixed)
    return out
