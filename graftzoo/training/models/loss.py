"""The loss of one micro-batch, as the step (graftzoo.training.learning.step) takes it: the forward pass, the ratio base
(theta_old), the learner's policy loss (a registered pure function, graftzoo.algos.losses), then, the same for
every algorithm, the per-sequence weights, the aggregation (``algo.loss_agg``), the entropy bonus and the k3 KL,
all divided by the policy term's one denominator (docs/algorithms.md#loss-aggregation,
docs/algorithms.md#kl-and-entropy).

The ratio base is data: every row arrives with it (an own row's theta_old from the step's theta_old pass, a peer
row's from its localization, a given base such as GRAFT T2's kept as it is). One choice is named, not hidden:
``base_from_forward`` (the update's first minibatch when theta_old comes from the training path) takes the base
from the loss's own forward instead, which runs under theta_old, on these rows and this layout: the ratio is then
``exp(logp - sg[logp]) = 1`` bitwise in every precision and packing, with the gradient a recomputed base gives
(docs/algorithms.md#notation-and-conventions).
"""
from __future__ import annotations

import math
from typing import Optional

import torch

from graftzoo.algos.functional import (agg_denominator, agg_loss, kl_k3, sequence_terms_as_tokens,
                                      truncated_is_weights)
from graftzoo.algos.losses import LossInputs, get_loss
from graftzoo.contract import metrics as M
from graftzoo.contract.batch import MiniBatch
from graftzoo.contract.errors import NonFiniteError


def ratio_base(mb: MiniBatch, logp: torch.Tensor, from_forward: bool) -> torch.Tensor:
    """``[B, R]`` log-probs the ratio is taken against: the rows' own (``mb.old_logp``), or with ``from_forward``
    this forward's detached values on every row whose base is theta_old (a given base, ``given_old``, is kept)."""
    if not from_forward:
        return mb.old_logp
    theta_old = logp.detach().to(mb.old_logp.device, mb.old_logp.dtype)
    return torch.where(mb.given_old.unsqueeze(1), mb.old_logp, theta_old)


def pg_mask(mb: MiniBatch) -> torch.Tensor:
    """The token mask of the policy-gradient (and entropy) terms: the loss mask of every row but aux rows."""
    return mb.loss_mask * (~mb.is_aux).unsqueeze(1).to(mb.loss_mask.dtype)


def normalizer(ctx, learner, mb: MiniBatch) -> Optional[float]:
    """The constant denominator of ``seq-mean-token-sum-norm`` (Dr.GRPO): the policy rows x the generation budget;
    None for the other modes, which count their denominators on the mask (``agg_loss``)."""
    if learner.cfg.loss_agg == "seq-mean-token-sum-norm":
        return float(int((~mb.is_aux).sum()) * ctx.max_response)
    return None


def denominators(ctx, learner, mb: MiniBatch) -> dict:
    """The denominator of the aggregated terms over a whole minibatch (``agg_denominator``), which each of its
    micro-batches divides by (``optim.max_tokens_per_micro``): ``pg``, shared by the policy, entropy and KL terms."""
    return {"pg": agg_denominator(pg_mask(mb), learner.cfg.loss_agg, normalizer(ctx, learner, mb))}


def micro_batch_loss(ctx, policy, learner, mb: MiniBatch, base_from_forward: bool = False) -> tuple:
    """``(loss, metrics)`` of a micro-batch under ``policy``'s current weights (module docstring). A micro-batch of a
    larger minibatch divides by the minibatch's denominators (``mb.norm``), so the micro losses add up exactly."""
    c = learner.cfg
    logp, ent = policy.logprobs(mb.input_ids, mb.attention_mask, mb.resp_len, with_entropy=True,
                                entropy_grad=bool(c.entropy_coeff))
    mask = pg_mask(mb)
    base = ratio_base(mb, logp, base_from_forward)
    x = LossInputs(logp, base, mb.advantages, mask, mb.weights, mb.role, mb.loss_mask, mb.origin_mean_logp,
                   ctx.update)
    pl = get_loss(learner.loss)(x, c, learner.clip)
    tok = sequence_terms_as_tokens(pl.token_loss, pl.seq_loss, pl.seq_rows)
    if mb.stale is not None:  # rows decoded by an older policy: each token's term by its truncated IS weight
        tok = tok * truncated_is_weights(base, mb.behaviour_logp, mb.stale, learner.run.tis_cap)
    den = mb.norm["pg"] if mb.norm is not None else normalizer(ctx, learner, mb)
    loss = agg_loss(tok * mb.weights.unsqueeze(1), mask, c.loss_agg, den)
    metrics = {**token_metrics(pl, mask, mb.is_peer, ent), **pl.metrics}
    if pl.extra is not None:
        loss = loss + pl.extra
    elif bool(mb.is_aux.any()):  # aux rows sit outside the policy term: only a loss's extra term trains them
        raise ValueError(f"learner {learner.name!r}: rows of role aux reach policy loss {learner.loss!r}, which gives "
                         f"them no term (PolicyLoss.extra): name a loss that trains them, e.g. SGT's 'sgt'")
    if c.entropy_coeff:
        loss = loss - c.entropy_coeff * agg_loss(ent, mask, c.loss_agg, den)
    if c.beta_kl > 0:
        with torch.no_grad():
            ref, _ = ctx.ref_policy.logprobs(mb.input_ids, mb.attention_mask, mb.resp_len)
        kl = kl_k3(logp, ref)
        loss = loss + c.beta_kl * agg_loss(kl, mb.kl_mask, c.loss_agg, den, den_mask=mask)
        metrics[M.KL] = float(agg_loss(kl.detach(), mb.kl_mask, c.loss_agg))  # the mean over the KL tokens
    return loss, metrics


def stale_metrics(batch, cap: float) -> dict:
    """The stale rows of a step's batch (``TrainRow.behaviour_logp``): their truncated importance weights'
    (``truncated_is_weights`` of theta_old against the behaviour log-probs) mean and max over the tokens they train,
    the share of those tokens at the cap; None without stale rows (docs/algorithms.md#stale-rollouts)."""
    ws = []
    for r in batch.rows:
        if r.behaviour_logp is not None:
            w = truncated_is_weights(torch.tensor([r.old_logp]), torch.tensor([r.behaviour_logp]),
                                     torch.ones(1, dtype=torch.bool), cap)[0]
            ws.append(w[torch.tensor(r.loss_mask) > 0])
    w = torch.cat(ws) if ws else torch.zeros(0)
    if not w.numel():
        return {M.ASYNC_IS_WEIGHT_MEAN: None, M.ASYNC_IS_WEIGHT_MAX: None, M.ASYNC_IS_CAPPED: None}
    return {M.ASYNC_IS_WEIGHT_MEAN: float(w.double().mean()), M.ASYNC_IS_WEIGHT_MAX: float(w.max()),
            M.ASYNC_IS_CAPPED: float((w >= cap).double().mean())}


def token_metrics(pl, mask: torch.Tensor, is_peer: torch.Tensor, ent: Optional[torch.Tensor]) -> dict:
    """Clip fractions, also split own vs peer tokens (GRAFT's Table 9), the mean ratio, the entropy."""
    clipped = (pl.clipped_low | pl.clipped_high).float()
    m = mask.float()
    peer = is_peer.float().unsqueeze(1) * m
    own = m - peer

    def frac(x, w):
        d = float(w.sum())
        return float((x * w).sum()) / d if d > 0 else None

    out = {M.CLIP_FRAC: frac(clipped, m), M.CLIP_FRAC_OWN: frac(clipped, own), M.CLIP_FRAC_PEER: frac(clipped, peer),
           M.CLIP_FRAC_LOW: frac(pl.clipped_low.float(), m), M.CLIP_FRAC_HIGH: frac(pl.clipped_high.float(), m),
           M.RATIO_MEAN: frac(pl.ratio.expand_as(m), m),
           M.TOKENS_PEER_SHARE: frac(peer, m) if m.sum() > 0 else None}
    if ent is not None:
        out[M.ENTROPY] = frac(ent.detach(), m)
    return out


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


def minibatch_metrics(parts: list) -> dict:
    """A minibatch's metrics from its parts (one per process that trained a share of it, ``optimize``): the
    loss is the sum of theirs, the gradient norm the group's, the others means over the micro-batches weighted by
    their rows."""
    records = [rec for p in parts for rec in p["records"]]
    met = mean_metrics([m for _, m in records], [w for w, _ in records])
    met[M.GRAD_NORM] = parts[0]["grad_norm"]
    met[M.LOSS] = sum(p["total"] for p in parts)
    return met


def optimize(ctx, policy, learner, minibatches: list, base_from_forward: bool, where: str) -> list:
    """The optimizer updates of one model on the step's minibatches (each given as its micro-batches, in order),
    where the model lives: in this process, or in each rank of its worker group on the rank's share. Per
    minibatch (``ctx.update`` its index): every micro-batch's loss (``micro_batch_loss``; its ratio base from its
    own forward on the first minibatch with ``base_from_forward``), scaled by ``MiniBatch.scale`` (0 for a rank's
    stand-in pass), backward; then one optimizer step. Returns per minibatch ``{"total": the summed loss,
    "records": [(rows, metrics)] of the counted micro-batches, "grad_norm"}`` (``loss.minibatch_metrics`` merges
    them). A non-finite loss or gradient raises ``NonFiniteError`` with the metrics before the step is applied."""
    out = []
    with ctx.phase("update"):
        for u, micros in enumerate(minibatches):
            ctx.update = u
            here = f"{where}, minibatch {u}"
            policy.zero_grad()
            total, records = 0.0, []
            with policy.compute_weights():  # bf16-mixed: the forwards in bf16, the gradients summed in float32
                for mb in micros:
                    loss, met = micro_batch_loss(ctx, policy, learner, mb, base_from_forward and u == 0)
                    if mb.scale != 1.0:
                        loss = loss * mb.scale
                    try:
                        value = policy.accumulate(loss, here)
                    except NonFiniteError as e:
                        e.metrics = {**met, **e.metrics}
                        raise
                    if mb.scale != 0.0:
                        total += value
                        records.append((len(mb), met))
                    del loss  # its graph is freed before the next micro-batch's forward
            try:
                grad_norm = policy.apply_gradients(total, here)
            except NonFiniteError as e:
                e.metrics = {**mean_metrics([r for _, r in records], [w for w, _ in records]), **e.metrics}
                raise
            out.append({"total": total, "records": records, "grad_norm": grad_norm})
    return out
