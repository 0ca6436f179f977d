"""Build a Policy from a model spec in a pair config (configs/pairs/*.yaml ``models:``).

``kind: tiny`` — a tiny model built in code (graftzoo.tiny.build) and warmed up once, cached on disk.
``kind: hf``   — a Hugging Face causal LM by hub id or local path (real pairs, GPUs).
Per-model keys understood here (all kinds): ``id``, ``kind``, ``template``, ``max_new_tokens``, ``lr``, ``device``
(default ``run.device``), ``gradient_checkpointing`` (default ``model.gradient_checkpointing``), ``dtype``,
``num_workers`` (``--backend ray``: the ranks of the model's worker group, its parameters sharded over them by FSDP2;
default 1).
"""
from __future__ import annotations

import copy

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer
from transformers.utils import logging as hf_logging

from graftzoo.core.engine import HFEngine
from graftzoo.core.policy import Policy
from graftzoo.core.config import algo_config
from graftzoo.core.schema import ConfigError
from graftzoo.core.vllm_engine import VLLMEngine
from graftzoo.tiny.build import TinyModelSpec
from graftzoo.tiny.warmup import load_or_warmup, load_tiny, load_tokenizer

PER_MODEL_KEYS = ("template", "max_new_tokens", "lr", "device", "gradient_checkpointing", "num_workers")


def split_spec(spec: dict) -> tuple[dict, dict]:
    spec = dict(spec)
    local = {k: spec.pop(k) for k in PER_MODEL_KEYS if k in spec}
    return spec, local


def tiny_spec(spec: dict) -> TinyModelSpec:
    """The TinyModelSpec of a ``kind: tiny`` pair.models entry (its per-model keys, ``dtype`` and ``arch`` aside)."""
    base, _ = split_spec(spec)
    return TinyModelSpec.from_dict({k: v for k, v in base.items() if k not in ("dtype", "arch")})


def load_model(spec: dict, seed: int = 0, progress=None):
    """(model, tokenizer, tokenizer_id) for a spec (without the per-model keys)."""
    hf_logging.disable_progress_bar()  # "Loading weights" bars for every model load clutter the run output
    kind = spec.get("kind", "tiny")
    if kind == "tiny":
        ts = tiny_spec(spec)
        dtype = spec.get("dtype")  # e.g. bfloat16, to train a tiny model as a real one would be
        path = load_or_warmup(ts, progress=progress)
        model, tok = load_tiny(path)
        if dtype is not None:
            model.to(getattr(torch, dtype))
        return model, tok, f"{ts.tokenizer}"
    if kind == "hf":
        path = spec.get("path") or spec["id"]
        dtype = getattr(torch, spec.get("dtype", "bfloat16"))
        model = AutoModelForCausalLM.from_pretrained(path, dtype=dtype)
        tok = AutoTokenizer.from_pretrained(path)
        if tok.pad_token_id is None:
            tok.pad_token = tok.eos_token
        return model, tok, spec.get("tokenizer_id", path)
    raise ValueError(f"model '{spec.get('id')}': unknown kind {kind!r} (tiny | hf)")


def load_tokenizer_of(spec: dict, progress=None) -> tuple:
    """(tokenizer, tokenizer_id) of a pair.models entry without loading its model (a tiny model is warmed up into the
    cache first, once, so that the workers of a Ray group only read it)."""
    base, _ = split_spec(spec)
    if base.get("kind", "tiny") == "tiny":
        ts = tiny_spec(spec)
        return load_tokenizer(load_or_warmup(ts, progress=progress)), f"{ts.tokenizer}"
    path = base.get("path") or base["id"]
    tok = AutoTokenizer.from_pretrained(path)
    if tok.pad_token_id is None:
        tok.pad_token = tok.eos_token
    return tok, base.get("tokenizer_id", path)


def build_policy(spec: dict, cfg: dict, seed: int = 0, progress=None) -> Policy:
    base, local = split_spec(spec)
    model, tok, tok_id = load_model(base, seed, progress)
    autocast = apply_precision(model, cfg["optim"]["precision"])
    if local.get("gradient_checkpointing", cfg["model"]["gradient_checkpointing"]):
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    model.to(local.get("device", cfg["run"]["device"])).train()
    optim = copy.deepcopy(cfg["optim"])
    if "lr" in local:
        optim["lr"] = local["lr"]
    pol = Policy(base["id"], model, tok, template=local.get("template", cfg["pair"]["template"]), optim=optim,
                 temperature=cfg["rollout"]["temperature"], max_prompt_tokens=cfg["rollout"]["max_prompt_tokens"],
                 tokenizer_id=tok_id)
    pol.max_response_tokens = int(local.get("max_new_tokens", cfg["rollout"]["max_new_tokens"]))
    pol.autocast_dtype = autocast
    pol.max_tokens_per_micro = cfg["optim"]["max_tokens_per_micro"]
    pol.optim_cfg = optim  # the run's optim.* with this model's lr: a worker rebuilds the optimizer after sharding
    return pol


def make_ref(policy: Policy) -> Policy:
    """A frozen copy of ``policy`` (the KL reference: its initial weights), sharing the tokenizer."""
    ref = copy.copy(policy)
    ref.model = copy.deepcopy(policy.model).eval()
    ref.optimizer = ref.scheduler = None
    for q in ref.model.parameters():
        q.requires_grad_(False)
    return ref


class InProcess:
    """``run.backend: inprocess``: every model, its optimizer and its rollout engine in the trainer's process."""

    def build(self, cfg: dict, specs: list, train_ids: list, seed: int) -> tuple[dict, dict, dict]:
        """(policies, engines, KL references) of the trained models; engines built one at a time, so that
        ``close`` ends those built when a later one fails."""
        torch.manual_seed(seed)
        self.engines: dict = {}
        policies = {s["id"]: build_policy(s, cfg, seed) for s in specs if s["id"] in train_ids}
        check_context(cfg, policies)
        for m, p in policies.items():
            self.engines[m] = build_engine(p, cfg)
        refs = {m: make_ref(p) for m, p in policies.items()} if wants_ref(cfg) else {}
        return policies, self.engines, refs

    def close(self) -> None:
        engines, self.engines = getattr(self, "engines", {}), {}
        for engine in engines.values():
            engine.close()


def wants_ref(cfg: dict) -> bool:
    """Whether the run's learner needs the KL reference policy (``algo.beta_kl > 0``)."""
    return getattr(algo_config(cfg), "beta_kl", 0) > 0


def check_context(cfg: dict, policies: dict) -> None:
    """``rollout.max_new_tokens`` must leave room for a prompt in every model's context window."""
    for m, p in policies.items():
        if int(cfg["rollout"]["max_new_tokens"]) >= p.context_window:
            raise ConfigError(f"config key 'rollout.max_new_tokens' ({cfg['rollout']['max_new_tokens']}) must be "
                              f"below model {m!r}'s context window of {p.context_window} tokens")


def apply_precision(model, precision: str):
    """``optim.precision`` applied to a loaded model; returns the forward's autocast dtype (None: none).
    ``auto`` trains a model loaded in 16 bits as ``bf16-mixed`` (AdamW on bfloat16 parameters loses updates
    smaller than their rounding: at lr 1e-6 most of them), any other as ``fp32``; ``bf16-mixed`` keeps float32
    master parameters and computes the forward in bfloat16; ``model`` trains in the dtype it was loaded in."""
    precision = resolve_precision(precision, next(model.parameters()).dtype in (torch.bfloat16, torch.float16))
    if precision in ("fp32", "bf16-mixed"):
        model.float()
    return torch.bfloat16 if precision == "bf16-mixed" else None


def resolve_precision(precision: str, loaded_16bit: bool) -> str:
    """``optim.precision`` with ``auto`` resolved: ``bf16-mixed`` for a model loaded in 16 bits, else ``fp32``."""
    if precision != "auto":
        return precision
    return "bf16-mixed" if loaded_16bit else "fp32"


ENGINES = {"hf": HFEngine, "vllm": VLLMEngine}  # rollout.engine -> engine (vllm is imported when one starts)


def build_engine(policy: Policy, cfg: dict):
    """The rollout engine ``rollout.engine`` names, with the run's sampling settings (``rollout.*``)."""
    r = cfg["rollout"]
    if r["engine"] not in ENGINES:
        raise ValueError(f"config key 'rollout.engine' must be one of {sorted(ENGINES)}, got {r['engine']!r}")
    return ENGINES[r["engine"]](policy, temperature=r["temperature"], top_p=r["top_p"], top_k=r["top_k"],
                                max_new_tokens=policy.max_response_tokens, gen_batch_size=r["gen_batch_size"],
                                settings=r.get("vllm"), seed=int(cfg["run"]["seed"]))
