"""Single-model algorithm formulas as pure functions: HORA, ExTra, OM-GRPO (docs/algorithms.md#hora)."""
from __future__ import annotations

import heapq
import math
from typing import Hashable, Optional, Sequence, Union

import torch
import torch.nn.functional as F
from torch import Tensor

from .core import _as_float, group_advantages, group_stats

Prior = Union[float, Sequence[float]]

# --------------------------------------------------------------------------------------------
# HORA (docs/algorithms.md#hora)
# --------------------------------------------------------------------------------------------


def _log_miss(alpha: float, beta: float, m: int) -> float:
    """log E[(1-p)^m] for p ~ Beta(alpha, beta) = log prod_{j<m} (beta+j)/(alpha+beta+j)."""
    return math.lgamma(beta + m) - math.lgamma(beta) - math.lgamma(alpha + beta + m) + math.lgamma(alpha + beta)


def _posterior(s: int, f: int, a0: float, b0: float) -> tuple[float, float]:
    if s < 0 or f < 0 or a0 <= 0 or b0 <= 0:
        raise ValueError(f"HORA: need s, f >= 0 and a0, b0 > 0, got s={s}, f={f}, a0={a0}, b0={b0}")
    return a0 + s, b0 + f


def hit_utility(s: int, f: int, m: int, a0: float = 1.0, b0: float = 1.0) -> float:
    """Posterior probability that at least one of ``m`` more rollouts is correct (docs/algorithms.md#hora):
    ``U(m) = 1 - prod_{j<m} (beta+j)/(alpha+beta+j)`` with ``alpha = a0+s``, ``beta = b0+f``; ``U(0) = 0``.
    Computed in log space (lgamma)."""
    if m < 0:
        raise ValueError(f"hit_utility: m must be >= 0, got {m}")
    alpha, beta = _posterior(s, f, a0, b0)
    return 0.0 if m == 0 else -math.expm1(_log_miss(alpha, beta, m))


def hit_gain(s: int, f: int, m: int, a0: float = 1.0, b0: float = 1.0) -> float:
    """Marginal gain of the (m+1)-th extra rollout ``Delta(m) = U(m+1) - U(m)
    = prod_{j<m} (beta+j)/(alpha+beta+j) * alpha/(alpha+beta+m)`` (docs/algorithms.md#hora)."""
    if m < 0:
        raise ValueError(f"hit_gain: m must be >= 0, got {m}")
    alpha, beta = _posterior(s, f, a0, b0)
    return math.exp(_log_miss(alpha, beta, m)) * alpha / (alpha + beta + m)


def _per_prompt(value: Prior, n: int, name: str) -> list[float]:
    if isinstance(value, (int, float)):
        return [float(value)] * n
    vals = [float(v) for v in value]
    if len(vals) != n:
        raise ValueError(f"hora_allocate: {name} has {len(vals)} entries for {n} prompts")
    return vals


def hora_allocate(counts: Sequence[tuple[int, int]], budget: int, cap: Optional[int] = None,
                  a0: Prior = 1.0, b0: Prior = 1.0, skip_saturated: bool = False,
                  decimals: int = 12) -> list[int]:
    """Exact greedy HORA allocation of ``budget`` extra rollouts over prompts with observed
    ``counts[i] = (s_i, f_i)`` (docs/algorithms.md#hora).

    Repeats ``budget`` times: give one rollout to the prompt with the largest marginal gain
    ``Delta_i(m_i)`` among prompts below ``cap`` extra rollouts. Gains are compared rounded to
    ``decimals`` (12) places and ties go to the lower prompt index (RECOMMENDED tie rule). Since every
    ``Delta_i`` decreases in m, this maximizes ``sum_i U_i(m_i)`` exactly. ``a0``/``b0`` are the Beta
    prior (scalars or one per prompt, for learned priors). ``skip_saturated=True`` gives 0 to all-correct
    probe groups (f = 0, s > 0). If every prompt hits its cap the rest of the budget is left unused.
    """
    if budget < 0:
        raise ValueError(f"hora_allocate: budget must be >= 0, got {budget}")
    if cap is not None and cap < 0:
        raise ValueError(f"hora_allocate: cap must be >= 0 or None, got {cap}")
    n = len(counts)
    a, b = _per_prompt(a0, n, "a0"), _per_prompt(b0, n, "b0")
    alloc = [0] * n
    limit = budget if cap is None else cap
    heap = []
    for i, (s, f) in enumerate(counts):
        if limit > 0 and not (skip_saturated and f == 0 and s > 0):
            heap.append((-round(hit_gain(s, f, 0, a[i], b[i]), decimals), i))
    heapq.heapify(heap)
    for _ in range(budget):
        if not heap:
            break
        _, i = heapq.heappop(heap)
        alloc[i] += 1
        if alloc[i] < limit:
            s, f = counts[i]
            heapq.heappush(heap, (-round(hit_gain(s, f, alloc[i], a[i], b[i]), decimals), i))
    return alloc


def hora_objective(counts: Sequence[tuple[int, int]], alloc: Sequence[int], a0: Prior = 1.0,
                   b0: Prior = 1.0) -> float:
    """``sum_i U_i(m_i)``: expected number of prompts with >= 1 correct extra rollout (docs/algorithms.md#hora)."""
    if len(alloc) != len(counts):
        raise ValueError(f"hora_objective: {len(alloc)} allocations for {len(counts)} prompts")
    a, b = _per_prompt(a0, len(counts), "a0"), _per_prompt(b0, len(counts), "b0")
    return sum(hit_utility(s, f, m, a[i], b[i]) for i, ((s, f), m) in enumerate(zip(counts, alloc)))


# --------------------------------------------------------------------------------------------
# ExTra (docs/algorithms.md#extra)
# --------------------------------------------------------------------------------------------

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


# --------------------------------------------------------------------------------------------
# OM-GRPO (docs/algorithms.md#om-grpo)
# --------------------------------------------------------------------------------------------

def soft_consensus_rewards(answer_clusters: Sequence[Optional[Hashable]],
                           contrast_clusters: Sequence[Optional[Hashable]] = (),
                           formatted: Optional[Sequence[bool]] = None,
                           format_weight: float = 1.0) -> list[float]:
    """OM-GRPO reward ``r_i = r^q_i + format_weight * r^f_i`` (docs/algorithms.md#om-grpo-consensus-reward, docs/algorithms.md#om-grpo-answer-mask).

    Pool ``Z`` = the G trajectory answers plus the contrast (CAR) answers; answers are given as
    equivalence-cluster ids (None = no extractable answer). ``r^q_i = #{z in Z : z == z_i} / |Z|``;
    None never matches (not even another None) but still counts in ``|Z|``. ``r^f_i`` defaults to
    ``answer_clusters[i] is not None``.
    """
    pool = list(answer_clusters) + list(contrast_clusters)
    if not pool:
        return []
    fmt = [c is not None for c in answer_clusters] if formatted is None else list(formatted)
    if len(fmt) != len(answer_clusters):
        raise ValueError(f"soft_consensus_rewards: {len(fmt)} format flags for {len(answer_clusters)} answers")
    votes: dict = {}
    for z in pool:
        if z is not None:
            votes[z] = votes.get(z, 0) + 1
    return [(votes[z] / len(pool) if z is not None else 0.0) + format_weight * float(f)
            for z, f in zip(answer_clusters, fmt)]


def majority_vote_rewards(answer_clusters: Sequence[Optional[Hashable]], formatted: Optional[Sequence[bool]] = None,
                          format_weight: float = 1.0) -> list[float]:
    """TTRL majority-vote baseline reward ``r_i = 1[z_i == z_maj] + format_weight * r^f_i``
    (docs/algorithms.md#om-grpo-answer-mask). Ties for the majority go to the answer seen first; None never wins."""
    fmt = [c is not None for c in answer_clusters] if formatted is None else list(formatted)
    votes: dict = {}
    for z in answer_clusters:
        if z is not None:
            votes[z] = votes.get(z, 0) + 1
    maj = max(votes, key=lambda z: votes[z]) if votes else None  # max keeps the first of equal counts
    return [float(z is not None and z == maj) + format_weight * float(f) for z, f in zip(answer_clusters, fmt)]


def contrast_pairs(group_size: int) -> list[tuple[int, int]]:
    """All ordered pairs (i, j), i != j, of a group: the G(G-1) CAR contrast prompts (docs/algorithms.md#om-grpo-consensus-reward
    step 3)."""
    return [(i, j) for i in range(group_size) for j in range(group_size) if i != j]


def contrast_prompt(problem: str, solution_a: str, solution_b: str) -> str:
    """User-turn text of the RECOMMENDED CAR contrast prompt (docs/algorithms.md#om-grpo-consensus-reward); render it with the
    model's chat template and truncate each solution to the rollout cap before calling."""
    return (f"Problem: {problem}\n\nSolution A:\n{solution_a}\n\nSolution B:\n{solution_b}\n\n"
            "Compare the two solutions and decide the correct final answer to the problem. "
            "Reply with only the final answer in \\boxed{}.")


def boxed_spans(text: str, last_only: bool = True) -> list[tuple[int, int]]:
    """Character spans ``[start, end)`` of the contents of ``\\boxed{...}`` (braces balanced, the
    ``\\boxed{`` / ``}`` format tokens excluded), docs/algorithms.md#om-grpo-answer-mask. ``last_only=True``
    keeps only the last one (``mask_all_boxed=False``). An unclosed ``\\boxed{`` is ignored."""
    spans, key, pos = [], "\\boxed{", 0
    while True:
        start = text.find(key, pos)
        if start < 0:
            break
        i, depth = start + len(key), 1
        while i < len(text) and depth:
            depth += {"{": 1, "}": -1}.get(text[i], 0)
            i += 1
        if depth:
            break
        spans.append((start + len(key), i - 1))
        pos = i
    return spans[-1:] if last_only else spans


def answer_span_mask(token_offsets: Sequence[tuple[int, int]], spans: Sequence[tuple[int, int]],
                     answer_grad_scale: float = 0.0) -> Tensor:
    """OM-GRPO outcome mask ``m^o`` over response tokens (docs/algorithms.md#om-grpo-answer-mask).

    Every token whose character span ``[a, b)`` overlaps an answer span gets ``answer_grad_scale``
    (0 = OM-GRPO, 1 = vanilla, the paper sweeps 0.25/0.5/0.75); all others 1. Zero-width tokens hold no
    characters and stay 1. Multiply into the loss mask (policy and KL terms alike).
    """
    if not 0.0 <= answer_grad_scale <= 1.0:
        raise ValueError(f"answer_span_mask: answer_grad_scale must be in [0, 1], got {answer_grad_scale}")
    out = torch.ones(len(token_offsets), dtype=torch.float32)
    for t, (a, b) in enumerate(token_offsets):
        if b > a and any(a < e and s < b for s, e in spans):
            out[t] = answer_grad_scale
    return out


__all__ = [
    "hit_utility", "hit_gain", "hora_allocate", "hora_objective", "novelty_scores", "extra_advantages",
    "reward_variance_ema", "extra_option_a_scores", "is_hard_prompt", "most_confident_rollout",
    "prefix_cut_points", "prefix_entropy_scores", "select_prefix", "soft_consensus_rewards",
    "majority_vote_rewards", "contrast_pairs", "contrast_prompt", "boxed_spans", "answer_span_mask",
]
