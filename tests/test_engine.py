"""HFEngine's own decoding loop: same tokens as transformers' generate when greedy, the right
sampling distribution (temperature, top-k) when sampling, its log-probs recorded, and min_new_tokens."""
import pytest
import torch
import torch.nn.functional as F

from graftzoo.training.engines.engine import HFEngine
from graftzoo.training.models.policy import Policy, position_ids_from_mask
from graftzoo.tiny.build import TinyModelSpec, build_tiny
from graftzoo.contract.types import Prompt

torch.set_num_threads(1)
PROMPTS = [Prompt(id=str(i), text=t) for i, t in enumerate(["12+7", "3*45", "9", "100-18"])]


def tiny_policy(family="qwen2", tokenizer="char", sharpen=1.0) -> Policy:
    spec = TinyModelSpec(id=f"e-{family}", family=family, tokenizer=tokenizer, hidden=32, layers=2, heads=2,
                         kv_heads=1 if family == "qwen2" else None, ffn=64, max_positions=64,
                         warmup={"steps": 0})
    model, tok = build_tiny(spec, seed=3)
    if sharpen != 1.0:  # peaked next-token distributions, so a wrong sampler is visible
        with torch.no_grad():
            model.get_output_embeddings().weight.mul_(sharpen)
    return Policy(spec.id, model.eval(), tok, template="compact")


@pytest.mark.parametrize("family,tokenizer", [("qwen2", "char"), ("gpt2", "digit_pair")])
def test_greedy_matches_transformers_generate(family, tokenizer):
    pol = tiny_policy(family, tokenizer)
    prefixes = [[], pol.encode_text("1"), [], pol.encode_text("2*")]
    groups = HFEngine(pol, max_new_tokens=12).generate(PROMPTS, 2, prefixes=prefixes, greedy=True)
    seqs = [pol.encode_prompt(p) + list(pre) for p, pre in zip(PROMPTS, prefixes)]
    width = max(map(len, seqs))
    ids = torch.tensor([[pol.pad_id] * (width - len(s)) + s for s in seqs])
    mask = torch.tensor([[0] * (width - len(s)) + [1] * len(s) for s in seqs])
    with torch.no_grad():
        ref = pol.model.generate(input_ids=ids, attention_mask=mask, position_ids=position_ids_from_mask(mask),
                                 do_sample=False, max_new_tokens=12, eos_token_id=pol.eos_id, pad_token_id=pol.pad_id)
    for g, pre, row in zip(groups, prefixes, ref[:, width:].tolist()):
        want = row[:row.index(pol.eos_id) + 1] if pol.eos_id in row else row
        for r in g.rollouts:
            assert r.token_ids == list(pre) + want
            assert r.prefix_len == len(pre) and r.logprobs[:len(pre)] == [0.0] * len(pre)


def test_sampling_follows_softmax_of_logits_over_t_within_top_k():
    pol = tiny_policy(sharpen=6.0)
    T, k, n = 0.7, 4, 3000
    ids = torch.tensor([pol.encode_prompt(PROMPTS[0])])
    with torch.no_grad():
        logits = pol.model(input_ids=ids).logits[0, -1].float()
    kept = torch.topk(logits, k).indices
    want = torch.zeros_like(logits)
    want[kept] = F.softmax(logits[kept] / T, -1)
    untruncated = F.softmax(logits, -1)
    assert 0.5 * (want - untruncated).abs().sum() > 0.15  # the test can tell the two apart

    torch.manual_seed(0)
    g = HFEngine(pol, temperature=T, top_k=k, max_new_tokens=1).generate(PROMPTS[:1], n)[0]
    first = torch.tensor([r.token_ids[0] for r in g.rollouts])
    got = torch.bincount(first, minlength=logits.numel()).float() / n
    assert set(first.tolist()) <= set(kept.tolist())
    assert 0.5 * (got - want).abs().sum() < 0.04
    # behaviour log-probs are those of the distribution sampled: softmax(logits / T) renormalised over the top k
    lp = want.log()
    assert max(abs(r.logprobs[0] - float(lp[r.token_ids[0]])) for r in g.rollouts) < 1e-5


def test_min_new_tokens_keeps_eos_out_until_reached():
    pol = tiny_policy()
    first = HFEngine(pol, max_new_tokens=1).generate(PROMPTS[:1], 1, greedy=True)[0].rollouts[0].token_ids[0]
    pol.tokenizer.eos_token = pol.tokenizer.convert_ids_to_tokens(first)  # greedy now stops at once
    assert pol.eos_id == first
    stopped = HFEngine(pol, max_new_tokens=6).generate(PROMPTS[:1], 2, greedy=True)[0].rollouts
    assert all(r.token_ids == [first] and r.finish_reason == "stop" for r in stopped)
    for greedy in (True, False):
        rolls = HFEngine(pol, max_new_tokens=6, min_new_tokens=6).generate(PROMPTS, 3, greedy=greedy)
        for r in (r for g in rolls for r in g.rollouts):
            assert len(r.token_ids) == 6 and first not in r.token_ids and r.finish_reason == "length"
