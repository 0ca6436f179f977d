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
    """Train ``policy`` on ``mbs`` (each minibatch as its micro-batches, in order): theta_old of every micro-batch
    first when ``recompute`` (``minibatch_old_logp``, before any optimizer step), then one optimizer step per
    minibatch (``step``, default ``minibatch_update``; a worker rank's returns its raw parts for the driver to merge),
    ``ctx.update`` set to its index. Phases ``logprob`` and ``update`` timed through ``ctx.phase``. Returns what
    ``step`` returned for each minibatch."""
    if recompute:
        with ctx.phase("logprob"):
            for micros in mbs:
                for mb in micros:
                    minibatch_old_logp(policy, mb)
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
    """theta_old of a minibatch's rows by the update's own forward code on the same batch (same rows, same
    padding or packing, ``optim.packing``), before any optimizer step of the rollout batch: the first minibatch's ratio is then exactly 1 in
    every precision (docs/algorithms.md#notation-and-conventions). A given ratio base (``given_old``, e.g. GRAFT T2) is kept."""
    logp, _ = policy.logprobs(mb.input_ids, mb.attention_mask, mb.resp_len)
    mb.old_logp = torch.where(mb.given_old.unsqueeze(1), mb.old_logp, logp.to(mb.old_logp.dtype))


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
