"""Worked examples for graftzoo.eval.metrics (docs/algorithms.md#evaluation-metrics)."""
import math
import random

import pytest
import torch

from graftzoo.eval.metrics import (avg_at_k, betainc, maj_at_k, mean_pass_at_k, mean_sd_ci, pass_at_k, t_cdf,
                                   t_quantile)


def test_pass_at_k_test_vectors():
    assert pass_at_k(10, 3, 5) == pytest.approx(0.916667, abs=1e-6)
    assert pass_at_k(16, 4, 1) == pytest.approx(0.25)
    assert pass_at_k(16, 1, 8) == pytest.approx(0.5)
    assert pass_at_k(16, 0, 8) == 0.0
    assert pass_at_k(16, 16, 8) == 1.0


def test_pass_at_k_matches_closed_form():
    rng = random.Random(0)
    for _ in range(300):
        n = rng.randint(1, 80)
        c = rng.randint(0, n)
        k = rng.randint(1, n)
        want = 1 - math.comb(n - c, k) / math.comb(n, k)
        assert pass_at_k(n, c, k) == pytest.approx(want, abs=1e-12)


def test_pass_at_k_rejects_bad_input():
    with pytest.raises(ValueError, match="k <= n"):
        pass_at_k(4, 1, 5)
    with pytest.raises(ValueError, match="c <= n"):
        pass_at_k(4, 5, 1)
    assert mean_pass_at_k([(16, 4), (16, 0)], 1) == pytest.approx(0.125)


def test_avg_at_k_examples():
    assert avg_at_k([[1, 0, 1, 1], [0, 0, 0, 0]]) == pytest.approx(0.375)
    assert avg_at_k([[True], [True, False]]) == pytest.approx(0.75)  # each row uses its own k
    assert avg_at_k(torch.tensor([[1, 0], [1, 1]])) == pytest.approx(0.75)
    rows = [[1, 0, 0, 1, 1], [0, 1, 0, 0, 0]]
    assert avg_at_k(rows) == pytest.approx(mean_pass_at_k([(5, sum(r)) for r in rows], 1))
    with pytest.raises(ValueError, match="problem 1"):
        avg_at_k([[1], []])


def test_maj_at_k():
    answers = [["2", "3", "2", None], ["5", "4", "4", "5"], [None, None]]
    correct = [[True, False, True, False], [True, False, False, True], [False, False]]
    assert maj_at_k(answers, correct) == pytest.approx(2 / 3)  # tie in problem 1 goes to "5" (seen first)


def test_t_quantiles_known_values():
    assert t_quantile(0.975, 1) == pytest.approx(12.7062047362, abs=1e-8)
    assert t_quantile(0.975, 4) == pytest.approx(2.7764451052, abs=1e-8)
    assert t_quantile(0.975, 10) == pytest.approx(2.2281388520, abs=1e-8)
    assert t_quantile(0.975, 30) == pytest.approx(2.0422724563, abs=1e-8)
    assert t_quantile(0.995, 5) == pytest.approx(4.0321429836, abs=1e-8)
    assert t_quantile(0.025, 4) == pytest.approx(-2.7764451052, abs=1e-8)
    # df = 2 closed form: t = (2p-1) / sqrt(2 p (1-p))
    p = 0.975
    assert t_quantile(p, 2) == pytest.approx((2 * p - 1) / math.sqrt(2 * p * (1 - p)), abs=1e-9)
    assert t_cdf(0.0, 7) == pytest.approx(0.5)
    assert betainc(2.0, 3.0, 0.4) == pytest.approx(0.5248, abs=1e-12)  # I_0.4(2,3) = 1 - 0.6^4 - 4*0.4*0.6^3


def test_mean_sd_ci_hand_example():
    mean, sd, lo, hi = mean_sd_ci([1, 2, 3, 4, 5])
    assert mean == 3.0 and sd == pytest.approx(math.sqrt(2.5))
    half = 2.7764451052 * math.sqrt(2.5) / math.sqrt(5)
    assert (lo, hi) == pytest.approx((3 - half, 3 + half), abs=1e-8)
    _, _, lo90, hi90 = mean_sd_ci([1, 2, 3, 4, 5], level=0.9)
    assert hi90 - lo90 < hi - lo
    m1 = mean_sd_ci([0.4])
    assert m1[0] == 0.4 and all(math.isnan(v) for v in m1[1:])
    with pytest.raises(ValueError, match="no values"):
        mean_sd_ci([])
