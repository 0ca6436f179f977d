"""HORA's formulas as pure functions (docs/algorithms.md#hora); the formulas several algorithms share are
graftzoo.algos.functional's."""
from __future__ import annotations

import heapq
import math
from typing import Optional, Sequence, Union



Prior = Union[float, Sequence[float]]


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
