"""Run configuration: YAML files plus dotted overrides, checked against a schema.

A run config is a nested dict with the sections below. ``load_config`` merges, in order:
DEFAULTS <- configs/pairs/<pair>.yaml <- configs/algos/<algo>.yaml (a preset, if one exists)
<- extra YAML files <- ``key=value`` overrides. Every key must exist in DEFAULTS (or, under
``algo.``, in the learner's Config dataclass); an unknown key raises ``ConfigError`` naming it.
Free-form maps (model specs, task mixes) are marked in FREE and not checked key by key.

Values are checked once, by ``validate`` at the end of ``load_config``: the core keys declared in CORE
and the learner's Config (choices, bounds and cross-field rules declared on the dataclass, see
graftzoo.core.schema). ``algo_config`` gives the trainer that Config object without checking again.
"""
from __future__ import annotations

import copy
import dataclasses
import os
from pathlib import Path
from typing import Literal, Optional, Union

import yaml

from graftzoo.core.registry import get_algo
from graftzoo.core.schema import ConfigError, build, check_value
from graftzoo.core.schema import validate as validate_algo


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
    },
    "pair": {
        "name": None,
        "models": [],            # list of model specs (see graftzoo.core.models)
        "train": None,           # ids of the models to train; None = all
        "template": "compact",
    },
    "task": {
        "env": "graftzoo/Arithmetic-v0",
        "dataset": None,         # for MathReasoning-v0: a bundled name or a path
        "split": "train",
        "mix": {},
        "difficulty": {},
        "size": None,            # finite prompt set size for procedural tasks (None = endless stream)
        "prompts_per_step": 8,
        "reward_correct": 1.0,
        "reward_wrong": 0.0,
        "verifier_timeout": 2.0,
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
        # theta_old log-probs from the training path (spec algos_single §0) instead of decoding: true | false |
        # auto (on unless the engine is the training model itself in float32, sampling without top-p / top-k)
        "recompute_old_logp": "auto",
    },
    "optim": {
        "lr": 1e-4,
        "betas": [0.9, 0.999],
        "eps": 1e-8,
        "weight_decay": 0.0,
        "warmup_steps": 0,       # linear lr warm-up, in optimizer steps
        "grad_clip": 1.0,
        "minibatches": 1,        # optimizer steps per rollout batch (1 = fully on-policy)
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
}

FREE = {"pair.models", "task.mix", "task.difficulty", "eval.benchmarks", "run.tags", "optim.betas"}

# declared choices (and bounds, as (type, interval)) of core keys, checked like the algo.* fields
CORE = {
    "peer.source": Literal["none", "online", "stored", "mixed"],
    "peer.align": Literal["same_step", "latest"],
    "xt.overflow": Literal["drop", "truncate", "error"],
    "rollout.engine": Literal["hf"],          # the only engine in this release
    "rollout.n": (int, "[1, inf)"),
    "rollout.recompute_old_logp": Union[Literal["auto"], bool],
    "eval.select": Optional[Literal["last", "val_avg"]],
    "optim.clip.eps_low": (float, "[0, 1]"),
    "optim.clip.eps_high": (float, "[0, inf)"),
    "optim.clip.dual_clip_c": (Optional[float], "(1, inf)"),
}
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
        if isinstance(schema[key], dict) and path not in FREE:
            if not isinstance(value, dict):
                raise ConfigError(f"config key '{path}' (in {origin}) must be a mapping")
            _merge(base[key], value, origin, path + ".", schema[key])
        else:
            base[key] = copy.deepcopy(value)
    return base


def parse_override(text: str) -> dict:
    """``a.b.c=value`` -> {"a": {"b": {"c": value}}}; the value is parsed as YAML."""
    if "=" not in text:
        raise ConfigError(f"override '{text}' must look like key=value")
    key, raw = text.split("=", 1)
    value = yaml.safe_load(raw) if raw.strip() else None
    if isinstance(value, str):  # YAML 1.1 reads "3e-5" as a string
        try:
            value = float(value)
        except ValueError:
            pass
    out: dict = {}
    node = out
    parts = key.strip().split(".")
    for part in parts[:-1]:
        node = node.setdefault(part, {})
    node[parts[-1]] = value
    return out


def config_dirs() -> list[Path]:
    """Where named configs live: ./configs, then the configs/ folder beside the package source."""
    here = Path(__file__).resolve().parent.parent
    dirs = [Path("configs"), here.parent / "configs", here / "configs"]
    return [d for d in dirs if d.is_dir()]


def find_config(kind: str, name: str) -> Path | None:
    if name.endswith((".yaml", ".yml")) and Path(name).is_file():
        return Path(name)
    for d in config_dirs():
        p = d / kind / f"{name}.yaml"
        if p.is_file():
            return p
    return None


def read_yaml(path: str | os.PathLike) -> dict:
    try:
        with open(path) as f:
            data = yaml.safe_load(f) or {}
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
            raise ConfigError(f"unknown pair '{pair}': no configs/pairs/{pair}.yaml")
        data = read_yaml(p)
        data.setdefault("pair", {})
        # a pair file may hold `name`, `models`, `template` at top level, plus other sections
        for key in ("name", "models", "template", "train"):
            if key in data:
                data["pair"][key] = data.pop(key)
        data["pair"].setdefault("name", pair)
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
        tp, rng = decl if isinstance(decl, tuple) else (decl, None)
        value = cfg
        for part in key.split("."):
            value = value[part]
        check_value(key, value, tp, rng)
    obj = validate_algo(build(cls.Config, algo), cfg)
    cfg["algo"] = {"name": name, **dataclasses.asdict(obj)}
    return cfg


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
