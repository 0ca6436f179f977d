"""Worked examples for graftzoo.algos.functional.peer (docs/algorithms.md#hacpo, #sgt, #graft)."""
import math
import random

import pytest
import torch

import graftzoo.algos.functional as F
from graftzoo.algos.graft.formulas import (graft_balance, graft_candidates, graft_cap, peer_order,
                                           random_count_matched_admission, random_count_matched_prompts,
                                           separate_minibatches, symmetric_cap)
from graftzoo.algos.hacpo.formulas import (capability_estimate, capability_ratio, cross_sequence_ratio,
                                           hacpo_advantages, hacpo_cross_loss, hacpo_discrepancy, hacpo_omegas,
                                           stepwise_lower_bound)
from graftzoo.algos.functional import sgt_augment, sgt_rescue

torch.set_num_threads(1)
D = torch.float64


def t(x):
    return torch.tensor(x, dtype=D)


# ---------------------------------------------------------- GRAFT gate (docs/algorithms.md#graft-compatibility-gate)

def test_compatibility_worked_example():
    s, w = F.compatibility_weights(t([-0.70, -0.90, -0.50]), t([-0.60, -0.60, -0.60]))
    assert s.tolist() == pytest.approx([0.904837, 0.740818, 1.105171], abs=1e-6)
    assert w.tolist() == pytest.approx([0.904837, 0.0, 1.0], abs=1e-6)
    _, w1 = F.compatibility_weights(t([-0.70, -0.90, -0.50]), t([-0.60] * 3), weight="one")
    assert w1.tolist() == [1.0, 0.0, 1.0]
    _, w0 = F.compatibility_weights(t([-0.70, -0.90, -0.50]), t([-0.60] * 3), delta=0.0)  # w/o gate
    assert w0.tolist() == pytest.approx([0.904837, 0.740818, 1.0], abs=1e-6)
    s, _ = F.compatibility_weights(t([0.0]), t([-25.0]))
    assert s.item() == pytest.approx(math.exp(10))
    with pytest.raises(ValueError, match="weight"):
        F.compatibility_weights(t([0.0]), t([0.0]), weight="max")


def test_peer_computed_advantages_worked_example():
    a = F.group_advantages(t([1, 0, 0, 0, 0, 0, 0, 0]), torch.zeros(8, dtype=torch.long))
    assert a[0].item() == pytest.approx(2.4749, abs=1e-4)
    assert a[1:].tolist() == pytest.approx([-0.35355] * 7, abs=1e-5)


# ----------------------------------------------------------- GRAFT selection (docs/algorithms.md#graft-which-groups)

def test_graft_candidates():
    learner = [0, 0, 0, 3, 0, 0]
    peer = [4, 8, 0, 4, None, 1]
    assert graft_candidates(learner, peer, [8] * 6, [8] * 6) == [0, 5]
    assert graft_candidates([0], [1], [0], [8]) == []  # empty learner group is not "all-fail"
    with pytest.raises(ValueError, match="differ in length"):
        graft_candidates([0, 0], [1], [8, 8], [8, 8])
    with pytest.raises(ValueError, match="prompt 0"):
        graft_candidates([0], [9], [8], [8])


def test_graft_cap_and_symmetric_cap():
    assert graft_cap(128) == 32
    assert graft_cap(100, 0.29) == 29  # 0.29*100 is 28.999... in floating point
    assert graft_cap(10) == 2
    assert symmetric_cap(5, 3, 32) == 3
    assert symmetric_cap(50, 40, 32) == 32


def test_graft_balance_ranks_by_outcome_balance():
    p = [0.5, 0.125, 0.25, 0.5, 0.875]
    cands = [0, 1, 2, 3, 4]
    rng = random.Random(0)
    assert graft_balance(cands, p, 2, rng) == [0, 3]
    assert graft_balance(cands, p, 3, rng) == [0, 2, 3]
    assert graft_balance(cands, p, 10, rng) == cands
    assert graft_balance(cands, p, 1, rng, mode="none") == cands
    with pytest.raises(ValueError, match="symmetric_cap"):
        graft_balance(cands, p, 1, rng, mode="symmetric")


def test_graft_balance_ties_are_seeded_random():
    p = [0.5, 0.125, 0.25, 0.5, 0.875]  # 0.125 and 0.875 tie on p(1-p)
    picks = {tuple(graft_balance([0, 1, 2, 3, 4], p, 4, random.Random(seed))) for seed in range(40)}
    assert picks == {(0, 1, 2, 3), (0, 2, 3, 4)}
    assert graft_balance([0, 1, 2, 3, 4], p, 4, random.Random(7)) == \
        graft_balance([0, 1, 2, 3, 4], p, 4, random.Random(7))


def test_random_count_matched_prompts_and_admission():
    sel = random_count_matched_prompts(128, 5, random.Random(1))
    assert len(sel) == 5 and sel == sorted(set(sel)) and all(0 <= x < 128 for x in sel)
    gate = torch.tensor([True, False, True, False, False, True, False, False])
    counts = [0] * 8
    for seed in range(800):
        out = random_count_matched_admission(gate, random.Random(seed))
        assert isinstance(out, torch.Tensor) and int(out.sum()) == 3
        for i, v in enumerate(out.tolist()):
            counts[i] += v
    assert all(abs(c / 800 - 3 / 8) < 0.07 for c in counts)  # uniform over positions
    elig = [True, True, True, False, False, True, True, True]
    for seed in range(50):
        out = random_count_matched_admission([True, True, False, False, False, False, False, False],
                                               random.Random(seed), eligible=elig)
        assert isinstance(out, list) and sum(out) == 2 and not out[3] and not out[4]
    with pytest.raises(ValueError, match="eligible"):
        random_count_matched_admission([True, True], random.Random(0), eligible=[True, False])


# ------------------------------------------------- GRAFT minibatch layout (docs/algorithms.md#graft-peer-last-order)

def test_minibatch_bounds():
    assert F.minibatch_bounds(128, 4) == [(0, 32), (32, 64), (64, 96), (96, 128)]
    assert F.minibatch_bounds(10, 4) == [(0, 3), (3, 6), (6, 8), (8, 10)]


def test_peer_order_modes():
    assert peer_order(3, 2, "last") == [0, 1, 2, 3, 4]
    assert peer_order(3, 2, "first") == [3, 4, 0, 1, 2]
    assert peer_order(6, 2, "uniform", 4) == [0, 6, 1, 7, 2, 3, 4, 5]
    assert peer_order(1, 7, "uniform", 4) == [1, 5, 2, 6, 3, 7, 0, 4]  # full minibatches pass their turn
    order = peer_order(96, 32, "uniform", 4)
    assert sorted(order) == list(range(128))
    for s, e in F.minibatch_bounds(128, 4):
        assert sum(x >= 96 for x in order[s:e]) == 8
    last = peer_order(100, 28, "last", 4)
    assert all(x >= 100 for x in last[100:])  # grafted groups occupy the final minibatch(es)
    with pytest.raises(ValueError, match="mode"):
        peer_order(1, 1, "middle")


def test_separate_minibatches():
    assert separate_minibatches(5, 3, 2) == [[0, 1], [2, 3], [4], [5, 6], [7]]


# ------------------------------------------------------ T2 alignment (docs/algorithms.md#graft-loss-and-token-ratio)

def test_align_peer_logprobs_hand_example():
    out = F.align_peer_logprobs([(0, 2), (2, 6)], [(0, 3), (3, 6)], [-0.3, -0.6])
    assert out == pytest.approx([-0.2, -0.7])
    same = F.align_peer_logprobs([(0, 1), (1, 4)], [(0, 1), (1, 4)], [-0.5, -1.5])
    assert same == pytest.approx([-0.5, -1.5])
    special = F.align_peer_logprobs([(0, 4)], [(0, 0), (0, 4), (4, 4)], [-9.0, -1.0, -9.0])
    assert special == pytest.approx([-1.0])  # zero-width peer tokens carry no characters
    with pytest.raises(ValueError, match="backwards"):
        F.align_peer_logprobs([(0, 2)], [(2, 4), (0, 2)], [-1.0, -1.0])


def test_align_preserves_total_logprob_on_random_tokenizations():
    rng = random.Random(3)
    for _ in range(20):
        n = rng.randint(5, 60)

        def split():
            cuts = sorted(rng.sample(range(1, n), rng.randint(0, n - 2)))
            edges = [0, *cuts, n]
            return list(zip(edges[:-1], edges[1:]))
        lo, po = split(), split()
        lps = [-rng.random() * 3 for _ in po]
        out = F.align_peer_logprobs(lo, po, lps)
        assert len(out) == len(lo)
        assert sum(out) == pytest.approx(sum(lps))


# ---------------------------------------------------------------- HACPO (docs/algorithms.md#hacpo)

def test_capability_estimate_window():
    assert capability_estimate([0.1, 0.2, 0.3, 0.4, 0.5, 0.6]) == pytest.approx(0.4)
    assert capability_estimate([0.2, 0.4]) == pytest.approx(0.3)
    assert capability_estimate([]) == 1.0
    assert capability_estimate([0.0, 0.0]) == 1e-8
    assert capability_ratio(0.5, 0.2) == pytest.approx(2.5)
    assert capability_ratio(1.0, 1e-8) == 10.0 and capability_ratio(1e-8, 1.0) == 0.1


def test_hacpo_worked_example():
    bw, gc = hacpo_omegas([0.2, 0.5], learner=0)
    assert bw.tolist() == pytest.approx([1.0, 0.4]) and gc.tolist() == pytest.approx([1.0, 2.5])
    rewards, source, group = t([0, 0, 1, 0]), torch.tensor([0, 0, 1, 1]), torch.zeros(4, dtype=torch.long)
    a = hacpo_advantages(rewards, group, source, 0, bw, eps=0.0)
    assert a.tolist() == pytest.approx([-0.2, -0.2, 1.8, -0.2], abs=1e-12)
    a_eps = hacpo_advantages(rewards, group, source, 0, bw)
    assert a_eps.tolist() == pytest.approx([-0.2, -0.2, 1.8, -0.2], abs=1e-5)
    at = hacpo_discrepancy(a, source, 0, gc)
    assert at.tolist() == pytest.approx([-0.2, -0.2, 4.5, -0.5], abs=1e-12)
    lo = stepwise_lower_bound(2, lower=1 - 0.2, step=0.025)
    assert lo == pytest.approx(0.85)
    assert stepwise_lower_bound(100) == 1.0

    log_s = torch.tensor([math.log(0.9), math.log(0.8), math.log(1.2)], dtype=D, requires_grad=True)
    adv = t([4.5, 4.5, 4.5])
    loss = hacpo_cross_loss(torch.exp(log_s), adv, lower=lo, alpha=1.0)
    assert loss.tolist() == pytest.approx([-3.645, -0.85 * 0.85 * 4.5, -4.5])
    loss.sum().backward()
    # d(objective)/d l = c^(alpha+1) * omega * A inside (lo, 1); zero outside
    assert log_s.grad.tolist() == pytest.approx([-0.9 ** 2 * 2.5 * 1.8, 0.0, 0.0])


def test_hacpo_guards():
    g = torch.zeros(4, dtype=torch.long)
    src = torch.tensor([0, 0, 1, 1])
    bw, _ = hacpo_omegas([0.2, 0.5], learner=0)
    assert hacpo_advantages(t([1, 1, 1, 1]), g, src, 0, bw).tolist() == [0.0] * 4
    assert hacpo_advantages(t([1, 1, 1, 1]), g, src, 0, bw, uniform_reward_guard=False)[0].item() > 1e3
    bw_strong, _ = hacpo_omegas([0.5, 0.1], learner=0)  # weak source -> baseline weight 5
    assert bw_strong.tolist() == pytest.approx([1.0, 5.0])
    a = hacpo_advantages(t([1, 0, 1, 1]), g, src, 0, bw_strong, eps=0.0)
    assert a.tolist() == pytest.approx([1.0, -1.0, 1.0, 1.0])  # mu^ = 2.75 > 1 -> own mean 0.5
    raw = hacpo_advantages(t([1, 0, 1, 1]), g, src, 0, bw_strong, eps=0.0, binary_baseline_guard=False)
    assert raw.tolist() == pytest.approx([-3.5, -5.5, -3.5, -3.5])


def test_hacpo_everyone_fails_and_multiple_prompts():
    r = t([0, 0, 0, 0, 1, 0, 0, 1])
    g = torch.tensor([0, 0, 0, 0, 1, 1, 1, 1])
    src = torch.tensor([0, 0, 1, 1, 0, 0, 1, 1])
    a = hacpo_advantages(r, g, src, 1, t([0.5, 1.0]), eps=0.0)
    assert a[:4].tolist() == [0.0] * 4
    # prompt 1: mu^ = (0.5*1 + 0 + 0 + 1)/4 = 0.375, std = sqrt(1/3)
    sd = math.sqrt(1 / 3)
    assert a[4:].tolist() == pytest.approx([0.625 / sd, -0.375 / sd, -0.375 / sd, 0.625 / sd])


def test_cross_sequence_ratio():
    s = cross_sequence_ratio(t([-0.7, 0.0]), t([-0.6, -30.0]))
    assert s.tolist() == pytest.approx([math.exp(-0.1), math.exp(10)])


# ---------------------------------------------------------------- SGT (docs/algorithms.md#sgt)

def test_sgt_rescue_gates():
    learner, G = [0, 0, 2, 0], [8, 8, 8, 8]
    succ = [[1, 4, 6], [], [0], None]
    out = sgt_rescue(learner, G, succ, random.Random(0))
    assert list(out) == [0] and len(out[0]) == 1 and out[0][0] in (1, 4, 6)
    out2 = sgt_rescue(learner, G, succ, random.Random(0), k_inj=2)
    assert len(out2[0]) == 2 and out2[0] == sorted(out2[0])
    out3 = sgt_rescue(learner, G, succ, random.Random(0), gate="threshold", tau=0.25)
    assert sorted(out3) == [0, 2] and out3[2] == [0]
    drawn = {sgt_rescue(learner, G, succ, random.Random(s))[0][0] for s in range(30)}
    assert drawn == {1, 4, 6}
    with pytest.raises(ValueError, match="gate"):
        sgt_rescue(learner, G, succ, random.Random(0), gate="mixed")


def test_sgt_augment_worked_advantages():
    pos, r, a = sgt_augment([0.0] * 8, [False] * 8, [1.0], random.Random(5))
    assert len(pos) == 1 and r.tolist().count(1.0) == 1 and r[pos[0]].item() == 1.0
    assert a[pos[0]].item() == pytest.approx(2.47487, abs=1e-4)  # (1 - 1/8) / 0.35355
    others = [a[i].item() for i in range(8) if i != pos[0]]
    assert others == pytest.approx([-0.35355] * 7, abs=1e-5)
    pos2, _, _ = sgt_augment([1.0, 0.0, 0.0], [True, False, False], [1.0, 1.0], random.Random(0))
    assert pos2 == [1, 2]  # only failures are replaced
    with pytest.raises(ValueError, match="failures"):
        sgt_augment([1.0, 0.0], [True, False], [1.0, 1.0], random.Random(0))


def test_sgt_aux_nll():
    # lambda * (-1/|Rescue|) * sum l: weights lambda / |Rescue| per rescue response
    assert F.aux_nll_loss(t([-1.0, -3.0]), t([0.5, 0.5])).item() == pytest.approx(2.0)
    assert F.aux_nll_loss(t([-1.0, -3.0]), t([0.25, 0.25])).item() == pytest.approx(1.0)   # lambda = 0.5
    assert F.aux_nll_loss(t([]), t([])).item() == 0.0
