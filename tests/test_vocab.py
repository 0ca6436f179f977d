"""The paper's real tokenizers, built offline (graftzoo.tiny.vocab; docs/guide.md#the-papers-families-in-miniature):
the published ids, exact agreement with the rank package's own encoder on every bundled benchmark's problems and
solutions, decode(encode(x)) == NFC(x) for Qwen3 and x for SmolLM3, the rank-file conversion on a worked example,
and the cache (built once, read after)."""
import json
import unicodedata

import pytest

from graftzoo.envs.datasets import BUNDLED, DATA_DIR
from graftzoo.tiny import vocab

# every bundled file: the benchmarks in full, each training set's every 10th row
FIELDS = ("problem", "solution", "answer", "question")


def texts():
    out = []
    for fname in sorted({f for f, _ in BUNDLED.values()}):
        lines = (DATA_DIR / fname).read_text(encoding="utf-8").splitlines()
        step = 10 if "train" in fname else 1
        for line in lines[::step]:
            row = json.loads(line)
            out += [row[k] for k in FIELDS if isinstance(row.get(k), str) and row[k]]
    return out


@pytest.fixture(scope="module")
def corpus():
    return texts()


@pytest.fixture(scope="module")
def toks():
    """Both tokenizers, read from the cache once for the module (a real vocabulary takes seconds to load)."""
    return {name: vocab.cached_vocab(name) for name in ("qwen3", "smollm3")}


@pytest.fixture(params=["qwen3", "smollm3"])
def tok(request, toks):
    return request.param, toks[request.param]


def test_published_ids(toks):
    q, s = toks["qwen3"], toks["smollm3"]
    assert q.encode("Hello world", add_special_tokens=False) == [9707, 1879]
    assert q.convert_tokens_to_ids(["<|endoftext|>", "<|im_start|>", "<|im_end|>"]) == [151643, 151644, 151645]
    assert (q.eos_token_id, q.pad_token_id, q.bos_token_id, len(q)) == (151643, 151643, None, 151669)
    assert s.encode("Hello world", add_special_tokens=False) == [9906, 1917]
    assert s.convert_tokens_to_ids(["<|begin_of_text|>", "<|end_of_text|>", "<|finetune_right_pad_id|>"]) == \
        [128000, 128001, 128004]
    assert s.convert_tokens_to_ids(["<think>", "</think>", "<|im_start|>", "<|im_end|>"]) == \
        [128002, 128003, 128011, 128012]
    assert (s.bos_token_id, s.eos_token_id, s.pad_token_id, len(s)) == (128000, 128001, 128004, 128256)
    # digits: Qwen one at a time, Llama-3 in runs of up to three
    assert [q.decode([i]) for i in q.encode("12345", add_special_tokens=False)] == list("12345")
    assert [s.decode([i]) for i in s.encode("12345", add_special_tokens=False)] == ["123", "45"]


def test_equal_to_the_reference_and_round_trip_on_every_benchmark(tok, corpus):
    name, t = tok
    ref = vocab.reference_encoder(name)
    assert len(corpus) > 5000
    ids = t(corpus, add_special_tokens=False)["input_ids"]
    wrong = [x for x, got in zip(corpus, ids) if got != list(ref.encode_ordinary(x))]
    assert not wrong, f"{name}: {len(wrong)} texts encode otherwise than the reference, e.g. {wrong[0][:80]!r}"
    norm = (lambda x: unicodedata.normalize("NFC", x)) if name == "qwen3" else (lambda x: x)
    back = t.batch_decode(ids, clean_up_tokenization_spaces=False)
    bad = [x for x, b in zip(corpus, back) if b != norm(x)]
    assert not bad, f"{name}: {len(bad)} texts do not round-trip, e.g. {bad[0][:80]!r}"


def test_normalisation_is_qwen_only(toks):
    nfd = unicodedata.normalize("NFD", "café 𝑥² Å")
    assert nfd != unicodedata.normalize("NFC", nfd)
    q, s = toks["qwen3"], toks["smollm3"]
    assert q.decode(q.encode(nfd, add_special_tokens=False)) == unicodedata.normalize("NFC", nfd)
    assert s.decode(s.encode(nfd, add_special_tokens=False)) == nfd


def test_ranks_to_merges_worked_example():
    """Ranks a=0 b=1 c=2 ab=3 bc=4 abc=5: 'abc' splits as ab+c and a+bc (both parts ranked); ordered by the merged
    token's rank, then the parts' ranks; bytes written in the byte-level alphabet (' ' is 'Ġ')."""
    ranks = {b"a": 0, b"b": 1, b"c": 2, b"ab": 3, b"bc": 4, b"abc": 5, b" ": 6, b" a": 7}
    v, merges = vocab.vocab_and_merges(ranks)
    assert v == {"a": 0, "b": 1, "c": 2, "ab": 3, "bc": 4, "abc": 5, "Ġ": 6, "Ġa": 7}
    assert merges == [("a", "b"), ("b", "c"), ("a", "bc"), ("ab", "c"), ("Ġ", "a")]


def test_built_once_then_read_from_the_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("GRAFTZOO_CACHE", str(tmp_path))
    vocab.cached_vocab_path.cache_clear()
    try:
        folder = vocab.cached_vocab_path("smollm3")
        assert folder.parent == tmp_path / "vocab" and (folder / "tokenizer.json").is_file()
        stamp = (folder / "tokenizer.json").stat().st_mtime_ns
        vocab.cached_vocab_path.cache_clear()
        assert vocab.cached_vocab_path("smollm3") == folder
        assert (folder / "tokenizer.json").stat().st_mtime_ns == stamp
        assert not [p for p in (tmp_path / "vocab").iterdir() if p.name.startswith(".")]  # no half-written build
        with pytest.raises(ValueError, match="unknown real tokenizer 'llama9'.*qwen3, smollm3"):
            vocab.cached_vocab_path("llama9")
    finally:
        vocab.cached_vocab_path.cache_clear()
