"""Build a Policy from a model spec in a pair config (configs/pairs/*.yaml ``models:``).

``kind: tiny`` — a tiny model built in code (graftzoo.tiny.build) and warmed up once, cached on disk.
``kind: hf``   — a Hugging Face causal LM by hub id or local folder (``id``, or ``path`` with ``id`` as its name);
                ``check_hf_model`` resolves it before the run directory exists (one error line, no retries).
An entry is a ``graftzoo.contract.config.ModelSpec``, validated and resolved by ``load_config``: its keys that
stand for run keys (``template``, ``stop``, ``max_new_tokens``, ``lr``, ``device``, ``gradient_checkpointing``,
``num_workers``: with ``--backend ray`` the ranks of the model's worker group, its parameters sharded over them by
FSDP2; ``lora``; ``attn_implementation``, set on the loaded model by ``set_attention``) hold the model's values,
its own or the run's, and ``dtype`` its load dtype (bfloat16 for ``kind: hf`` unless given, as saved for ``kind:
tiny``).

A group of more than one rank builds its model with ``build_sharded_policy``: the model on the meta device from its
folder's ``config.json``, sharded, and each rank's rows read from the safetensors files (``fsdp.materialize``), so
that no rank holds the whole model; it is the policy ``build_policy`` and ``fsdp.shard_policy`` make.
"""
from __future__ import annotations

import contextlib
import copy
import logging
import os
import socket
from functools import lru_cache
from pathlib import Path
from typing import Optional
from urllib.parse import urlparse

import torch
from huggingface_hub import constants as hf_constants
from huggingface_hub import hf_hub_download, try_to_load_from_cache
from safetensors import safe_open
from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer, GenerationConfig
from transformers.utils import logging as hf_logging

from graftzoo.training.models import fsdp
from graftzoo.training.models import lora as lora_mod
from graftzoo.training.engines.engine import HFEngine
from graftzoo.training.models.policy import Policy, context_of
from graftzoo.contract.config import TINY_KEYS, ModelSpec, RunConfig, model_folder, trained_ids, with_values
from graftzoo.contract.output import libraries_shown, wait
from graftzoo.contract.errors import ConfigError
from graftzoo.training.engines.vllm_engine import VLLMEngine
from graftzoo.envs.templates import resolve_stop, resolve_template
from graftzoo.eval.evaluate import eval_top_p
from graftzoo.tiny.build import TinyModelSpec, warmup_template
from graftzoo.tiny.warmup import load_or_warmup, load_tokenizer

log = logging.getLogger("graftzoo")


def tiny_spec(spec: ModelSpec) -> TinyModelSpec:
    """The TinyModelSpec of a ``kind: tiny`` pair.models entry: its id and the tiny keys it gives."""
    return TinyModelSpec.from_dict({"id": spec.id, **{k: getattr(spec, k) for k in TINY_KEYS
                                                      if getattr(spec, k) is not None}})


def spec_dtype(spec: ModelSpec) -> Optional[torch.dtype]:
    """The torch dtype a pair.models entry's weights load in (its resolved ``dtype``; None: as saved)."""
    return None if spec.dtype is None else getattr(torch, spec.dtype)


@lru_cache(maxsize=8)
def tiny_tokenizer(path: str):
    """The tokenizer of a warmed-up tiny model's folder, read once per process and shared (a real vocabulary takes
    about 2 s to load; ``prompt_limits`` and ``load_model`` both ask for it)."""
    return load_tokenizer(path)


def load_model(spec: ModelSpec, seed: int = 0, progress=None):
    """(model, tokenizer, tokenizer_id) of a pair.models entry."""
    if not libraries_shown():  # "Loading weights" bars for every model load clutter the run output (not --debug)
        hf_logging.disable_progress_bar()
    if spec.kind == "tiny":
        ts = tiny_spec(spec)
        dtype = spec_dtype(spec)  # e.g. bfloat16, to train a tiny model as a real one would be
        path = load_or_warmup(ts, progress=progress)
        model = AutoModelForCausalLM.from_pretrained(path)
        model.eval()
        tok = tiny_tokenizer(path)
        if dtype is not None:
            model.to(dtype)
        set_attention(model, spec)
        return model, tok, f"{ts.tokenizer}"
    path, local_only = check_hf_model(spec)
    try:
        model = AutoModelForCausalLM.from_pretrained(path, dtype=spec_dtype(spec), local_files_only=local_only)
    except (OSError, ValueError) as e:
        raise ConfigError(f"model '{spec.id}': cannot load its weights from {path}: {_one_line(e)}") from e
    set_attention(model, spec)
    tok = hf_tokenizer(spec, path, local_only)
    return model, tok, spec.tokenizer_id or path


def set_attention(model, spec: ModelSpec) -> None:
    """Give a loaded model its entry's attention implementation (``attn_implementation``: its own, else
    ``model.attn_implementation``); ``auto`` leaves the one transformers chose at load untouched (sdpa, eager
    where the model lacks it). ``optim.packing: auto`` packs with the ones that skip masked blocks only
    (docs/scaling.md#memory-bounded-updates). One the model or this machine cannot run is a ``ConfigError``."""
    attn = spec.attn_implementation
    if attn in (None, "auto"):
        return
    try:
        model.set_attn_implementation(attn)
    except (ValueError, ImportError) as e:
        raise ConfigError(f"config key '{spec.key_of('attn_implementation')}' is {attn!r}, which model "
                          f"'{spec.id}' cannot run here: {_one_line(e)}") from None


def load_tokenizer_of(spec: ModelSpec, progress=None) -> tuple:
    """(tokenizer, tokenizer_id) of a pair.models entry without loading its model (a tiny model is warmed up into the
    cache first, once, so that the workers of a Ray group only read it)."""
    if spec.kind == "tiny":
        ts = tiny_spec(spec)
        return tiny_tokenizer(load_or_warmup(ts, progress=progress)), f"{ts.tokenizer}"
    path, local_only = check_hf_model(spec)
    return hf_tokenizer(spec, path, local_only), spec.tokenizer_id or path


HUB_PROBE_S = 3.0  # seconds to reach the hub before a model that is not cached is refused


def _one_line(e: BaseException) -> str:
    return f"{type(e).__name__}: {' '.join(str(e).split())[:300]}"


def _hub_offline() -> bool:
    return bool(hf_constants.HF_HUB_OFFLINE) or os.environ.get("HF_HUB_OFFLINE", "").upper() in ("1", "ON", "YES",
                                                                                                  "TRUE")


def hub_unreachable() -> str | None:
    """Why the Hugging Face hub (``HF_ENDPOINT``) cannot be reached (one TCP connection, ``HUB_PROBE_S`` at most),
    or None. huggingface_hub itself retries an unreachable hub for ~25 s per file before it gives up."""
    url = urlparse(hf_constants.ENDPOINT)
    try:
        socket.create_connection((url.hostname, url.port or (443 if url.scheme == "https" else 80)),
                                 timeout=HUB_PROBE_S).close()
    except OSError as e:
        return f"{hf_constants.ENDPOINT}: {e.strerror or type(e).__name__}"
    return None


def _cached(repo: str) -> bool:
    """Whether the hub model ``repo`` is in the local Hugging Face cache (its config and weights)."""
    def hit(name):
        return isinstance(try_to_load_from_cache(repo, name), str)
    return hit("config.json") and any(hit(w) for w in ("model.safetensors", "model.safetensors.index.json",
                                                       "pytorch_model.bin", "pytorch_model.bin.index.json"))


def check_hf_model(spec: ModelSpec) -> tuple[str, bool]:
    """Resolve a ``kind: hf`` model before anything is built: (where to load it from, load from local files only).
    A local folder (``path``, or an ``id`` that is one) must hold a ``config.json``, weights and tokenizer files; a
    hub id must be in the local cache or on a reachable hub. Anything else is one ``ConfigError`` naming the model
    and why, in seconds (``HF_HUB_OFFLINE=1``, or an unreachable hub, means the cache only)."""
    mid = spec.id
    src = str(spec.path or mid)
    folder = model_folder(spec)  # a local folder, checked with the file system only (before torch, in the CLI)
    if folder is not None:
        return folder, True
    if _cached(src):
        return src, _hub_offline() or hub_unreachable() is not None
    where = f"not a local folder and not in the Hugging Face cache ({hf_constants.HF_HUB_CACHE})"
    if _hub_offline():
        raise ConfigError(f"model '{mid}': {where}, and HF_HUB_OFFLINE is set: download it first "
                          f"(`hf download {src}`) or give its folder as the model's path")
    why = hub_unreachable()
    if why:
        raise ConfigError(f"model '{mid}': {where}, and the hub cannot be reached ({why}): download it where "
                          f"there is network (`hf download {src}`) or give its folder as the model's path")
    try:
        hf_hub_download(src, "config.json")
    except Exception as e:  # unknown repo, gated, invalid id, ...
        raise ConfigError(f"model '{mid}': cannot resolve it on the hub: {_one_line(e)}") from None
    return src, False


def check_models(cfg: RunConfig) -> None:
    """The pre-flight check of every trained ``kind: hf`` model (``check_hf_model``), before a run directory is
    made: a model that cannot be loaded fails the run in one line, in seconds, leaving nothing behind."""
    train = trained_ids(cfg)
    for spec in cfg.pair.models:
        if spec.kind == "hf" and spec.id in train:
            check_hf_model(spec)


def hf_tokenizer(spec: ModelSpec, path: str, local_only: bool):
    """The tokenizer of a ``kind: hf`` model (pad = EOS when it has no pad token)."""
    try:
        tok = AutoTokenizer.from_pretrained(path, local_files_only=local_only)
    except (OSError, ValueError) as e:
        raise ConfigError(f"model '{spec.id}': cannot load its tokenizer from {path}: {_one_line(e)}") from e
    if tok.pad_token_id is None:
        tok.pad_token = tok.eos_token
    return tok


def model_template(spec: ModelSpec, tokenizer) -> str:
    """The prompt template a model renders with: its ``template`` (its own or ``pair.template``), ``auto`` resolved
    (graftzoo.envs.templates.resolve_template: the tokenizer's chat template, ``plain`` without one, ``compact``
    for a tiny model with a character-level vocabulary; a miniature with a real one is a base model: ``plain``)."""
    kind = "tiny" if spec.kind == "tiny" and warmup_template(spec.tokenizer) == "compact" else "hf"
    return resolve_template(spec.template, tokenizer, kind)


def model_stop(spec: ModelSpec, template: str) -> list:
    """The stop strings a model's rollouts end at: its ``stop`` (its own or ``rollout.stop``; ``auto``: the defaults
    of its template, graftzoo.envs.templates.STOP_DEFAULTS)."""
    return resolve_stop(spec.stop, template)


def use_run_threads(cfg: RunConfig) -> None:
    """torch's intra-op threads as the run asks (``run.threads``): every command that runs a model (train, eval,
    checkpoint selection, the demo's measurements) builds it here, so none runs with torch's default of one
    thread per core, which oversubscribes the CPU when several runs share it."""
    torch.set_num_threads(cfg.run.threads)


def resolve_device(setting) -> str:
    """A device setting (``run.device``, ``pair.models[i].device``) with ``auto`` resolved: ``cuda`` when this
    process sees a GPU, else ``cpu`` (docs/scaling.md#one-gpu)."""
    setting = str(setting)
    if setting != "auto":
        return setting
    return "cuda" if torch.cuda.is_available() else "cpu"


def usable_device(setting, key: str) -> str:
    """``resolve_device(setting)``, refused with a one-line ``ConfigError`` naming ``key`` (the config key that set
    it) when it is a GPU this process cannot use: no CUDA device visible, or an index past the last one."""
    device = resolve_device(setting)
    if device.startswith("cuda"):
        count = torch.cuda.device_count()
        index = int(device.split(":")[1]) if ":" in device else 0
        if index >= count:
            has = (f"{count} GPU{'s' if count > 1 else ''}" if count else
                   f"no GPU torch can use (torch {torch.__version__}, "
                   f"{'a CUDA build' if torch.backends.cuda.is_built() else 'a CPU-only build'})")
            use = f"cuda:0 to cuda:{count - 1}, or auto" if count else "auto or cpu"
            raise ConfigError(f"config key '{key}' is {setting!r}, but this machine has {has}: use {use}")
    return device


def device_of(spec: ModelSpec) -> tuple:
    """(the device setting of a pair.models entry, the config key that set it: its own ``device`` or
    ``run.device``)."""
    return str(spec.device), spec.key_of("device")


def build_policy(spec: ModelSpec, cfg: RunConfig, seed: int = 0, progress=None) -> Policy:
    """The Policy of a pair.models entry, its whole model loaded in this process (``load_model``), in the run's
    precision, with gradient checkpointing and LoRA adapters as configured, on its device."""
    use_run_threads(cfg)
    with wait(f"loading model {spec.id}", note=f"kind {spec.kind}"):  # a tiny model's first warm-up inside it
        model, tok, tok_id = load_model(spec, seed, progress)
    autocast = apply_precision(model, cfg.optim.precision)
    if spec.gradient_checkpointing:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    lora = spec.lora
    if lora is not None:  # only the adapters train (graftzoo.training.models.lora)
        model = lora_mod.wrap(model, lora.model_dump(), spec.key_of("lora"))
    model.to(usable_device(*device_of(spec))).train()
    pol = policy_of(spec, cfg, model, tok, tok_id, autocast, lora_mod.count_parameters(model))
    if lora is not None:
        log.info("model %r: LoRA r=%d alpha=%g on %s: %d of %d parameters train (%.2f%%)", spec.id, lora.r,
                 lora.alpha, lora.target_modules, pol.trainable_params, pol.total_params,
                 100.0 * pol.trainable_params / max(1, pol.total_params))
    return pol


def policy_of(spec: ModelSpec, cfg: RunConfig, model, tok, tok_id: str, autocast, counts: tuple) -> Policy:
    """The Policy of a built ``model`` (its template, stop strings, budgets, AdamW over its parameters as they
    are: whole, or a rank's shards); ``counts``: its (trainable, total) parameters, whole."""
    optim = cfg.optim.model_copy(update={"lr": spec.lr}) if spec.sets("lr") else cfg.optim
    template = model_template(spec, tok)
    pol = Policy(spec.id, model, tok, template=template, optim=optim,
                 temperature=cfg.rollout.temperature, max_prompt_tokens=cfg.rollout.max_prompt_tokens,
                 tokenizer_id=tok_id)
    pol.max_response_tokens = int(spec.max_new_tokens)
    pol.stop_strings = model_stop(spec, template)
    pol.autocast_dtype = autocast
    pol.max_tokens_per_micro = cfg.optim.max_tokens_per_micro
    pol.optim_cfg = optim  # the run's optim.* with this model's lr: a worker rebuilds the optimizer after sharding
    pol.trainable_params, pol.total_params = counts
    return pol


class MetaUnsupported(Exception):
    """Why a model cannot be built on the meta device and loaded shard by shard (``build_sharded_policy`` then
    loads it whole on every rank, as ``build_policy`` does)."""


def model_source(spec: ModelSpec, progress=None) -> tuple[Path, object, str]:
    """(the local folder holding a model's ``config.json`` and weights, tokenizer, tokenizer_id), as ``load_model``
    finds them: a tiny model's cache folder (warmed up first when missing), a ``kind: hf`` model's folder or its
    snapshot in the Hugging Face cache. A hub model that is not downloaded has no folder (``MetaUnsupported``)."""
    if spec.kind == "tiny":
        ts = tiny_spec(spec)
        path = load_or_warmup(ts, progress=progress)
        return Path(path), load_tokenizer(path), f"{ts.tokenizer}"
    path, local_only = check_hf_model(spec)
    folder = Path(path) if Path(path).is_dir() else None
    if folder is None:
        config = try_to_load_from_cache(path, "config.json")
        if not isinstance(config, str):
            raise MetaUnsupported(f"{path} is not downloaded to a local folder")
        folder = Path(config).parent
    return folder, hf_tokenizer(spec, path, local_only), spec.tokenizer_id or path


@contextlib.contextmanager
def default_dtype(dtype: torch.dtype):
    """torch's default dtype set to ``dtype`` within the block (as ``from_config(..., dtype=)`` builds a model)."""
    before = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        yield
    finally:
        torch.set_default_dtype(before)


def real_buffers(model, dtype: torch.dtype) -> None:
    """Give a model built on the meta device real values of its non-persistent buffers (those no weight file holds:
    a rotary embedding's ``inv_freq``), computed as its constructor computes them: each module holding one is
    built again from its config on the CPU, under the model's default ``dtype``, and its buffers taken. A module
    that cannot be built from its config alone, or that holds parameters, raises ``MetaUnsupported``."""
    for name, module in model.named_modules():
        own = [b for b in module._non_persistent_buffers_set if module._buffers.get(b) is not None]
        if not own:
            continue
        where = f"{type(module).__name__} ({name}) holds non-persistent buffers {sorted(own)}"
        if next(module.parameters(recurse=False), None) is not None or getattr(module, "config", None) is None:
            raise MetaUnsupported(f"{where} and is not a parameterless module built from its config")
        try:
            with default_dtype(dtype):
                fresh = type(module)(module.config)
        except Exception as e:  # a constructor that wants more than the config
            raise MetaUnsupported(f"{where} that its config alone does not rebuild: {_one_line(e)}") from None
        for b in own:
            module._buffers[b] = fresh._buffers[b]


def load_dtype(spec: ModelSpec, config, files: dict) -> torch.dtype:
    """The dtype ``load_model`` loads a model's weights in: a ``kind: hf`` model's ``dtype`` (resolved: bfloat16
    unless given), a tiny model's saved dtype (its config's, else its first floating-point tensor's)."""
    if spec.kind == "hf":
        return spec_dtype(spec)
    dtype = getattr(config, "dtype", None)
    if isinstance(dtype, str):
        dtype = getattr(torch, dtype)
    if isinstance(dtype, torch.dtype):
        return dtype
    for key, file in files.items():
        with safe_open(str(file), "pt") as f:
            part = f.get_slice(key)
            empty = part[:0] if part.get_shape() else f.get_tensor(key)
        if empty.is_floating_point():
            return empty.dtype
    return torch.get_default_dtype()


def meta_skeleton(spec: ModelSpec, cfg: RunConfig, folder: Path, files: dict) -> tuple:
    """(model on the meta device, name -> the dtype it is loaded in, autocast dtype): a model built from
    ``folder``'s config as ``build_policy`` loads it (the dtype of ``load_model``, its generation config,
    ``apply_precision``, gradient checkpointing, in train mode), its parameters without storage and its
    non-persistent buffers real (``real_buffers``)."""
    config = AutoConfig.from_pretrained(str(folder))
    dtype = load_dtype(spec, config, files)
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config, dtype=dtype)
    set_attention(model, spec)
    real_buffers(model, dtype)
    if (folder / "generation_config.json").is_file():
        model.generation_config = GenerationConfig.from_pretrained(str(folder))
    if spec.kind == "tiny" and spec.dtype is not None:
        model.to(spec_dtype(spec))
    loaded = {n: t.dtype for n, t in model.state_dict(keep_vars=True).items()}
    autocast = apply_precision(model, cfg.optim.precision)
    if spec.gradient_checkpointing:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    return model.train(), loaded, autocast


def sharded_model(spec: ModelSpec, cfg: RunConfig, folder: Path, files: dict, frozen: bool = False) -> tuple:
    """(model, autocast dtype, (trainable, total) parameters): ``meta_skeleton`` sharded over the group and
    loaded shard by shard (``fsdp.materialize``; every rank calls it at once). ``frozen``: the KL reference's
    copy, in eval mode without gradients. Keys no weight file holds raise ``MetaUnsupported`` before anything is
    sharded."""
    model, loaded, autocast = meta_skeleton(spec, cfg, folder, files)
    sources, missing = fsdp.tensor_sources(model, files, model.base_model_prefix)
    if missing:
        raise MetaUnsupported(f"{len(missing)} tensors are not in its weight files ({missing[0]}, ...), and loading "
                              f"the whole model initialises them")
    if frozen:
        model.eval().requires_grad_(False)
    counts = lora_mod.count_parameters(model)
    fsdp.materialize(model, usable_device(*device_of(spec)), autocast, sources, files, loaded,
                     what=f"model '{spec.id}'")
    return model, autocast, counts


def build_sharded_policy(spec: ModelSpec, cfg: RunConfig, seed: int = 0, ref: bool = False,
                         progress=None) -> tuple[Policy, Optional[Policy]]:
    """(policy, KL reference or None) of one rank of a model's FSDP2 group (every rank calls it at once): what
    ``build_policy``, ``make_ref`` and ``fsdp.shard_policy`` make, without the whole model on any rank. The model
    is built on the meta device and each rank reads only its shards from the safetensors files
    (``sharded_model``); the reference is built the same way, from the same files. A LoRA model, a model without
    a local folder or one the meta build cannot reproduce (``MetaUnsupported``) is loaded whole and then sharded,
    with one log line saying why; a folder without safetensors weights is a ``ConfigError``."""
    use_run_threads(cfg)
    try:
        if spec.lora is not None:
            raise MetaUnsupported("LoRA adapters wrap a loaded model")
        folder, tok, tok_id = model_source(spec, progress)
        files = fsdp.weight_files(folder)
        if not files:
            raise ConfigError(f"model '{spec.id}': {folder} holds no safetensors weights ({fsdp.SAFETENSORS_FILE} "
                              f"or {fsdp.SAFETENSORS_INDEX}), which the ranks of its worker group read their shards "
                              f"from: save it with save_pretrained (safetensors) or train it with num_workers: 1")
        model, autocast, counts = sharded_model(spec, cfg, folder, files)
    except MetaUnsupported as e:
        log.info("model %r: every rank loads the whole model before FSDP2 shards it: %s", spec.id, e)
        pol = build_policy(spec, cfg, seed, progress)
        frozen = make_ref(pol, sharded=True) if ref else None
        fsdp.shard_policy(pol, frozen)
        return pol, frozen
    pol = policy_of(spec, cfg, model, tok, tok_id, autocast, counts)
    frozen = ref_of(pol, sharded_model(spec, cfg, folder, files, frozen=True)[0]) if ref else None
    pol.sharded = True
    return pol, frozen


def make_ref(policy: Policy, sharded: bool = False) -> Policy:
    """A frozen copy of ``policy`` (the KL reference: its initial weights), sharing the tokenizer. A LoRA policy's
    reference is its own model with the adapters disabled (``lora.AdaptersOff``): the base weights, which LoRA never
    changes, without a second copy of them. Under ``bf16-mixed`` a reference kept in one process holds its weights
    in the compute dtype only (it never steps: no float32 masters); one that FSDP2 will shard (``sharded``) keeps
    them as trained, its gathers computing in bf16, as the meta-device build makes it."""
    ref = copy.copy(policy)
    ref.optimizer = ref.scheduler = None
    if lora_mod.is_lora(policy.model):
        ref.model = lora_mod.AdaptersOff(policy.model)
        return ref
    ref = ref_of(policy, copy.deepcopy(policy.model))
    if policy.autocast_dtype is not None and not sharded:
        for q in ref.model.parameters():
            if q.dtype == torch.float32:
                q.data = q.data.to(policy.autocast_dtype)
    return ref


def ref_of(policy: Policy, model) -> Policy:
    """``policy`` over ``model`` (a copy of its initial weights) as a frozen KL reference: eval mode, no gradients,
    no optimizer, the tokenizer shared."""
    ref = copy.copy(policy)
    ref.optimizer = ref.scheduler = None
    ref.model = model.eval()
    for q in ref.model.parameters():
        q.requires_grad_(False)
    return ref


class InProcess:
    """``run.backend: inprocess``: every model, its optimizer and its rollout engine in the trainer's process."""

    def build(self, cfg: RunConfig, specs: list, train_ids: list, seed: int, run_dir=None) -> tuple[dict, dict, dict]:
        """(policies, engines, KL references) of the trained models; engines built one at a time, so that
        ``close`` ends those built when a later one fails. ``run_dir``: unused (one process, one view of it)."""
        torch.manual_seed(seed)
        self.engines: dict = {}
        policies = {s.id: build_policy(s, cfg, seed) for s in specs if s.id in train_ids}
        check_context(cfg, policies)
        for m, p in policies.items():  # an hf engine decodes with the training weights: nothing to wait for
            starting = contextlib.nullcontext() if cfg.rollout.engine == "hf" else \
                wait(f"starting the {cfg.rollout.engine} engine of {m}")
            with starting:
                self.engines[m] = build_engine(p, cfg)
        refs = {m: make_ref(p) for m, p in policies.items()} if wants_ref(cfg) else {}
        return policies, self.engines, refs

    def close(self) -> None:
        engines, self.engines = getattr(self, "engines", {}), {}
        for engine in engines.values():
            engine.close()


def wants_ref(cfg: RunConfig) -> bool:
    """Whether the run's learner needs the KL reference policy (``algo.beta_kl > 0``)."""
    return getattr(cfg.algo, "beta_kl", 0) > 0


def prompt_limits(spec: ModelSpec, cfg: RunConfig) -> tuple:
    """(tokenizer, template, prompt budget) of a pair.models entry, without building its model: the budget is the
    prompt tokens that leave room for the model's max_new_tokens in its context window, at most
    ``rollout.max_prompt_tokens`` (graftzoo.training.engines.engine.fitting_prompts)."""
    tok, _ = load_tokenizer_of(spec)
    if spec.kind == "tiny":
        context = int(tiny_spec(spec).max_positions)
    else:
        path, local_only = check_hf_model(spec)
        context = context_of(AutoConfig.from_pretrained(path, local_files_only=local_only))
    max_new = int(spec.max_new_tokens)
    if max_new >= context:
        raise ConfigError(f"config key '{spec.key_of('max_new_tokens')}' ({max_new}) must be below model "
                          f"{spec.id!r}'s context window of {context} tokens")
    return tok, model_template(spec, tok), min(int(cfg.rollout.max_prompt_tokens), context - max_new)


def check_context(cfg: RunConfig, policies: dict) -> None:
    """``rollout.max_new_tokens`` must leave room for a prompt in every model's context window."""
    for m, p in policies.items():
        if int(cfg.rollout.max_new_tokens) >= p.context_window:
            raise ConfigError(f"config key 'rollout.max_new_tokens' ({cfg.rollout.max_new_tokens}) must be "
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


def build_engine(policy: Policy, cfg: RunConfig):
    """The rollout engine ``rollout.engine`` names, with the run's sampling settings (``rollout.*``)."""
    r = cfg.rollout
    if r.engine not in ENGINES:
        raise ValueError(f"config key 'rollout.engine' must be one of {sorted(ENGINES)}, got {r.engine!r}")
    return ENGINES[r.engine](policy, temperature=r.temperature, top_p=r.top_p, top_k=r.top_k,
                                max_new_tokens=policy.max_response_tokens, gen_batch_size=r.gen_batch_size,
                                settings=r.vllm.model_dump(), seed=cfg.run.seed,
                                longest_new_tokens=longest_response(policy, cfg))


def longest_response(policy: Policy, cfg: RunConfig) -> int:
    """The longest response a run asks a model's engine for (what a vLLM engine is sized for): the model's
    max_new_tokens, ``eval.max_new_tokens`` and an algorithm's own response limits (``algo.*max_new_tokens``, e.g.
    OM-GRPO's contrast answers)."""
    own = [v for k, v in cfg.algo.model_dump().items() if k.endswith("max_new_tokens") and isinstance(v, int)]
    return max([int(policy.max_response_tokens), int(cfg.eval.max_new_tokens or 0), *own])


def make_eval_engine(policy, cfg: RunConfig, top_p: Optional[float] = None, engine=None):
    """A rollout engine for ``policy`` built as in training, with the eval top-p (``top_p``, else
    ``eval_top_p(cfg)``). Given the training ``engine``, a view of it with that top-p (no second engine)."""
    if engine is not None:
        return engine.with_sampling(top_p=float(eval_top_p(cfg) if top_p is None else top_p))
    return build_engine(policy, with_values(cfg, {"rollout.top_p": float(eval_top_p(cfg) if top_p is None else top_p)}))
