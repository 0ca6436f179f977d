"""Memory-bounded updates on one device: a minibatch split into micro-batches by a token
budget (``optim.max_tokens_per_micro``) gives the gradient of the unsplit minibatch for every ``loss_agg`` mode and
every kind of row (own, grafted peer rows with their weights, aux NLL rows, KL and entropy terms); gradient
checkpointing gives the same gradient; ``optim.precision=bf16-mixed`` keeps float32 master weights, so a bfloat16
model at lr 1e-6 moves every parameter that has a gradient (pure bfloat16 loses most updates); per-model devices;
the scoring passes keep to the budget."""
import copy

import pytest
import torch
from test_loss_wiring import FAIL, LEARNER, MIXED, PEER, PROMPTS, context, group, grpo_adv, make

from graftzoo.algos.functional import agg_denominator, agg_loss
from graftzoo.contract.batch import micro_split
from graftzoo.contract.config import load_config, with_values
from graftzoo.training.models import policy as policy_module
from graftzoo.training.models.loss import denominators, micro_batch_loss
from graftzoo.training.planner.build import build_policy
from graftzoo.training.models.policy import Policy
from graftzoo.training.trainer import Trainer

MODES = ["token-mean", "seq-mean-token-sum", "seq-mean-token-mean", "seq-mean-token-sum-norm"]


def close(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Equal up to float32 summation order: max |a - b| within 1e-5 of b's largest entry."""
    return float((a - b).abs().max()) <= 1e-5 * float(b.abs().max()) + 1e-12


def test_micro_split_packs_by_padded_size_and_keeps_every_row_once():
    lengths = [50, 12, 48, 30, 7, 90, 29]
    parts = micro_split(lengths, 100)
    assert sorted(i for p in parts for i in p) == list(range(len(lengths)))
    for p in parts:
        assert len(p) * max(lengths[i] for i in p) <= 100 or len(p) == 1  # a row over the budget stands alone
    assert [5] in parts  # 90 tokens: alone
    assert micro_split(lengths, None) == [list(range(len(lengths)))]
    assert micro_split([], 64) == []


@pytest.mark.parametrize("mode", MODES)
def test_agg_denominator_makes_micro_batch_losses_add_up(mode):
    torch.manual_seed(0)
    loss, mask = torch.randn(6, 5), (torch.rand(6, 5) > 0.4).float()
    mask[2] = 0  # a row without tokens
    den = agg_denominator(mask, mode, 30.0 if mode == "seq-mean-token-sum-norm" else None)
    whole = agg_loss(loss, mask, mode, 30.0 if mode == "seq-mean-token-sum-norm" else None)
    parts = sum(agg_loss(loss[i:j], mask[i:j], mode, den) for i, j in ((0, 2), (2, 3), (3, 6)))
    assert float(parts) == pytest.approx(float(whole), rel=1e-6)


def step_grads(tmp_path, name, *overrides, algo="grpo"):
    """One trainer step of the micro pair's Qwen2 (one minibatch): its metrics and the parameters' gradients."""
    cfg = load_config(pair="micro", algo=algo, overrides=[
        "run.track=false", f"run.out_dir={tmp_path}", f"run.name={name}", f"pair.train=[{LEARNER}]",
        "optim.minibatches=1", "algo.beta_kl=0.05", "algo.entropy_coeff=0.01", *overrides])
    tr = Trainer(cfg)
    try:
        met = tr.train_step(0)[LEARNER]
        model = tr.policies[LEARNER].model
        grads = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
        met["checkpointing"] = model.is_gradient_checkpointing
        return met, grads
    finally:
        tr.close()


@pytest.mark.parametrize("mode", MODES)
def test_a_micro_batched_step_has_the_gradient_of_the_unsplit_step(tmp_path, mode, monkeypatch):
    seen = []  # micro-batches per minibatch, as the step's loop (``optimize``) receives them
    optimize = policy_module.optimize

    def counting(ctx, policy, learner, minibatches, base_from_forward, where):
        seen.extend(len(micros) for micros in minibatches)
        return optimize(ctx, policy, learner, minibatches, base_from_forward, where)

    monkeypatch.setattr(policy_module, "optimize", counting)
    whole_met, whole = step_grads(tmp_path, "whole", f"algo.loss_agg={mode}")
    split_met, split = step_grads(tmp_path, "split", f"algo.loss_agg={mode}", "optim.max_tokens_per_micro=120")
    # one minibatch per step; 16 rows of ~20-55 tokens in micro-batches of <= 120 padded tokens
    assert len(seen) == 2 and seen[0] == 1 and seen[1] >= 4
    assert split_met["loss"] == pytest.approx(whole_met["loss"], rel=1e-5, abs=1e-8)
    assert split_met["grad_norm"] == pytest.approx(whole_met["grad_norm"], rel=1e-5)
    assert whole_met["grad_norm"] > 1e-4 and split_met["kl"] == pytest.approx(whole_met["kl"], rel=1e-3, abs=1e-9)
    for n, g in whole.items():
        assert close(split[n], g), n


def micro_vs_whole(learner, ctx, pol, slots, budget):
    """(loss, gradient) of the learner's minibatch, and the sums over its micro-batches (as the trainer splits)."""
    batch = learner.build_batch(ctx, slots)
    idx = [i for mb_idx in learner.schedule(ctx, batch) for i in mb_idx]
    params = [p for p in pol.model.parameters() if p.requires_grad]

    def run(micros):
        total, grads = 0.0, [torch.zeros_like(p) for p in params]
        for mb in micros:
            loss, _ = micro_batch_loss(ctx, pol, learner, mb)
            for acc, g in zip(grads, torch.autograd.grad(loss, params, allow_unused=True)):
                if g is not None:
                    acc += g
            total += float(loss)
        return total, torch.cat([g.flatten() for g in grads])

    micros = batch.micro_batches(idx, budget, lambda mb: denominators(ctx, learner, mb))
    assert len(micros) >= 3
    return run([batch.minibatch(idx)]), run(micros), micros


@pytest.mark.parametrize("mode", MODES)
def test_peer_and_aux_rows_split_exactly(mode):
    """GRAFT's grafted peer rows (weights min{s,1}) and SGT's aux NLL rows, with KL (to a reference model that
    differs) and entropy terms, in micro-batches: same loss, same gradient as the whole minibatch."""
    cfg0 = load_config(pair="micro", algo="grpo")
    pols = {s.id: build_policy(s, cfg0) for s in cfg0.pair.models}
    lpol, ppol = pols[LEARNER], pols[PEER]
    own = [group(lpol, p, FAIL if i == 0 else MIXED, grpo_adv(FAIL if i == 0 else MIXED))
           for i, p in enumerate(PROMPTS)]
    peer = {PROMPTS[0].id: group(ppol, PROMPTS[0], MIXED, grpo_adv(MIXED))}
    ref = copy.copy(lpol)  # a reference model that differs from the policy: the KL term has a gradient
    ref.model = copy.deepcopy(lpol.model)
    torch.manual_seed(0)
    with torch.no_grad():
        for p in ref.model.parameters():
            p.add_(torch.randn_like(p) * 0.02)
    for algo, extra in (("graft", ["algo.delta=0.0"]), ("sgt", ["algo.mode=aux_nll", "algo.lam=0.5"])):
        learner, cfg = make(algo, "peer.source=online", f"algo.loss_agg={mode}", "algo.beta_kl=0.1",
                            "algo.entropy_coeff=0.01", *extra)
        ctx = context(cfg, lpol, ref_policy=ref)
        slots = learner.exchange(ctx, [g for g in own], dict(peer))
        (l_whole, g_whole), (l_split, g_split), micros = micro_vs_whole(learner, ctx, lpol, slots, 150)
        kinds = {k for mb in micros for k, on in (("peer", mb.is_peer.any()), ("aux", mb.is_aux.any())) if on}
        assert kinds == {"peer" if algo == "graft" else "aux"}, (algo, kinds)
        assert l_split == pytest.approx(l_whole, rel=1e-5, abs=1e-8), algo
        assert close(g_split, g_whole), algo
        assert float(g_whole.norm()) > 1e-4


def test_gradient_checkpointing_gives_the_same_gradient(tmp_path):
    plain_met, plain = step_grads(tmp_path, "plain")
    ckpt_met, ckpt = step_grads(tmp_path, "ckpt", "model.gradient_checkpointing=true")
    assert ckpt_met["checkpointing"] and not plain_met["checkpointing"]
    assert ckpt_met["loss"] == pytest.approx(plain_met["loss"], rel=1e-6)
    for n, g in plain.items():
        assert close(ckpt[n], g), n


def moved_fraction(tmp_path, name, precision):
    """A bfloat16 copy of the micro pair's Qwen2 trained one step at lr 1e-6: the share of the parameter entries
    with a non-zero gradient that changed (as the model trains: master weights when there are any)."""
    cfg = load_config(pair="micro", algo="grpo", overrides=[
        "run.track=false", f"run.out_dir={tmp_path}", f"run.name={name}", f"pair.train=[{LEARNER}]",
        "optim.minibatches=1", "optim.lr=1e-6", f"optim.precision={precision}", "algo.entropy_coeff=0.01"])
    first, *rest = cfg.pair.models
    cfg = with_values(cfg, {"pair.models": [first.replace(dtype="bfloat16"), *rest]})
    tr = Trainer(cfg)
    try:
        pol = tr.policies[LEARNER]
        before = {n: p.detach().clone() for n, p in pol.model.named_parameters()}
        grads = {}  # the gradients the optimizer step applies (freed right after it)
        pol.optimizer.register_step_pre_hook(lambda *_: grads.update(
            {n: p.grad.clone() for n, p in pol.model.named_parameters() if p.grad is not None}))
        tr.train_step(0)
        assert all(p.grad is None for p in pol.model.parameters())  # freed after the optimizer step
        moved = total = 0
        for n, p in pol.model.named_parameters():
            if n not in grads:
                continue
            live = grads[n] != 0
            moved += int(((p.detach() != before[n]) & live).sum())
            total += int(live.sum())
        return moved / total, next(pol.model.parameters()).dtype, pol.autocast_dtype
    finally:
        tr.close()


def test_bf16_mixed_keeps_fp32_master_weights_that_take_every_small_update(tmp_path):
    frac_bf16, dtype, autocast = moved_fraction(tmp_path, "pure", "model")
    assert dtype == torch.bfloat16 and autocast is None
    frac_mixed, dtype, autocast = moved_fraction(tmp_path, "mixed", "bf16-mixed")
    assert dtype == torch.float32 and autocast == torch.bfloat16
    assert frac_mixed > 0.999, frac_mixed   # every entry with a gradient moved
    assert frac_bf16 < 0.5, frac_bf16       # bfloat16 rounding swallowed most of the 1e-6 updates
    assert moved_fraction(tmp_path, "auto", "auto")[1:] == (torch.float32, torch.bfloat16)  # auto: 16-bit -> mixed


def test_per_model_device_and_scoring_passes_within_the_budget(monkeypatch):
    cfg = load_config(pair="micro", algo="grpo", overrides=["run.track=false", "optim.max_tokens_per_micro=100"])
    pol = build_policy(cfg.pair.models[0].replace(device="cpu"), cfg)   # a per-model device
    assert pol.device == torch.device("cpu") and pol.max_tokens_per_micro == 100
    shapes = []
    logprobs = Policy.logprobs

    def spy(self, ids, att, resp_len, with_entropy=False):
        shapes.append(tuple(ids.shape))
        return logprobs(self, ids, att, resp_len, with_entropy=with_entropy)

    monkeypatch.setattr(Policy, "logprobs", spy)
    prompts = [pol.encode_prompt(p) for p in PROMPTS] * 4
    responses = [pol.encode_text("1" * k) for k in (3, 30, 9, 17)] * 4
    lps, _ = pol.score_sequences(prompts, responses)
    assert len(shapes) > 1 and all(b * t <= 100 or b == 1 for b, t in shapes), shapes
    pol.max_tokens_per_micro = None
    whole, _ = pol.score_sequences(prompts, responses)
    assert all(len(a) == len(r) for a, r in zip(lps, responses))
    assert max(abs(x - y) for a, b in zip(lps, whole) for x, y in zip(a, b)) < 1e-5  # same values, in order


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("chunk", [3 * 50, 2 * 7 * 50])  # 3 positions of one row; 2 whole rows (of 7 x 50)
def test_token_logprobs_equal_the_full_log_softmax_in_value_and_gradient(dtype, chunk, monkeypatch):
    from graftzoo.training.models import policy as policy_module
    from graftzoo.training.models.policy import token_entropies, token_logprobs
    monkeypatch.setattr(policy_module, "LOGIT_CHUNK", chunk)
    torch.manual_seed(0)
    logits = (torch.randn(3, 7, 50) * 3).to(dtype).requires_grad_()
    target = torch.randint(0, 50, (3, 7))
    weights = torch.randn(3, 7)
    ref_all = torch.log_softmax(logits.float() / 0.7, dim=-1)
    ref = ref_all.gather(-1, target[..., None])[..., 0]
    (g_ref,) = torch.autograd.grad((ref * weights).sum(), logits)
    ours = token_logprobs(logits, target, 0.7)
    (g_ours,) = torch.autograd.grad((ours * weights).sum(), logits)
    assert ours.dtype == torch.float32 and torch.equal(ours, ref)  # the same arithmetic, piece by piece
    assert g_ours.dtype == dtype and close(g_ours.float(), g_ref.float())
    ent = token_entropies(logits, 0.7)
    assert torch.allclose(ent, -(ref_all.exp() * ref_all).sum(-1), atol=1e-6)
