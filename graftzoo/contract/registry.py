"""Algorithm registry: ``@register_algo`` in-process, plus the entry-point group ``graftzoo.algos``.

Each algorithm has a learner class (its ``Config`` is its ``algo.*`` section) and that section's class. The builtin
sections are declared apart from their learners (``graftzoo.algos.config``, no torch), so ``get_config`` checks a
run config without importing torch; a plugin's section is its learner's ``Config`` (the plugin is imported).

Plugins are resolved the same way in every process (``ensure_loaded`` is called by ``get_algo``),
so Ray workers and subprocesses see the same registry. A plugin that fails to import is reported by
name (``list_algos`` and ``get_algo`` say why); a name clash is an error.
"""
from __future__ import annotations

import importlib
import traceback
from dataclasses import dataclass
from importlib.metadata import entry_points

GROUP = "graftzoo.algos"


class RegistryError(RuntimeError):
    """An algorithm is unknown, failed to import or clashes; ``known`` holds the registered names."""

    def __init__(self, message: str, known=()):
        super().__init__(message)
        self.known = tuple(known)


@dataclass
class AlgoEntry:
    name: str
    cls: type
    source: str   # "builtin" | "plugin:<distribution>" | "runtime"
    module: str


_ALGOS: dict[str, AlgoEntry] = {}
_CONFIGS: dict[str, type] = {}
_FAILED: dict[str, str] = {}
_LOADED = False
_current_source: str | None = None


def register_algo(name: str):
    """Class decorator registering a Learner subclass under ``name``."""

    def deco(cls):
        source = _current_source or ("builtin" if cls.__module__.startswith("graftzoo.") else "runtime")
        old = _ALGOS.get(name)
        if old is not None and old.cls is not cls:
            raise RegistryError(f"algorithm name clash: '{name}' from {cls.__module__} "
                                f"is already registered by {old.module} ({old.source})")
        cls.name = name
        _ALGOS[name] = AlgoEntry(name, cls, source, cls.__module__)
        _CONFIGS[name] = cls.Config
        return cls

    return deco


def register_config(name: str):
    """Class decorator registering a builtin learner's ``algo.*`` section class under ``name`` (before, and without,
    importing the learner)."""

    def deco(cls):
        _CONFIGS.setdefault(name, cls)
        return cls

    return deco


def plugin_names() -> list:
    """Names of the installed plugins' entry points (read from package metadata; nothing is imported)."""
    return sorted({ep.name for ep in entry_points(group=GROUP)})


def get_config(name: str) -> type:
    """The ``algo.*`` section class of algorithm ``name``: a builtin's without importing its learner, a plugin's
    from its learner class."""
    if name not in _CONFIGS:
        importlib.import_module("graftzoo.algos.config")   # the builtin sections register themselves
    if name in _CONFIGS:
        return _CONFIGS[name]
    if name in plugin_names() or name in _FAILED:
        return get_algo(name).Config
    known = sorted(set(_CONFIGS) | set(plugin_names()))
    raise RegistryError(f"unknown algorithm '{name}'; registered: {known}", known)


def _load_builtins():
    importlib.import_module("graftzoo.algos").load_builtins()


def _load_plugins():
    global _current_source
    for ep in entry_points(group=GROUP):
        dist = getattr(getattr(ep, "dist", None), "name", "?")
        _current_source = f"plugin:{dist}"
        try:
            obj = ep.load()
        except RegistryError:
            raise
        except Exception as e:  # reported by name, never silently dropped
            _FAILED[ep.name] = f"plugin '{ep.name}' ({ep.value}, from {dist}) failed to import: " \
                               f"{type(e).__name__}: {e}\n{traceback.format_exc(limit=3)}"
            continue
        finally:
            _current_source = None
        if isinstance(obj, type) and ep.name not in _ALGOS:
            _current_source = f"plugin:{dist}"
            try:
                register_algo(ep.name)(obj)
            finally:
                _current_source = None
        elif isinstance(obj, type) and _ALGOS[ep.name].cls is not obj:
            raise RegistryError(f"algorithm name clash: plugin entry point '{ep.name}' from {dist} "
                                f"({ep.value}) vs {_ALGOS[ep.name].module}")


def ensure_loaded():
    global _LOADED
    if not _LOADED:
        _LOADED = True
        _load_builtins()
        _load_plugins()


def get_algo(name: str):
    ensure_loaded()
    if name in _ALGOS:
        return _ALGOS[name].cls
    if name in _FAILED:
        raise RegistryError(_FAILED[name].splitlines()[0])
    raise RegistryError(f"unknown algorithm '{name}'; registered: {sorted(_ALGOS)}"
                        + (f"; failed plugins: {sorted(_FAILED)}" if _FAILED else ""))


def list_algos() -> tuple[list[AlgoEntry], dict[str, str]]:
    ensure_loaded()
    return sorted(_ALGOS.values(), key=lambda e: e.name), dict(_FAILED)
