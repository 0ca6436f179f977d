"""Options that do nothing in a run's setting: a key set to another value than its default where the rest of the
config leaves it idle (a vLLM key with the HF engine, a Ray key in process, asynchronous rollouts with nothing to
overlap, ...). ``graftzoo train`` and ``graftzoo.train`` say each such setting once, one warning line at start
(``say_no_effect``), and the run trains as it would without it.

One table, ``NO_EFFECT``: each row names its keys (a dotted key, ``section.*`` for every key of a section, or
``pair.models[].KEY`` for a model entry's own), when the rest of the config leaves them idle (a function of the
config that says why in words, or None where they act) and what they do where they act. A key counts as set when its
resolved value differs from its declared default (``graftzoo.contract.config.defaults``), a model entry's key when
the entry sets it. Light: no torch, so that the command says it before the heavy imports."""
from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Callable, Optional

from graftzoo.contract.config import RunConfig, as_dict, defaults, value_at
from graftzoo.contract.peer_sources import peer_source_kind
from graftzoo.training.learning.ahead import overlaps

log = logging.getLogger("graftzoo")


@dataclass(frozen=True)
class NoEffect:
    """Keys that have no effect in some setting: ``idle(cfg)`` says why in this config (None: they act here);
    ``does`` says what they do where they act, or what to do instead."""

    keys: str
    idle: Callable[[RunConfig], Optional[str]]
    does: str
    effect: str = "no effect"


def _unless(key: str, value: str):
    """Idle unless the run key ``key`` is ``value``."""
    def idle(cfg: RunConfig) -> Optional[str]:
        now = value_at(cfg, key)
        return None if now == value else f"{key} is {now}"
    return idle


def _peer_source_ignores(key: Optional[str]):
    """Idle unless the peer source reads ``peer.KEY`` (its registered kind's ``keys``); ``None``: unless there is a
    peer source."""
    def idle(cfg: RunConfig) -> Optional[str]:
        kind = peer_source_kind(cfg.peer.source)
        reads = kind is not None and (key is None or key in kind.keys)
        return None if reads else f"peer.source is {cfg.peer.source}"
    return idle


def _no_overlap(cfg: RunConfig) -> Optional[str]:
    """Why the batches ahead (``rollout.max_staleness`` >= 1) cannot be generated while the models update, from the
    config alone (``graftzoo.training.learning.ahead.overlaps``, the trainer's rule); None where they may. The learners'
    ``collect_reads_policy`` and ``multiprocessing: auto`` on GPUs are decided once the run is built: not said."""
    r = cfg.rollout
    mp = r.vllm.multiprocessing
    cpus = all(str(spec.device).startswith("cpu") for spec in cfg.pair.models)  # resolved: the run's device too
    if cfg.run.backend == "ray":
        apart = cfg.ray.rollout_workers >= 1
    else:
        apart = r.engine == "vllm" and mp is not False and not (mp == "auto" and cpus)
    if overlaps(int(r.max_staleness), cfg.run.layout, apart, False):
        return None
    if cfg.run.layout == "offload":
        return "run.layout is offload, which moves the models between devices"
    if cfg.run.backend == "ray":
        return ("ray.rollout_workers is 0: each model's training ranks decode too, and a worker takes one call at a "
                "time")
    if r.engine != "vllm":
        return f"rollout.engine is {r.engine}, which decodes with the training model itself"
    if mp is False:
        return "rollout.vllm.multiprocessing is false: the engine core runs in the trainer's process"
    return "rollout.vllm.multiprocessing is auto, which keeps the engine core in the trainer's process on CPUs"


NO_EFFECT = (
    NoEffect("rollout.max_staleness", lambda c: _no_overlap(c) if c.rollout.max_staleness else None,
             "the batches ahead are generated just before each update, so the run is no faster and trains on stale "
             "rollouts; set it to 0, or decode apart (rollout.engine=vllm, rollout.vllm.multiprocessing=true; on "
             "Ray ray.rollout_workers >= 1; docs/scaling.md#asynchronous-rollouts)", effect="nothing overlaps"),
    NoEffect("rollout.tis_cap", lambda c: None if c.rollout.max_staleness else "rollout.max_staleness is 0",
             "it caps the importance weight of stale rollouts, which rollout.max_staleness >= 1 makes"),
    NoEffect("rollout.vllm.*", _unless("rollout.engine", "vllm"), "vLLM engine settings (rollout.engine=vllm)"),
    NoEffect("ray.*", _unless("run.backend", "ray"), "Ray worker group settings (run.backend=ray)"),
    NoEffect("pair.models[].num_workers", _unless("run.backend", "ray"),
             "the ranks of a model's Ray worker group (run.backend=ray)"),
    NoEffect("ray.hf_split_generate",
             lambda c: "rollout.engine is vllm" if c.run.backend == "ray" and c.rollout.engine == "vllm" else None,
             "it splits the HF engine's prompts over a worker group's ranks"),
    NoEffect("peer.path", _peer_source_ignores("path"), "it names a stored peer's run (peer.source stored or mixed)"),
    NoEffect("peer.model", _peer_source_ignores("model"), "it chooses the model a stored peer's run reads"),
    NoEffect("peer.align", _peer_source_ignores("align"), "it chooses the stored step a learner step reads"),
    NoEffect("peer.missing", _peer_source_ignores("missing"), "it says what a step the peer store lacks does"),
    NoEffect("peer.mix_ratio", _peer_source_ignores("mix_ratio"),
             "it mixes stored and online peer groups (peer.source=mixed)"),
    NoEffect("xt.*", _peer_source_ignores(None), "cross-tokenizer exchange settings, for a peer's responses"),
    NoEffect("tracking.*", lambda c: None if c.run.track else "run.track is false", "wandb settings"),
    NoEffect("run.wandb_project", lambda c: None if c.run.track else "run.track is false", "a wandb setting"),
    NoEffect("run.wandb_mode", lambda c: None if c.run.track else "run.track is false", "a wandb setting"),
    NoEffect("run.eval_every",
             lambda c: (f"the run is {c.run.steps} steps long" if c.run.epochs is None and c.run.eval_every
                        and c.run.eval_every >= c.run.steps else None),
             "no evaluation during training falls before the last step, after which run.eval_at_end evaluates"),
)


def _flat(node, prefix: str = "") -> dict:
    out = {}
    for k, v in node.items():
        if isinstance(v, dict) and v:
            out.update(_flat(v, f"{prefix}{k}."))
        else:
            out[f"{prefix}{k}"] = v
    return out


def set_keys(cfg: RunConfig) -> dict:
    """Dotted key -> value of every key ``cfg`` sets to another value than its declared default, and
    ``pair.models[ID].KEY`` -> value of every run key a model entry sets itself (``ModelSpec.sets``)."""
    now, declared = _flat({k: v for k, v in as_dict(cfg).items() if k not in ("pair", "algo")}), _flat(defaults())
    out = {k: v for k, v in now.items() if v != declared.get(k)}
    for spec in cfg.pair.models:
        for key, value in spec.model_dump().items():
            if spec.sets(key):
                out[f"pair.models[{spec.id}].{key}"] = value
    return out


def _matches(pattern: str, key: str) -> bool:
    if pattern.endswith(".*"):
        return key.startswith(pattern[:-1])
    if pattern.startswith("pair.models[]."):
        return key.startswith("pair.models[") and key.endswith("]." + pattern.rpartition(".")[2])
    return key == pattern


def no_effect_lines(cfg: RunConfig) -> list:
    """One line per row of ``NO_EFFECT`` whose keys ``cfg`` sets where they have no effect: the keys and their
    values, why they have none here, what they do where they act."""
    given = set_keys(cfg)
    lines = []
    for row in NO_EFFECT:
        keys = [k for k in given if _matches(row.keys, k)]
        why = row.idle(cfg) if keys else None
        if why:
            said = ", ".join(f"{k}={given[k]!r}" for k in keys)
            lines.append(f"{said}: {row.effect} here ({why}); {row.does}")
    return lines


def say_no_effect(cfg: RunConfig) -> None:
    """Each of ``no_effect_lines`` as a warning of the ``graftzoo`` logger (stderr, one line each)."""
    for line in no_effect_lines(cfg):
        log.warning("%s", line)
