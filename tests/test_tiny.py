"""Tiny model pair: tokenizers, architectures, left padding, SFT warm-up and its disk cache."""
import json
import os
import random
from dataclasses import replace

import pytest
import torch
from transformers import AutoTokenizer

from graftzoo.envs.arithmetic import SKILLS, make_problem
from graftzoo.tiny.build import TinyModelSpec, build_tiny, build_tokenizer, compact_prompt, position_ids
from graftzoo.tiny.warmup import (CONTINUE_START, cache_key, encode_batch, load_or_warmup, load_tiny, sft_loss,
                                  sft_train, warmup_info, warmup_pair)
from graftzoo.tiny import warmup as W

torch.set_num_threads(1)


def small_spec(family="qwen2", tokenizer="char", steps=3, **warm):
    w = {"steps": steps, "batch": 8, "lr": 3e-3, "warmup_steps": 2, "mix": {"add": 1, "mul": 1},
         "difficulty": 2, "probe_per_skill": 2, **warm}
    return TinyModelSpec(id=f"t-{family}", family=family, tokenizer=tokenizer, hidden=32, layers=1, heads=2,
                         kv_heads=1 if family == "qwen2" else None, ffn=64, max_positions=64, warmup=w)


def scratchpad_texts():
    rng = random.Random(0)
    return [compact_prompt(p.question) + p.solution for s in SKILLS for p in
            (make_problem(s, d, rng) for d in (1, 3, 4))]


@pytest.mark.parametrize("kind", ["char", "digit_pair", "digit_rpair", "digit_triple"])
def test_tokenizer_round_trips_and_reloads(kind, tmp_path):
    tok = build_tokenizer(kind)
    for text in scratchpad_texts() + ["Q:(12+3)*4\n 0"]:
        ids = tok(text, add_special_tokens=False)["input_ids"]
        assert tok.unk_token_id not in ids
        assert tok.decode(ids, clean_up_tokenization_spaces=False) == text
        assert tok.decode(ids + [tok.eos_token_id, tok.pad_token_id], skip_special_tokens=True) == text
    tok.save_pretrained(tmp_path)
    again = AutoTokenizer.from_pretrained(tmp_path)
    text = scratchpad_texts()[5]
    assert again(text)["input_ids"] == tok(text)["input_ids"] and again.padding_side == "left"
    chat = [{"role": "user", "content": "347*6"}, {"role": "assistant", "content": "2082"}]
    assert again.apply_chat_template(chat[:1], tokenize=False, add_generation_prompt=True) == "Q:347*6\n"
    assert again.apply_chat_template(chat, tokenize=False) == "Q:347*6\n2082" + tok.eos_token


def test_digit_pair_chunks_from_the_left():
    tok = build_tokenizer("digit_pair")
    assert tok.tokenize("2082+347") == ["20", "82", "+", "34", "7"]
    assert build_tokenizer("char").tokenize("2082") == ["2", "0", "8", "2"]


def test_the_third_families_tokenizers_split_numbers_their_own_way():
    """digit_rpair: pairs aligned to place value from the right; digit_triple: up to three digits from the left (as
    Llama-3); each its own ids for the same pieces."""
    rpair, triple = build_tokenizer("digit_rpair"), build_tokenizer("digit_triple")
    assert rpair.tokenize("2082+347-5") == ["20", "82", "+", "3", "47", "-", "5"]
    assert triple.tokenize("20823+347") == ["208", "23", "+", "347"]
    assert rpair.convert_tokens_to_ids("20") != build_tokenizer("digit_pair").convert_tokens_to_ids("20")
    assert len(rpair) == 124 and len(triple) == 1124


def test_families_differ_in_architecture_and_vocab():
    a, ta = build_tiny(small_spec("qwen2", "char"), 0)
    b, tb = build_tiny(small_spec("gpt2", "digit_pair"), 0)
    assert a.config.model_type == "qwen2" and b.config.model_type == "gpt2"
    assert a.config.num_key_value_heads == 1 and hasattr(b.transformer, "wpe") and not hasattr(a.model, "wpe")
    assert len(ta) == 24 and len(tb) == 124 and a.config.vocab_size == 24 and b.config.vocab_size == 124
    assert ta.get_vocab() != tb.get_vocab()


def test_position_ids_skip_left_padding():
    assert position_ids(torch.tensor([[0, 0, 1, 1, 1], [1, 1, 1, 1, 1]])).tolist() == [[0, 0, 0, 1, 2],
                                                                                      [0, 1, 2, 3, 4]]


@pytest.mark.parametrize("family,kind", [("qwen2", "char"), ("gpt2", "digit_pair")])
def test_left_padded_row_matches_unpadded(family, kind):
    model, tok = build_tiny(small_spec(family, kind), 0)
    model.eval()
    short, long = "Q:12+34\n", "Q:347*6\n347*6=300*6"
    enc = tok([short, long], add_special_tokens=False, padding=True, return_tensors="pt")
    alone = tok([short], add_special_tokens=False, return_tensors="pt")
    with torch.no_grad():
        padded = model(**enc, position_ids=position_ids(enc["attention_mask"])).logits[0, -alone["input_ids"].shape[1]:]
        single = model(**alone).logits[0]
    torch.testing.assert_close(padded, single, atol=1e-4, rtol=1e-4)


def test_sft_lowers_the_loss():
    spec = small_spec(steps=40)
    model, tok = build_tiny(spec, 0)
    rng = random.Random(1)
    probs = [make_problem("add", 2, rng) for _ in range(16)]
    batch = encode_batch(tok, [p.question for p in probs], [p.solution for p in probs])
    assert (batch["labels"] != -100).sum() == sum(len(p.solution) + 1 for p in probs)  # completion + EOS only
    with torch.no_grad():
        before = sft_loss(model, batch).item()
    stats = sft_train(model, tok, spec.warmup, seed=0)
    with torch.no_grad():
        after = sft_loss(model, batch).item()
    assert stats["steps"] == 40 and after < before - 0.5


def test_stop_when_ends_at_the_first_probe_that_meets_it():
    spec = small_spec(steps=20, stop_when={"add": 0.0}, probe_every=4)
    model, tok = build_tiny(spec, 0)
    stats = sft_train(model, tok, spec.warmup, seed=0)
    assert stats["steps"] == 4 and stats["max_steps"] == 20 and [p["step"] for p in stats["stop_probes"]] == [4]
    spec = small_spec(steps=8, stop_when={"mul": 1.01}, probe_every=4)  # unreachable: runs to the cap
    stats = sft_train(*build_tiny(spec, 0), spec.warmup, seed=0)
    assert stats["steps"] == 8 and [p["step"] for p in stats["stop_probes"]] == [4]
    with pytest.raises(ValueError, match="stop_when"):
        small_spec(stop_when={"div": 0.5})


def test_warmup_is_cached_and_reused(tmp_path):
    spec = small_spec()
    calls = []
    path = load_or_warmup(spec, 0, cache_dir=tmp_path, progress=calls.append)
    assert len(calls) == 3 and os.path.basename(path).startswith(spec.id)
    info = warmup_info(path)
    assert info["seed"] == 0 and info["steps"] == 3 and set(info["probe_greedy"]) == {"add", "mul"}
    mtime = os.path.getmtime(os.path.join(path, "warmup.json"))
    assert load_or_warmup(spec, 0, cache_dir=tmp_path, progress=calls.append) == path
    assert len(calls) == 3 and os.path.getmtime(os.path.join(path, "warmup.json")) == mtime
    assert cache_key(spec, 1) != cache_key(spec, 0) != cache_key(small_spec(lr=1e-3), 0)
    assert [p.name for p in tmp_path.iterdir()] == [os.path.basename(path)]  # no temp dir left
    model, tok = load_tiny(path)
    assert model.config.model_type == "qwen2" and tok.decode(tok("Q:1+2\n")["input_ids"]) == "Q:1+2\n"


def test_a_cache_of_other_code_is_not_reused(tmp_path, monkeypatch):
    """The cached weights are keyed by the code and libraries that made them: a warm-up written by
    another version of the warm-up, model or problem code (or of torch / transformers) is trained
    again, neither found by its key nor reused as the same recipe under another id."""
    spec = small_spec(steps=2)
    path = load_or_warmup(spec, 0, cache_dir=tmp_path)
    assert warmup_info(path)["code"] == W.code_fingerprint()
    monkeypatch.setattr(W.torch, "__version__", "0.0-other")
    W.code_fingerprint.cache_clear()
    try:
        assert W.same_weights(spec, 0, tmp_path) is None
        other = load_or_warmup(spec, 0, cache_dir=tmp_path)
        assert other != path and warmup_info(other)["code"] == W.code_fingerprint()
    finally:
        W.code_fingerprint.cache_clear()


@pytest.mark.slow
def test_warmup_pair_runs_both_in_parallel(tmp_path):
    specs = [small_spec("qwen2", "char", steps=2), small_spec("gpt2", "digit_pair", steps=2)]
    paths = warmup_pair(specs, 0, cache_dir=tmp_path, parallel=True)
    assert [json.loads(open(os.path.join(p, "warmup.json")).read())["spec"]["family"] for p in paths] \
        == ["qwen2", "gpt2"]
    assert [load_or_warmup(s, 0, cache_dir=tmp_path) for s in specs] == paths


def test_spec_from_config_dict_checks_keys():
    d = {"id": "x", "kind": "tiny", "family": "gpt2", "tokenizer": "digit_pair", "hidden": 32, "layers": 1,
         "heads": 2, "ffn": 64, "warmup": {"steps": 5, "lr": 1e-3, "betas": [0.9, 0.95]}}
    spec = TinyModelSpec.from_dict(d)
    assert spec.warmup.steps == 5 and spec.warmup.betas == (0.9, 0.95)
    with pytest.raises(ValueError, match="stepz"):
        TinyModelSpec.from_dict({**d, "warmup": {"stepz": 5}})
    with pytest.raises(ValueError, match="family"):
        TinyModelSpec.from_dict({**d, "family": "mamba"})


def test_then_continues_the_first_phase_checkpoint(tmp_path):
    """warmup.then (a stronger checkpoint of the same model): the first phase is cached on its own, the
    continuation starts from exactly that checkpoint, inherits the keys it does not set, and trains on problems the
    first phase never saw; a spec without ``then`` keeps its old cache key (no ``then`` in its dict)."""
    plain = small_spec(steps=3)
    assert "then" not in plain.to_dict()["warmup"] and cache_key(plain, 0) == cache_key(small_spec(steps=3), 0)
    spec = small_spec(steps=3, then={"steps": 2, "mix": {"mul": 1.0}})
    assert spec.warmup.then.lr == 3e-3 and spec.warmup.then.batch == 8 and spec.warmup.then.steps == 2
    assert spec.to_dict()["warmup"]["then"]["mix"] == {"mul": 1.0} and cache_key(spec, 0) != cache_key(plain, 0)
    calls = []
    path = load_or_warmup(spec, 0, cache_dir=tmp_path, progress=calls.append)
    assert [c["step"] for c in calls] == [1, 2, 3, 1, 2]  # the first phase, then the continuation
    first = load_or_warmup(plain, 0, cache_dir=tmp_path)  # the same first phase (same id): already cached
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted([os.path.basename(path), os.path.basename(first)])
    info = warmup_info(path)
    assert info["steps"] == 2 and info["first_phase"]["steps"] == 3 and set(info["probe_greedy"]) == {"add", "mul"}
    # the continuation = the first-phase checkpoint trained two more steps from the continuation's problems
    model, tok = load_tiny(first)
    sft_train(model, tok, spec.warmup.then, 0, start=CONTINUE_START)
    cont, _ = load_tiny(path)
    for (k, a), b in zip(model.state_dict().items(), cont.state_dict().values()):
        assert torch.allclose(a, b, atol=1e-6), k
    base, _ = load_tiny(first)
    assert not torch.allclose(base.lm_head.weight, cont.lm_head.weight)
    with pytest.raises(ValueError, match="then.*stepz"):
        small_spec(then={"stepz": 2})


def test_a_recipe_warmed_under_another_id_is_reused(tmp_path):
    """The id does not change the weights: a spec equal to a cached one but for its id trains nothing."""
    spec = small_spec(steps=2)
    path = load_or_warmup(spec, 0, cache_dir=tmp_path)
    calls = []
    assert load_or_warmup(replace(spec, id="other"), 0, cache_dir=tmp_path, progress=calls.append) == path
    assert calls == []
    assert load_or_warmup(replace(spec, id="other"), 1, cache_dir=tmp_path) != path  # another seed: trained
