"""Worked examples for graftzoo.algos.functional.single (docs/algorithms.md#hora, #extra, #om-grpo)."""
import itertools
import math
import random

import pytest
import torch

import graftzoo.algos.functional as F
from graftzoo.algos.extra.formulas import (extra_advantages, extra_option_a_scores, is_hard_prompt,
                                           most_confident_rollout, novelty_scores, prefix_cut_points,
                                           prefix_entropy_scores, reward_variance_ema, select_prefix)
from graftzoo.algos.hora.formulas import hit_gain, hit_utility, hora_allocate, hora_objective
from graftzoo.algos.om_grpo.formulas import (answer_span_mask, boxed_spans, contrast_pairs, contrast_prompt,
                                             majority_vote_rewards, soft_consensus_rewards)

torch.set_num_threads(1)
D = torch.float64


def t(x):
    return torch.tensor(x, dtype=D)


# ---------------------------------------------------------------- HORA (docs/algorithms.md#hora)

U_VECTORS = {
    (0, 4): [0, 0.166667, 0.285714, 0.375, 0.444444, 0.5],
    (2, 2): [0, 0.5, 0.714286, 0.821429, 0.880952, 0.916667],
    (4, 0): [0, 0.833333, 0.952381, 0.982143, 0.992063, 0.996032],
    (1, 3): [0, 0.333333, 0.523810, 0.642857, 0.722222, 0.777778],
}
COUNTS = [(4, 0), (2, 2), (0, 4), (1, 3)]


@pytest.mark.parametrize("sf", list(U_VECTORS))
def test_hit_utility_vectors(sf):
    got = [hit_utility(*sf, m) for m in range(6)]
    assert got == pytest.approx(U_VECTORS[sf], abs=1e-6)
    for m in range(5):
        assert hit_gain(*sf, m) == pytest.approx(got[m + 1] - got[m], abs=1e-12)


def test_hit_utility_all_fail_closed_form_and_large_counts():
    for n in range(0, 7):
        for m in range(0, 9):
            assert hit_utility(0, n, m) == pytest.approx(m / (m + n + 1), abs=1e-12)
    u = hit_utility(500, 5000, 100)
    assert 0.0 < u < 1.0 and math.isfinite(hit_gain(500, 5000, 100))
    with pytest.raises(ValueError, match="a0"):
        hit_utility(1, 1, 1, a0=0.0)


@pytest.mark.parametrize("budget,want", [(6, [1, 2, 1, 2]), (8, [2, 2, 2, 2]), (10, [2, 3, 2, 3]),
                                         (16, [2, 4, 5, 5]), (7, [2, 2, 1, 2])])
def test_hora_greedy_vectors_and_tie_break(budget, want):
    assert hora_allocate(COUNTS, budget) == want


def test_hora_tie_gains_are_exactly_five_over_42():
    # the three competitors for budget 7/8: (4,0) at m=1, (0,4) at m=1, (1,3) at m=2
    for sf, m in [((4, 0), 1), ((0, 4), 1), ((1, 3), 2)]:
        assert hit_gain(*sf, m) == pytest.approx(5 / 42, abs=1e-15)


def test_hora_cap_skip_saturated_and_priors():
    assert hora_allocate(COUNTS, 10, cap=1) == [1, 1, 1, 1]  # remainder unused
    assert hora_allocate(COUNTS, 6, skip_saturated=True) == [0, 2, 2, 2]
    assert sum(hora_allocate(COUNTS, 16, cap=5)) == 16
    # a strong prior of failure on prompt 0 moves budget away from it
    assert hora_allocate(COUNTS, 6, a0=[1, 1, 1, 1], b0=[50, 1, 1, 1])[0] == 0
    with pytest.raises(ValueError, match="a0"):
        hora_allocate(COUNTS, 6, a0=[1, 1])


def test_hora_greedy_is_optimal_by_brute_force():
    rng = random.Random(0)
    for _ in range(15):
        counts = [(rng.randint(0, 4), rng.randint(0, 4)) for _ in range(3)]
        budget = rng.randint(0, 6)
        best = max(hora_objective(counts, a) for a in itertools.product(range(budget + 1), repeat=3)
                   if sum(a) == budget)
        alloc = hora_allocate(counts, budget)
        assert sum(alloc) == budget
        assert hora_objective(counts, alloc) == pytest.approx(best, abs=1e-12)


# ------------------------------------------------------------ ExTra novelty (docs/algorithms.md#extra-novelty-bonus)

def test_novelty_scores_nearest_neighbour_distance():
    mem = t([[1, 0], [0, 1]])
    cur = t([[1, 0], [1, 1]])
    nov = novelty_scores(cur, mem, min_history=2)
    assert nov.tolist() == pytest.approx([0.0, 1 - 1 / math.sqrt(2)], abs=1e-6)
    assert novelty_scores(cur, mem[:1], min_history=2).tolist() == [0.0, 0.0]  # warm-up
    assert novelty_scores(cur, None, min_history=2).tolist() == [0.0, 0.0]
    far = novelty_scores(t([[1, 0], [-1, 0]]), t([[-1, 0]]), min_history=1)
    assert far.tolist() == pytest.approx([2.0, 0.0])  # opposite neighbours; e1 duplicates the memory entry
    far2 = novelty_scores(t([[1, 0], [0, 1]]), t([[-1, 0]]), min_history=1)
    assert far2.tolist() == pytest.approx([1.0, 1.0])  # nearest neighbour is orthogonal


def test_extra_option_b_advantage():
    r = t([1, -1, 1, -1, 1, 1])
    correct = torch.tensor([True, False, True, False, True, True])
    g = torch.tensor([0, 0, 0, 0, 1, 1])
    nov = t([0.2, 0.5, 0.4, 0.1, 0.3, 0.05])
    a = extra_advantages(r, correct, g, nov, alpha=0.1)
    grpo = 0.866024
    assert a.tolist() == pytest.approx([grpo + 0.02, -grpo, grpo + 0.04, -grpo, 0.03, 0.005], abs=1e-6)


def test_extra_option_a_scores_and_ema():
    assert reward_variance_ema(None, [1, -1, 1, -1]) == pytest.approx(1.0)
    assert reward_variance_ema(1.0, [1, 1]) == pytest.approx(0.9)
    assert reward_variance_ema(0.5, [1]) == pytest.approx(0.45)
    r = t([1, -1, 1, -1])
    correct = torch.tensor([True, False, True, False])
    s = extra_option_a_scores(r, correct, torch.zeros(4, dtype=torch.long), t([0.2, 0.5, 0.4, 0.1]),
                                t([0.5]), alpha=0.1, lam=1.0)
    gamma = math.exp(-0.5)
    assert s.tolist() == pytest.approx([1 + 0.1 * gamma * 0.4, -1, 1 + 0.1 * gamma * 0.8, -1])


# ------------------------------------------ ExTra prefix regeneration (docs/algorithms.md#extra-prefix-regeneration)

def test_hard_prompt_and_most_confident():
    assert is_hard_prompt(1, 8) and is_hard_prompt(0, 8) and not is_hard_prompt(2, 8)
    assert not is_hard_prompt(1, 8, max_pass_rate=0.0)
    ent = t([[0.5, 0.5, 9.0], [0.2, 0.9, 0.0], [0.0, 0.0, 0.0]])
    mask = t([[1, 1, 0], [1, 1, 1], [0, 0, 0]])
    assert most_confident_rollout(ent, mask) == 1  # means 0.5, 0.3667; empty row excluded
    assert most_confident_rollout(ent, torch.zeros_like(mask)) is None


def test_prefix_cut_points_merge_drop_last_and_cap():
    ids = [1] * 130
    for pos in (5, 20, 40, 45, 80, 120):
        ids[pos] = 10
    assert prefix_cut_points(ids, {10}) == [6, 41, 81]
    assert prefix_cut_points([1, 2, 3], {10}) == []
    assert prefix_cut_points([1, 2, 10], {10}) == [3]  # a single boundary is kept, even at the end
    ids = [1] * (40 * 32)
    for j in range(40):
        ids[j * 32 + 31] = 10
    bounds = [32 * (j + 1) for j in range(39)]  # 40 kept, last dropped
    assert prefix_cut_points(ids, [10, 11]) == [bounds[math.floor(k * 39 / 15)] for k in range(15)]


def test_prefix_scores_and_selection():
    assert prefix_entropy_scores(t([1, 2, 3, 4]), [1, 3]).tolist() == pytest.approx([1.0, 2.0])
    with pytest.raises(ValueError, match="cut points"):
        prefix_entropy_scores(t([1, 2]), [3])
    scores = t([0.3, 0.9, 0.5])
    emb = t([[1, 0], [1, 0], [0, 1]])
    idx, smooth = select_prefix(scores, emb, tau=0.1)
    e10 = math.exp(10)
    assert smooth.tolist() == pytest.approx([(1.2 * e10 + 0.5) / (2 * e10 + 1)] * 2 + [(1.2 + 0.5 * e10) / (2 + e10)])
    assert idx == 2  # raw argmin would be 0


# ---------------------------------------------------------------- OM-GRPO (docs/algorithms.md#om-grpo)

def test_soft_consensus_with_and_without_car():
    answers = ["a", "a", "b", None]
    assert soft_consensus_rewards(answers) == pytest.approx([1.5, 1.5, 1.25, 0.0])
    contrast = ["a"] * 6 + ["b"] * 4 + [None] * 2
    assert soft_consensus_rewards(answers, contrast) == pytest.approx([1.5, 1.5, 1.3125, 0.0])
    assert soft_consensus_rewards([None, None]) == [0.0, 0.0]  # None never matches None
    assert soft_consensus_rewards(["a", "b"], formatted=[True, False], format_weight=0.5) == pytest.approx([1.0, 0.5])
    unanimous = soft_consensus_rewards(["x"] * 4, ["x"] * 12)
    assert F.group_advantages(t(unanimous), torch.zeros(4, dtype=torch.long)).tolist() == [0.0] * 4


def test_majority_vote_and_pairs_and_prompt():
    assert majority_vote_rewards(["b", "a", "a", "b", None]) == [2.0, 1.0, 1.0, 2.0, 0.0]
    pairs = contrast_pairs(8)
    assert len(pairs) == 56 and len(set(pairs)) == 56 and all(i != j for i, j in pairs)
    text = contrast_prompt("1+1?", "It is 2.", "It is 3.")
    assert text.index("Solution A:\nIt is 2.") < text.index("Solution B:\nIt is 3.") and "\\boxed{}" in text


def test_boxed_spans_and_answer_mask():
    s = "so \\boxed{1} then \\boxed{\\frac{1}{2}} end"
    (a, b), = boxed_spans(s)
    assert s[a:b] == "\\frac{1}{2}"
    assert [s[x:y] for x, y in boxed_spans(s, last_only=False)] == ["1", "\\frac{1}{2}"]
    assert boxed_spans("x \\boxed{1") == []
    offsets = [(0, 3), (3, 8), (8, 10), (10, 10), (10, 14)]
    assert answer_span_mask(offsets, [(5, 9)]).tolist() == [1.0, 0.0, 0.0, 1.0, 1.0]
    assert answer_span_mask(offsets, [(5, 9)], answer_grad_scale=0.25).tolist() == [1.0, 0.25, 0.25, 1.0, 1.0]
    assert answer_span_mask(offsets, []).tolist() == [1.0] * 5
