"""Worked examples for graftzoo.algos.functional.core (docs/algorithms.md#shared-loss-terms and the learners'
sections)."""
import math

import pytest
import torch

from graftzoo.algos.functional import (agg_loss, clipped_surrogate, entropy_from_logits, group_advantages,
                                       gspo_sequence_ratio, gspo_token_ratio, kl_k3, ratio_surrogate,
                                       rloo_advantages, sequence_mean_logp, truncated_is_weights)
from graftzoo.algos.dapo.formulas import dapo_overlong_penalty, zero_variance_groups

torch.set_num_threads(1)
D = torch.float64


def t(x, dtype=D):
    return torch.tensor(x, dtype=dtype)


def gi(x):
    return torch.tensor(x, dtype=torch.long)


# ------------------------------------------------------------- group advantages (docs/algorithms.md#group-advantage)

def test_grpo_test_vectors_verl_and_trl_eps():
    a = group_advantages(t([1, 0, 1, 0]), gi([0, 0, 0, 0]))
    assert torch.allclose(a, t([0.866024, -0.866024, 0.866024, -0.866024]), atol=1e-6)
    a = group_advantages(t([1, 0, 1, 0]), gi([0, 0, 0, 0]), eps=1e-4)
    assert torch.allclose(a, t([0.865875, -0.865875, 0.865875, -0.865875]), atol=1e-6)
    a = group_advantages(t([1, 1, 1, 0]), gi([0, 0, 0, 0]), eps=0.0)
    assert torch.allclose(a, t([0.5, 0.5, 0.5, -1.5]), atol=1e-12)


def test_dr_grpo_no_std_and_reward_convention():
    a = group_advantages(t([1, 0, 1, 0]), gi([0] * 4), std_normalize=False)
    assert torch.allclose(a, t([0.5, -0.5, 0.5, -0.5]))
    pm = group_advantages(t([1, -1, 1, -1]), gi([0] * 4), std_normalize=False)
    assert torch.allclose(pm, 2 * a)  # +-1 rewards double Dr. GRPO advantages
    std01 = group_advantages(t([1, 0, 0, 1, 1]), gi([0] * 5), eps=0.0)
    stdpm = group_advantages(t([1, -1, -1, 1, 1]), gi([0] * 5), eps=0.0)
    assert torch.allclose(std01, stdpm)  # affine invariance


def test_variable_size_groups_with_sparse_ids():
    r = t([1, 0, 0, 1, 1, 0, 0])
    g = gi([7, 3, 7, 3, 3, 7, 7])
    a = group_advantages(r, g, eps=0.0)
    # group 7: [1,0,0,0] mean .25 sd .5 ; group 3: [0,1,1] mean 2/3 sd sqrt(1/3)
    sd3 = math.sqrt(1 / 3)
    want = t([1.5, -2 / 3 / sd3, -0.5, 1 / 3 / sd3, 1 / 3 / sd3, -0.5, -0.5])
    assert torch.allclose(a, want, atol=1e-12)


def test_zero_variance_group_is_exactly_zero_and_singletons():
    a = group_advantages(t([0.1, 0.1, 0.1, 5.0]), gi([0, 0, 0, 1]))
    assert a.tolist() == [0.0, 0.0, 0.0, 0.0]  # all-equal group and singleton (RECOMMENDED 0)
    v = group_advantages(t([0.1, 0.1, 0.1, 5.0]), gi([0, 0, 0, 1]), singleton="verl")
    assert v[3].item() == pytest.approx(5.0 / (1 + 1e-6))
    with pytest.raises(ValueError, match="singleton"):
        group_advantages(t([1.0]), gi([0]), singleton="bad")


def test_group_advantages_bad_input_names_argument():
    with pytest.raises(ValueError, match="group_index"):
        group_advantages(t([1, 0]), gi([0, 0, 0]))
    with pytest.raises(ValueError, match="integer"):
        group_advantages(t([1, 0]), t([0, 0]))


def test_rloo_vector_and_leave_one_out_identity():
    a = rloo_advantages(t([1, 1, 1, 0]), gi([0] * 4))
    assert torch.allclose(a, t([1 / 3, 1 / 3, 1 / 3, -1.0]))
    r = t([0.3, 1.0, 0.0, 0.7, 0.2])
    g = gi([0, 0, 0, 1, 1])
    loo = []
    for i in range(5):
        sib = [r[j].item() for j in range(5) if j != i and g[j] == g[i]]
        loo.append(r[i].item() - sum(sib) / len(sib))
    assert torch.allclose(rloo_advantages(r, g), t(loo))
    assert rloo_advantages(t([1.0, 0, 0]), gi([0, 1, 1])).tolist()[0] == 0.0
    assert rloo_advantages(t([1.0, 0, 0]), gi([0, 1, 1]), singleton="verl").tolist()[0] == 1.0


def test_zero_variance_groups_keep_rule():
    r = t([1, 1, 1, 0, 1])
    g = gi([5, 5, 2, 2, 9])  # groups in id order: 2 -> mixed, 5 -> flat, 9 -> singleton
    assert zero_variance_groups(r, g).tolist() == [False, True, True]
    assert zero_variance_groups(r, g, drop_singletons=False).tolist() == [False, True, False]


# ---------------------------------------------------------------- DAPO overlong (docs/algorithms.md#dapo)

def test_dapo_overlong_test_vectors():
    p = dapo_overlong_penalty([16000, 16384, 18432, 20480, 30000], 20480, 4096)
    assert p.tolist() == [0.0, 0.0, -0.5, -1.0, -1.0]
    assert dapo_overlong_penalty([18432], 20480, 4096, penalty_factor=0.5).tolist() == [-0.25]
    with pytest.raises(ValueError, match="cache_len"):
        dapo_overlong_penalty([1], 10, 20)


# ---------------------------------------------------------------- agg_loss (docs/algorithms.md#loss-aggregation)

LOSS = t([[1, 2, 3], [4, 5, 6]])
MASK = t([[1, 1, 0], [1, 0, 0]])


def test_agg_loss_table():
    assert agg_loss(LOSS, MASK, "token-mean").item() == pytest.approx(7 / 3)
    assert agg_loss(LOSS, MASK, "seq-mean-token-sum").item() == pytest.approx(3.5)
    assert agg_loss(LOSS, MASK, "seq-mean-token-mean").item() == pytest.approx(2.75)
    assert agg_loss(LOSS, MASK, "seq-mean-token-sum-norm").item() == pytest.approx(7 / 6)
    assert agg_loss(LOSS, MASK, "seq-mean-token-sum-norm", normalizer=2 * 4096).item() == pytest.approx(7 / 8192)
    assert agg_loss(LOSS, MASK, "token-mean", normalizer=10).item() == pytest.approx(0.7)


def test_agg_loss_empty_rows_and_empty_mask():
    loss = torch.cat([LOSS, t([[9, 9, 9]])])
    mask = torch.cat([MASK, t([[0, 0, 0]])])
    assert agg_loss(loss, mask, "token-mean").item() == pytest.approx(7 / 3)
    assert agg_loss(loss, mask, "seq-mean-token-sum").item() == pytest.approx(3.5)  # N' excludes empty rows
    assert agg_loss(loss, mask, "seq-mean-token-mean").item() == pytest.approx(2.75)
    assert agg_loss(loss, mask, "seq-mean-token-sum-norm").item() == pytest.approx(7 / 9)  # N counts every row
    x = LOSS.clone().requires_grad_(True)
    for mode in ("token-mean", "seq-mean-token-sum", "seq-mean-token-mean", "seq-mean-token-sum-norm"):
        out = agg_loss(x, torch.zeros_like(MASK), mode)
        assert out.item() == 0.0
        out.backward()
        assert not torch.isnan(x.grad).any()


def test_agg_loss_den_mask_divides_like_another_term():
    """``den_mask``: the numerator over ``mask``'s tokens, the denominators counted on ``den_mask`` (a KL over the
    own row 0 only, divided as the policy term over both rows is, docs/algorithms.md#loss-aggregation)."""
    kl_mask = t([[1, 1, 0], [0, 0, 0]])
    assert agg_loss(LOSS, kl_mask, "token-mean", den_mask=MASK).item() == pytest.approx(3 / 3)
    assert agg_loss(LOSS, kl_mask, "seq-mean-token-sum", den_mask=MASK).item() == pytest.approx(3 / 2)
    assert agg_loss(LOSS, kl_mask, "seq-mean-token-mean", den_mask=MASK).item() == pytest.approx((3 / 2) / 2)
    assert agg_loss(LOSS, kl_mask, "seq-mean-token-sum-norm", 8.0, den_mask=MASK).item() == pytest.approx(3 / 8)
    wide = t([[1, 1, 1], [0, 0, 0]])                    # a KL token outside the denominator's rows still counts
    assert agg_loss(LOSS, wide, "token-mean", den_mask=MASK).item() == pytest.approx(6 / 3)
    empty_row = t([[1, 1, 0], [0, 0, 0]])                # a row without a denominator token adds nothing
    assert agg_loss(LOSS, t([[0, 0, 0], [1, 1, 1]]), "seq-mean-token-mean", den_mask=empty_row).item() == 0.0


def test_agg_loss_bad_input():
    with pytest.raises(ValueError, match="unknown mode"):
        agg_loss(LOSS, MASK, "sum")
    with pytest.raises(ValueError, match="mask shape"):
        agg_loss(LOSS, MASK[:, :2], "token-mean")
    with pytest.raises(ValueError, match="normalizer"):
        agg_loss(LOSS, MASK, "token-mean", normalizer=0)


# ---------------------------------------------------------- clipped surrogate (docs/algorithms.md#clipped-surrogate)

def test_clipped_surrogate_values_and_flags():
    ratios = t([[1.5, 0.5, 1.0, 1.1], [1.5, 0.5, 5.0, 2.0]])
    logp = torch.log(ratios).requires_grad_(True)
    adv = t([1.0, -1.0])
    loss, info = clipped_surrogate(logp, torch.zeros_like(logp), adv, 0.2, 0.28)
    assert torch.allclose(loss, t([[-1.28, -0.5, -1.0, -1.1], [1.5, 0.8, 5.0, 2.0]]))
    assert info["clipped_high"].tolist() == [[True, False, False, False], [False] * 4]
    assert info["clipped_low"].tolist() == [[False] * 4, [False, True, False, False]]
    loss.sum().backward()
    # clipped tokens carry no gradient; others -A * rho
    assert torch.allclose(logp.grad, t([[0, -0.5, -1.0, -1.1], [1.5, 0, 5.0, 2.0]]))


def test_dual_clip_caps_negative_advantages():
    logp = torch.log(t([[5.0, 2.0, 5.0]]))
    loss, info = clipped_surrogate(logp, torch.zeros_like(logp), t([[-1.0, -1.0, 1.0]]), 0.2, 0.2, dual_clip_c=3.0)
    assert torch.allclose(loss, t([[3.0, 2.0, -1.2]]))
    assert info["dual_clipped"].tolist() == [[True, False, False]]
    with pytest.raises(ValueError, match="dual_clip_c"):
        clipped_surrogate(logp, logp, t([1.0]), 0.2, 0.2, dual_clip_c=0.5)


def test_log_ratio_clamp_and_unclipped_mode():
    logp = t([[50.0, 0.3]])
    loss, info = clipped_surrogate(logp, torch.zeros_like(logp), t([-1.0]), math.inf, math.inf)
    assert info["ratio"][0, 0].item() == pytest.approx(math.exp(20.0))
    assert loss[0, 1].item() == pytest.approx(math.exp(0.3))  # -A * rho with no clipping


def test_ratio_surrogate_sequence_level_gspo_clips():
    s = t([1.0005, 0.9990, 1.0001])
    loss, info = ratio_surrogate(s, t([1.0, -1.0, 1.0]), 3e-4, 4e-4)
    assert torch.allclose(loss, t([-1.0004, 0.9997, -1.0001]))
    assert info["clipped_high"].tolist() == [True, False, False]
    assert info["clipped_low"].tolist() == [False, True, False]


# ------------------------------------------------ truncated importance weights (docs/algorithms.md#stale-rollouts)

def test_truncated_is_weights_worked_example():
    """Row 0 decoded by an older policy (stale), row 1 by theta_old itself (fresh); w = min(pi_old / pi_behaviour, C)
    with C = 2 on the stale row, 1 on the fresh one whatever its log-probs say:

        row 0  pi_old      0.3   0.9   0.5
               pi_beh      0.6   0.3   0.4
               ratio       0.5   3.0   1.25
               w           0.5   2.0   1.25    (below 1; above the cap, cut to C; between)
        row 1  pi_old      0.9   0.2   0.5
               pi_beh      0.1   0.8   0.5
               w           1     1     1       (fresh: exactly 1, although the ratios are 9 and 0.25)
    """
    old = torch.log(t([[0.3, 0.9, 0.5], [0.9, 0.2, 0.5]])).requires_grad_(True)
    beh = torch.log(t([[0.6, 0.3, 0.4], [0.1, 0.8, 0.5]]))
    w = truncated_is_weights(old, beh, torch.tensor([True, False]), cap=2.0)
    assert torch.allclose(w[0], t([0.5, 2.0, 1.25]), rtol=0, atol=1e-12)
    assert w[0, 1].item() == 2.0                                # the cap itself, not 2.0000001
    assert torch.equal(w[1], t([1.0, 1.0, 1.0]))                # a fresh row is not reweighed at all
    assert not w.requires_grad                                  # a weight, not a path for the gradient
    # a cap of 5 lets 3.0 through and cuts 9.0 (both rows stale); the log-ratio is clamped to +-20 as the clipped
    # surrogate's is
    wide = truncated_is_weights(old, beh, torch.tensor([True, True]), cap=5.0)
    assert torch.allclose(wide, t([[0.5, 3.0, 1.25], [5.0, 0.25, 1.0]]), rtol=0, atol=1e-12)
    assert truncated_is_weights(t([[30.0]]), t([[0.0]]), torch.tensor([True]), cap=1e12).item() == \
        pytest.approx(math.exp(20.0))
    with pytest.raises(ValueError, match="do not match"):
        truncated_is_weights(old, beh[:, :2], torch.tensor([True, False]), cap=2.0)
    with pytest.raises(ValueError, match="cap must be > 0"):
        truncated_is_weights(old, beh, torch.tensor([True, False]), cap=0.0)


def test_the_stale_rollouts_worked_example_of_the_docs():
    """docs/algorithms.md#stale-rollouts: log pi_old [-1, -2, -0.5, -0.3], log pi_beh [-1.2, -1, -0.5, -1.3], C = 2:
    weights e^0.2 = 1.2214, e^-1 = 0.3679, 1, e^1 = 2.718 cut to 2; at rho = 1 and A = 1 the token terms are -w and
    token-mean over the 4 masked tokens gives -1.1473 (unweighted: -1); the fresh row of the step keeps weight 1."""
    old = t([[-1.0, -2.0, -0.5, -0.3], [-1.0, -2.0, -0.5, -0.3]])
    beh = t([[-1.2, -1.0, -0.5, -1.3], [-1.2, -1.0, -0.5, -1.3]])
    w = truncated_is_weights(old, beh, torch.tensor([True, False]), cap=2.0)
    assert torch.allclose(w[0], t([1.2214, 0.3679, 1.0, 2.0]), atol=1e-4)
    terms, _ = clipped_surrogate(old[:1], old[:1], t([1.0]))  # rho = 1: each token's term is -A
    mask = torch.ones(1, 4, dtype=D)
    assert agg_loss(terms * w[:1], mask, "token-mean").item() == pytest.approx(-1.1473, abs=1e-4)
    assert agg_loss(terms, mask, "token-mean").item() == -1.0
    assert torch.equal(w[1], t([1.0] * 4))


# ---------------------------------------------------------------- KL (docs/algorithms.md#kl-and-entropy)

def test_k3_value_and_clamps():
    k = kl_k3(t([math.log(0.5)]), t([math.log(0.25)]))
    assert k.item() == pytest.approx(0.193147, abs=1e-6)
    assert kl_k3(t([0.0]), t([30.0])).item() == 10.0  # d clamped to 20, value clamped to 10
    assert kl_k3(t([0.0]), t([30.0]), clamp=None, kl_clamp=None).item() == pytest.approx(math.exp(30) - 31)
    x = torch.randn(50, dtype=D)
    assert (kl_k3(x, torch.randn(50, dtype=D)) >= 0).all()


def test_k3_plus_gradient_is_k2():
    logp = t([-0.2, -1.5]).requires_grad_(True)
    ref = t([-0.9, -0.4])
    k = kl_k3(logp, ref, kind="k3+")
    assert torch.allclose(k.detach(), kl_k3(logp.detach(), ref))
    k.sum().backward()
    assert torch.allclose(logp.grad, logp.detach() - ref)


# ---------------------------------------------------------------- GSPO (docs/algorithms.md#gspo)

def test_gspo_sequence_ratio():
    logp = t([[0.1, 0.3, 5.0], [0.0, 0.0, 0.0]])
    mask = t([[1, 1, 0], [0, 0, 0]])
    s = gspo_sequence_ratio(logp, torch.zeros_like(logp), mask)
    assert torch.allclose(s, t([math.exp(0.2), 1.0]))
    assert gspo_sequence_ratio(t([[30.0]]), t([[0.0]]), t([[1]])).item() == pytest.approx(math.exp(10))


def test_gspo_token_equals_sequence_level_value_and_gradient():
    torch.manual_seed(0)
    old = torch.randn(3, 5, dtype=D)
    mask = t([[1, 1, 1, 1, 1], [1, 1, 0, 0, 0], [1, 1, 1, 0, 0]])
    adv = t([1.0, -1.0, 0.5])
    base = old + 0.05 * torch.randn(3, 5, dtype=D)
    lp1 = base.clone().requires_grad_(True)
    lp2 = base.clone().requires_grad_(True)
    tok, _ = ratio_surrogate(gspo_token_ratio(lp1, old, mask), adv, 0.2, 0.2)
    tok_loss = agg_loss(tok, mask, "seq-mean-token-mean")
    seq, _ = ratio_surrogate(gspo_sequence_ratio(lp2, old, mask), adv, 0.2, 0.2)
    seq_loss = seq.mean()
    assert tok_loss.item() == pytest.approx(seq_loss.item())
    tok_loss.backward()
    seq_loss.backward()
    assert torch.allclose(lp1.grad, lp2.grad)
    r = gspo_token_ratio(base, old, mask)
    assert torch.allclose(r, gspo_sequence_ratio(base, old, mask).unsqueeze(1).expand(3, 5))


def test_sequence_mean_logp_and_entropy():
    assert torch.allclose(sequence_mean_logp(t([[-1.0, -3.0, -9.0]]), t([[1, 1, 0]])), t([-2.0]))
    assert entropy_from_logits(torch.zeros(2, 4)).tolist() == pytest.approx([math.log(4)] * 2)
