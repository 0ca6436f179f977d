"""Parity of graftzoo's loss formulas with the frameworks' own code, called directly
(docs/algorithms.md#loss-aggregation, its "Parity" paragraph). tests/test_loss_parity.py checks the learner against
formulas paraphrased from TRL and verl; this file checks graftzoo's pure functions (``graftzoo.algos.functional``)
against the real functions:

- TRL 1.16.0, ``GRPOTrainer._compute_loss``, unchanged, on a trainer made with ``object.__new__`` that holds the
  attributes its ``__init__`` sets from a real ``GRPOConfig``; the accelerator is the one-process identity (gather and
  reduce return their tensor) and the policy a stand-in whose forward returns the test's log-probs and entropies in
  the form of TRL's fused LM head (``FusedCausalLMOutput``, zero where the label is -100), so the gradients are taken
  with respect to those tensors.
- verl 0.9.1, ``verl.trainer.ppo.core_algos``: ``agg_loss``, the registered policy losses ``vanilla`` (PPO clip,
  clip-higher, dual clip) and ``gspo``, ``kl_penalty``, ``compute_grpo_outcome_advantage`` and
  ``compute_rloo_outcome_advantage``. The loss verl's trainer builds (``verl/workers/utils/losses.py``,
  ``ppo_loss``) is the policy loss plus ``kl_loss_coef`` times ``agg_loss`` of the KL minus ``entropy_coeff``
  times ``agg_loss`` of the entropy, each with the one ``loss_agg_mode`` and the one ``global_batch_info``: the
  tests compose those calls the same way.

Float64 throughout; loss values and gradients agree to TOL = 1e-12 (absolute, on values of order 1), except where
verl adds a constant of its own: its ``seq-mean-token-mean`` divides each row by its token count + 1e-8 (a relative
difference <= 1e-8, TOL_VERL_ROW), and its GRPO advantage of a one-response group is ``r / (std + eps)`` with a
float32 ``std = 1`` (1 + 1e-6 rounded to float32: a relative difference < 1e-7, TOL_VERL_F32).

What is not parity is tested as a difference, with its exact size:

- a fully masked row: TRL's ``grpo`` averages over all N rows, graftzoo's ``seq-mean-token-mean`` (and verl's
  ``agg_loss`` without a ``global_batch_size``) over the N' rows with a token, so TRL's loss and gradient are
  graftzoo's times N'/N; verl's trainer passes the mini-batch's row count as ``global_batch_size`` and then agrees
  with TRL;
- TRL 1.16's default ``use_bias_correction_kl=True`` multiplies the KL by the importance ratio (graftzoo's KL is
  TRL's with it off);
- verl's ``seq-mean-token-sum-norm``, without a ``global_batch_size``, divides by N' x the padded width where
  graftzoo (as TRL's ``dr_grpo``) divides by N x L_max.

The frameworks load in module-scoped fixtures (TRL's import loads vLLM, about 10 s) so that collecting the suite does
not import them; a framework that is not installed skips its tests (``make install`` installs both).
"""
import contextlib
import os
import types
from collections import defaultdict

import numpy as np
import pytest
import torch

from graftzoo.algos.functional import (agg_denominator, agg_loss, clipped_surrogate, group_advantages,
                                       gspo_sequence_ratio, gspo_token_ratio, kl_k3, ratio_surrogate,
                                       rloo_advantages)

# importing TRL 1.16 warns that vLLM 0.32 is newer than it supports (its generation code; the loss does not use
# vLLM), and torch that a module loaded along the way uses torch.jit.script_method
pytestmark = [pytest.mark.filterwarnings("ignore:TRL currently supports vLLM versions:UserWarning"),
              pytest.mark.filterwarnings("ignore:`torch.jit.script_method` is deprecated:DeprecationWarning")]

D = torch.float64
TOL = 1e-12
TOL_VERL_ROW = 1e-8    # verl's seq-mean-token-mean: sum_t / (count + 1e-8)
TOL_VERL_F32 = 1e-7    # verl's one-response group: float32 std 1, plus eps
MODES = ("token-mean", "seq-mean-token-mean", "seq-mean-token-sum", "seq-mean-token-sum-norm")
TRL_MODE = {"bnpo": "token-mean", "dapo": "token-mean", "grpo": "seq-mean-token-mean",
            "dr_grpo": "seq-mean-token-sum-norm"}
L_MAX = 10                          # rollout.max_new_tokens = TRL's max_completion_length = verl's loss_scale_factor
LENGTHS = [5, 3, 7, 2, 6, 4]        # response tokens of the rows, padded to T = 7
ADV = [1.25, -0.75, 0.375, -1.125, -0.5, 0.875]
CLIP_HIGHER = (0.2, 0.28)
GSPO_CLIP = (3e-4, 4e-4)


# ------------------------------------------------------------------------------------------------
# the batch
# ------------------------------------------------------------------------------------------------

def batch(lengths=LENGTHS, scale=0.6, shift=None, spikes=True, seed=0):
    """mask, old, logp, ref, entropies, advantages ([B]) of a batch. Log-ratios: uniform in +-scale/2 plus the row's
    ``shift``; with ``spikes``, the first token of each row has log-ratio +0.3 (A > 0: above 1 + 0.28) or -0.3
    (A < 0: below 1 - 0.2) and the second of each negative row +1.3 (ratio 3.7, past the dual clip c = 3)."""
    g = torch.Generator().manual_seed(seed)
    B, T = len(lengths), max(lengths)
    mask = torch.tensor([[1.0] * n + [0.0] * (T - n) for n in lengths], dtype=D)
    old = -0.5 - 2.5 * torch.rand(B, T, generator=g, dtype=D)
    log_ratio = scale * (torch.rand(B, T, generator=g, dtype=D) - 0.5)
    if shift is not None:
        log_ratio += torch.tensor(shift, dtype=D).unsqueeze(1)
    adv = torch.tensor(ADV[:B], dtype=D)
    if spikes:
        log_ratio[:, 0] = torch.where(adv > 0, 0.3, -0.3)
        log_ratio[:, 1] = torch.where(adv < 0, 1.3, log_ratio[:, 1])
    logp = old + log_ratio
    ref = logp + 0.4 * (torch.rand(B, T, generator=g, dtype=D) - 0.5)
    ent = 0.1 + 2.0 * torch.rand(B, T, generator=g, dtype=D)
    return mask, old, logp, ref, ent, adv


# GSPO: (clip, noise, row shifts of the log-ratio): rows 0 (A > 0) and 3 (A < 0) past the clip, the others inside
GSPO_CASES = [(CLIP_HIGHER, 0.1, [0.3, 0.0, 0.0, -0.3, 0.05, -0.05]),
              (GSPO_CLIP, 2e-4, [1e-3, 0.0, 0.0, -1e-3, 1e-4, -1e-4])]


def gspo_batch(eps, scale, shift):
    """A batch whose sequence ratios clip in rows 0 and 3 only."""
    mask, old, logp, ref, ent, adv = batch(scale=scale, shift=shift, spikes=False)
    _, info = ratio_surrogate(gspo_sequence_ratio(logp, old, mask), adv, *eps)
    assert (info["clipped_low"] | info["clipped_high"]).tolist() == [True, False, False, True, False, False]
    return mask, old, logp, ref, ent, adv


def leaf(x):
    return x.detach().clone().requires_grad_(True)


def close(a, b, tol=TOL):
    torch.testing.assert_close(a, b, rtol=0.0, atol=tol)


def norm_for(mode, mask):
    """graftzoo's denominator for the minibatch (as the learner passes it): N x L_max for seq-mean-token-sum-norm."""
    return agg_denominator(mask, mode, normalizer=mask.shape[0] * L_MAX if mode == "seq-mean-token-sum-norm" else None)


def value_and_grads(fn, *tensors):
    """``fn`` on fresh leaves of ``tensors``: (loss, the gradients with respect to each)."""
    leaves = [leaf(t) for t in tensors]
    loss = fn(*leaves)
    grads = torch.autograd.grad(loss, leaves, allow_unused=True)
    return loss.detach(), [torch.zeros_like(t) if g is None else g for t, g in zip(leaves, grads)]


def assert_same(a, b, tol=TOL):
    (va, ga), (vb, gb) = a, b
    close(va, vb, tol)
    for x, y in zip(ga, gb):
        close(x, y, tol)


# ------------------------------------------------------------------------------------------------
# TRL: the real GRPOTrainer._compute_loss
# ------------------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def trl(tmp_path_factory):
    trl_mod = pytest.importorskip("trl")
    from trl import GRPOConfig
    from trl.trainer.grpo_trainer import GRPOTrainer
    from trl.trainer.utils import FusedCausalLMOutput
    return types.SimpleNamespace(version=trl_mod.__version__, GRPOConfig=GRPOConfig, GRPOTrainer=GRPOTrainer,
                                 Output=FusedCausalLMOutput, out=tmp_path_factory.mktemp("trl"))


class FixedPolicy(torch.nn.Module):
    """A policy whose fused-LM-head forward returns the given per-token log-probs and entropies of the completion,
    shaped as TRL's ``FusedCausalLMOutput`` (``(batch, seq_len - 1)``, zero where the next-token label is -100)."""

    def __init__(self, output_cls, logp, ent):
        super().__init__()
        self.output_cls, self.logp, self.ent = output_cls, logp, ent

    def forward(self, input_ids, attention_mask, labels, fused_lm_head):
        assert fused_lm_head
        valid = labels[:, 1:] != -100
        pad = input_ids.shape[1] - 1 - self.logp.shape[1]

        def per_token(x):
            return torch.cat([x.new_zeros(x.shape[0], pad), x], dim=1).masked_fill(~valid, 0.0)

        return self.output_cls(log_probs=per_token(self.logp), entropy=per_token(self.ent))


def trl_trainer(trl, **config):
    """A GRPOTrainer that holds what ``_compute_loss`` reads, set as its ``__init__`` sets it from ``GRPOConfig``."""
    args = trl.GRPOConfig(output_dir=str(trl.out), report_to="none", use_cpu=True, max_completion_length=L_MAX,
                          per_device_train_batch_size=len(LENGTHS), num_generations=2, **config)
    self = object.__new__(trl.GRPOTrainer)
    self.args = args
    self.max_completion_length = args.max_completion_length
    self.use_vllm = args.use_vllm
    self.vllm_importance_sampling_correction = args.vllm_importance_sampling_correction
    self.loss_type = args.loss_type
    self.aux_loss_enabled = False                    # not a mixture-of-experts model
    self.importance_sampling_level = args.importance_sampling_level
    self.off_policy_mask_threshold = args.off_policy_mask_threshold
    self.top_entropy_quantile = args.top_entropy_quantile
    self.entropy_coef = args.entropy_coef
    self.use_adaptive_entropy = args.use_adaptive_entropy
    self._entropy_bonus_enabled = self.entropy_coef != 0.0 or self.use_adaptive_entropy
    self._last_world_entropy = float("inf")
    self._entropy_window_stats = None
    self.epsilon_low = args.epsilon
    self.epsilon_high = args.epsilon_high if args.epsilon_high is not None else args.epsilon
    self.beta = args.beta
    self._metrics = {"train": defaultdict(list), "eval": defaultdict(list)}
    self.current_gradient_accumulation_steps = 1     # one optimizer step per batch
    self.accelerator = types.SimpleNamespace(        # one process: gather and reduce are the identity
        autocast=contextlib.nullcontext, gather=lambda t: t, gather_for_metrics=lambda t: t,
        reduce=lambda t, reduction="sum": t, num_processes=1, is_main_process=True, sync_gradients=True)
    return self


def trl_loss(trl, mask, old, ref, adv, **config):
    """``fn(logp, ent)``: the loss of TRL's ``_compute_loss`` for the batch."""
    B, T = mask.shape

    def fn(logp, ent):
        self = trl_trainer(trl, **config)
        self.model = FixedPolicy(trl.Output, logp, ent).train()
        completion_mask = mask.to(torch.int32)      # TRL's completion mask is an int tensor
        inputs = {"prompt_ids": torch.ones(B, 2, dtype=torch.long), "prompt_mask": torch.ones(B, 2, dtype=torch.int32),
                  "completion_ids": torch.ones(B, T, dtype=torch.long), "completion_mask": completion_mask,
                  "advantages": adv, "old_per_token_logps": old, "ref_per_token_logps": ref,
                  "num_items_in_batch": completion_mask.sum()}
        loss = trl.GRPOTrainer._compute_loss(self, self.model, inputs)
        assert loss.dtype == D
        return loss
    return fn


def gz_loss(mask, old, ref, adv, mode, eps, beta=0.0, ent_coef=0.0, level="token", dual_clip_c=None,
            normalizer="minibatch"):
    """``fn(logp, ent)``: graftzoo's loss, Agg(l_clip + beta k - c H) with the policy term's one denominator;
    ``level="sequence"`` / ``"gspo-token"``: GSPO's sequence ratio on each token / GSPO-token's ratio."""
    den = norm_for(mode, mask) if normalizer == "minibatch" else normalizer

    def fn(logp, ent):
        if level == "token":
            pg, _ = clipped_surrogate(logp, old, adv, eps[0], eps[1], dual_clip_c)
        else:
            ratio = (gspo_sequence_ratio(logp, old, mask).unsqueeze(1).expand_as(logp) if level == "sequence"
                     else gspo_token_ratio(logp, old, mask))
            pg, _ = ratio_surrogate(ratio, adv, eps[0], eps[1], None)
        per_token = pg - ent_coef * ent
        if beta:
            per_token = per_token + beta * kl_k3(logp, ref)
        return agg_loss(per_token, mask, mode, normalizer=den)
    return fn


@pytest.mark.parametrize("loss_type", ["grpo", "bnpo", "dapo", "dr_grpo"])
@pytest.mark.parametrize("beta", [0.0, 0.04])
@pytest.mark.parametrize("eps", [(0.2, 0.2), CLIP_HIGHER])
def test_trl_loss_types(trl, loss_type, beta, eps):
    """Each TRL loss_type against its graftzoo mode (docs: token-mean = bnpo and dapo, seq-mean-token-mean = grpo,
    seq-mean-token-sum-norm = dr_grpo), PPO clip and clip-higher, with and without the k3 KL."""
    mask, old, logp, ref, ent, adv = batch()
    _, info = clipped_surrogate(logp, old, adv, *eps)
    assert info["clipped_low"][mask > 0].any() and info["clipped_high"][mask > 0].any()
    trl_fn = trl_loss(trl, mask, old, ref, adv, loss_type=loss_type, beta=beta, epsilon=eps[0], epsilon_high=eps[1],
                      use_bias_correction_kl=False)
    gz_fn = gz_loss(mask, old, ref, adv, TRL_MODE[loss_type], eps, beta=beta)
    assert_same(value_and_grads(trl_fn, logp, ent), value_and_grads(gz_fn, logp, ent))


@pytest.mark.parametrize("loss_type", ["grpo", "bnpo", "dapo", "dr_grpo"])
def test_trl_entropy_bonus_is_a_token_mean(trl, loss_type):
    """TRL 1.16's entropy bonus is a token mean in every loss_type: TRL's loss is graftzoo's policy and KL terms
    minus c x the token mean of H; under token-mean (bnpo, dapo) that is graftzoo's own loss with its entropy term."""
    mask, old, logp, ref, ent, adv = batch()
    beta, c = 0.04, 0.01
    mode = TRL_MODE[loss_type]
    trl_fn = trl_loss(trl, mask, old, ref, adv, loss_type=loss_type, beta=beta, epsilon=0.2, epsilon_high=0.28,
                      entropy_coef=c, use_bias_correction_kl=False)
    policy = gz_loss(mask, old, ref, adv, mode, CLIP_HIGHER, beta=beta)

    def gz_fn(logp, ent):
        return policy(logp, ent) - c * agg_loss(ent, mask, "token-mean")
    assert_same(value_and_grads(trl_fn, logp, ent), value_and_grads(gz_fn, logp, ent))
    if mode == "token-mean":
        own = gz_loss(mask, old, ref, adv, mode, CLIP_HIGHER, beta=beta, ent_coef=c)
        assert_same(value_and_grads(trl_fn, logp, ent), value_and_grads(own, logp, ent))


@pytest.mark.parametrize("form", ["sequence", "gspo-token"])
@pytest.mark.parametrize("eps,scale,shift", GSPO_CASES)
def test_trl_sequence_level_is_gspo(trl, form, eps, scale, shift):
    """GSPO: TRL's grpo with importance_sampling_level="sequence" = graftzoo's sequence ratio on every token
    (algo.ratio_form: sequence) and GSPO-token's ratio (token, verl's form): same value and gradient under
    seq-mean-token-mean, at a wide clip and at GSPO's own (some rows clipped, some not)."""
    mask, old, logp, ref, ent, adv = gspo_batch(eps, scale, shift)
    trl_fn = trl_loss(trl, mask, old, ref, adv, loss_type="grpo", beta=0.0, epsilon=eps[0], epsilon_high=eps[1],
                      importance_sampling_level="sequence")
    gz_fn = gz_loss(mask, old, ref, adv, "seq-mean-token-mean", eps, level=form)
    assert_same(value_and_grads(trl_fn, logp, ent), value_and_grads(gz_fn, logp, ent))


def test_trl_grpo_counts_fully_masked_rows(trl):
    """The caveat of the docs' parity paragraph: with a fully masked row, TRL's grpo divides the sum of the row means
    by all N rows and graftzoo's seq-mean-token-mean by the N' rows with a token, so TRL's loss and gradient are
    graftzoo's x N'/N. The token-mean and Dr. GRPO forms still agree (a masked row adds no token; both divide by
    N x L_max)."""
    lengths = [5, 3, 0, 2, 6, 4]                      # row 2 fully masked (e.g. a truncated response, mask_truncated)
    mask, old, logp, ref, ent, adv = batch(lengths=lengths)
    n, n_tok = len(lengths), sum(1 for L in lengths if L > 0)
    kw = dict(beta=0.04, epsilon=0.2, epsilon_high=0.28, use_bias_correction_kl=False)
    trl_v, trl_g = value_and_grads(trl_loss(trl, mask, old, ref, adv, loss_type="grpo", **kw), logp, ent)
    gz_v, gz_g = value_and_grads(gz_loss(mask, old, ref, adv, "seq-mean-token-mean", CLIP_HIGHER, beta=0.04),
                                 logp, ent)
    assert norm_for("seq-mean-token-mean", mask) == n_tok
    assert abs(trl_v - gz_v) > 1e-3                   # a real difference, not rounding
    close(trl_v, gz_v * n_tok / n)
    for a, b in zip(trl_g, gz_g):
        close(a, b * n_tok / n)
    for loss_type in ("bnpo", "dapo", "dr_grpo"):
        assert_same(value_and_grads(trl_loss(trl, mask, old, ref, adv, loss_type=loss_type, **kw), logp, ent),
                    value_and_grads(gz_loss(mask, old, ref, adv, TRL_MODE[loss_type], CLIP_HIGHER, beta=0.04),
                                    logp, ent))


def test_trl_default_kl_is_bias_corrected(trl):
    """TRL 1.16's default use_bias_correction_kl=True multiplies the per-token KL by the importance ratio (the
    parity above is with it off): TRL's default loss is graftzoo's policy term plus beta x Agg(k x rho). On policy
    (rho = 1) the values agree and the gradients do not (rho's own gradient)."""
    mask, old, logp, ref, ent, adv = batch()
    beta = 0.04
    trl_fn = trl_loss(trl, mask, old, ref, adv, loss_type="bnpo", beta=beta, epsilon=0.2, epsilon_high=0.28)
    assert trl_trainer(trl, beta=beta).args.use_bias_correction_kl is True
    policy = gz_loss(mask, old, ref, adv, "token-mean", CLIP_HIGHER)

    def corrected(logp, ent):
        return policy(logp, ent) + beta * agg_loss(kl_k3(logp, ref) * torch.exp(logp - old), mask, "token-mean")
    assert_same(value_and_grads(trl_fn, logp, ent), value_and_grads(corrected, logp, ent))
    on_policy = trl_loss(trl, mask, logp.detach(), ref, adv, loss_type="bnpo", beta=beta, epsilon=0.2,
                         epsilon_high=0.28)
    gz = gz_loss(mask, logp.detach(), ref, adv, "token-mean", CLIP_HIGHER, beta=beta)
    (tv, tg), (gv, gg) = value_and_grads(on_policy, logp, ent), value_and_grads(gz, logp, ent)
    close(tv, gv)
    close(tg[0] - gg[0], beta * kl_k3(logp, ref) * mask / mask.sum())   # d(k rho)/dlogp - dk/dlogp = k at rho = 1
    assert (tg[0] - gg[0]).abs().max() > 1e-6


# ------------------------------------------------------------------------------------------------
# verl: verl.trainer.ppo.core_algos
# ------------------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def verl():
    env = dict(os.environ)
    verl_mod = pytest.importorskip("verl")
    from verl.trainer.ppo import core_algos
    from verl.workers.config import ActorConfig
    for name in set(os.environ) - set(env):        # `import verl` sets a Ray variable; the later test files run without
        del os.environ[name]
    return types.SimpleNamespace(version=verl_mod.__version__, core=core_algos, ActorConfig=ActorConfig)


def actor_config(verl, mode, eps=CLIP_HIGHER, clip_ratio_c=3.0, global_batch_info=None):
    return verl.ActorConfig(strategy="fsdp", rollout_n=2, ppo_micro_batch_size_per_gpu=1, clip_ratio=eps[0],
                            clip_ratio_low=eps[0], clip_ratio_high=eps[1], clip_ratio_c=clip_ratio_c,
                            loss_agg_mode=mode, global_batch_info=dict(global_batch_info or {}))


def trainer_batch_info(mask):
    """What verl's trainer passes to agg_loss (verl/workers/utils/losses.py, ppo_loss), on one process: the
    mini-batch's token count and row count, and loss_scale_factor (actor.loss_scale_factor; L_max here)."""
    return {"dp_size": 1, "batch_num_tokens": int(mask.sum()), "global_batch_size": mask.shape[0],
            "loss_scale_factor": L_MAX}


def verl_tol(mode):
    return TOL_VERL_ROW if mode == "seq-mean-token-mean" else TOL


@pytest.mark.parametrize("mode", MODES)
def test_verl_agg_loss(verl, mode):
    """verl's agg_loss, as called alone (no global batch info: N' rows, the padded width for the -norm mode) and as
    its trainer calls it (the mini-batch's rows and tokens, loss_scale_factor = L_max), against graftzoo's agg_loss
    with its default denominator and with the learner's (agg_denominator; N x L_max)."""
    mask, _, loss_mat, _, _, _ = batch()
    alone = value_and_grads(lambda x: verl.core.agg_loss(x, mask, mode), loss_mat)
    assert_same(alone, value_and_grads(lambda x: agg_loss(x, mask, mode), loss_mat), verl_tol(mode))
    as_trained = value_and_grads(lambda x: verl.core.agg_loss(x, mask, mode, **trainer_batch_info(mask)), loss_mat)
    assert_same(as_trained, value_and_grads(lambda x: agg_loss(x, mask, mode, normalizer=norm_for(mode, mask)),
                                            loss_mat), verl_tol(mode))


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("eps,dual", [((0.2, 0.2), 3.0), (CLIP_HIGHER, 3.0), (CLIP_HIGHER, 10.0)])
def test_verl_vanilla_policy_loss(verl, mode, eps, dual):
    """verl's "vanilla" policy loss (PPO clip, clip-higher, dual clip c; log-ratio clamped at +-20) against graftzoo's
    clipped_surrogate, aggregated in each mode; the batch clips low, high and (c = 3) dual."""
    mask, old, logp, _, ent, adv = batch()
    _, info = clipped_surrogate(logp, old, adv, eps[0], eps[1], dual)
    valid = mask > 0
    assert info["clipped_low"][valid].any() and info["clipped_high"][valid].any()
    assert info["dual_clipped"][valid].any() == (dual == 3.0)
    cfg = actor_config(verl, mode, eps, dual, trainer_batch_info(mask))
    adv_tok = adv.unsqueeze(1) * mask                     # verl's advantages are per token, 0 on padding
    vanilla = verl.core.get_policy_loss_fn("vanilla")
    ours = gz_loss(mask, old, None, adv, mode, eps, dual_clip_c=dual)
    assert_same(value_and_grads(lambda lp: vanilla(old, lp, adv_tok, mask, mode, cfg)[0], logp),
                value_and_grads(lambda lp: ours(lp, ent), logp), verl_tol(mode))


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("eps,scale,shift", GSPO_CASES)
def test_verl_gspo_policy_loss(verl, mode, eps, scale, shift):
    """verl's "gspo" policy loss (GSPO-token: sg[s_i] exp(logp - sg[logp]), log clamped at 10, no dual clip) against
    graftzoo's gspo_token_ratio and ratio_surrogate (algo.ratio_form: token), in each mode."""
    mask, old, logp, _, ent, adv = gspo_batch(eps, scale, shift)
    cfg = actor_config(verl, mode, eps, global_batch_info=trainer_batch_info(mask))
    adv_tok = adv.unsqueeze(1) * mask
    gspo = verl.core.get_policy_loss_fn("gspo")
    ours = gz_loss(mask, old, None, adv, mode, eps, level="gspo-token")
    assert_same(value_and_grads(lambda lp: gspo(old, lp, adv_tok, mask, mode, cfg)[0], logp),
                value_and_grads(lambda lp: ours(lp, ent), logp), verl_tol(mode))


@pytest.mark.parametrize("kind", ["k3", "low_var_kl", "k3+"])
def test_verl_kl_penalty(verl, kind):
    """verl's kl_penalty against graftzoo's kl_k3 (d clamped to +-20, k to +-10; k3+ = k3's value, k2's gradient), on
    log-ratios from -25 to 25, so both clamps act."""
    g = torch.Generator().manual_seed(1)
    logp = -0.5 - 3 * torch.rand(4, 9, generator=g, dtype=D)
    d = torch.tensor([-25.0, -21.0, -12.0, -3.0, -0.4, 0.0, 0.3, 2.0, 2.5, 9.0, 14.0, 19.0, 21.0, 25.0, 0.05,
                      -0.05, 1.0, -1.0] * 2, dtype=D).view(4, 9)
    ref = logp + d
    ours = "k3+" if kind == "k3+" else "k3"
    assert_same(value_and_grads(lambda lp, r: verl.core.kl_penalty(lp, r, kind).sum(), logp, ref),
                value_and_grads(lambda lp, r: kl_k3(lp, r, kind=ours).sum(), logp, ref))
    assert (kl_k3(logp, ref) == 10.0).any()           # the k clamp acted


@pytest.mark.parametrize("mode", MODES)
def test_verl_whole_loss_one_normaliser(verl, mode):
    """The loss verl's trainer builds (ppo_loss: policy loss + kl_loss_coef x agg_loss(k3) - entropy_coeff x
    agg_loss(H), one mode, one global_batch_info) = graftzoo's Agg(l_clip + beta k - c H) with one denominator."""
    mask, old, logp, ref, ent, adv = batch()
    beta, c = 0.04, 0.01
    info = trainer_batch_info(mask)
    cfg = actor_config(verl, mode, CLIP_HIGHER, 10.0, info)
    adv_tok = adv.unsqueeze(1) * mask
    vanilla = verl.core.get_policy_loss_fn("vanilla")

    def verl_fn(lp, h):
        pg, _ = vanilla(old, lp, adv_tok, mask, mode, cfg)
        kl = verl.core.agg_loss(verl.core.kl_penalty(lp, ref, "low_var_kl"), mask, mode, **info)
        return pg - c * verl.core.agg_loss(h, mask, mode, **info) + beta * kl
    ours = gz_loss(mask, old, ref, adv, mode, CLIP_HIGHER, beta=beta, ent_coef=c, dual_clip_c=10.0)
    assert_same(value_and_grads(verl_fn, logp, ent), value_and_grads(ours, logp, ent), verl_tol(mode))


def test_verl_fully_masked_row(verl):
    """A fully masked row: verl's agg_loss without global batch info divides the seq-mean modes by the N' rows with
    a token, as graftzoo does; given its trainer's global_batch_size (all N rows of the mini-batch) they are
    graftzoo's x N'/N (its seq-mean-token-mean is then TRL's grpo). Its seq-mean-token-sum-norm without it divides by
    N' x the padded width, graftzoo's by N x L_max: verl's value is graftzoo's x (N / N') x (L_max / T)."""
    lengths = [5, 3, 0, 2, 6, 4]
    mask, _, loss_mat, _, _, _ = batch(lengths=lengths)
    n, n_tok, T = len(lengths), sum(1 for L in lengths if L > 0), mask.shape[1]
    for mode in ("token-mean", "seq-mean-token-mean", "seq-mean-token-sum"):
        assert_same(value_and_grads(lambda x: verl.core.agg_loss(x, mask, mode), loss_mat),
                    value_and_grads(lambda x: agg_loss(x, mask, mode), loss_mat), verl_tol(mode))
    for mode in ("seq-mean-token-mean", "seq-mean-token-sum"):
        trained = verl.core.agg_loss(loss_mat, mask, mode, **trainer_batch_info(mask))
        close(trained, agg_loss(loss_mat, mask, mode) * n_tok / n, verl_tol(mode))
    gz_norm = agg_loss(loss_mat, mask, "seq-mean-token-sum-norm", normalizer=norm_for("seq-mean-token-sum-norm", mask))
    close(verl.core.agg_loss(loss_mat, mask, "seq-mean-token-sum-norm"), gz_norm * (n / n_tok) * (L_MAX / T))
    close(verl.core.agg_loss(loss_mat, mask, "seq-mean-token-sum-norm", **trainer_batch_info(mask)), gz_norm)


# ------------------------------------------------------------------------------------------------
# verl: group advantages
# ------------------------------------------------------------------------------------------------

REWARDS = [1.0, 0.0, 1.0, 0.25, 0.5, 0.5, 0.0, 0.7, 1.0, 1.0, 1.0, 1.0, 0.0, 0.9]
GROUPS = [3, 3, 3, 3, 7, 7, 7, 5, 1, 1, 1, 1, 2, 2]    # sizes 4, 3, 1, 4 (all equal), 2; ids not contiguous


def verl_advantages(fn, rewards, groups, mask, **kw):
    token_rewards = torch.zeros_like(mask)
    last = mask.sum(-1).long() - 1
    token_rewards[torch.arange(len(rewards)), last] = rewards   # the outcome reward on the last response token
    adv, returns = fn(token_rewards, mask, np.array([f"uid{g}" for g in groups], dtype=object), **kw)
    close(adv, returns, 0.0)
    close(adv, adv[:, :1] * mask, 0.0)                          # one advantage per row, 0 on padding
    return adv[:, 0]


@pytest.mark.parametrize("std_normalize", [True, False])
def test_verl_grpo_advantage(verl, std_normalize):
    """verl's GRPO outcome advantage (std-normalised, eps 1e-6, and Dr. GRPO's without std) = graftzoo's
    group_advantages with singleton="verl", uneven groups, an all-equal group and a one-response group."""
    rewards = torch.tensor(REWARDS, dtype=D)
    lengths = [1 + i % 6 for i in range(len(REWARDS))]
    mask = torch.tensor([[1.0] * n + [0.0] * (6 - n) for n in lengths], dtype=D)
    theirs = verl_advantages(verl.core.compute_grpo_outcome_advantage, rewards, GROUPS, mask, epsilon=1e-6,
                             norm_adv_by_std_in_grpo=std_normalize)
    ours = group_advantages(rewards, torch.tensor(GROUPS), std_normalize=std_normalize, eps=1e-6, singleton="verl")
    single = torch.tensor([GROUPS.count(g) == 1 for g in GROUPS])
    close(theirs[~single], ours[~single])
    torch.testing.assert_close(theirs[single], ours[single], rtol=TOL_VERL_F32, atol=0.0)
    assert (ours[torch.tensor(GROUPS) == 1] == 0).all()       # the all-equal group: exactly 0 in both
    assert (theirs[torch.tensor(GROUPS) == 1] == 0).all()


def test_verl_rloo_advantage(verl):
    """verl's RLOO outcome advantage = graftzoo's rloo_advantages with singleton="verl" (a one-response group keeps
    its reward), each group's own size."""
    rewards = torch.tensor(REWARDS, dtype=D)
    mask = torch.ones(len(REWARDS), 3, dtype=D)
    theirs = verl_advantages(verl.core.compute_rloo_outcome_advantage, rewards, GROUPS, mask)
    close(theirs, rloo_advantages(rewards, torch.tensor(GROUPS), singleton="verl"))
