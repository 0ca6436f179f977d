"""ExTra's formulas as pure functions (docs/algorithms.md#extra); the formulas several algorithms share are
graftzoo.algos.functional's."""
from __future__ import annotations

import math
from typing import Optional, Sequence

import torch
import torch.nn.functional as F
from torch import Tensor

from graftzoo.algos.functional.core import _as_float, group_advantages, group_stats



def novelty_scores(embeddings: Tensor, memory: Optional[Tensor], min_history: int) -> Tensor:
    """ExTra raw novelty of the current rollouts of one prompt key (docs/algorithms.md#extra-novelty-bonus).

    ``pool = memory + current``; ``nov_i = max(0, 1 - max_{u in pool, u != self} cos(e_i, u))``, the
    self entry excluded by position (identical siblings do count). Zeros while the memory holds fewer
    than ``min_history`` (= G in the code) entries. ``embeddings`` is ``[G, d]``, ``memory`` ``[M, d]``
    or None. The caller appends the current embeddings to its FIFO afterwards.
    """
    if embeddings.dim() != 2:
        raise ValueError(f"novelty_scores: embeddings must be [G, d], got {tuple(embeddings.shape)}")
    emb = embeddings.float()
    mem = emb.new_zeros((0, emb.shape[1])) if memory is None else memory.to(emb.dtype)
    if mem.dim() != 2 or mem.shape[1] != emb.shape[1]:
        raise ValueError(f"novelty_scores: memory shape {tuple(mem.shape)} does not match embeddings "
                         f"{tuple(emb.shape)}")
    g = emb.shape[0]
    if mem.shape[0] < min_history or mem.shape[0] + g < 2:
        return emb.new_zeros(g)
    pool = torch.cat([mem, emb], dim=0)
    sim = F.normalize(emb, dim=-1) @ F.normalize(pool, dim=-1).T
    idx = torch.arange(g)
    sim[idx, mem.shape[0] + idx] = float("-inf")
    return (1.0 - sim.max(dim=1).values).clamp(min=0.0)


def extra_advantages(rewards: Tensor, correct: Tensor, group_index: Tensor, novelty: Tensor,
                     alpha: float = 0.1, eps: float = 1e-6) -> Tensor:
    """ExTra Option B advantage: ``A_i = GRPO(r)_i + alpha * nov_i * 1[correct_i]`` (docs/algorithms.md#extra-novelty-bonus,
    docs/algorithms.md#extra-novelty-bonus; the paper's "after GRPO normalization"). The GRPO part is :func:`core.group_advantages`
    (singleton -> 0, RECOMMENDED). ``alpha = 0.1`` (paper runs; the released script uses 0.01)."""
    corr = torch.as_tensor(correct).to(torch.bool)
    adv = group_advantages(rewards, group_index, eps=eps)
    return adv + alpha * novelty.to(adv.dtype) * corr.to(adv.dtype)


def reward_variance_ema(prev: Optional[float], rewards: Sequence[float], momentum: float = 0.1) -> float:
    """Per-prompt EMA of the within-step population reward variance, initialized with the first value
    (``(1-momentum)*prev + momentum*var``), used by ExTra Option A (docs/algorithms.md#extra-novelty-bonus)."""
    r = [float(x) for x in rewards]
    if len(r) > 1:
        mean = sum(r) / len(r)
        var = sum((x - mean) ** 2 for x in r) / len(r)
    else:
        var = 0.0
    return var if prev is None else (1.0 - momentum) * prev + momentum * var


def extra_option_a_scores(rewards: Tensor, correct: Tensor, group_index: Tensor, novelty: Tensor,
                          reward_var_ema: Tensor, alpha: float = 0.1, lam: float = 1.0) -> Tensor:
    """ExTra Option A (legacy, pre-normalization) scores, to be GRPO-normalized by the caller
    (docs/algorithms.md#extra-novelty-bonus): ``nov~_i = nov_i / max_group nov`` (if that max > 1e-8),
    ``gamma = exp(-lam * V_ema(group))``, ``score_i = r_i + alpha * gamma * nov~_i * 1[correct_i]``.
    ``reward_var_ema`` is ``[K]`` over groups in ascending id order (after this step's update)."""
    r = _as_float(rewards, "rewards")
    nov = novelty.to(r.dtype)
    st = group_stats(nov, group_index)
    inv = st["inverse"]
    ema = torch.as_tensor(reward_var_ema, dtype=r.dtype)
    if ema.numel() != st["count"].numel():
        raise ValueError(f"extra_option_a_scores: reward_var_ema has {ema.numel()} entries for "
                         f"{st['count'].numel()} groups")
    gmax = st["max"][inv]
    nov = torch.where(gmax > 1e-8, nov / torch.where(gmax > 1e-8, gmax, torch.ones_like(gmax)), nov)
    gamma = torch.exp(-lam * ema)[inv]
    return r + alpha * gamma * nov * torch.as_tensor(correct).to(r.dtype)


def is_hard_prompt(num_correct: int, n: int, max_pass_rate: Optional[float] = None) -> bool:
    """ExTra hard prompt: pass rate ``<= 1/G`` (at most one correct; configurable, docs/algorithms.md#extra-prefix-regeneration
    step 1, docs/algorithms.md#extra-prefix-regeneration)."""
    if n <= 0:
        raise ValueError(f"is_hard_prompt: n must be > 0, got {n}")
    return num_correct / n <= (1.0 / n if max_pass_rate is None else max_pass_rate)


def most_confident_rollout(entropies: Tensor, mask: Tensor) -> Optional[int]:
    """Row with the lowest mean token entropy among non-empty rows, None if all are empty
    (docs/algorithms.md#extra-prefix-regeneration). ``entropies`` and ``mask`` are ``[G, T]``."""
    m = mask.to(entropies.dtype)
    lengths = m.sum(dim=1)
    if not bool((lengths > 0).any()):
        return None
    mean = (entropies * m).sum(dim=1) / lengths.clamp(min=1)
    mean = torch.where(lengths > 0, mean, torch.full_like(mean, float("inf")))
    return int(torch.argmin(mean))


def prefix_cut_points(token_ids: Sequence[int], newline_ids, min_gap: int = 32,
                      max_prefixes: int = 15) -> list[int]:
    """ExTra prefix boundaries of one response (docs/algorithms.md#extra-prefix-regeneration).

    Candidates are the positions right after each newline token. Scanning left to right the first is
    kept and later ones only if ``>= min_gap`` tokens after the last kept one; then the last boundary is
    dropped if more than one remains; above ``max_prefixes`` keep ``b[floor(k*len/max_prefixes)]``.
    A boundary ``b`` names the prefix ``token_ids[:b]``; no newline gives no prefixes.
    """
    nl = set(newline_ids)
    cand = [pos + 1 for pos, tid in enumerate(token_ids) if tid in nl]
    if not cand:
        return []
    kept = [cand[0]]
    for b in cand[1:]:
        if b - kept[-1] >= min_gap:
            kept.append(b)
    if len(kept) > 1:
        kept = kept[:-1]
    if len(kept) > max_prefixes:
        kept = [kept[math.floor(k * len(kept) / max_prefixes)] for k in range(max_prefixes)]
    return kept


def prefix_entropy_scores(entropies: Tensor, cut_points: Sequence[int]) -> Tensor:
    """Prefix score ``S = mean_{t<b} H_t`` for each boundary b (docs/algorithms.md#extra-prefix-regeneration)."""
    h = entropies.reshape(-1)
    if any(not 0 < b <= h.numel() for b in cut_points):
        raise ValueError(f"prefix_entropy_scores: cut points {list(cut_points)} outside (0, {h.numel()}]")
    csum = torch.cumsum(h.double(), dim=0)
    return torch.stack([csum[b - 1] / b for b in cut_points]) if cut_points else h.new_zeros(0, dtype=torch.float64)


def select_prefix(scores: Tensor, embeddings: Tensor, tau: float = 0.1) -> tuple[int, Tensor]:
    """ExTra prefix selection (docs/algorithms.md#extra-prefix-regeneration): ``W = row_softmax(E E^T / tau)`` on
    unit-normalized embeddings, ``S~ = W S``, choose ``argmin S~``. Returns (index, smoothed scores)."""
    if scores.numel() == 0 or embeddings.shape[0] != scores.numel():
        raise ValueError(f"select_prefix: need K >= 1 scores and K embeddings, got {scores.numel()} and "
                         f"{embeddings.shape[0]}")
    e = F.normalize(embeddings.double(), dim=-1)
    w = torch.softmax(e @ e.T / max(tau, 1e-6), dim=1)
    smoothed = w @ scores.double()
    return int(torch.argmin(smoothed)), smoothed
