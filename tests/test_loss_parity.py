"""Parity of the loss with the anchors (docs/algorithms.md#loss-aggregation, docs/algorithms.md#kl-and-entropy): for
every ``algo.loss_agg`` mode, with a KL term (beta > 0) and an entropy bonus, the step's real loss of a micro-batch
(``graftzoo.training.models.loss.micro_batch_loss``, with the policy loss the learner names) and its gradient with respect
to the log-probs and the entropies, in float64, equal the reference formulas below to 1e-12, whole and split into
micro-batches.

The references are written out here from their sources (paraphrased, not copied):

- TRL 1.16, ``GRPOTrainer._compute_loss``: the per-token loss is the clipped surrogate plus ``beta`` times the k3 KL,
  then aggregated by ``loss_type``: ``grpo`` (each row's token mean, then the mean over rows), ``bnpo`` (the token
  mean of the batch), ``dr_grpo`` (the token sum over rows x ``max_completion_length``), ``dapo`` (the token sum
  over the generation batch's token count); sequence-level importance sampling (GSPO) takes the row's mean
  log-ratio as the ratio of all its tokens.
- verl ``agg_loss`` (``verl/trainer/ppo/core_algos.py``), for ``seq-mean-token-sum``, which TRL does not have: the
  row's token sum, then the mean over rows.

The entropy bonus: graftzoo aggregates it, like the KL, with the policy term's one normaliser in every mode (as verl
aggregates its entropy loss with the loss's own ``loss_agg_mode``), so the references put ``-c * H`` into the same
per-token loss. TRL 1.16's own entropy bonus is a token mean in every ``loss_type``: the same value for ``bnpo`` and
``dapo``; for ``grpo`` and ``dr_grpo`` graftzoo follows verl.
"""
import dataclasses
import random

import pytest
import torch

from graftzoo.algos.base import StepContext
from graftzoo.contract.batch import TrainBatch
from graftzoo.contract.config import LearnerFacts, load_config
from graftzoo.contract.registry import get_algo
from graftzoo.contract.types import TrainRow
from graftzoo.training.models.loss import denominators, micro_batch_loss

L_MAX = 10                 # rollout.max_new_tokens: TRL's max_completion_length
LENGTHS = [5, 3, 7, 2]     # response tokens of the 4 rows (padded to 7)
ADVANTAGES = [1.25, -0.75, 0.375, -1.125]   # exact in float32, as the rows carry them
BETA, ENT = 0.04, 0.01
TOL = 1e-12


# ------------------------------------------------------------------------------------------------
# the reference formulas
# ------------------------------------------------------------------------------------------------

def clipped_token_loss(logp, old, adv, eps_low, eps_high):
    """Minus the PPO clipped objective per token, ``-min(rho A, clip(rho, 1 - eps_low, 1 + eps_high) A)``
    (docs/algorithms.md#clipped-surrogate; TRL 1.16 ``_compute_loss``, token-level importance sampling)."""
    ratio = torch.exp(logp - old)
    a = adv.unsqueeze(1)
    return -torch.minimum(ratio * a, ratio.clamp(1 - eps_low, 1 + eps_high) * a)


def sequence_clipped_loss(logp, old, adv, mask, eps_low, eps_high):
    """The same with one ratio per row, ``exp`` of the row's mean log-ratio over its tokens, on each of its tokens
    (docs/algorithms.md#gspo; TRL 1.16 ``_compute_loss`` with ``importance_sampling_level="sequence"``)."""
    ratio = torch.exp(((logp - old) * mask).sum(-1, keepdim=True) / mask.sum(-1, keepdim=True).clamp(min=1.0))
    a = adv.unsqueeze(1)
    return -torch.minimum(ratio * a, ratio.clamp(1 - eps_low, 1 + eps_high) * a).expand_as(logp)


def k3(logp, ref):
    """Schulman's k3 estimate of KL(pi_theta || pi_ref) per token, ``exp(ref - logp) - (ref - logp) - 1``
    (docs/algorithms.md#kl-and-entropy; TRL 1.16 ``per_token_kl``)."""
    return torch.exp(ref - logp) - (ref - logp) - 1


def trl_grpo(per_token, mask):
    """TRL ``loss_type="grpo"``: each row's token mean, then the mean over rows (graftzoo ``seq-mean-token-mean``,
    docs/algorithms.md#loss-aggregation)."""
    return ((per_token * mask).sum(-1) / mask.sum(-1).clamp(min=1.0)).mean()


def trl_bnpo(per_token, mask):
    """TRL ``loss_type="bnpo"``: the token mean of the batch (graftzoo ``token-mean``,
    docs/algorithms.md#loss-aggregation)."""
    return (per_token * mask).sum() / mask.sum().clamp(min=1.0)


def trl_dapo(per_token, mask):
    """TRL ``loss_type="dapo"``: the token sum over ``num_items_in_batch``, the generation batch's token count; on one
    process with one optimizer step per generation batch, this batch's (graftzoo ``token-mean``,
    docs/algorithms.md#loss-aggregation)."""
    num_items_in_batch = mask.sum()
    return (per_token * mask).sum() / num_items_in_batch


def trl_dr_grpo(per_token, mask):
    """TRL ``loss_type="dr_grpo"``: the token sum over rows x ``max_completion_length`` (graftzoo
    ``seq-mean-token-sum-norm``, docs/algorithms.md#dr-grpo)."""
    return (per_token * mask).sum() / (per_token.size(0) * L_MAX)


def verl_seq_mean_token_sum(per_token, mask):
    """verl ``agg_loss``, ``seq-mean-token-sum``: each row's token sum, then the mean over rows (no TRL counterpart;
    docs/algorithms.md#loss-aggregation; every row here has tokens, so verl's versions that count only rows with
    tokens agree)."""
    return (per_token * mask).sum(-1).mean()


# ------------------------------------------------------------------------------------------------
# graftzoo's loss on the same numbers
# ------------------------------------------------------------------------------------------------

def data():
    g = torch.Generator().manual_seed(0)
    B, T = len(LENGTHS), max(LENGTHS)
    mask = torch.tensor([[1.0] * n + [0.0] * (T - n) for n in LENGTHS], dtype=torch.float64)
    old = -0.5 - 2.5 * torch.rand(B, T, generator=g, dtype=torch.float64)
    logp = old + 0.6 * (torch.rand(B, T, generator=g, dtype=torch.float64) - 0.5)   # ratios 0.74..1.35: some clipped
    ref = logp + 0.4 * (torch.rand(B, T, generator=g, dtype=torch.float64) - 0.5)
    ent = 0.1 + 2.0 * torch.rand(B, T, generator=g, dtype=torch.float64)
    return mask, old, logp, ref, ent


class FixedPolicy:
    """A policy whose log-probs (and entropies) are given tensors: row ``b`` of a minibatch is the row whose prompt is
    ``[b + 1]``."""

    def __init__(self, logp, ent=None):
        self.logp, self.ent = logp, ent

    def logprobs(self, input_ids, attention_mask, resp_len, with_entropy=False, entropy_grad=True):
        rows = input_ids[:, input_ids.shape[1] - resp_len - 1] - 1
        ent = self.ent[rows, :resp_len] if with_entropy and self.ent is not None else None
        return self.logp[rows, :resp_len], ent


def graftzoo_loss(algo, overrides, old, logp, ref, ent, split=False, peer_rows=(), peer_weight=1.0):
    """The step's loss (``micro_batch_loss``) on the 4 rows as one minibatch (or as micro-batches of 1, 2 and 1 rows
    carrying the minibatch's ``denominators``, as ``optim.max_tokens_per_micro`` splits it), in float64. ``peer_rows``: rows of role
    peer (weight ``peer_weight``, no KL tokens)."""
    cfg = load_config(pair="micro", algo=algo, overrides=[f"rollout.max_new_tokens={L_MAX}", f"algo.beta_kl={BETA}",
                                                          f"algo.entropy_coeff={ENT}", *overrides])
    learner = get_algo(algo)(cfg.algo, LearnerFacts.of(cfg))
    ctx = StepContext(step=0, epoch=0, run=LearnerFacts.of(cfg), policy=None, engine=None, env=None,
                      ref_policy=FixedPolicy(ref), rng=random.Random(0))
    rows = [TrainRow([b + 1], [7] * n, old[b, :n].tolist(), [1.0] * n, [0.0 if b in peer_rows else 1.0] * n,
                     ADVANTAGES[b], peer_weight if b in peer_rows else 1.0, "peer" if b in peer_rows else "own", b)
            for b, n in enumerate(LENGTHS)]
    batch = TrainBatch(rows, [None] * len(rows), pad_id=0)

    def f64(mb):
        return dataclasses.replace(mb, **{k: getattr(mb, k).double() for k in (
            "old_logp", "loss_mask", "kl_mask", "advantages", "weights", "origin_mean_logp")})

    whole = batch.minibatch(range(len(rows)))
    parts = [[0], [1, 2], [3]] if split else [list(range(len(rows)))]
    total = 0.0
    for idx in parts:
        mb = f64(batch.minibatch(idx))
        mb.old_logp = old[idx, :mb.resp_len]   # the exact float64 values (the rows hold Python floats already)
        if split:
            mb.norm = denominators(ctx, learner, f64(whole))
        loss, _ = micro_batch_loss(ctx, FixedPolicy(logp, ent), learner, mb)
        total = total + loss
    return learner, total


CASES = [  # (learner, overrides, reference aggregation, sequence-level ratio)
    ("grpo", ["algo.loss_agg=token-mean"], trl_bnpo, False),
    ("grpo", ["algo.loss_agg=token-mean"], trl_dapo, False),
    ("grpo", ["algo.loss_agg=seq-mean-token-mean"], trl_grpo, False),
    ("grpo", ["algo.loss_agg=seq-mean-token-sum-norm"], trl_dr_grpo, False),
    ("grpo", ["algo.loss_agg=seq-mean-token-sum"], verl_seq_mean_token_sum, False),
    ("dr_grpo", [], trl_dr_grpo, False),
    ("dapo", [], trl_dapo, False),
    ("gspo", ["algo.ratio_form=sequence"], trl_grpo, True),
    ("gspo", ["algo.ratio_form=token"], trl_grpo, True),
]


@pytest.mark.parametrize("split", [False, True], ids=["whole", "micro"])
@pytest.mark.parametrize("algo,overrides,reference,sequence", CASES,
                         ids=[f"{a}-{'-'.join(o) or 'default'}-{r.__name__}" for a, o, r, _ in CASES])
def test_loss_and_gradient_equal_the_anchor_formula(algo, overrides, reference, sequence, split):
    mask, old, logp, ref, ent = data()
    lp, en = logp.clone().requires_grad_(True), ent.clone().requires_grad_(True)
    learner, got = graftzoo_loss(algo, overrides, old, lp, ref, en, split=split)
    g_lp, g_en = torch.autograd.grad(got, [lp, en])

    lo, hi = learner.clip["eps_low"], learner.clip["eps_high"]
    if algo == "gspo":
        lo, hi = learner.cfg.seq_clip
    lp2, en2 = logp.clone().requires_grad_(True), ent.clone().requires_grad_(True)
    adv = torch.tensor(ADVANTAGES, dtype=torch.float64)
    pg = sequence_clipped_loss(lp2, old, adv, mask, lo, hi) if sequence else clipped_token_loss(lp2, old, adv, lo, hi)
    want = reference(pg + BETA * k3(lp2, ref) - ENT * en2, mask)
    w_lp, w_en = torch.autograd.grad(want, [lp2, en2])

    assert got.dtype == torch.float64
    assert abs(float(got.detach()) - float(want.detach())) <= TOL
    assert float((g_lp - w_lp * mask).abs().max()) <= TOL
    assert float((g_en - w_en * mask).abs().max()) <= TOL
    assert float((w_lp * mask).abs().max()) > 1e-3    # the gradient is not trivially zero


def test_the_kl_and_entropy_terms_are_not_normalised_apart_from_the_policy_term():
    """Dr.GRPO on rows much shorter than L_max: a KL or entropy term divided by B x the padded width (instead of
    N x L_max) would change the effective beta with the batch's longest row."""
    mask, old, logp, ref, ent = data()
    _, got = graftzoo_loss("dr_grpo", [], old, logp, ref, ent)
    padded = mask.shape[0] * mask.shape[1]
    pg = trl_dr_grpo(clipped_token_loss(logp, old, torch.tensor(ADVANTAGES, dtype=torch.float64), 0.2, 0.2), mask)
    apart = pg + (BETA * k3(logp, ref) * mask).sum() / padded - ENT * (ent * mask).sum() / padded
    assert abs(float(got.detach()) - float(apart)) > 1e-4


MODES = {"token-mean": trl_bnpo, "seq-mean-token-mean": trl_grpo, "seq-mean-token-sum-norm": trl_dr_grpo,
         "seq-mean-token-sum": verl_seq_mean_token_sum}


@pytest.mark.parametrize("split", [False, True], ids=["whole", "micro"])
@pytest.mark.parametrize("mode", list(MODES))
def test_peer_rows_without_kl_share_the_one_normaliser(mode, split):
    """GRAFT's grafted rows (weight w, no KL tokens, docs/algorithms.md#graft-loss-and-token-ratio): the KL sums over
    the own rows' tokens and divides by the policy term's denominator, which counts the grafted rows too (TRL has
    no peer rows: the references above with the KL masked to own tokens)."""
    mask, old, logp, ref, ent = data()
    lp = logp.clone().requires_grad_(True)
    _, got = graftzoo_loss("graft", [f"algo.loss_agg={mode}", "peer.source=online"], old, lp, ref, ent, split=split,
                           peer_rows=(2, 3), peer_weight=0.75)
    (g_lp,) = torch.autograd.grad(got, [lp])
    lp2 = logp.clone().requires_grad_(True)
    adv = torch.tensor(ADVANTAGES, dtype=torch.float64)
    w = torch.tensor([1.0, 1.0, 0.75, 0.75], dtype=torch.float64).unsqueeze(1)
    own = torch.tensor([1.0, 1.0, 0.0, 0.0], dtype=torch.float64).unsqueeze(1)
    want = MODES[mode](w * clipped_token_loss(lp2, old, adv, 0.2, 0.2) + BETA * own * k3(lp2, ref) - ENT * ent, mask)
    (w_lp,) = torch.autograd.grad(want, [lp2])
    assert abs(float(got.detach()) - float(want.detach())) <= TOL
    assert float((g_lp - w_lp * mask).abs().max()) <= TOL
