"""HACPO's formulas as pure functions (docs/algorithms.md#hacpo); the formulas several algorithms share are
graftzoo.algos.functional's."""
from __future__ import annotations

from typing import Sequence

import torch
from torch import Tensor

from graftzoo.algos.functional.core import _as_float, group_stats
from graftzoo.algos.functional.peer import compatibility_score



def capability_estimate(history: Sequence[float], window: int = 5, floor: float = 1e-8,
                        default: float = 1.0) -> float:
    """Smoothed capability ``P^_t`` = mean of the last ``window`` per-step accuracies (including the
    current step), floored at ``floor``; ``default`` (1.0 in the code) before any history exists
    (docs/algorithms.md#hacpo-capability-aware-advantage)."""
    if window < 1:
        raise ValueError(f"capability_estimate: window must be >= 1, got {window}")
    if not history:
        return default
    recent = list(history)[-window:]
    return max(floor, sum(recent) / len(recent))


def capability_ratio(p_source: float, p_target: float, clamp: tuple[float, float] = (0.1, 10.0)) -> float:
    """``ratio(source=j, target=k) = clip(P^_j / P^_k, 0.1, 10)`` (docs/algorithms.md#hacpo-capability-aware-advantage, CODE)."""
    return min(max(p_source / p_target, clamp[0]), clamp[1])


def hacpo_omegas(p_hat: Sequence[float], learner: int,
                 clamp: tuple[float, float] = (0.1, 10.0)) -> tuple[Tensor, Tensor]:
    """Per-source capability coefficients for ``learner`` k (docs/algorithms.md#hacpo-capability-aware-advantage).

    Returns ``(baseline_weight, grad_coef)`` as ``[n]`` tensors indexed by source j:
    ``baseline_weight[j] = omega^(k,j) = 1/ratio(j,k)`` (used in the baseline) and
    ``grad_coef[j] = omega^(j,k) = ratio(j,k)`` (the discrepancy coefficient); both are 1 for j = k.
    """
    if not 0 <= learner < len(p_hat):
        raise ValueError(f"hacpo_omegas: learner={learner} outside the {len(p_hat)} agents")
    ratio = torch.tensor([capability_ratio(p, p_hat[learner], clamp) for p in p_hat], dtype=torch.float64)
    ratio[learner] = 1.0
    return 1.0 / ratio, ratio


def hacpo_advantages(rewards, group_index, source, learner: int, baseline_weight, eps: float = 1e-6,
                     uniform_reward_guard: bool = True, binary_baseline_guard: bool = True) -> Tensor:
    """HACPO capability-aware advantage for learner k over pooled groups (docs/algorithms.md#hacpo-capability-aware-advantage).

    Per prompt group (all agents' responses, ``source[i]`` = the agent that generated response i):
    ``mu^ = (1/(nG)) sum_i omega^(k,source_i) r_i``, ``sigma = std_unbiased(all rewards)``,
    ``A_i = (r_i - mu^) / (sigma + eps)`` for self and cross responses alike.
    CODE guards: ``uniform_reward_guard`` (all rewards equal -> plain mean, so A = 0) and
    ``binary_baseline_guard`` (``mu^ > 1`` -> mean of the learner's own rewards in the group).
    A pooled group of one response gets 0.
    """
    r = _as_float(rewards, "rewards")
    src = torch.as_tensor(source)
    if src.shape != r.shape:
        raise ValueError(f"hacpo_advantages: source shape {tuple(src.shape)} != rewards shape {tuple(r.shape)}")
    bw = torch.as_tensor(baseline_weight, dtype=r.dtype)
    if r.numel() == 0:
        return r.clone()
    if int(src.max()) >= bw.numel() or int(src.min()) < 0:
        raise ValueError(f"hacpo_advantages: source ids must be in [0, {bw.numel()}), got {src.unique().tolist()}")
    st = group_stats(r, group_index)
    inv, k = st["inverse"], st["count"].numel()
    zeros = torch.zeros(k, dtype=r.dtype)
    mu = zeros.index_add(0, inv, bw[src] * r) / st["count"]
    if binary_baseline_guard:
        own = (src == learner).to(r.dtype)
        own_n = zeros.index_add(0, inv, own)
        own_mean = zeros.index_add(0, inv, own * r) / own_n.clamp(min=1)
        mu = torch.where((mu > 1.0) & (own_n > 0), own_mean, mu)
    adv = (r - mu[inv]) / (st["std"][inv] + eps)
    zero = st["count"] == 1
    if uniform_reward_guard:  # baseline = plain mean = every reward, so A = 0 exactly
        zero = zero | (st["max"] == st["min"])
    return torch.where(zero[inv], torch.zeros_like(adv), adv)


def hacpo_discrepancy(advantages: Tensor, source, learner: int, grad_coef) -> Tensor:
    """Capability discrepancy coefficient: ``A~ = A`` for self responses, ``omega^(j,k) * A`` for
    responses from agent j != k (docs/algorithms.md#hacpo-capability-aware-advantage)."""
    src = torch.as_tensor(source)
    coef = torch.as_tensor(grad_coef, dtype=advantages.dtype)[src]
    return advantages * torch.where(src == learner, torch.ones_like(coef), coef)


def cross_sequence_ratio(learner_mean_logp: Tensor, source_mean_logp, clamp: float = 10.0) -> Tensor:
    """HACPO cross ratio ``s^(k,j) = exp(clamp(l_k(y; theta) - l_j(y; theta_old^j), -10, 10))``, each mean
    over its own tokenizer's length (v2/CODE form, docs/algorithms.md#hacpo-cross-sample-loss). Differentiable in the
    learner's mean log-prob (see ``core.sequence_mean_logp``)."""
    return compatibility_score(learner_mean_logp, torch.as_tensor(source_mean_logp, dtype=learner_mean_logp.dtype),
                               clamp)


def stepwise_lower_bound(update_index: int, lower: float = 0.8, step: float = 0.025) -> float:
    """Stepwise cross clip floor ``lo_u = min(1, lower + u * step)`` for the u-th optimizer update of the
    step, 0-based (docs/algorithms.md#hacpo-cross-sample-loss; ``lower = 1 - delta`` = ``hacpo.cross_clip_lower``)."""
    if update_index < 0:
        raise ValueError(f"stepwise_lower_bound: update_index must be >= 0, got {update_index}")
    return min(1.0, lower + update_index * step)


def hacpo_cross_loss(seq_ratio: Tensor, advantages: Tensor, lower: float, alpha: float = 1.0,
                     upper: float = 1.0) -> Tensor:
    """HACPO cross-agent per-sequence loss (minimization form), docs/algorithms.md#hacpo-cross-sample-loss (CODE form):

    ``c = clip(s, lower, upper)``, ``loss = -c * sg[c]^alpha * A~`` with ``A~`` the discrepancy-scaled
    advantage. No PPO min: outside ``[lower, upper]`` the value is constant (no gradient).
    The self term is :func:`core.ratio_surrogate` on the GSPO sequence ratio with clips 3e-4 / 4e-4;
    the minibatch loss is the mean over all (self and cross) sequences.
    """
    c = seq_ratio.clamp(min=lower, max=upper)
    return -(c * c.detach() ** alpha * advantages.to(c.dtype))
