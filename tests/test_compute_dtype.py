"""Every forward pass computes in the policy's compute dtype (graftzoo.training.models.policy ``ComputeWeights``,
docs/scaling.md#precision). Under ``bf16-mixed`` the parameters are float32 master weights; generation (the HF
engine), the theta_old pass, the KL reference and the update each run with the attention inputs, the KV cache and the
logits in bfloat16, for every model family of the tiny configs (qwen2, gpt2) and of the pair configs (llama, qwen3,
smollm3), each built through ``build_policy`` as the trainer builds it. The master weights come back bit for bit and
the gradients reach them in float32, summed over micro-batches."""
import pytest
import torch
import torch.nn.functional as F
import yaml
from transformers import AutoConfig, AutoModelForCausalLM

from graftzoo.contract.batch import pad_pairs
from graftzoo.contract.config import load_config
from graftzoo.contract.types import Prompt
from graftzoo.tiny.hf import save_hf_model
from graftzoo.training.engines.engine import HFEngine
from graftzoo.training.planner.build import build_policy, make_ref
from graftzoo.training.models.policy import ComputeWeights

BF16 = torch.bfloat16
HF_FAMILIES = ("llama", "qwen3", "smollm3")  # the pair configs' families (pair1: SmolLM3 and Qwen3)


def hf_pair(tmp_path, folder) -> str:
    path = tmp_path / f"{folder.name}.yaml"
    path.write_text(yaml.safe_dump({
        "name": "dtype", "models": [{"kind": "hf", "dtype": "float32", "id": str(folder)}],
        "task": {"env": "graftzoo/Arithmetic-v0", "mix": {"add": 1}, "difficulty": 1, "prompts_per_step": 2},
        "rollout": {"n": 2, "max_new_tokens": 6}, "run": {"progress": False, "track": False}}))
    return str(path)


@pytest.fixture(scope="module")
def policies(tmp_path_factory):
    """(family, policy) under bf16-mixed: the micro pair's two tiny models and one small model per pair family."""
    out = []
    micro = load_config(pair="micro", algo="grpo", overrides=["optim.precision=bf16-mixed", "run.track=false"])
    for spec, family in zip(micro.pair.models, ("qwen2", "gpt2")):
        out.append((family, build_policy(spec, micro, seed=0)))
    root = tmp_path_factory.mktemp("dtype")
    for family in HF_FAMILIES:
        folder = save_hf_model(root / family)
        tok_vocab = AutoConfig.from_pretrained(folder).vocab_size
        cfg = AutoConfig.for_model(family, vocab_size=tok_vocab, hidden_size=64, intermediate_size=128,
                                   num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, head_dim=16,
                                   max_position_embeddings=512, pad_token_id=0, eos_token_id=1, bos_token_id=None,
                                   tie_word_embeddings=True)
        torch.manual_seed(0)
        AutoModelForCausalLM.from_config(cfg).save_pretrained(folder)
        run = load_config(pair=hf_pair(root, folder), algo="grpo", overrides=["optim.precision=bf16-mixed"])
        pol = build_policy(run.pair.models[0], run, seed=0)
        assert pol.model.config.model_type == family
        out.append((family, pol))
    return out


class Seen:
    """The dtypes a model's forward passes meet: SDPA's inputs, the KV cache's keys and values, the logits."""

    def __init__(self, monkeypatch, model):
        self.attn, self.cache, self.logits = set(), set(), set()
        sdpa = F.scaled_dot_product_attention

        def spy(q, k, v, *a, **kw):
            self.attn.add((q.dtype, k.dtype, v.dtype))
            return sdpa(q, k, v, *a, **kw)
        monkeypatch.setattr(torch.nn.functional, "scaled_dot_product_attention", spy)

        def hook(module, args, out):
            self.logits.add(out.logits.dtype)
            cache = getattr(out, "past_key_values", None)
            for layer in getattr(cache, "layers", []) or []:
                if getattr(layer, "keys", None) is not None:
                    self.cache.add((layer.keys.dtype, layer.values.dtype))
        self.handle = model.register_forward_hook(hook)

    def only(self, dtype) -> bool:
        return bool(self.attn) and self.attn == {(dtype,) * 3} and self.logits == {dtype} and \
            self.cache <= {(dtype, dtype)}


def masters(pol) -> dict:
    return {n: p.detach().clone() for n, p in pol.model.named_parameters()}


def rows(pol):
    prompts = [pol.encode_text("1+2="), pol.encode_text("3+40=")]
    responses = [pol.encode_text("3"), pol.encode_text("43") + [pol.eos_id]]
    return prompts, responses


@pytest.mark.parametrize("family", ("qwen2", "gpt2") + HF_FAMILIES)
def test_generation_theta_old_and_reference_compute_in_bf16_and_leave_the_masters_untouched(family, policies,
                                                                                           monkeypatch):
    pol = dict(policies)[family]
    assert pol.autocast_dtype == BF16 and pol.param_dtype == torch.float32
    before = masters(pol)
    seen = Seen(monkeypatch, pol.model)
    HFEngine(pol, max_new_tokens=4).generate([Prompt(id="p", text="1+2=")], 2)
    assert seen.only(BF16) and seen.cache == {(BF16, BF16)}, (seen.attn, seen.cache, seen.logits)
    seen = Seen(monkeypatch, pol.model)
    logps, _ = pol.score_sequences(*rows(pol))
    assert seen.only(BF16) and all(isinstance(x, float) for r in logps for x in r), (seen.attn, seen.logits)
    ref = make_ref(pol)
    assert {p.dtype for p in ref.model.parameters()} == {BF16}  # frozen: the compute dtype only
    seen = Seen(monkeypatch, ref.model)
    ref.score_sequences(*rows(pol))
    assert seen.only(BF16), (seen.attn, seen.logits)
    after = masters(pol)
    assert all(after[n].dtype == torch.float32 and torch.equal(after[n], before[n]) for n in before)


@pytest.mark.parametrize("family", ("qwen2", "gpt2") + HF_FAMILIES)
def test_the_update_computes_in_bf16_and_sums_the_gradients_onto_the_float32_masters(family, policies, monkeypatch):
    pol = dict(policies)[family]
    prompts, responses = rows(pol)
    ids, att, R = pad_pairs(prompts, responses, pol.pad_id)

    def grads(parts):
        pol.zero_grad()
        with pol.compute_weights():
            for sl in parts:
                logp, _ = pol.logprobs(ids[sl], att[sl], R)
                logp.sum().backward()
        return {n: p.grad for n, p in pol.model.named_parameters() if p.grad is not None}

    seen = Seen(monkeypatch, pol.model)
    whole = grads([slice(0, 2)])
    assert seen.only(BF16), (seen.attn, seen.logits)
    split = grads([slice(0, 1), slice(1, 2)])  # two micro-batches, summed inside one context
    first, second = grads([slice(0, 1)]), grads([slice(1, 2)])
    assert whole and set(whole) == set(split)
    params = dict(pol.model.named_parameters())
    for n, g in split.items():
        assert g.dtype == torch.float32 and params[n].dtype == torch.float32
        assert torch.equal(g, first[n] + second[n]), n  # summed in float32: a bfloat16 sum would round
        assert F.cosine_similarity(g.flatten(), whole[n].flatten(), dim=0) > 0.98 or float(g.abs().max()) < 1e-4, n
    pol.zero_grad()
    with pytest.raises(RuntimeError, match="compute_weights"):  # a backward outside would land bf16 grads
        pol.logprobs(ids, att, R)


def test_the_working_copy_is_shared_by_nested_entries(policies):
    pol = dict(policies)["qwen2"]
    weights = pol.compute_weights()
    assert isinstance(weights, ComputeWeights)
    p = next(pol.model.parameters())
    with weights:
        copy = p.data_ptr()
        assert p.dtype == BF16
        with pol.compute_weights():  # nested: the same copy, no second cast
            assert p.data_ptr() == copy
        assert p.data_ptr() == copy and weights.active
    assert p.dtype == torch.float32 and not weights.active


def test_fp32_and_sharded_policies_have_nothing_to_cast(policies):
    pol = dict(policies)["gpt2"]
    dtype = pol.autocast_dtype
    try:
        pol.autocast_dtype = None
        assert not isinstance(pol.compute_weights(), ComputeWeights)
    finally:
        pol.autocast_dtype = dtype
