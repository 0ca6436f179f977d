"""GRPO-family formulas as pure tensor functions (docs/algorithms.md#shared-loss-terms, docs/algorithms.md#group-advantage).

Conventions used throughout:

* ``group_index`` is a 1-D integer tensor giving each response's group id (verl's ``uid``). Ids need
  not be contiguous; per-group outputs follow the order of ``torch.unique(group_index)`` (ascending).
* Token tensors are ``[B, T]`` (B responses padded to T tokens) with a 0/1 ``mask``.
* Losses are in minimization form (the negative of the spec's objectives).
"""
from __future__ import annotations

from typing import Optional

import torch
from torch import Tensor

AGG_MODES = ("token-mean", "seq-mean-token-sum", "seq-mean-token-mean", "seq-mean-token-sum-norm")
SINGLETON_MODES = ("zero", "verl")


# --------------------------------------------------------------------------------------------
# group statistics
# --------------------------------------------------------------------------------------------

def _as_float(x, name: str) -> Tensor:
    t = torch.as_tensor(x)
    if t.dim() != 1:
        raise ValueError(f"{name}: expected a 1-D tensor, got shape {tuple(t.shape)}")
    return t if t.is_floating_point() else t.to(torch.get_default_dtype())


def _group_inverse(group_index, n: int) -> tuple[Tensor, int]:
    """Map arbitrary group ids to 0..K-1 (ascending id order); returns (inverse [n], K)."""
    g = torch.as_tensor(group_index)
    if g.dim() != 1 or g.numel() != n:
        raise ValueError(f"group_index: expected shape ({n},), got {tuple(g.shape)}")
    if g.is_floating_point() or g.dtype == torch.bool:
        raise ValueError(f"group_index: expected an integer tensor, got dtype {g.dtype}")
    uniq, inv = torch.unique(g, return_inverse=True)
    return inv, int(uniq.numel())


def group_stats(values: Tensor, group_index: Tensor) -> dict:
    """Per-group count, mean, unbiased std, min and max (docs/algorithms.md#notation-and-conventions, docs/algorithms.md#group-advantage).

    Returns a dict of ``[K]`` tensors ("count", "mean", "std", "min", "max") plus "inverse" (``[N]``,
    each response's position among the K groups). The std of a singleton group is 0.
    """
    v = _as_float(values, "values")
    inv, k = _group_inverse(group_index, v.numel())
    zeros = torch.zeros(k, dtype=v.dtype)
    count = zeros.index_add(0, inv, torch.ones_like(v))
    mean = zeros.index_add(0, inv, v) / count
    dev = v - mean[inv]
    var = zeros.index_add(0, inv, dev * dev) / (count - 1).clamp(min=1)
    vmin = zeros.scatter_reduce(0, inv, v, reduce="amin", include_self=False)
    vmax = zeros.scatter_reduce(0, inv, v, reduce="amax", include_self=False)
    return {"count": count, "mean": mean, "std": var.sqrt(), "min": vmin, "max": vmax, "inverse": inv}


def _singleton_check(singleton: str) -> None:
    if singleton not in SINGLETON_MODES:
        raise ValueError(f"singleton={singleton!r}: expected one of {SINGLETON_MODES}")


def group_advantages(rewards: Tensor, group_index: Tensor, std_normalize: bool = True,
                     eps: float = 1e-6, singleton: str = "zero") -> Tensor:
    """GRPO outcome advantage, one scalar per response (docs/algorithms.md#group-advantage, docs/algorithms.md#dr-grpo, docs/algorithms.md#group-advantage;
    docs/algorithms.md#group-advantage).

    ``A_i = (r_i - mean_g) / (std_g + eps)`` with the unbiased (n-1) std of the response's own group;
    with ``std_normalize=False`` (Dr. GRPO) ``A_i = r_i - mean_g``. Groups may have different sizes
    (HORA). A group whose rewards are all equal gets exactly 0. ``eps=1e-6`` is verl's value (TRL: 1e-4).

    Singleton groups: ``singleton="zero"`` gives A = 0 (the spec's RECOMMENDED resolution, docs/algorithms.md#notation-and-conventions);
    ``singleton="verl"`` reproduces verl (mean 0, std 1, so ``A = r/(1+eps)``, or ``r`` without std).
    """
    _singleton_check(singleton)
    r = _as_float(rewards, "rewards")
    st = group_stats(r, group_index)
    inv = st["inverse"]
    adv = r - st["mean"][inv]
    if std_normalize:
        adv = adv / (st["std"][inv] + eps)
    adv = torch.where((st["max"] == st["min"])[inv], torch.zeros_like(adv), adv)
    single = (st["count"] == 1)[inv]
    if singleton == "verl":
        return torch.where(single, r / (1.0 + eps) if std_normalize else r, adv)
    return torch.where(single, torch.zeros_like(adv), adv)


def rloo_advantages(rewards: Tensor, group_index: Tensor, singleton: str = "zero") -> Tensor:
    """RLOO leave-one-out advantage (docs/algorithms.md#rloo).

    ``A_i = r_i - mean_{j != i} r_j = n/(n-1) * (r_i - mean_g)`` with each group's own size n.
    Singleton groups: 0 (RECOMMENDED) or ``singleton="verl"`` for verl's ``A = r``.
    """
    _singleton_check(singleton)
    r = _as_float(rewards, "rewards")
    st = group_stats(r, group_index)
    inv = st["inverse"]
    n = st["count"][inv]
    adv = (r - st["mean"][inv]) * n / (n - 1).clamp(min=1)
    adv = torch.where((st["max"] == st["min"])[inv], torch.zeros_like(adv), adv)
    single = n == 1
    return torch.where(single, r if singleton == "verl" else torch.zeros_like(r), adv)


# --------------------------------------------------------------------------------------------
# token losses
# --------------------------------------------------------------------------------------------

def _check_tokens(loss_mat: Tensor, mask: Tensor, where: str) -> Tensor:
    if loss_mat.dim() != 2:
        raise ValueError(f"{where}: expected a [B, T] tensor, got shape {tuple(loss_mat.shape)}")
    if tuple(mask.shape) != tuple(loss_mat.shape):
        raise ValueError(f"{where}: mask shape {tuple(mask.shape)} != loss shape {tuple(loss_mat.shape)}")
    return mask.to(loss_mat.dtype)


def _safe_div(num: Tensor, den: Tensor) -> Tensor:
    """``num / den``, and 0 (still backpropagating, with a zero gradient) where ``den`` is 0."""
    ok = den > 0
    return torch.where(ok, num, torch.zeros_like(num)) / torch.where(ok, den, torch.ones_like(den))


def agg_loss(loss_mat: Tensor, mask: Tensor, mode: str, normalizer: Optional[float] = None,
             den_mask: Optional[Tensor] = None) -> Tensor:
    """Aggregate a ``[B, T]`` token loss into a scalar (docs/algorithms.md#loss-aggregation, exact table).

    With ``m`` the mask and ``N'`` the number of rows with at least one masked-in token:

    * ``token-mean``:           ``sum(m*l) / sum(m)`` (DAPO; use ``normalizer`` = the global
      mini-batch token count when a mini-batch is split into micro-batches, the RECOMMENDED form);
    * ``seq-mean-token-sum``:   ``sum_i sum_t m*l / N'``;
    * ``seq-mean-token-mean``:  ``sum_i (sum_t m*l / sum_t m) / N'`` (original GRPO);
    * ``seq-mean-token-sum-norm`` (Dr. GRPO): ``sum(m*l) / (N * L_max)``. Without ``normalizer`` this
      uses N = B rows and L_max = the padded width T; learners should pass
      ``normalizer = N * max_response_length`` (fixed for the run), the spec's RECOMMENDED constant.

    ``normalizer`` replaces the denominator in every mode (token count, sequence count or constant).
    ``den_mask`` (default ``mask``) is the mask the denominators are counted on (``sum(m)``, ``sum_t m``, ``N'``)
    while ``mask`` selects the numerator's tokens: a term aggregated with another term's normaliser
    (docs/algorithms.md#kl-and-entropy: the KL over its own tokens, divided as the policy term is). A fractional
    mask is used as given in numerator and denominator (as verl does). A zero denominator gives a loss of exactly 0
    that still backpropagates (zero gradient), never NaN.
    """
    m = _check_tokens(loss_mat, mask, "agg_loss")
    d = m if den_mask is None else _check_tokens(loss_mat, den_mask, "agg_loss (den_mask)")
    if mode not in AGG_MODES:
        raise ValueError(f"agg_loss: unknown mode {mode!r}; expected one of {AGG_MODES}")
    if normalizer is not None and not normalizer > 0:
        raise ValueError(f"agg_loss: normalizer must be > 0, got {normalizer}")
    masked = loss_mat * m
    if mode == "token-mean":
        den = d.sum() if normalizer is None else torch.as_tensor(float(normalizer), dtype=loss_mat.dtype)
        return _safe_div(masked.sum(), den)
    if mode == "seq-mean-token-sum-norm":
        den = float(normalizer) if normalizer is not None else float(loss_mat.shape[0] * loss_mat.shape[1])
        return masked.sum() / den if den > 0 else masked.sum() * 0.0
    row_tokens = d.sum(dim=1)
    row = masked.sum(dim=1)
    if mode == "seq-mean-token-mean":
        row = _safe_div(row, row_tokens)
    else:  # a row without a token of den_mask is outside the denominator and adds nothing
        row = torch.where(row_tokens > 0, row, torch.zeros_like(row))
    n_seq = (row_tokens > 0).sum().to(loss_mat.dtype)
    den = n_seq if normalizer is None else torch.as_tensor(float(normalizer), dtype=loss_mat.dtype)
    return _safe_div(row.sum(), den)


def agg_denominator(mask: Tensor, mode: str, normalizer: Optional[float] = None) -> Optional[float]:
    """The denominator ``agg_loss`` divides by for ``mask`` in ``mode`` (docs/algorithms.md#loss-aggregation): the masked-in
    token count (token-mean), the number of rows with a masked-in token (seq-mean-*), or ``normalizer`` when given
    (seq-mean-token-sum-norm's N * L_max). None when it is 0 (nothing to aggregate).

    Computed once on a whole minibatch and passed as ``agg_loss(..., normalizer=...)`` to each of its micro-batches,
    it makes the micro-batch losses add up to the minibatch's loss exactly (the spec's RECOMMENDED global
    token count): ``agg_loss`` is then a sum of per-row terms over a fixed denominator in every mode."""
    if mode not in AGG_MODES:
        raise ValueError(f"agg_denominator: unknown mode {mode!r}; expected one of {AGG_MODES}")
    if normalizer is not None:
        den = float(normalizer)
    elif mode == "token-mean":
        den = float(mask.sum())
    elif mode == "seq-mean-token-sum-norm":
        den = float(mask.shape[0] * mask.shape[1])
    else:
        den = float((mask.sum(dim=1) > 0).sum())
    return den if den > 0 else None


def ratio_surrogate(ratio: Tensor, advantages: Tensor, eps_low: float, eps_high: float,
                    dual_clip_c: Optional[float] = None) -> tuple[Tensor, dict]:
    """PPO clipped surrogate for a given importance ratio, minimization form (docs/algorithms.md#clipped-surrogate,
    docs/algorithms.md#group-advantage; GSPO docs/algorithms.md#peer-exchange when ``ratio`` is a sequence ratio).

    ``loss = max(-A*rho, -A*clip(rho, 1-eps_low, 1+eps_high))``; with dual clip (verl) and ``A < 0``:
    ``loss = min(loss, -A*c)``. ``advantages`` broadcasts against ``ratio`` (``[B]`` advantages are
    expanded over the token axis of a ``[B, T]`` ratio). ``eps_low = eps_high = math.inf`` gives the
    unclipped surrogate ``-A*rho`` (GRAFT's "w/o token-level ratio" ablation, docs/algorithms.md#graft-ablations).

    Info (bool tensors shaped like the loss): "clipped_low" (A<0 and rho<1-eps_low), "clipped_high"
    (A>0 and rho>1+eps_high), "dual_clipped"; and "ratio". Masking them is the caller's job.
    """
    adv = advantages
    if ratio.dim() == 2 and adv.dim() == 1:
        if adv.shape[0] != ratio.shape[0]:
            raise ValueError(f"ratio_surrogate: advantages shape {tuple(adv.shape)} does not match ratio rows "
                             f"{ratio.shape[0]}")
        adv = adv.unsqueeze(1)
    adv = adv.to(ratio.dtype)
    lo, hi = 1.0 - eps_low, 1.0 + eps_high
    pg1 = -adv * ratio
    pg2 = -adv * ratio.clamp(min=lo, max=hi)
    loss = torch.maximum(pg1, pg2)
    clipped_low = (adv < 0) & (ratio < lo)
    clipped_high = (adv > 0) & (ratio > hi)
    dual = torch.zeros_like(clipped_low)
    if dual_clip_c is not None:
        if not dual_clip_c > 1.0:
            raise ValueError(f"ratio_surrogate: dual_clip_c must be > 1, got {dual_clip_c}")
        cap = -adv * dual_clip_c
        dual = (adv < 0) & (loss > cap)
        loss = torch.where(adv < 0, torch.minimum(loss, cap), loss)
    info = {"ratio": ratio.detach(), "clipped_low": clipped_low.expand_as(loss),
            "clipped_high": clipped_high.expand_as(loss), "dual_clipped": dual.expand_as(loss)}
    return loss, info


def clipped_surrogate(logp: Tensor, old_logp: Tensor, advantages: Tensor, eps_low: float = 0.2,
                      eps_high: float = 0.2, dual_clip_c: Optional[float] = None,
                      clamp: float = 20.0) -> tuple[Tensor, dict]:
    """Token-level PPO/GRPO clipped loss ``[B, T]`` (docs/algorithms.md#clipped-surrogate, docs/algorithms.md#group-advantage).

    ``rho = exp(clamp(logp - old_logp, -clamp, clamp))`` (verl clamps the log-ratio to +-20), then
    :func:`ratio_surrogate`. ``advantages`` is ``[B]`` (broadcast over tokens) or ``[B, T]``.
    verl default dual clip is ``c = 3.0`` (DAPO/ExTra scripts 10.0); TRL has none (``None``).
    """
    if logp.shape != old_logp.shape:
        raise ValueError(f"clipped_surrogate: logp shape {tuple(logp.shape)} != old_logp shape "
                         f"{tuple(old_logp.shape)}")
    ratio = torch.exp((logp - old_logp).clamp(min=-clamp, max=clamp))
    return ratio_surrogate(ratio, advantages, eps_low, eps_high, dual_clip_c)


def truncated_is_weights(old_logp: Tensor, behaviour_logp: Tensor, stale: Tensor, cap: float,
                         clamp: float = 20.0) -> Tensor:
    """Per-token truncated importance weights of rollouts decoded by an older policy than theta_old
    (docs/algorithms.md#stale-rollouts): ``w = min(exp(old_logp - behaviour_logp), cap)`` on the rows ``stale``
    marks, exactly 1 on the others. ``old_logp``, ``behaviour_logp``: ``[B, T]``; ``stale``: ``[B]`` bool. The
    log-ratio is clamped to +-``clamp`` as the clipped surrogate's is; the weights carry no gradient. The surrogate
    stays clipped against theta_old (decoupled PPO: theta_old is the proximal policy), the weight multiplies each
    token's term (truncated importance sampling, TIS)."""
    if old_logp.shape != behaviour_logp.shape or stale.shape != old_logp.shape[:1]:
        raise ValueError(f"truncated_is_weights: old_logp {tuple(old_logp.shape)}, behaviour_logp "
                         f"{tuple(behaviour_logp.shape)} and stale {tuple(stale.shape)} do not match")
    if not cap > 0:
        raise ValueError(f"truncated_is_weights: cap must be > 0, got {cap}")
    w = torch.exp((old_logp.detach() - behaviour_logp).clamp(min=-clamp, max=clamp)).clamp(max=cap)
    return torch.where(stale.unsqueeze(1), w, torch.ones_like(w))


def kl_k3(logp: Tensor, ref_logp: Tensor, clamp: Optional[float] = 20.0, kl_clamp: Optional[float] = 10.0,
          kind: str = "k3") -> Tensor:
    """Per-token k3 ("low_var_kl") estimate of KL(pi_theta || pi_ref) (docs/algorithms.md#kl-and-entropy).

    ``d = clamp(ref_logp - logp, -clamp, clamp)``; ``k = clamp(exp(d) - d - 1, -kl_clamp, kl_clamp)``
    (verl's clamps; pass ``None`` for TRL's unclamped value). ``kind="k3+"``: forward value of k3, gradient
    of k2 = ``0.5 (logp - ref_logp)^2`` (straight-through). Always >= 0.
    """
    if kind not in ("k3", "k3+"):
        raise ValueError(f"kl_k3: kind must be 'k3' or 'k3+', got {kind!r}")
    d = ref_logp - logp
    if clamp is not None:
        d = d.clamp(min=-clamp, max=clamp)
    k = torch.exp(d) - d - 1.0
    if kl_clamp is not None:
        k = k.clamp(min=-kl_clamp, max=kl_clamp)
    if kind == "k3+":
        k2 = 0.5 * (logp - ref_logp) ** 2
        k = k2 + (k - k2).detach()
    return k


def entropy_from_logits(logits: Tensor) -> Tensor:
    """Token entropy ``H_t = -sum_v p log p`` of the next-token distribution (docs/algorithms.md#notation-and-conventions)."""
    logp = torch.log_softmax(logits.float(), dim=-1)
    return -(logp.exp() * logp).sum(dim=-1)


# --------------------------------------------------------------------------------------------
# sequence ratios
# --------------------------------------------------------------------------------------------

def sequence_mean_logp(logp: Tensor, mask: Tensor) -> Tensor:
    """Length-normalized sequence log-prob ``l(y) = (1/L) sum_t logp_t`` per row (docs/algorithms.md#notation-and-conventions).

    Rows with no valid token give 0 (verl clamps the length to 1).
    """
    m = _check_tokens(logp, mask, "sequence_mean_logp")
    return (logp * m).sum(dim=1) / m.sum(dim=1).clamp(min=1.0)


def gspo_sequence_ratio(logp: Tensor, old_logp: Tensor, mask: Tensor, clamp: Optional[float] = 10.0) -> Tensor:
    """GSPO sequence ratio ``s_i = exp(mean_t (logp - old_logp))``, shape ``[B]`` (docs/algorithms.md#gspo,
    docs/algorithms.md#gspo).

    The log-ratio is clamped to ``[-clamp, clamp]`` (verl/HACPO use 10). Empty rows give 1.
    Use with :func:`ratio_surrogate` (GSPO clips 3e-4 / 4e-4) for the sequence-level loss.
    """
    log_s = sequence_mean_logp(logp - old_logp, mask)
    if clamp is not None:
        log_s = log_s.clamp(min=-clamp, max=clamp)
    return torch.exp(log_s)


def gspo_token_ratio(logp: Tensor, old_logp: Tensor, mask: Tensor, clamp: Optional[float] = 10.0) -> Tensor:
    """GSPO-token ratio ``s_{i,t} = sg[s_i] * exp(logp_t - sg[logp_t])``, shape ``[B, T]``
    (docs/algorithms.md#gspo, the variant verl implements).

    Numerically equal to ``s_i`` on every token; its gradient is ``s_i * grad logp_t``. Aggregate the
    resulting :func:`ratio_surrogate` loss with ``seq-mean-token-mean`` and no dual clip, as verl does.
    """
    log_s = sequence_mean_logp(logp - old_logp, mask).detach()
    log_tok = log_s.unsqueeze(1) + logp - logp.detach()
    if clamp is not None:
        log_tok = log_tok.clamp(max=clamp)
    return torch.exp(log_tok)


def sequence_terms_as_tokens(token_loss: Tensor, seq_loss: Optional[Tensor] = None,
                             seq_rows: Optional[Tensor] = None) -> Tensor:
    """A ``[B, T]`` token loss in which rows ``seq_rows`` carry one sequence-level value ``seq_loss[b]``
    (docs/algorithms.md#hacpo-cross-sample-loss: HACPO's cross term is defined per sequence).

    The convention that makes a sequence-level term exact under every aggregation of ``agg_loss``
    (docs/algorithms.md#loss-aggregation): the value is the row's per-token value. Under ``seq-mean-token-mean`` the
    row then contributes exactly ``seq_loss[b]``; under ``token-mean`` it is weighted by its token count
    like every other row; under the token-sum modes it is summed over the row's tokens (the GSPO-token
    convention, docs/algorithms.md#gspo). Rows outside ``seq_rows`` keep their token losses.
    """
    if seq_loss is None:
        return token_loss
    if seq_rows is None or seq_rows.shape != seq_loss.shape or seq_loss.dim() != 1 \
            or seq_loss.shape[0] != token_loss.shape[0]:
        raise ValueError("sequence_terms_as_tokens: seq_loss and seq_rows must both be [B] for a [B, T] token loss")
    return torch.where(seq_rows.unsqueeze(1), seq_loss.unsqueeze(1).expand_as(token_loss), token_loss)


def aux_nll_loss(mean_logp: Tensor, weights: Tensor) -> Tensor:
    """Auxiliary NLL ``-sum_i w_i l(y_i; theta)`` over length-normalized sequence log-probs (see
    docs/algorithms.md#sgt: SGT ``aux_nll`` sets ``w_i = lambda / |Rescue|``, giving ``lambda * (-1/|Rescue|) sum l``).
    A minibatch holding part of the rescue set contributes its share. Empty -> 0."""
    if mean_logp.shape != weights.shape:
        raise ValueError(f"aux_nll_loss: {tuple(mean_logp.shape)} log-probs for {tuple(weights.shape)} weights")
    return -(weights.to(mean_logp.dtype) * mean_logp).sum()


__all__ = ["sequence_terms_as_tokens", "aux_nll_loss", "AGG_MODES", "group_stats", "group_advantages", "rloo_advantages", "agg_loss", "agg_denominator", "ratio_surrogate", "clipped_surrogate", "truncated_is_weights", "kl_k3", "entropy_from_logits", "sequence_mean_logp", "gspo_sequence_ratio", "gspo_token_ratio"]
