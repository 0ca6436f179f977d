"""The update of one model on its step's minibatches, where the model lives: in the trainer's process, or in each
rank of the model's Ray worker group (graftzoo.distributed.worker), which runs the same functions on its share of every
minibatch's micro-batches.

A minibatch is given as micro-batches (``optim.max_tokens_per_micro``) that carry the whole minibatch's loss
denominators (``Learner.norms``), so their gradients add up to the minibatch's; one optimizer step per minibatch.
"""
from __future__ import annotations

import math
from typing import Optional

import torch

from graftzoo.contract import metrics as M
from graftzoo.contract.errors import NonFiniteError


def update_policy(ctx, policy, learner, mbs: list, recompute: bool, where: str, step=None) -> list:
    """Train ``policy`` on ``mbs`` (each minibatch as its micro-batches, in order): one optimizer step per minibatch
    (``step``, default ``minibatch_update``; a worker rank's returns its raw parts for the driver to merge),
    ``ctx.update`` set to its index; phase ``update`` timed through ``ctx.phase``. Returns what ``step`` returned for
    each minibatch.

    theta_old (docs/algorithms.md#notation-and-conventions) takes no pass here. Every row arrives with it, computed
    once this step by the same forward code (``Policy.logprobs``): an own row's in phase 1 (the trainer's
    ``old_logp_pass``), a peer row's when it was localized (``ctx.localize``); or with a given ratio base
    (``given_old``, kept). With ``recompute`` the first minibatch's micro-batches take theirs from their own loss
    forward instead (``MiniBatch.old_from_forward``): it is the step's first forward of the update, before any
    optimizer step, so a forward under theta_old, on these very rows and layout; detached, it makes their ratio
    ``exp(logp - sg[logp]) = 1`` bitwise in every precision and packing, with the gradient a recomputed base gives.
    The later minibatches keep the values the rows arrived with: theta_old, not the weights the earlier steps
    moved, equal to their own forward under theta_old up to the rounding of another batch shape. Without
    ``recompute`` every base is the one the rows arrived with (own rows: the engine's log-probs)."""
    if recompute and mbs:
        for mb in mbs[0]:
            mb.old_from_forward = True
    out = []
    with ctx.phase("update"):
        for u, micros in enumerate(mbs):
            ctx.update = u
            out.append((step or minibatch_update)(ctx, policy, learner, micros, where=f"{where}, minibatch {u}"))
    return out


def accumulate_minibatch(ctx, policy, learner, micros: list, where: str) -> tuple[float, list]:
    """Add the gradients of ``micros`` (after ``policy.zero_grad()``): each micro-batch's loss over its minibatch's
    denominators, scaled by ``MiniBatch.scale`` (0 for the stand-in pass of a rank that holds fewer micro-batches
    than the others: it takes part in the collectives and adds nothing). Returns the sum of the losses and
    ``(rows, metrics)`` of each counted micro-batch. A non-finite loss raises ``NonFiniteError`` carrying its
    metrics before anything of it is added."""
    total, records = 0.0, []
    for mb in micros:
        loss, met = learner.loss(ctx, policy, mb)
        if mb.scale != 1.0:
            loss = loss * mb.scale
        try:
            value = policy.accumulate(loss, where)
        except NonFiniteError as e:
            e.metrics = {**met, **e.metrics}
            raise
        if mb.scale != 0.0:
            total += value
            records.append((len(mb), met))
        del loss  # its graph is freed before the next micro-batch's forward
    return total, records


def minibatch_update(ctx, policy, learner, micros: list, where: str) -> dict:
    """One optimizer step on a minibatch given as micro-batches (``accumulate_minibatch``). Metrics: ``loss`` (the
    minibatch's, the sum of the micro-batch losses), ``grad_norm``, the learner's others averaged over the
    micro-batches weighted by their rows (``mean_metrics``). A non-finite loss or gradient stops it before the step
    (``NonFiniteError`` carrying the metrics)."""
    policy.zero_grad()
    total, records = accumulate_minibatch(ctx, policy, learner, micros, where)
    return finish_minibatch(policy, total, records, where)


def finish_minibatch(policy, total: float, records: list, where: str) -> dict:
    """The optimizer step after ``accumulate_minibatch``; the minibatch's metrics."""
    met = mean_metrics([r for _, r in records], [w for w, _ in records])
    try:
        met[M.GRAD_NORM] = policy.apply_gradients(total, where)
    except NonFiniteError as e:
        e.metrics = {**met, **e.metrics}
        raise
    met[M.LOSS] = total
    return met


@torch.no_grad()
def minibatch_old_logp(policy, mb):
    """theta_old of a micro-batch's rows by a no-grad pass of the update's own forward code on the micro-batch
    itself (``MiniBatch.logprobs``: same rows, same padding or packing, ``optim.packing``) under the current
    weights; a given ratio base (``given_old``, e.g. GRAFT T2) is kept. The values a loss forward under theta_old
    takes itself (``MiniBatch.old_from_forward``, ``update_policy``), for a micro-batch whose loss does not run
    under theta_old (docs/algorithms.md#notation-and-conventions)."""
    mb.old_from_forward = True
    mb.logprobs(policy)


def mean_metrics(records: list, weights: Optional[list] = None) -> dict:
    """Each metric's mean over the records that have a value of it (None and NaN left out), weighted by
    ``weights`` when given (a minibatch's micro-batches by their rows)."""
    weights = weights or [1.0] * len(records)
    out = {}
    for k in {k for r in records for k in r}:
        vals = [(w, r[k]) for w, r in zip(weights, records)
                if r.get(k) is not None and not (isinstance(r[k], float) and math.isnan(r[k]))]
        total = sum(w for w, _ in vals)
        out[k] = math.fsum(w * v for w, v in vals) / total if total > 0 else None
    return out
