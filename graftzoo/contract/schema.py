"""How a config section is declared: a frozen pydantic model whose fields carry their type, bounds, default and a
one-line doc. pydantic does the validation; this module holds the conventions and turns pydantic's errors into one
line naming the key.

- ``Section``: the base of every section (the run config's and each learner's ``algo.*``): unknown keys are
  refused, values are strict (``1`` is not ``true``, ``"0.1"`` is not a number), never infinite or NaN, and the
  object is frozen once validated.
- ``Int``: an integer; an integral float (YAML's ``1e3``) is taken as that integer, a bool is not an integer.
- ``key(default, doc, ge=..., le=..., why=...)``: a field with its doc, bounds (pydantic's ``ge``/``gt``/``le``/
  ``lt``) and, optionally, the reason added to the error when a value is refused.
- ``config_error(exc, prefix)``: the first error of a ``ValidationError`` as a ``ConfigError``:
  ``config key 'optim.lr' must be >= 0, got -1``.
"""
from __future__ import annotations

import math
import typing
from typing import Annotated, Any, ClassVar, Literal, Union

import annotated_types as at
from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, ValidationError
from pydantic.fields import FieldInfo

from graftzoo.contract.errors import ConfigError, did_you_mean


def _integral(v):
    """YAML reads ``1e3`` as a float: an integral float is that integer (anything else is left to the check)."""
    if isinstance(v, float) and math.isfinite(v) and v.is_integer():
        return int(v)
    return v


Int = Annotated[int, BeforeValidator(_integral)]


class Section(BaseModel):
    """A config section: strict, frozen, no unknown keys, no infinities (module docstring). Built directly
    (``GRAFTConfig(delta=0.5)``), a refused value is a ``ConfigError`` naming ``key_prefix`` + the key."""

    model_config = ConfigDict(extra="forbid", frozen=True, strict=True, allow_inf_nan=False,
                              validate_default=False, protected_namespaces=())
    key_prefix: ClassVar[str] = ""

    def __init__(self, **data):
        try:
            super().__init__(**data)
        except ValidationError as e:
            raise config_error(e, type(self), data, self.key_prefix) from None

    # pydantic calls a model's own __init__ while validating a section that nests it, unless marked as its base
    # __init__: the nested section's error would then lose the path of its key (``model.lora.r``).
    __init__.__pydantic_base_init__ = True


def key(default: Any = ..., doc: str = "", *, why: str | None = None, **bounds) -> Any:
    """A declared field: ``default``, a one-line ``doc``, pydantic bounds (``ge``, ``gt``, ``le``, ``lt``) and
    ``why``, the reason the error gives when a value is refused."""
    extra = {"why": why} if why else None
    if callable(default) and not isinstance(default, (int, float, str, bool)) and default is not None:
        return Field(default_factory=default, description=doc, json_schema_extra=extra, **bounds)
    return Field(default, description=doc, json_schema_extra=extra, **bounds)


# ------------------------------------------------------------------------------------------------
# describing a declaration (errors and the key list)
# ------------------------------------------------------------------------------------------------

def _num(x: float) -> str:
    return str(int(x)) if float(x) == int(x) else str(x)


def bounds_of(metadata) -> tuple:
    """``(low, low excluded, high, high excluded)`` of a field's annotated-types bounds (None: open)."""
    lo = hi = None
    lo_open = hi_open = False
    for m in metadata:
        if isinstance(m, at.Ge):
            lo = m.ge
        elif isinstance(m, at.Gt):
            lo, lo_open = m.gt, True
        elif isinstance(m, at.Le):
            hi = m.le
        elif isinstance(m, at.Lt):
            hi, hi_open = m.lt, True
        elif isinstance(m, at.Interval):
            lo, lo_open = (m.gt, True) if m.gt is not None else (m.ge, False)
            hi, hi_open = (m.lt, True) if m.lt is not None else (m.le, False)
    return lo, lo_open, hi, hi_open


def describe_bounds(metadata) -> str:
    """``>= 1``, ``> 0``, ``<= 2`` or ``in (0, 1]``; "" when unbounded."""
    lo, lo_open, hi, hi_open = bounds_of(metadata)
    if lo is None and hi is None:
        return ""
    if hi is None:
        return f"{'>' if lo_open else '>='} {_num(lo)}"
    if lo is None:
        return f"{'<' if hi_open else '<='} {_num(hi)}"
    return f"in {'(' if lo_open else '['}{_num(lo)}, {_num(hi)}{')' if hi_open else ']'}"


def _unwrap(tp):
    """``Annotated[T, ...]`` -> (T, its metadata)."""
    if typing.get_origin(tp) is Annotated:
        args = typing.get_args(tp)
        meta = []
        for m in args[1:]:
            meta.extend(m.metadata if isinstance(m, FieldInfo) else [m])
        return args[0], meta
    return tp, []


def describe(tp) -> str:
    """What a value of type ``tp`` must be, in words: ``an integer``, ``one of a | b or null``, ..."""
    tp, _ = _unwrap(tp)
    origin = typing.get_origin(tp)
    if origin is Literal:
        return "one of " + " | ".join(str(a) for a in typing.get_args(tp))
    if origin is Union or str(origin) == "types.UnionType":
        args = [a for a in typing.get_args(tp) if a is not type(None)]
        text = " or ".join(describe(a) for a in args)
        return text + " or null" if len(args) < len(typing.get_args(tp)) else text
    args = typing.get_args(tp)
    if origin is tuple and len(args) > 1 and Ellipsis not in args:
        inner = [_unwrap(a)[0] for a in args]
        plural = {int: "integers", float: "numbers", str: "strings", bool: "booleans"}
        if len(set(inner)) == 1 and inner[0] in plural:
            return f"a list of {len(args)} {plural[inner[0]]}"
        return f"a list of {len(args)} items ({', '.join(describe(a) for a in args)})"
    if isinstance(tp, type) and issubclass(tp, BaseModel):
        return "a mapping"
    names = {bool: "true or false", int: "an integer", float: "a number", str: "a string", list: "a list",
             tuple: "a list", dict: "a mapping"}
    return names.get(origin or tp, getattr(tp, "__name__", str(tp)))


def _item_bounds(tp) -> list:
    """The bounds of a list's or tuple's items (``tuple[Annotated[float, Field(ge=0)], ...]``)."""
    tp, _ = _unwrap(tp)
    for a in typing.get_args(tp):
        if a is not type(None):
            inner, meta = _unwrap(a)
            if meta:
                return meta
            if typing.get_origin(inner) in (list, tuple):
                return _item_bounds(inner)
    return []


# ------------------------------------------------------------------------------------------------
# one error line
# ------------------------------------------------------------------------------------------------

def section_class(annotation):
    """The pydantic model class inside an annotation (``Optional[LoraSection]`` -> ``LoraSection``), or None."""
    tp, _ = _unwrap(annotation)
    for a in (typing.get_args(tp) or (tp,)):
        if isinstance(a, type) and issubclass(a, BaseModel):
            return a
    return None


def _field_at(model: type, loc: tuple):
    """The (FieldInfo, rest of loc) of the field ``loc`` names inside ``model``, following nested sections."""
    info, rest = None, list(loc)
    while rest and isinstance(rest[0], str) and isinstance(model, type) and issubclass(model, BaseModel):
        name = rest.pop(0)
        info = model.model_fields.get(name)
        if info is None:
            return None, rest
        tp, _ = _unwrap(info.annotation)
        nested = [a for a in (typing.get_args(tp) or (tp,)) if isinstance(a, type) and issubclass(a, BaseModel)]
        model = nested[0] if nested and rest and isinstance(rest[0], str) else None
    return info, rest


def _value_at(data, loc):
    for part in loc:
        try:
            data = data[part]
        except (KeyError, IndexError, TypeError):
            return None
    return data


BOUND_ERRORS = ("greater_than", "greater_than_equal", "less_than", "less_than_equal")


def _names(err: dict) -> list:
    """The key names of an error's location (a union's member tags and list indices left out)."""
    return [p for p in err["loc"] if isinstance(p, str) and not ("[" in p or p.startswith("function-"))]


def config_error(exc: ValidationError, model: type, data: Any = None, prefix: str = "") -> ConfigError:
    """The first error of ``exc`` (validating ``data`` as ``model``) as one line naming the key. A value refused by
    every member of a union (``task.difficulty``: a level or skill -> level) is reported by its bound when one of
    them refused it by a bound (``{mul: 500}``: its level is above the bound, not "not an integer")."""
    errors = exc.errors()
    err = errors[0]
    if err["type"] not in BOUND_ERRORS:
        first = _names(err)
        err = next((e for e in errors if e["type"] in BOUND_ERRORS and _names(e)[:len(first)] == first), err)
    names = _names(err)
    if err["type"] == "extra_forbidden":
        parent = model
        if len(names) > 1:
            info, _ = _field_at(model, tuple(names[:-1]))
            parent = section_class(info.annotation) if info is not None else None
        known = sorted(parent.model_fields) if parent is not None else []
        where = prefix + ".".join(names[:-1]) if len(names) > 1 else prefix.rstrip(".") or "<root>"
        key = f"{prefix}{'.'.join(names)}"
        hint = did_you_mean(names[-1], known, key[:len(key) - len(names[-1])]) or ";"
        return ConfigError(f"unknown config key '{key}'{hint} known keys under '{where}': {known}")
    info, rest = _field_at(model, tuple(names))
    # an item of a list (loc ends in an index): the message is about the whole list
    path = ".".join(names[:len(names) - len([r for r in rest if isinstance(r, str)])]) if info else ".".join(names)
    full = f"{prefix}{path}"
    if err["type"] in ("value_error", "assertion_error") and isinstance(err.get("ctx", {}).get("error"), ConfigError):
        return err["ctx"]["error"]
    if info is None:
        return ConfigError(f"config key '{full}': {err['msg']}")
    value = _value_at(data, tuple(path.split("."))) if data is not None else err.get("input")
    if value is None and err.get("input") is not None:
        value = err.get("input")
    what = describe(info.annotation)
    own_bounds = describe_bounds(info.metadata)
    items = describe_bounds(_item_bounds(info.annotation))
    extra = info.json_schema_extra if isinstance(info.json_schema_extra, dict) else {}
    why = f": {extra['why']}" if extra.get("why") else ""
    kind = err["type"]
    if kind in BOUND_ERRORS:
        if items and (isinstance(value, (list, tuple, dict)) or not own_bounds):
            held = isinstance(value, (list, tuple, dict))
            return ConfigError(f"config key '{full}' must {'hold values' if held else 'be'} {items}, "
                               f"got {value!r}{why}")
        return ConfigError(f"config key '{full}' must be {own_bounds}, got {value!r}{why}")
    if kind == "finite_number":
        return ConfigError(f"config key '{full}' must be a finite number{' ' + own_bounds if own_bounds else ''}, "
                           f"got {value!r}{why}")
    return ConfigError(f"config key '{full}' must be {what}, got {value!r}{_named_value_hint(info, value)}{why}")


def literal_values(tp) -> list:
    """The named values a declaration accepts (its ``Literal`` members, inside a union too): ``hf``, ``vllm``."""
    tp, _ = _unwrap(tp)
    if typing.get_origin(tp) is Literal:
        return [str(a) for a in typing.get_args(tp)]
    if typing.get_origin(tp) is Union or str(typing.get_origin(tp)) == "types.UnionType":
        return [v for a in typing.get_args(tp) for v in literal_values(a)]
    return []


def _named_value_hint(info, value) -> str:
    """``"; did you mean 'vllm'?"`` for a string value close to one of a key's named values (``VLLM``)."""
    named = literal_values(info.annotation)
    return did_you_mean(value, named) if isinstance(value, str) and named else ""


def validate_section(model: type, data: Any, prefix: str = ""):
    """``model`` validated from ``data``; a refused value is a ``ConfigError`` naming its key (``prefix`` + key)."""
    try:
        return model.model_validate(data)
    except ValidationError as e:
        raise config_error(e, model, data, prefix) from None


REQUIRED = "(required)"  # the default declared_keys shows for a key without one


def declared_keys(model: type, prefix: str = "") -> list:
    """``(key, type in words, default, doc)`` of every field of ``model`` and of its nested sections; the keys of a
    list of sections' items are ``KEY[].item`` (``pair.models[].lr``); a required key's default is ``REQUIRED``."""
    out = []
    for name, info in model.model_fields.items():
        tp, _ = _unwrap(info.annotation)
        nested = [a for a in (typing.get_args(tp) or (tp,)) if isinstance(a, type) and issubclass(a, Section)]
        full = f"{prefix}{name}"
        inner = full + ("[]." if typing.get_origin(tp) is list else ".")
        if nested and not info.description:
            out += declared_keys(nested[0], inner)
            continue
        default = REQUIRED if info.is_required() else info.get_default(call_default_factory=True)
        if isinstance(default, BaseModel):
            default = default.model_dump(mode="json")
        bounds = describe_bounds(info.metadata) or describe_bounds(_item_bounds(info.annotation))
        what = describe(info.annotation) + (f", {bounds}" if bounds else "")
        out.append((full, what, default, info.description or ""))
        if nested:
            out += declared_keys(nested[0], inner)
    return out
