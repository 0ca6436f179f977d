"""Tiny heterogeneous model pair built in code (nothing downloaded) for the CPU demo.

Two families that differ in every part a cross-tokenizer method cares about
(docs/results.md):

- ``qwen2``: ``Qwen2ForCausalLM`` (RoPE, GQA, RMSNorm, SwiGLU, tied embeddings), usually with the
  ``char`` tokenizer (one token per character);
- ``gpt2``: ``GPT2LMHeadModel`` (learned absolute positions, LayerNorm, GELU), usually with the
  ``digit_pair`` tokenizer (digit runs split into 2-digit chunks from the left, ``2082`` ->
  ``20``, ``82``; one token per other character);
- ``llama``: ``LlamaForCausalLM`` (RoPE, GQA, RMSNorm, SwiGLU, an untied head), the third family of the CPU
  populations, with the ``digit_triple`` tokenizer (digit runs in chunks of up to three from the left, as Llama-3
  splits numbers: ``20823`` -> ``208``, ``23``; ``micro3``) or ``digit_rpair`` (pairs aligned to place value from
  the right, ``208`` -> ``2``, ``08``; ``tiny3``: a 96-wide model learns little arithmetic from a thousand
  three-digit tokens in a warm-up, as the SmolLM3 miniature does not at 64 wide).

Both tokenizers are real Hugging Face fast tokenizers (a ``tokenizers`` WordLevel model with a
regex Split pre-tokenizer and a Fuse decoder), so ``save_pretrained`` / ``AutoTokenizer``,
``decode(skip_special_tokens=True)`` and ``apply_chat_template`` work, and decoding round-trips
text exactly: peers exchange text and re-tokenize it. The chat template renders a user turn
as the compact prompt ``Q:{content}\\n`` and an assistant turn as ``{content}<eos>``.

Load a saved tiny tokenizer with ``load_tokenizer(path)``, not ``AutoTokenizer``: for a directory
that also holds a ``qwen2`` model config, transformers 5 forces its own ``Qwen2Tokenizer`` (byte-level
BPE) over the saved ``tokenizer.json`` and silently drops characters such as ``\n``. An exported model
(``graftzoo export``) that other tools load with ``AutoTokenizer`` gets ``byte_level_tokenizer(tok)``
instead: the same ids, written in byte-level symbols, which ``Qwen2Tokenizer`` reads correctly.

Padding is on the left; callers pass ``position_ids(attention_mask)`` so a left-padded row
sees the same positions as an unpadded one (docs/results.md).
"""
from __future__ import annotations

import string
from dataclasses import asdict, dataclass, field, fields, replace
from typing import Any, Mapping, Optional

import torch
from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers
from transformers import (GPT2Config, GPT2LMHeadModel, LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast,
                          Qwen2Config,
                          Qwen2ForCausalLM, Qwen3Config, Qwen3ForCausalLM, SmolLM3Config, SmolLM3ForCausalLM)

from graftzoo.envs.arithmetic import SKILLS
from graftzoo.envs.templates import render_prompt
from graftzoo.tiny import vocab as real_vocab

PAD, EOS, BOS, UNK = "<pad>", "<eos>", "<bos>", "<unk>"
SPECIALS = (PAD, EOS, BOS, UNK)
# Every character of the compact template "Q:{question}\n" and of the arithmetic scratchpads.
CHARS = tuple(string.digits) + tuple("+-*=()Q: \n")
PROMPT_TEMPLATE = "Q:{question}\n"
CHAT_TEMPLATE = (
    "{% for m in messages %}"
    "{% if m['role'] == 'user' %}Q:{{ m['content'] }}\n"
    "{% elif m['role'] == 'assistant' %}{{ m['content'] }}{{ eos_token }}"
    "{% else %}{{ m['content'] }}\n{% endif %}"
    "{% endfor %}"
)
# The paper's families in miniature (docs/guide.md#the-papers-families-in-miniature): the real tokenizers
# (graftzoo.tiny.vocab) with the published models' embedding rows (Qwen3 pads its 151,669 tokens to 151,936).
REAL_VOCABS = {"qwen3": 151936, "smollm3": 128256}
TOKENIZERS = ("char", "digit_pair", "digit_rpair", "digit_triple", *REAL_VOCABS)
FAMILIES = ("qwen2", "gpt2", "llama", "qwen3", "smollm3")


def compact_prompt(question: str) -> str:
    """The compact prompt the tiny models are warmed up on: ``Q:{question}\\n``."""
    return PROMPT_TEMPLATE.format(question=question)


def warmup_template(tokenizer: str) -> str:
    """The prompt template a tiny model is warmed up on and trains with: ``plain`` (the paper's base-model format)
    for a real vocabulary, ``compact`` for the character-level ones, which hold no English letters."""
    return "plain" if tokenizer in REAL_VOCABS else "compact"


def warmup_prompt(question: str, tokenizer: str) -> str:
    """``question`` rendered as a tiny model with tokenizer kind ``tokenizer`` is warmed up on it."""
    return render_prompt(question, warmup_template(tokenizer))


def warmup_answer(solution: str, tokenizer: str) -> str:
    """The completion a tiny model is warmed up on: the scratchpad, after a space where the prompt ends in a word
    (``Solution: 12+34=...``), as a base model continues the plain template."""
    return (" " + solution) if tokenizer in REAL_VOCABS else solution


def build_tokenizer(kind: str) -> PreTrainedTokenizerFast:
    """A left-padding fast tokenizer: ``char`` (one token per character), ``digit_pair``, or a real vocabulary
    (``qwen3``, ``smollm3``: graftzoo.tiny.vocab, built once and cached)."""
    if kind in REAL_VOCABS:
        return real_vocab.cached_vocab(kind)
    if kind == "char":
        pieces = list(CHARS)
        pattern = r"[\s\S]"
    elif kind == "digit_pair":
        pieces = [f"{i:02d}" for i in range(100)] + list(CHARS)
        pattern = r"\d\d|[\s\S]"
    elif kind == "digit_rpair":  # pairs aligned to place value, from the right: 208 -> 2, 08 (its own ids)
        pieces = list(CHARS) + [f"{i:02d}" for i in range(100)]
        pattern = r"\d{1,2}(?=(?:\d\d)*(?!\d))|[\s\S]"
    elif kind == "digit_triple":  # as Llama-3 splits numbers: runs of up to three digits from the left
        pieces = [f"{i:03d}" for i in range(1000)] + [f"{i:02d}" for i in range(100)] + list(CHARS)
        pattern = r"\d{1,3}|[\s\S]"
    else:
        raise ValueError(f"tiny: unknown tokenizer {kind!r}; expected one of {TOKENIZERS}")
    vocab = {tok: i for i, tok in enumerate(list(SPECIALS) + pieces)}
    core = Tokenizer(models.WordLevel(vocab=vocab, unk_token=UNK))
    core.pre_tokenizer = pre_tokenizers.Split(Regex(pattern), behavior="isolated")
    core.decoder = decoders.Fuse()
    return PreTrainedTokenizerFast(
        tokenizer_object=core, pad_token=PAD, eos_token=EOS, bos_token=BOS, unk_token=UNK,
        padding_side="left", clean_up_tokenization_spaces=False, chat_template=CHAT_TEMPLATE,
        model_max_length=1024)


def byte_level_tokenizer(tok: PreTrainedTokenizerFast) -> PreTrainedTokenizerFast:
    """The same tokenizer (ids, specials, padding side, chat template) as a byte-level BPE without merges, for
    export: ``AutoTokenizer`` forces ``Qwen2Tokenizer`` on a qwen2 model folder, which reads the vocabulary and
    merges of ``tokenizer.json`` but replaces its pre-tokenizer and decoder by byte-level ones; with every piece
    written in byte-level symbols both that class and a plain ``tokenizer.json`` reader give the original ids and
    texts. Only for tokenizers whose pieces are single ASCII characters (``char``); others raise ``ValueError``."""
    specials = set(tok.all_special_tokens)
    table = real_vocab.byte_symbols()
    vocab = {}
    for piece, i in tok.get_vocab().items():
        if piece not in specials and (len(piece) != 1 or ord(piece) > 127):
            raise ValueError(f"tiny: tokenizer piece {piece!r} is not one ASCII character; only a 'char' tokenizer "
                             f"has a byte-level equivalent")
        vocab[piece if piece in specials else table[ord(piece)]] = i
    core = Tokenizer(models.BPE(vocab=vocab, merges=[], unk_token=tok.unk_token, fuse_unk=False))
    core.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    core.decoder = decoders.ByteLevel()
    return PreTrainedTokenizerFast(
        tokenizer_object=core, pad_token=tok.pad_token, eos_token=tok.eos_token, bos_token=tok.bos_token,
        unk_token=tok.unk_token, padding_side=tok.padding_side, clean_up_tokenization_spaces=False,
        chat_template=tok.chat_template, model_max_length=tok.model_max_length)


def load_tokenizer(path) -> PreTrainedTokenizerFast:
    """A saved tiny tokenizer, read from its own ``tokenizer.json`` (see the module docstring)."""
    tok = PreTrainedTokenizerFast.from_pretrained(path)
    if len(tok) > 1000:  # a real vocabulary (graftzoo.tiny.vocab)
        return tok
    probe = "Q:12+345\n"
    if tok.decode(tok(probe, add_special_tokens=False)["input_ids"]) != probe:
        raise ValueError(f"tiny: tokenizer at {path} does not round-trip {probe!r}; is it a tiny tokenizer?")
    return tok


@dataclass
class WarmupSpec:
    """The supervised warm-up recipe (graftzoo.tiny.warmup). ``seed`` is the default warm-up seed.

    ``stop_when`` ({skill: greedy accuracy}) ends the run early, at the first probe (every
    ``probe_every`` steps, on ``probe_per_skill`` held-out problems per skill; skills are checked
    in order, the rest skipped once one falls short) where every listed skill reaches its
    threshold; ``steps`` stays the cap and sets the lr schedule. Stopping on a measured level
    rather than a step count lands the skill profile in its band across seeds and machines,
    where a fixed step count does not (a weak skill sits on a steep part of its learning curve).

    ``then`` (a mapping of these same keys) continues training from the checkpoint this recipe
    produces: the model is warmed exactly as without ``then`` (that checkpoint is cached on its
    own), then trained further on fresh problems with the second recipe (keys it does not give are
    the first phase's; its ``steps`` count the second phase alone). It makes a *stronger
    checkpoint of the same model* (the positive control: same family, tokenizer and first
    phase as the learner, then more steps on the learner's weak skill until ``then.stop_when``).
    """

    steps: int = 1000
    batch: int = 32
    lr: float = 4e-3
    warmup_steps: int = 30
    min_lr_ratio: float = 0.1
    weight_decay: float = 0.01
    betas: tuple = (0.9, 0.98)
    grad_clip: float = 1.0
    mix: dict = field(default_factory=lambda: {"add": 0.5, "mul": 0.5})
    difficulty: Any = 3  # int or {skill: int}
    seed: int = 0
    probe_per_skill: int = 64
    stop_when: Optional[dict] = None
    probe_every: int = 50
    then: Optional["WarmupSpec"] = None

    def __post_init__(self):
        if isinstance(self.then, Mapping):  # keys not given are the first phase's
            first = {f.name: getattr(self, f.name) for f in fields(self) if f.name != "then"}
            unknown = sorted(set(self.then) - set(first) - {"then"})
            if unknown:
                raise ValueError(f"warmup.then: unknown key(s) {unknown}; known: {sorted(first)}")
            self.then = WarmupSpec(**{**first, **self.then})
        if isinstance(self.betas, list):
            self.betas = tuple(self.betas)
        bad = sorted(set(self.stop_when or {}) - set(SKILLS))
        if bad:
            raise ValueError(f"warmup.stop_when key(s) {bad} are not skills {SKILLS}")

    def first_phase(self) -> "WarmupSpec":
        """This recipe without ``then``: the checkpoint a continuation starts from."""
        return replace(self, then=None)


@dataclass
class TinyModelSpec:
    """Architecture of one tiny model plus its warm-up recipe (configs/pairs/tiny.yaml ``models:``)."""

    id: str
    family: str  # one of FAMILIES
    tokenizer: str  # one of TOKENIZERS
    hidden: int
    layers: int
    heads: int
    ffn: int
    kv_heads: Optional[int] = None  # qwen2, qwen3, smollm3; None = heads
    max_positions: int = 128
    warmup: WarmupSpec = field(default_factory=WarmupSpec)

    def __post_init__(self):
        if self.family not in FAMILIES:
            raise ValueError(f"tiny spec {self.id!r}: family {self.family!r} not in {FAMILIES}")
        if self.tokenizer not in TOKENIZERS:
            raise ValueError(f"tiny spec {self.id!r}: tokenizer {self.tokenizer!r} not in {TOKENIZERS}")
        if self.hidden % self.heads:
            raise ValueError(f"tiny spec {self.id!r}: hidden {self.hidden} not divisible by heads {self.heads}")
        if self.kv_heads is not None and self.heads % self.kv_heads:
            raise ValueError(f"tiny spec {self.id!r}: heads {self.heads} not divisible by kv_heads {self.kv_heads}")
        if isinstance(self.warmup, Mapping):
            try:
                self.warmup = _from_mapping(WarmupSpec, self.warmup, "warmup")
            except ValueError as e:
                raise ValueError(f"tiny spec {self.id!r}: {e}") from None

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> "TinyModelSpec":
        """From a ``models:`` entry of a pair config; ``kind: tiny`` is accepted and dropped."""
        d = dict(d)
        kind = d.pop("kind", "tiny")
        if kind != "tiny":
            raise ValueError(f"tiny spec {d.get('id')!r}: kind {kind!r} is not 'tiny'")
        return _from_mapping(cls, d, f"tiny spec {d.get('id')!r}")

    def to_dict(self) -> dict:
        """Plain data (the warm-up cache key hashes it); ``then`` appears only when set, so specs without a
        continuation keep the keys they had before it existed."""
        d = asdict(self)
        w = d["warmup"]
        while w is not None:
            w["betas"] = list(w["betas"])
            nxt = w.pop("then")
            if nxt is not None:
                w["then"] = nxt
            w = nxt
        return d


def _from_mapping(cls, d: Mapping[str, Any], where: str):
    known = {f.name for f in fields(cls)}
    unknown = sorted(set(d) - known)
    if unknown:
        raise ValueError(f"{where}: unknown key(s) {unknown}; known: {sorted(known)}")
    return cls(**d)


def tiny_config(spec: TinyModelSpec, tok: Optional[PreTrainedTokenizerFast] = None):
    """The transformers config of a tiny model (its tokenizer's ids and vocabulary size)."""
    tok = tok or build_tokenizer(spec.tokenizer)
    ids = dict(vocab_size=REAL_VOCABS.get(spec.tokenizer, len(tok)), bos_token_id=tok.bos_token_id,
               eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id)
    kv = spec.kv_heads or spec.heads
    if spec.family == "qwen3":  # q/k-norm, GQA, head_dim decoupled from hidden / heads as in the published config
        return Qwen3Config(hidden_size=spec.hidden, intermediate_size=spec.ffn, num_hidden_layers=spec.layers,
                           num_attention_heads=spec.heads, num_key_value_heads=kv, head_dim=spec.hidden // spec.heads,
                           max_position_embeddings=spec.max_positions, tie_word_embeddings=True,
                           attention_dropout=0.0, rope_parameters={"rope_type": "default", "rope_theta": 1000000.0},
                           **ids)
    if spec.family == "smollm3":  # every 4th layer without RoPE (NoPE), GQA, tied embeddings
        return SmolLM3Config(hidden_size=spec.hidden, intermediate_size=spec.ffn, num_hidden_layers=spec.layers,
                             num_attention_heads=spec.heads, num_key_value_heads=kv, no_rope_layer_interval=4,
                             max_position_embeddings=spec.max_positions, tie_word_embeddings=True,
                             attention_dropout=0.0, rope_parameters={"rope_type": "default", "rope_theta": 5000000.0},
                             **ids)
    if spec.family == "llama":  # RoPE, GQA, RMSNorm, SwiGLU, untied head (a third family of the CPU population)
        return LlamaConfig(hidden_size=spec.hidden, intermediate_size=spec.ffn, num_hidden_layers=spec.layers,
                           num_attention_heads=spec.heads, num_key_value_heads=kv,
                           max_position_embeddings=spec.max_positions, tie_word_embeddings=False,
                           attention_dropout=0.0, **ids)
    if spec.family == "qwen2":
        return Qwen2Config(hidden_size=spec.hidden, intermediate_size=spec.ffn, num_hidden_layers=spec.layers,
                           num_attention_heads=spec.heads, num_key_value_heads=spec.kv_heads or spec.heads,
                           max_position_embeddings=spec.max_positions, tie_word_embeddings=True,
                           attention_dropout=0.0, **ids)
    return GPT2Config(n_embd=spec.hidden, n_layer=spec.layers, n_head=spec.heads, n_inner=spec.ffn,
                      n_positions=spec.max_positions, resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0,
                      tie_word_embeddings=True, **ids)


def build_tiny(spec: TinyModelSpec, seed: int) -> tuple[torch.nn.Module, PreTrainedTokenizerFast]:
    """Randomly initialised model (seeded) and its tokenizer, from ``spec``."""
    tok = build_tokenizer(spec.tokenizer)
    cfg = tiny_config(spec, tok)
    torch.manual_seed(seed)
    model = MODEL_CLASSES[spec.family](cfg)
    gc = model.generation_config
    gc.bos_token_id, gc.eos_token_id, gc.pad_token_id = tok.bos_token_id, tok.eos_token_id, tok.pad_token_id
    return model, tok


MODEL_CLASSES = {"qwen2": Qwen2ForCausalLM, "gpt2": GPT2LMHeadModel, "llama": LlamaForCausalLM,
                 "qwen3": Qwen3ForCausalLM,
                 "smollm3": SmolLM3ForCausalLM}


def position_ids(attention_mask: torch.Tensor) -> torch.Tensor:
    """Positions that ignore left padding: cumsum(mask) - 1, and 0 on padded slots (docs/results.md)."""
    pos = attention_mask.long().cumsum(-1) - 1
    return pos.masked_fill(attention_mask == 0, 0)
