"""Algorithm registry: ``@register_algo`` in-process, the entry-point group ``graftzoo.algos``, and local plugins:
modules or ``.py`` files named by ``GRAFTZOO_PLUGINS`` (comma-separated; ``--plugin`` on the command line adds to it).

Each algorithm has a learner class (its ``Config`` is its ``algo.*`` section) and that section's class. A builtin
algorithm is a package of graftzoo.algos (``builtin_names``) whose section is declared apart from its learner (the
package itself, no torch; the learner in its ``learner`` module), so ``get_config`` checks a run config without
importing torch; a plugin's section is its learner's ``Config`` (the plugin is imported).

Plugins are resolved the same way in every process (``ensure_loaded`` is called by ``get_algo``),
so Ray workers and subprocesses see the same registry. An installed plugin that fails to import is reported by
name (``list_algos`` and ``get_algo`` say why); a local plugin that fails to import is a ``PluginError`` naming it;
a name clash is an error.
"""
from __future__ import annotations

import importlib
import importlib.util
import os
import sys
import traceback
from dataclasses import dataclass
from importlib.metadata import entry_points
from pathlib import Path

from graftzoo.contract.errors import ConfigError

GROUP = "graftzoo.algos"
PLUGINS_ENV = "GRAFTZOO_PLUGINS"


class PluginError(ConfigError):
    """A local plugin (``--plugin`` / ``GRAFTZOO_PLUGINS``) is missing or failed to import; the message names it."""


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
_LOCAL: set = set()   # the local plugins imported (a file by its absolute path, a module by its name)
_LOADED = False
_current_source: str | None = None


class FunctionRegistry(dict):
    """Pure functions registered by name (policy losses, advantage estimators): ``register(name)`` is the function
    decorator, a second function under a taken name is an error naming both; ``lookup(name)`` the function, an
    unknown name a ``KeyError`` listing the registered ones."""

    def __init__(self, what: str):
        super().__init__()
        self.what = what

    def register(self, name: str):
        def deco(fn):
            old = self.get(name)
            if old is not None and old is not fn:
                raise ValueError(f"{self.what} name clash: {name!r} from {fn.__module__} is already registered by "
                                 f"{old.__module__}")
            self[name] = fn
            return fn
        return deco

    def lookup(self, name: str):
        if name not in self:
            raise KeyError(f"unknown {self.what} {name!r}; registered: {sorted(self)}")
        return self[name]


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


def _is_file(spec: str) -> bool:
    return spec.endswith(".py") or os.sep in spec or "/" in spec


def _plugin_key(spec: str) -> str:
    return str(Path(spec).resolve()) if _is_file(spec) else spec


def _import_plugin(spec: str):
    """Import one local plugin: a ``.py`` file (as module ``_graftzoo_plugin_<stem>``, so that it shadows no other
    module) or a module (the current directory comes first on ``sys.path``); its ``@register_algo`` classes
    register with source ``plugin:<spec>``."""
    global _current_source
    _current_source = f"plugin:{Path(spec).name if _is_file(spec) else spec}"
    try:
        if _is_file(spec):
            path = Path(spec)
            if not path.is_file():
                raise PluginError(f"plugin '{spec}': no such file")
            name = f"_graftzoo_plugin_{path.stem}"
            found = importlib.util.spec_from_file_location(name, path)
            module = importlib.util.module_from_spec(found)
            sys.modules[name] = module   # a pickled learner class (Ray) finds its module
            try:
                found.loader.exec_module(module)
            except BaseException:
                sys.modules.pop(name, None)
                raise
        else:
            if os.getcwd() not in sys.path:
                sys.path.insert(0, os.getcwd())
            importlib.import_module(spec)
    except PluginError:
        raise
    except Exception as e:
        why = " ".join(str(e).split())
        raise PluginError(f"plugin '{spec}' failed to import: {type(e).__name__}{': ' + why if why else ''}") from e
    finally:
        _current_source = None


def plugin_specs() -> list:
    """The local plugins named by ``GRAFTZOO_PLUGINS`` (comma-separated modules or ``.py`` files)."""
    return [s.strip() for s in os.environ.get(PLUGINS_ENV, "").split(",") if s.strip()]


def load_local_plugins(specs=None):
    """Import the local plugins ``specs`` (default: ``plugin_specs()``) not imported yet; ``PluginError`` names the
    first that is missing or fails to import."""
    todo = [s for s in (plugin_specs() if specs is None else specs) if _plugin_key(s) not in _LOCAL]
    missing = [s for s in todo if _is_file(s) and not Path(s).is_file()]
    if missing:  # said before the builtins are imported (they import torch)
        raise PluginError(f"plugin '{missing[0]}': no such file")
    if todo:
        _load_registered()   # builtins and installed plugins first: a local plugin reusing their names clashes
    for spec in todo:
        if _plugin_key(spec) not in _LOCAL:
            _import_plugin(spec)
            _LOCAL.add(_plugin_key(spec))


def add_plugins(specs) -> None:
    """``--plugin``: import ``specs`` now and add them to ``GRAFTZOO_PLUGINS`` (files as absolute paths), so that
    the child processes of this command (a grid's runs, the demo's, Ray workers) load them too."""
    load_local_plugins(specs)
    known = plugin_specs()
    new = [_plugin_key(s) for s in specs]
    os.environ[PLUGINS_ENV] = ",".join(dict.fromkeys(known + new))


def get_config(name: str) -> type:
    """The ``algo.*`` section class of algorithm ``name``: a builtin's without importing its learner, a plugin's
    from its learner class (local plugins are imported first)."""
    load_local_plugins()
    if name not in _CONFIGS:
        load_sections()   # the builtin sections register themselves
    if name in _CONFIGS:
        return _CONFIGS[name]
    if name in plugin_names() or name in _FAILED:
        return get_algo(name).Config
    known = sorted(set(_CONFIGS) | set(plugin_names()))
    raise RegistryError(f"unknown algorithm '{name}'; registered: {known}", known)


def load_sections() -> None:
    """Every builtin algorithm's ``algo.*`` section and metrics (their packages, no torch)."""
    importlib.import_module("graftzoo.algos").load_sections()


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


def _load_registered():
    global _LOADED
    if not _LOADED:
        _LOADED = True
        _load_builtins()
        _load_plugins()


def ensure_loaded():
    """Builtins, installed plugins (entry points), then the local plugins of ``GRAFTZOO_PLUGINS``."""
    _load_registered()
    load_local_plugins()


def get_algo(name: str):
    ensure_loaded()
    if name in _ALGOS:
        return _ALGOS[name].cls
    if name in _FAILED:
        raise RegistryError(_FAILED[name].splitlines()[0])
    raise RegistryError(f"unknown algorithm '{name}'; registered: {sorted(_ALGOS)}"
                        + (f"; failed plugins: {sorted(_FAILED)}" if _FAILED else ""))


def sections() -> dict:
    """name -> ``algo.*`` section class of every builtin algorithm and every plugin imported so far (no torch)."""
    load_local_plugins()
    load_sections()
    return dict(_CONFIGS)


def own_clip_keys() -> dict:
    """``algo.<key>`` -> algorithm, for each key an algorithm clips with by design instead of the shared
    ``optim.clip`` (its section's ``own_clip_keys``: GSPO's ``seq_clip``, HACPO's ``self_clip``)."""
    return {f"algo.{k}": name for name, cls in sections().items() for k in cls.own_clip_keys}


def list_algos() -> tuple[list[AlgoEntry], dict[str, str]]:
    ensure_loaded()
    return sorted(_ALGOS.values(), key=lambda e: e.name), dict(_FAILED)
