"""Declared config rules and the one generic check of them.

A learner's Config dataclass declares, on its fields, what ``algo.*`` accepts:

- choices with ``Literal[...]`` (``Optional[Literal[...]]`` when null is allowed);
- bounds with ``bounded(default, "[lo, hi]")``: interval notation, ``(``/``)`` exclude the end, ``inf``
  leaves a side open (or ``field(..., metadata={"range": (lo, hi)})``, a closed interval). A subclass
  that only changes a field's default keeps the base class's bounds;
- ``needs_peer = True`` (a ClassVar) when it trains on a peer's rollouts (``peer.source`` may not be none);
- cross-field and run-dependent rules in ``check(self, run_cfg)``, raising ``ConfigError`` naming the key.

``validate`` checks the type, choices and bounds of every field, then ``needs_peer``, then ``check``;
``graftzoo.contract.config.load_config`` calls it once per run config. ``build`` makes a Config from values
``validate`` accepted before, without checking them again (the trainer's path).
"""
from __future__ import annotations

import copy
import dataclasses
import functools
import math
import typing
from typing import Any, Literal, Union

NEEDS_PEER_HINT = "pass --peer online|stored:PATH|mixed:PATH (config key peer.source)"


class ConfigError(ValueError):
    """A config key or value is wrong; the one-line message names the key."""


# ------------------------------------------------------------------------------------------------
# declaring
# ------------------------------------------------------------------------------------------------

def bounded(default: Any = dataclasses.MISSING, interval: str = "(-inf, inf)", **kw) -> Any:
    """A dataclass field whose value, when not None, must lie in ``interval`` (e.g. "[0, 1]", "(0, inf)")."""
    parse_interval(interval)  # a typo in a declaration fails at import time
    return dataclasses.field(default=default, metadata={"range": interval}, **kw)


@functools.lru_cache(maxsize=None)
def parse_interval(text: str) -> tuple:
    """``"(0, 1]"`` -> ``(0.0, True, 1.0, False)``: (low, low excluded, high, high excluded)."""
    t = text.strip()
    parts = t[1:-1].split(",")
    if len(t) < 5 or t[0] not in "[(" or t[-1] not in "])" or len(parts) != 2:
        raise ValueError(f"bad interval {text!r}: write it like '[0, 1]', '(0, inf)' or '[1, inf)'")
    lo, hi = (float(p) for p in parts)
    return lo, t[0] == "(", hi, t[-1] == ")"


def _interval(rng) -> str:
    if isinstance(rng, str):
        return rng
    lo, hi = rng
    return f"[{'-inf' if lo is None else lo}, {'inf' if hi is None else hi}]"


def _num(x: float) -> str:
    return str(int(x)) if x == int(x) else str(x)


def describe_range(rng) -> str:
    """``"[1, inf)"`` -> ``">= 1"``; ``"(0, 1]"`` -> ``"in (0, 1]"``."""
    lo, lo_open, hi, hi_open = parse_interval(_interval(rng))
    if math.isinf(hi) and not math.isinf(lo):
        return f"{'>' if lo_open else '>='} {_num(lo)}"
    if math.isinf(lo) and not math.isinf(hi):
        return f"{'<' if hi_open else '<='} {_num(hi)}"
    return f"in {_interval(rng)}"


def within(value: float, rng) -> bool:
    lo, lo_open, hi, hi_open = parse_interval(_interval(rng))
    return (value > lo if lo_open else value >= lo) and (value < hi if hi_open else value <= hi)


# ------------------------------------------------------------------------------------------------
# checking one value
# ------------------------------------------------------------------------------------------------

def _is_number(v) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def matches(value, tp) -> bool:
    """Whether ``value`` (as read from YAML) fits the declared type ``tp``."""
    origin = typing.get_origin(tp)
    if tp is Any or tp is object:
        return True
    if origin is Literal:
        return any(value == a and type(value) is type(a) for a in typing.get_args(tp))
    if origin is Union:
        return any(matches(value, a) for a in typing.get_args(tp))
    if tp is type(None):
        return value is None
    if tp is bool:
        return isinstance(value, bool)
    if tp is int:  # 1e3 reads as a float: an integral float is accepted as it is
        return _is_number(value) and float(value).is_integer()
    if tp is float:
        return _is_number(value)
    if tp in (list, tuple) or origin in (list, tuple):
        if not isinstance(value, (list, tuple)):
            return False
        args = typing.get_args(tp)
        if origin is tuple and len(args) > 1 and Ellipsis not in args:  # tuple[float, float]: exactly two numbers
            return len(value) == len(args) and all(matches(v, a) for v, a in zip(value, args))
        args = [a for a in args if a is not Ellipsis]
        return len(args) != 1 or all(matches(v, args[0]) for v in value)
    if tp is dict or origin is dict:
        return isinstance(value, dict)
    if isinstance(tp, type):
        return isinstance(value, tp)
    return True  # a form this check does not know: accepted


def describe(tp) -> str:
    origin = typing.get_origin(tp)
    if origin is Literal:
        return "one of " + " | ".join(str(a) for a in typing.get_args(tp))
    if origin is Union:
        args = [a for a in typing.get_args(tp) if a is not type(None)]
        text = " or ".join(describe(a) for a in args)
        return text + " or null" if len(args) < len(typing.get_args(tp)) else text
    args = typing.get_args(tp)
    if origin is tuple and len(args) > 1 and Ellipsis not in args:
        plural = {int: "integers", float: "numbers", str: "strings", bool: "booleans"}
        if len(set(args)) == 1 and args[0] in plural:
            return f"a list of {len(args)} {plural[args[0]]}"
        return f"a list of {len(args)} items ({', '.join(describe(a) for a in args)})"
    names = {bool: "true or false", int: "an integer", float: "a number", str: "a string", list: "a list",
             tuple: "a list", dict: "a mapping"}
    return names.get(origin or tp, getattr(tp, "__name__", str(tp)))


def check_value(key: str, value, tp=Any, rng=None):
    """Raise ``ConfigError`` naming ``key`` unless ``value`` fits the type ``tp`` and, for a number (or each number
    of a list), ``rng``."""
    if not matches(value, tp):
        raise ConfigError(f"config key '{key}' must be {describe(tp)}, got {value!r}")
    if rng is not None and _is_number(value) and not within(value, rng):
        raise ConfigError(f"config key '{key}' must be {describe_range(rng)}, got {value!r}")
    if rng is not None and isinstance(value, (list, tuple)) and not all(
            within(v, rng) for v in value if _is_number(v)):
        raise ConfigError(f"config key '{key}' must hold values {describe_range(rng)}, got {value!r}")


# ------------------------------------------------------------------------------------------------
# checking a Config dataclass
# ------------------------------------------------------------------------------------------------

@functools.lru_cache(maxsize=None)
def declared(cls) -> dict:
    """Field name -> (type, range or None) of a Config dataclass; a range is inherited along the MRO."""
    hints = typing.get_type_hints(cls)
    ranges: dict = {}
    for klass in reversed(cls.__mro__):
        for f in (klass.__dict__.get("__dataclass_fields__") or {}).values():
            if "range" in f.metadata:
                ranges[f.name] = f.metadata["range"]
    return {f.name: (hints.get(f.name, Any), ranges.get(f.name)) for f in dataclasses.fields(cls)}


def check_fields(obj, prefix: str = "algo"):
    """Types, choices and bounds of every field of ``obj``."""
    for name, (tp, rng) in declared(type(obj)).items():
        check_value(f"{prefix}.{name}", getattr(obj, name), tp, rng)


def needs_peer_error(name: str) -> ConfigError:
    return ConfigError(f"algorithm '{name}' trains on the peer's rollouts and needs a peer source: {NEEDS_PEER_HINT}")


def validate(obj, run_cfg: dict, prefix: str = "algo"):
    """The one check of a Config object against the run config: fields, ``needs_peer``, then ``check``."""
    check_fields(obj, prefix)
    if getattr(obj, "needs_peer", False) and (run_cfg.get("peer") or {}).get("source", "none") == "none":
        raise needs_peer_error((run_cfg.get("algo") or {}).get("name", type(obj).__name__))
    check = getattr(obj, "check", None)
    if check is not None:
        check(run_cfg)
    return obj


def build(cls, values: dict, prefix: str = "algo"):
    """A ``cls`` dataclass from ``values`` (missing keys take their defaults) without running ``__init__`` or
    ``__post_init__``: no check runs here (the values are checked by ``validate``, once)."""
    known = {f.name: f for f in dataclasses.fields(cls)}
    unknown = sorted(set(values) - set(known))
    if unknown:
        raise ConfigError(f"unknown config key '{prefix}.{unknown[0]}' for {cls.__name__}; known: {sorted(known)}")
    obj = object.__new__(cls)
    for name, f in known.items():
        if name in values:
            value = copy.deepcopy(values[name])
        elif f.default is not dataclasses.MISSING:
            value = f.default
        elif f.default_factory is not dataclasses.MISSING:
            value = f.default_factory()
        else:
            raise ConfigError(f"config key '{prefix}.{name}' is required")
        object.__setattr__(obj, name, value)
    return obj
