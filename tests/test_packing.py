"""Padding-free updates (``optim.packing``, docs/scaling.md#memory-bounded-updates): a micro-batch's rows run as one
sequence of their real tokens, position ids restarting at 0 for each row, and the per-token log-probs and entropies
come back in the padded ``[B, R]`` layout. In float64, for every tiny model family built in code (qwen2, gpt2, llama) and
attention implementation that runs here (sdpa, eager), the packed logits equal those of each row alone to 1e-10
(and, under sdpa, the padded ones); the log-probs and entropies (float32 by design) equal the padded ones; the loss
of every ``loss_agg`` mode and its gradient, theta_old (the first ratio exactly 1) and one real trainer step equal
the padded path's. A packing whose position ids do not restart per row, or a model that ignores them, is caught.
FlexAttention (float32 on CPU) gives the padded log-probs too. ``auto`` packs on CUDA under an attention that skips
masked blocks only (flex, flash), not under sdpa or eager (a dense mask), nor on CPU; ``model.attn_implementation``
sets it at load. The AdamW implementation: fused on CUDA, foreach elsewhere."""
import copy
import dataclasses
import random
import shutil

import pytest
import torch
from torch.nn.attention.flex_attention import BlockMask
from helpers import theta_old_base
from test_engine import tiny_policy

from graftzoo.algos.base import StepContext
from graftzoo.contract.batch import TrainBatch, pad_pairs
from graftzoo.contract.config import LearnerFacts, load_config
from graftzoo.contract.errors import ConfigError
from graftzoo.contract.registry import get_algo
from graftzoo.contract.types import TrainRow
from graftzoo.training.models.loss import micro_batch_loss, ratio_base
from graftzoo.tiny.hf import save_hf_model
from graftzoo.training.models import policy as policy_mod
from graftzoo.training.planner.build import load_model
from graftzoo.training.models.policy import (BLOCK_SKIPPING_ATTENTION, Policy, adamw_kwargs, attention_of, pack_rows,
                                      packing_fault, position_ids_from_mask, skips_masked_blocks, use_packing)
from graftzoo.training.trainer import Trainer
from transformers import AutoModelForCausalLM, masking_utils
from transformers.modeling_utils import AttentionInterface

PROMPT_LENS, RESP_LENS = (3, 19, 7, 1, 11), (33, 2, 15, 1, 24)  # very different lengths, one 1-token prompt
MODES = ["token-mean", "seq-mean-token-sum", "seq-mean-token-mean", "seq-mean-token-sum-norm"]


def family_policy(family, tmp_path_factory=None, attn="sdpa") -> Policy:
    """A randomly initialised tiny policy of ``family`` in float64 (llama: ``graftzoo.tiny.hf``'s model)."""
    if family == "llama":
        folder = save_hf_model(tmp_path_factory.mktemp("llama"))
        pol = tiny_policy("qwen2")
        pol = Policy("e-llama", AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float64).eval(),
                     pol.tokenizer, template="compact")
    else:
        pol = tiny_policy(family)
        pol.model.double()
    pol.model.set_attn_implementation(attn)
    return pol


def rows_of(seed=1, vocab=14):
    """Prompts and responses (token ids 4.. of the tiny vocabularies) of ``PROMPT_LENS`` / ``RESP_LENS``."""
    g = torch.Generator().manual_seed(seed)
    prompts = [torch.randint(4, vocab, (n,), generator=g).tolist() for n in PROMPT_LENS]
    resps = [torch.randint(4, vocab, (n,), generator=g).tolist() for n in RESP_LENS]
    return prompts, resps


def resp_mask(resps, R):
    return torch.tensor([[1.0] * len(r) + [0.0] * (R - len(r)) for r in resps], dtype=torch.float64)


FAMILIES = [("qwen2", "sdpa"), ("qwen2", "eager"), ("gpt2", "sdpa"), ("gpt2", "eager"), ("llama", "sdpa"),
            ("llama", "eager")]


@pytest.mark.parametrize("family,attn", FAMILIES, ids=[f"{f}-{a}" for f, a in FAMILIES])
def test_packed_logits_and_logprobs_equal_the_padded_ones(family, attn, tmp_path_factory):
    pol = family_policy(family, tmp_path_factory, attn)
    assert packing_fault(pol.model) is None
    prompts, resps = rows_of()
    ids, att, R = pad_pairs(prompts, resps, pol.pad_id)
    mask = resp_mask(resps, R)
    with torch.no_grad():
        padded = pol.model(input_ids=ids, attention_mask=att, position_ids=position_ids_from_mask(att),
                           use_cache=False).logits[:, -R - 1:-1]
        pids, pos, keep, target, valid = pack_rows(ids, att, R)
        assert pids.shape == (1, sum(PROMPT_LENS) + sum(RESP_LENS))  # only the real tokens
        assert int(keep.numel()) == sum(RESP_LENS) and bool((valid == mask.bool()).all())
        packed = pol.model(input_ids=pids, position_ids=pos, use_cache=False, logits_to_keep=keep).logits
        alone = torch.cat([pol.model(input_ids=torch.tensor([p + r]), use_cache=False).logits[0, len(p) - 1:-1]
                           for p, r in zip(prompts, resps)])  # each row by itself, no padding
    assert packed.shape[1] == keep.numel()  # a 1-D logits_to_keep keeps exactly those positions
    assert float((packed[0] - alone).abs().max()) <= 1e-10
    if attn == "sdpa":  # eager attention in float64 gives NaN on left-padded rows: padded holds in sdpa only
        assert float((packed[0] - padded[valid]).abs().max()) <= 1e-10
    assert bool((target == ids[:, -R:][valid]).all())
    if attn == "eager":
        return

    pol.temperature = 0.7  # divided as in the padded path
    pol.packing = False
    with torch.no_grad():
        lp_pad, ent_pad = pol.logprobs(ids, att, R, with_entropy=True)
    pol.packing = True
    assert pol.packs()
    with torch.no_grad():
        lp, ent = pol.logprobs(ids, att, R, with_entropy=True)
    # the log-probs are float32 by design (token_logprobs): equal to its rounding, 0 on padding
    assert lp.shape == lp_pad.shape == (len(prompts), R)
    assert float(((lp - lp_pad) * mask).abs().max()) <= 1e-6
    assert float(((ent - ent_pad) * mask).abs().max()) <= 1e-6
    assert float((lp * (1 - mask)).abs().max()) == 0.0 and float((ent * (1 - mask)).abs().max()) == 0.0


def test_packing_whose_positions_do_not_restart_per_row_is_caught(monkeypatch):
    """The check above can fail: position ids running on across the rows (no reset: one long causal sequence)
    score the later rows after the earlier ones."""
    pol = family_policy("qwen2")
    prompts, resps = rows_of()
    ids, att, R = pad_pairs(prompts, resps, pol.pad_id)
    mask = resp_mask(resps, R)
    pol.packing = False
    with torch.no_grad():
        lp_pad, _ = pol.logprobs(ids, att, R)
    pol.packing = True
    monkeypatch.setattr(policy_mod, "position_ids_from_mask",
                        lambda m: (m.long().flatten().cumsum(0) - 1).view_as(m).clamp(min=0))
    with torch.no_grad():
        broken, _ = pol.logprobs(ids, att, R)
    assert float(((broken - lp_pad) * mask).abs().max()) > 1e-2


@pytest.mark.skipif(not (shutil.which("g++") or shutil.which("clang++")),
                    reason="inductor compiles FlexAttention for the CPU with a C++ compiler")
def test_flex_attention_packed_logprobs_equal_the_padded_ones_on_cpu(monkeypatch):
    """FlexAttention runs here (float32: its CPU kernel has no float64; compiled once per shape, some seconds): the
    packed rows' BlockMask keeps them apart, so their log-probs and entropies equal the padded (sdpa) ones."""
    pol = tiny_policy("qwen2")
    prompts, resps = rows_of()
    ids, att, R = pad_pairs(prompts, resps, pol.pad_id)
    mask = resp_mask(resps, R).float()
    pol.packing = False
    with torch.no_grad():
        lp_pad, ent_pad = pol.logprobs(ids, att, R, with_entropy=True)
    masks = []
    flex = AttentionInterface._global_mapping["flex_attention"]
    monkeypatch.setitem(AttentionInterface._global_mapping, "flex_attention",
                        lambda module, q, k, v, attention_mask, **kw: masks.append(attention_mask)
                        or flex(module, q, k, v, attention_mask, **kw))
    pol.model.set_attn_implementation("flex_attention")
    pol.packing = True
    assert pol.packs()  # the packing check passes under flex, on two short rows
    with torch.no_grad():
        lp, ent = pol.logprobs(ids, att, R, with_entropy=True)
    assert masks and all(isinstance(m, BlockMask) for m in masks)  # flex ran, with the rows' block mask
    assert float(((lp - lp_pad) * mask).abs().max()) <= 1e-5 and float(((ent - ent_pad) * mask).abs().max()) <= 1e-5
    assert float((lp * (1 - mask)).abs().max()) == 0.0


class NoPositions(torch.nn.Module):
    """A model that drops the position ids it is given (so it cannot tell packed rows apart)."""

    def __init__(self, model):
        super().__init__()
        self.inner = model

    def forward(self, position_ids=None, **kw):
        """The wrapped model's forward without ``position_ids``."""
        return self.inner(**kw)

    def get_input_embeddings(self):
        """The wrapped model's input embeddings."""
        return self.inner.get_input_embeddings()


def test_a_model_that_cannot_pack_falls_back_to_the_padded_path(caplog):
    pol = family_policy("gpt2")
    pol.model = NoPositions(pol.model)
    pol.packing = True
    assert "scores differently" in packing_fault(pol.model)
    prompts, resps = rows_of()
    ids, att, R = pad_pairs(prompts, resps, pol.pad_id)
    with caplog.at_level("WARNING", logger="graftzoo"):
        assert not pol.packs()
    assert "falls back to padded" in caplog.text
    lp, _ = pol.logprobs(ids, att, R)  # the padded path: NoPositions gets an attention mask, and runs
    assert lp.shape == (len(prompts), R)


def test_packing_resolves_auto_on_cuda_with_a_block_skipping_attention_only():
    cpu, cuda = torch.device("cpu"), torch.device("cuda")
    for attn in BLOCK_SKIPPING_ATTENTION:
        assert use_packing("auto", cuda, attn) and not use_packing("auto", cpu, attn)
    for attn in ("sdpa", "eager", None):  # a dense [T, T] mask of the packed rows: auto keeps the padded path
        assert not use_packing("auto", cuda, attn) and not use_packing("auto", cpu, attn)
    assert use_packing(True, cpu, "sdpa") and use_packing(True, cuda, "eager")
    assert not use_packing(False, cuda, "flash_attention_2") and not use_packing(False, cpu, "flex_attention")
    cfg = load_config(pair="micro", algo="grpo", overrides=["optim.packing=true"])
    pol = tiny_policy()
    assert pol.packing == "auto" and not pol.packs()  # CPU: the padded path, as before
    pol.configure_optimizer(cfg.optim)
    assert pol.packing is True
    pol.apply_optim_settings(load_config(pair="micro", algo="grpo").optim)
    assert pol.packing == "auto"


def test_a_hub_kernel_skips_masked_blocks_as_the_attention_it_is_masked_like(monkeypatch):
    """A hub kernel (``kernels-community/flash-attn2`` standing in for ``flash_attention_2`` without the flash_attn
    package) counts as the attention whose mask transformers registered for it: flash's (varlen) packs, sdpa's
    (a kernel with its own forward, masked densely) does not."""
    mapping = masking_utils.AttentionMaskInterface._global_mapping
    monkeypatch.setitem(mapping, "kernels-community/flash-attn2", mapping["flash_attention_2"])
    monkeypatch.setitem(mapping, "kernels-community/dense", mapping["sdpa"])
    assert skips_masked_blocks("kernels-community/flash-attn2") and not skips_masked_blocks("kernels-community/dense")
    assert not skips_masked_blocks("kernels-community/unregistered") and not skips_masked_blocks(None)
    assert not any(map(skips_masked_blocks, ("sdpa", "eager", "paged|eager")))


def on_cuda(monkeypatch, pol, attn):
    """``pol`` seen as on CUDA with ``attn`` as its model's attention (``config._attn_implementation``, what
    ``attention_of`` reads), its ``packing_fault`` check counted (its model stays on the CPU, which runs neither
    flash kernel)."""
    monkeypatch.setattr(Policy, "device", property(lambda self: torch.device("cuda")))
    pol.model.config._attn_implementation = attn
    checked = []
    monkeypatch.setattr(policy_mod, "packing_fault", lambda model: checked.append(model) and None)
    return checked


@pytest.mark.parametrize("attn,packs", [("sdpa", False), ("eager", False), ("flex_attention", True),
                                        ("flash_attention_2", True), ("flash_attention_3", True)])
def test_policy_packs_on_cuda_under_auto_with_a_block_skipping_attention_only(monkeypatch, attn, packs):
    pol = tiny_policy()
    assert attention_of(pol.model) == "sdpa" and pol.packing == "auto"  # transformers' default here, as before
    checked = on_cuda(monkeypatch, pol, attn)
    assert attention_of(pol.model) == attn and pol.device.type == "cuda"
    assert pol.packs() is packs and len(checked) == packs  # the fault check runs only where packing is wanted
    pol.packing = True
    assert pol.packs()  # true packs whatever the attention


def test_packing_true_under_a_dense_mask_on_cuda_warns_once(monkeypatch, caplog):
    pol = tiny_policy()
    pol.packing = True
    on_cuda(monkeypatch, pol, "sdpa")
    with caplog.at_level("WARNING", logger="graftzoo"):
        assert pol.packs() and pol.packs()
    assert caplog.text.count("masks the packed rows densely") == 1
    caplog.clear()
    pol = tiny_policy()
    pol.packing = True
    on_cuda(monkeypatch, pol, "flex_attention")
    with caplog.at_level("WARNING", logger="graftzoo"):
        assert pol.packs()
    assert "densely" not in caplog.text


def test_model_attn_implementation_is_set_at_load_and_auto_keeps_transformers_default():
    cfg = load_config(pair="micro", algo="grpo")
    spec = cfg.pair.models[0]
    assert cfg.model.attn_implementation == "auto" and spec.attn_implementation == "auto"
    model, _, _ = load_model(spec)
    assert attention_of(model) == "sdpa"  # auto: untouched, the attention every run had before the key
    eager = load_config(pair="micro", algo="grpo", overrides=["model.attn_implementation=eager"]).pair.models[0]
    assert eager.attn_implementation == "eager" and eager.key_of("attn_implementation") == "model.attn_implementation"
    model, _, _ = load_model(eager)
    assert attention_of(model) == "eager"
    with pytest.raises(ConfigError, match="model.attn_implementation"):
        load_config(pair="micro", algo="grpo", overrides=["model.attn_implementation=flash"])


def test_adamw_is_fused_on_cuda_and_foreach_elsewhere():
    assert adamw_kwargs(torch.device("cuda")) == {"fused": True}
    assert adamw_kwargs(torch.device("cuda:1")) == {"fused": True}
    assert adamw_kwargs(torch.device("cpu")) == {"foreach": True}
    pol = tiny_policy()
    pol.configure_optimizer(load_config(pair="micro", algo="grpo").optim)
    assert pol.optimizer.param_groups[0]["foreach"] is True and not pol.optimizer.param_groups[0]["fused"]


# ---- the loss ------------------------------------------------------------------------------------------------

def minibatch(pol, seed=2):
    """The rows as one float64 minibatch (TrainBatch's real layout) with theta_old from the policy's own path
    (``theta_old_base``), then old log-probs moved off it so some ratios clip."""
    prompts, resps = rows_of()
    g = torch.Generator().manual_seed(seed)
    rows = [TrainRow(p, r, [0.0] * len(r), [1.0] * len(r), [1.0] * len(r), float(a), 1.0, "own", b)
            for b, (p, r, a) in enumerate(zip(prompts, resps, (1.25, -0.75, 0.375, -1.125, 0.5)))]
    mb = TrainBatch(rows, [None] * len(rows), pad_id=pol.pad_id).minibatch(range(len(rows)))
    mb = dataclasses.replace(mb, **{k: getattr(mb, k).double() for k in (
        "old_logp", "loss_mask", "kl_mask", "advantages", "weights", "origin_mean_logp")})
    mb.old_logp = theta_old_base(pol, mb)
    mb.old_logp = mb.old_logp + 0.6 * (torch.rand(mb.old_logp.shape, generator=g, dtype=torch.float64) - 0.5)
    return mb


def loss_and_grads(pol, ref, mode, packing):
    """The GRPO learner's real loss (KL and entropy terms on) and its parameter gradients."""
    cfg = load_config(pair="micro", algo="grpo", overrides=[f"algo.loss_agg={mode}", "algo.beta_kl=0.05",
                                                            "algo.entropy_coeff=0.01", "rollout.max_new_tokens=40"])
    learner = get_algo("grpo")(cfg.algo, LearnerFacts.of(cfg))
    ctx = StepContext(step=0, epoch=0, run=LearnerFacts.of(cfg), policy=pol, engine=None, env=None,
                      ref_policy=ref, rng=random.Random(0))
    pol.packing = ref.packing = packing
    mb = minibatch(pol)
    pol.model.zero_grad(set_to_none=True)
    loss, _ = micro_batch_loss(ctx, pol, learner, mb)
    loss.backward()
    return float(loss.detach()), {n: p.grad.clone() for n, p in pol.model.named_parameters() if p.grad is not None}


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("family", ["qwen2", "gpt2"])
def test_packed_loss_and_gradient_equal_the_padded_ones(family, mode):
    pol = family_policy(family)
    pol.model.train()
    with torch.no_grad():  # a reference the policy differs from, so the KL term is not 0
        ref = copy.copy(pol)
        ref.model = copy.deepcopy(pol.model).eval()
        for p in ref.model.parameters():
            p.add_(0.05 * torch.randn_like(p))
    pad_loss, pad_grads = loss_and_grads(pol, ref, mode, False)
    loss, grads = loss_and_grads(pol, ref, mode, True)
    assert abs(loss - pad_loss) <= 1e-6 and abs(pad_loss) > 1e-4
    assert grads.keys() == pad_grads.keys()
    worst = max(float((grads[n] - pad_grads[n]).abs().max()) for n in grads)
    scale = max(float(g.abs().max()) for g in pad_grads.values())
    assert worst <= 1e-6 * scale and scale > 1e-4


@pytest.mark.parametrize("packing", [False, True])
def test_theta_old_through_the_same_path_gives_a_first_ratio_of_exactly_one(packing):
    pol = family_policy("qwen2")
    pol.packing = packing
    prompts, resps = rows_of()
    rows = [TrainRow(p, r, [0.0] * len(r), [1.0] * len(r), [1.0] * len(r), 1.0, 1.0, "own", b)
            for b, (p, r) in enumerate(zip(prompts, resps))]
    mb = TrainBatch(rows, [None] * len(rows), pad_id=pol.pad_id).minibatch(range(len(rows)))
    mb.old_logp = theta_old_base(pol, mb)  # a separate pass, as the rows' arrived theta_old
    logp, _ = pol.logprobs(mb.input_ids, mb.attention_mask, mb.resp_len)
    assert bool((torch.exp(logp - mb.old_logp) * mb.loss_mask == mb.loss_mask).all())
    base = ratio_base(mb, logp, True)  # the base the loss takes from its own forward (``base_from_forward``)
    assert bool((torch.exp(logp - base) * mb.loss_mask == mb.loss_mask).all())


# ---- a real trainer step ---------------------------------------------------------------------------------------

def stepped_weights(tmp_path, packing):
    """The learner's weights after one trainer step of the micro pair (its models made float64 first), with
    ``optim.packing=packing``, micro-batches of at most 120 padded tokens and theta_old recomputed."""
    cfg = load_config(pair="micro", algo="grpo", overrides=[
        "run.track=false", f"run.out_dir={tmp_path}", f"run.name=pack-{str(packing).lower()}",
        "pair.train=[micro-qwen-char]",
        "algo.beta_kl=0.05", "algo.entropy_coeff=0.01", "optim.max_tokens_per_micro=120",
        "rollout.recompute_old_logp=on", f"optim.packing={str(packing).lower()}", "optim.lr=1e-3"])
    tr = Trainer(cfg)
    try:
        for m, pol in tr.policies.items():
            pol.model.double()
            pol.configure_optimizer(cfg.optim)
            if tr.refs.get(m) is not None:
                tr.refs[m].model.double()
        pol = tr.policies["micro-qwen-char"]
        before = {n: p.detach().clone() for n, p in pol.model.named_parameters()}
        met = tr.train_step(0)["micro-qwen-char"]
        return before, {n: p.detach().clone() for n, p in pol.model.named_parameters()}, met
    finally:
        tr.close()


def test_one_trainer_step_with_packing_gives_the_padded_step_s_weights(tmp_path, monkeypatch):
    calls = []
    pack = policy_mod.pack_rows
    monkeypatch.setattr(policy_mod, "pack_rows", lambda *a: calls.append(a[0].shape[0]) or pack(*a))
    before, padded, met_pad = stepped_weights(tmp_path, False)
    assert calls == []
    _, packed, met = stepped_weights(tmp_path, True)
    assert len(calls) > 2 and max(calls) > 1  # theta_old and loss passes, several rows packed per pass
    moved = max(float((padded[n] - before[n]).abs().max()) for n in padded)
    worst = max(float((packed[n] - padded[n]).abs().max()) for n in padded)
    assert moved > 1e-4  # the step changed the weights
    assert worst <= 1e-9, worst
    assert met["loss"] == pytest.approx(met_pad["loss"], abs=1e-6)
