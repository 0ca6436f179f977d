"""Peer sources, registered by name (docs/architecture.md#where-to-add-a-peer-source): where a learner's peer groups come from.

A source is one module: its class (a ``graftzoo.peers.sources.PeerSource``) and its ``PeerSourceKind``, registered
with ``register_peer_source``. The builtins are the modules of ``graftzoo.peers.sources`` (``online``, ``stored``,
``mixed``); a plugin registers one from its own file or module (``--plugin`` / ``GRAFTZOO_PLUGINS``), as it registers
an algorithm. Everything that depends on the source reads its kind, never its name: the config check of
``peer.source`` and ``peer.path``, the command line's ``--peer``, the pre-flight check, the keys that have no effect
under it, the run directory's name, the report's label and the compute accounting. ``none`` (no peer) is not a
source. Light: no torch, no pandas (a config is checked before anything heavy is imported).
"""
from __future__ import annotations

import importlib
from dataclasses import dataclass
from typing import Callable, Optional

from graftzoo.contract.errors import ConfigError, did_you_mean
from graftzoo.contract.registry import load_local_plugins

NONE = "none"


@dataclass(frozen=True)
class PeerSourceKind:
    """What the rest of graftzoo needs to know about a peer source.

    ``build(cfg, trained_ids, dataset_id, prompt_ids, plan)`` makes the source for a run (``plan``: (step, epoch,
    prompts) of every step, to check a store covers them; ``prompt_ids``: the prompts of the first steps).
    ``live``: it hands a learner the groups its partners in this run generate (needs two or more trained models;
    the partners' compute is charged with the learner's). ``reads_run``: it reads an earlier run at ``peer.path``
    (required; named in the run directory's name; with ``live`` false its compute is sunk, not charged).
    ``keys``: the other ``peer.*`` keys it reads (one it does not read, set, is said to have no effect).
    ``check(cfg)``: a pre-flight check before any heavy import (``graftzoo train``), raising ``ConfigError``.
    ``label``: appended to the algorithm in a report's row (``", stored peer"``). ``artifact``: the run summary's
    ``peer_source`` (default: the name)."""

    name: str
    doc: str
    build: Callable
    live: bool = False
    reads_run: bool = False
    keys: tuple = ()
    check: Optional[Callable] = None
    label: str = ""
    artifact: str = ""

    @property
    def summary_name(self) -> str:
        return self.artifact or self.name


_KINDS: dict[str, PeerSourceKind] = {}


def register_peer_source(kind: PeerSourceKind) -> PeerSourceKind:
    """Register ``kind`` under ``kind.name``; another kind under a taken name (or ``none``) is an error naming both."""
    old = _KINDS.get(kind.name)
    if kind.name == NONE or (old is not None and old.build is not kind.build):
        where = "reserved (no peer)" if kind.name == NONE else f"registered by {old.build.__module__}"
        raise ValueError(f"peer source name clash: {kind.name!r} from {kind.build.__module__} is already {where}")
    _KINDS[kind.name] = kind
    return kind


def _load() -> None:
    importlib.import_module("graftzoo.peers.sources")  # the builtins register themselves (light modules)
    load_local_plugins()


def peer_source_names() -> list:
    """``none`` and every registered source (builtins, then plugins in the order they registered)."""
    _load()
    return [NONE, *_KINDS]


def peer_source_kind(name: str) -> Optional[PeerSourceKind]:
    """The kind registered as ``name`` (None for ``none``); an unknown name is a ``ConfigError`` naming the key."""
    if name == NONE:
        return None
    if name not in _KINDS:
        _load()
    if name not in _KINDS:
        known = [NONE, *_KINDS]
        raise ConfigError(f"config key 'peer.source' must be a registered peer source ({', '.join(known)}; a "
                          f"plugin's once its module is loaded: GRAFTZOO_PLUGINS), got {name!r}{did_you_mean(name, known)}")
    return _KINDS[name]


def source_label(name: str) -> str:
    """A report row's suffix for a run whose ``peer.source`` is ``name`` (``", stored peer"``; ``""`` for none and
    online); a source not registered in this process (its plugin not loaded) is named as it is."""
    if name in (None, NONE):
        return ""
    try:
        return peer_source_kind(name).label
    except ConfigError:
        return f", {name} peer"


def pays_for_peer(summary_name: Optional[str]) -> bool:
    """Whether a run whose summary's ``peer_source`` is ``summary_name`` is charged its peer's compute: the peer is a
    live partner of the run (docs/algorithms.md#evaluation-protocol-and-compute). A source not registered in this
    process is charged as live (the conservative rule)."""
    _load()
    kinds = [k for k in _KINDS.values() if k.summary_name == summary_name]
    return kinds[0].live if kinds else True
