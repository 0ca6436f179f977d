"""Evaluation metrics: unbiased pass@k, avg@k, maj@k, t intervals (over seeds) and bootstrap
intervals of accuracies (over prompts) (docs/algorithms.md#evaluation-metrics); the test over seeds that a report's
marks and the demo's verdict rest on (``seed_test``, docs/results.md#marks-of-significance).

Pure Python (no scipy): the Student-t quantile comes from the regularized incomplete beta function,
evaluated by its continued fraction and inverted by bisection.
"""
from __future__ import annotations

import math
import random
from dataclasses import dataclass
from typing import Hashable, Mapping, Optional, Sequence


def pass_at_k(n: int, c: int, k: int) -> float:
    """Unbiased pass@k for one problem with n samples, c correct (docs/algorithms.md#evaluation-metrics, Chen et al. 2021):
    ``1 - C(n-c, k) / C(n, k)``, computed as ``1 - prod_{i=n-c+1}^{n} (1 - k/i)`` (1 when ``n - c < k``).
    Requires ``0 <= c <= n`` and ``1 <= k <= n``."""
    if not 0 <= c <= n:
        raise ValueError(f"pass_at_k: need 0 <= c <= n, got n={n}, c={c}")
    if not 1 <= k <= n:
        raise ValueError(f"pass_at_k: need 1 <= k <= n, got n={n}, k={k}")
    if n - c < k:
        return 1.0
    prod = 1.0
    for i in range(n - c + 1, n + 1):
        prod *= 1.0 - k / i
    return 1.0 - prod


def mean_pass_at_k(counts: Sequence[tuple[int, int]], k: int) -> float:
    """Benchmark pass@k: mean of :func:`pass_at_k` over problems given as ``(n, c)`` pairs (docs/algorithms.md#evaluation-metrics)."""
    if not counts:
        raise ValueError("mean_pass_at_k: no problems")
    return sum(pass_at_k(n, c, k) for n, c in counts) / len(counts)


def _rows(matrix) -> list[list[float]]:
    rows = matrix.tolist() if hasattr(matrix, "tolist") else matrix
    out = []
    for i, row in enumerate(rows):
        vals = [float(v) for v in row]
        if not vals:
            raise ValueError(f"avg_at_k: problem {i} has no samples")
        out.append(vals)
    if not out:
        raise ValueError("avg_at_k: no problems")
    return out


def avg_at_k(correct_matrix) -> float:
    """avg@k (= mean@k): ``(1/|D|) sum_x (1/k) sum_j correct(y_{x,j})`` (docs/algorithms.md#evaluation-metrics).

    ``correct_matrix`` holds one row of 0/1 (or bool) outcomes per problem: nested lists (rows may differ
    in length; each uses its own k), a 2-D tensor or a numpy array."""
    rows = _rows(correct_matrix)
    return sum(sum(r) / len(r) for r in rows) / len(rows)


def maj_at_k(answers: Sequence[Sequence[Optional[Hashable]]], correct: Sequence[Sequence[bool]]) -> float:
    """maj@k: fraction of problems whose most frequent answer is correct (docs/algorithms.md#evaluation-metrics).

    ``answers[x][j]`` is the equivalence-normalized answer of sample j (None = none extracted, never the
    majority); ``correct[x][j]`` its correctness. Ties go to the answer seen first. A problem with no
    answer at all counts as wrong."""
    if len(answers) != len(correct) or not answers:
        raise ValueError(f"maj_at_k: {len(answers)} answer rows vs {len(correct)} correctness rows (need >= 1)")
    hits = 0
    for x, (ans, cor) in enumerate(zip(answers, correct)):
        if len(ans) != len(cor):
            raise ValueError(f"maj_at_k: problem {x}: {len(ans)} answers vs {len(cor)} correctness flags")
        votes: dict = {}
        first_correct: dict = {}
        for a, c in zip(ans, cor):
            if a is not None:
                votes[a] = votes.get(a, 0) + 1
                first_correct.setdefault(a, bool(c))
        if votes:
            hits += first_correct[max(votes, key=lambda a: votes[a])]
    return hits / len(answers)


# --------------------------------------------------------------------------------------------
# Student t quantiles and confidence intervals
# --------------------------------------------------------------------------------------------

def _beta_cf(a: float, b: float, x: float) -> float:
    """Continued fraction of the incomplete beta function (modified Lentz), valid for x < (a+1)/(a+b+2)."""
    tiny, c, d = 1e-300, 1.0, 1.0 - (a + b) * x / (a + 1.0)
    d = 1.0 / (d if abs(d) > tiny else tiny)
    h = d
    for m in range(1, 1000):
        for num in (m * (b - m) * x / ((a + 2 * m - 1) * (a + 2 * m)),
                    -(a + m) * (a + b + m) * x / ((a + 2 * m) * (a + 2 * m + 1))):
            d = 1.0 + num * d
            d = 1.0 / (d if abs(d) > tiny else tiny)
            c = 1.0 + num / c
            c = c if abs(c) > tiny else tiny
            h *= d * c
        if abs(d * c - 1.0) < 1e-15:
            break
    return h


def betainc(a: float, b: float, x: float) -> float:
    """Regularized incomplete beta ``I_x(a, b)`` for ``a, b > 0`` and ``0 <= x <= 1``."""
    if not 0.0 <= x <= 1.0:
        raise ValueError(f"betainc: x={x} outside [0, 1]")
    if x in (0.0, 1.0):
        return x
    log_front = (math.lgamma(a + b) - math.lgamma(a) - math.lgamma(b)
                 + a * math.log(x) + b * math.log1p(-x))
    if x < (a + 1.0) / (a + b + 2.0):
        return math.exp(log_front) * _beta_cf(a, b, x) / a
    return 1.0 - math.exp(log_front) * _beta_cf(b, a, 1.0 - x) / b


def t_cdf(t: float, df: float) -> float:
    """Student-t CDF: ``1 - I_{df/(df+t^2)}(df/2, 1/2) / 2`` for t >= 0, by symmetry below 0."""
    if df <= 0:
        raise ValueError(f"t_cdf: df must be > 0, got {df}")
    tail = 0.5 * betainc(df / 2.0, 0.5, df / (df + t * t))
    return 1.0 - tail if t >= 0 else tail


def t_quantile(p: float, df: float) -> float:
    """Inverse Student-t CDF by bisection on :func:`t_cdf` (absolute accuracy ~1e-12)."""
    if not 0.0 < p < 1.0:
        raise ValueError(f"t_quantile: p={p} outside (0, 1)")
    if p < 0.5:
        return -t_quantile(1.0 - p, df)
    lo, hi = 0.0, 1.0
    while t_cdf(hi, df) < p:
        lo, hi = hi, hi * 2.0
    for _ in range(200):
        mid = 0.5 * (lo + hi)
        if t_cdf(mid, df) < p:
            lo = mid
        else:
            hi = mid
        if hi - lo < 1e-13 * max(1.0, hi):
            break
    return 0.5 * (lo + hi)


def mean_sd_ci(values: Sequence[float], level: float = 0.95) -> tuple[float, float, float, float]:
    """Mean, sample sd (n-1) and the two-sided t-interval ``mean -+ t_{(1+level)/2, n-1} * sd / sqrt(n)``
    (e.g. over seeds). With one value sd and the bounds are NaN."""
    vals = [float(v) for v in values]
    if not vals:
        raise ValueError("mean_sd_ci: no values")
    if not 0.0 < level < 1.0:
        raise ValueError(f"mean_sd_ci: level={level} outside (0, 1)")
    n = len(vals)
    mean = sum(vals) / n
    if n == 1:
        return mean, math.nan, math.nan, math.nan
    sd = math.sqrt(sum((v - mean) ** 2 for v in vals) / (n - 1))
    half = t_quantile(0.5 + level / 2.0, n - 1) * sd / math.sqrt(n)
    return mean, sd, mean - half, mean + half


BOOTSTRAP_RESAMPLES = 2000


def bootstrap_ci(values: Sequence[float], level: float = 0.95, resamples: int = BOOTSTRAP_RESAMPLES,
                 seed: int = 0) -> tuple[float, float]:
    """Percentile bootstrap interval of the mean of ``values`` (docs/algorithms.md#evaluation-metrics):
    draw ``len(values)`` values with replacement ``resamples`` times (``random.Random(seed)``, so
    the interval is reproducible), take the mean of each draw, and return the ``(1-level)/2`` and
    ``(1+level)/2`` quantiles of those means. Every draw's mean lies between the smallest and the
    largest value, so an interval of accuracies (per-prompt accuracies in [0, 1]) stays in [0, 1]."""
    vals = [float(v) for v in values]
    if not vals:
        raise ValueError("bootstrap_ci: no values")
    if not 0.0 < level < 1.0:
        raise ValueError(f"bootstrap_ci: level={level} outside (0, 1)")
    if resamples < 1:
        raise ValueError(f"bootstrap_ci: resamples={resamples} must be >= 1")
    rng, n = random.Random(seed), len(vals)
    means = sorted(math.fsum(rng.choices(vals, k=n)) / n for _ in range(resamples))
    lo = means[int(math.floor((1.0 - level) / 2.0 * (resamples - 1)))]
    hi = means[int(math.ceil((1.0 + level) / 2.0 * (resamples - 1)))]
    return max(lo, min(vals)), min(hi, max(vals))


# --------------------------------------------------------------------------------------------
# Tests over training seeds: what a report may call a difference
# --------------------------------------------------------------------------------------------

SIGNIFICANCE = 0.05
"""The level α of ``seed_test``: a difference is significant when its two-sided p-value is below it."""


def paired_t_p(diffs: Sequence[float]) -> float:
    """Two-sided p-value of the paired t-test that the mean of ``diffs`` (one difference per seed) is 0
    (docs/results.md#marks-of-significance): ``t = mean / (sd / sqrt(n))`` with the sample sd, ``p = 2 (1 -
    T_{n-1}(|t|))``. When every difference is the same (sd 0: t is undefined) it is the exact sign-flip test's p,
    ``2 / 2^n`` (only the observed signs and their mirror reach the observed |mean|), and 1 when they are all 0.
    Needs n >= 2."""
    d = [float(x) for x in diffs]
    n = len(d)
    if n < 2:
        raise ValueError(f"paired_t_p: need >= 2 differences, got {n}")
    mean = math.fsum(d) / n
    sd = math.sqrt(math.fsum((x - mean) ** 2 for x in d) / (n - 1))
    if sd <= 1e-12 * max(1.0, abs(mean)):
        return 1.0 if abs(mean) <= 1e-12 else min(1.0, 2.0 / 2 ** n)
    t = mean / (sd / math.sqrt(n))
    return min(1.0, 2.0 * (1.0 - t_cdf(abs(t), n - 1)))


def welch_t_p(a: Sequence[float], b: Sequence[float]) -> float:
    """Two-sided p-value of Welch's t-test that two independent samples (seeds of two methods that share too few
    seeds to pair) have the same mean (docs/results.md#marks-of-significance): ``t = (mean_b - mean_a) / se``,
    ``se^2 = s_a^2/n_a + s_b^2/n_b``, Welch-Satterthwaite degrees of freedom ``se^4 / ((s_a^2/n_a)^2/(n_a-1) +
    (s_b^2/n_b)^2/(n_b-1))``. When both samples are constant (se 0) it is the exact label-permutation test's p,
    ``(1 + [n_a = n_b]) / C(n_a + n_b, n_a)``, and 1 when their values are equal. Needs two values on each side."""
    xa, xb = [float(x) for x in a], [float(x) for x in b]
    na, nb = len(xa), len(xb)
    if min(na, nb) < 2:
        raise ValueError(f"welch_t_p: need >= 2 values on each side, got {na} and {nb}")
    ma, mb = math.fsum(xa) / na, math.fsum(xb) / nb
    va = math.fsum((x - ma) ** 2 for x in xa) / (na - 1) / na
    vb = math.fsum((x - mb) ** 2 for x in xb) / (nb - 1) / nb
    if va + vb <= 1e-24 * max(1.0, ma * ma, mb * mb):
        return 1.0 if abs(mb - ma) <= 1e-12 else (1.0 + (na == nb)) / math.comb(na + nb, na)
    t = (mb - ma) / math.sqrt(va + vb)
    df = (va + vb) ** 2 / (va ** 2 / (na - 1) + vb ** 2 / (nb - 1))
    return min(1.0, 2.0 * (1.0 - t_cdf(abs(t), df)))


@dataclass(frozen=True)
class SeedTest:
    """The outcome of ``seed_test``: the tested difference (other - base, a fraction), its p-value, how many seeds
    it rests on (pairs, or the smaller side unpaired) and whether they were paired."""

    diff: float
    p: float
    n: int
    paired: bool

    @property
    def significant(self) -> bool:
        return self.p < SIGNIFICANCE

    @property
    def name(self) -> str:
        return "paired t-test" if self.paired else "Welch's t-test"


def seed_test(base: Mapping[int, float], other: Mapping[int, float]) -> Optional[SeedTest]:
    """Whether two methods' per-seed scores (seed -> score) differ (docs/results.md#marks-of-significance): over the
    seeds both have, when there are at least two, ``paired_t_p`` of the differences ``other - base`` (a seed index
    is one warm-up and one prompt order for both methods); else, with two seeds or more on each side,
    ``welch_t_p`` over all of them; else None (one seed has no spread: no test). ``diff`` is the mean of the tested
    differences (paired) or of other minus the mean of base."""
    common = sorted(set(base) & set(other))
    if len(common) >= 2:
        diffs = [float(other[s]) - float(base[s]) for s in common]
        return SeedTest(math.fsum(diffs) / len(diffs), paired_t_p(diffs), len(common), True)
    if min(len(base), len(other)) >= 2:
        a, b = list(base.values()), list(other.values())
        diff = math.fsum(b) / len(b) - math.fsum(a) / len(a)
        return SeedTest(diff, welch_t_p(a, b), min(len(a), len(b)), False)
    return None


__all__ = ["pass_at_k", "mean_pass_at_k", "avg_at_k", "maj_at_k", "betainc", "t_cdf", "t_quantile", "mean_sd_ci",
           "bootstrap_ci", "SIGNIFICANCE", "paired_t_p", "welch_t_p", "SeedTest", "seed_test"]
