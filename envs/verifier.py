"""Hardened math verifier: ``graftzoo.envs.verify(response, gold)`` (DESIGN.md "Real parts: Verifier";
spec anchors §3 row "Math verifier" and pain point 6; baseline_perf §3).

Per (response, gold):
  1. extract the final answer (graftzoo.envs.extract: last ``\\boxed``, then fallbacks), in the
     caller's process, with length and nesting limits;
  2. normalize both strings (spacing macros, ``\\left``/``\\right``, ``\\dfrac``) and take the fast
     exact path without math-verify: equal strings, or equal plain numbers (integers, decimals,
     integer fractions, and tuples/intervals of them) are correct; numbers that differ without a
     decimal point (e.g. two different integers) are wrong;
  3. look up the LRU of verdicts keyed by the normalized pair;
  4. otherwise run math-verify (its LaTeX path only: no ExprExtractionConfig, so no sympy string
     parser or eval on model text; latex2sympy passes sympy only digit tokens from its lexer)
     in a bounded pool of worker processes with a hard wall-clock kill per call
     (``graftzoo.envs.verify_pool``: workers, timeouts, start-up and shutdown).
"""
from __future__ import annotations

import math
import re
import threading
from collections import OrderedDict
from dataclasses import dataclass
from fractions import Fraction
from importlib.metadata import version

from graftzoo.envs.extract import MAX_ANSWER_CHARS, braces_balanced, extract_answer
from graftzoo.envs.verify_pool import DEFAULT_WORKERS, close_pool, configure_pool, run_tasks

__all__ = ["VerifyResult", "verify", "verify_batch", "answers_equivalent", "answer_classes", "extract_answer",
           "normalize_answer", "configure_pool", "close_pool", "clear_caches", "VERIFIER_VERSION",
           "DEFAULT_WORKERS"]

VERIFIER_VERSION = f"graftzoo-verifier-1+math-verify-{version('math-verify')}"
STATUSES = ("ok", "no_answer", "unparsable", "timeout", "multiple_answers")
VERDICT_CACHE_SIZE = 65_536


@dataclass(frozen=True)
class VerifyResult:
    """Verdict for one response. ``status`` is one of STATUSES; "ok" means parsed and compared."""

    correct: bool
    extracted: str | None
    status: str


# ---------------------------------------------------------------- normalization and fast path

# Group 1 keeps a LaTeX row break (two backslashes) whole, so that in "1 \\ 2" its second
# backslash is not taken for the space macro "\ ". Dollars, escaped or not, are dropped.
_DROP = re.compile(r"(\\\\)|\\?\$|\\(?:left|right)\.|\\(?:left|right)(?![A-Za-z])|\\[,;:! ]|\\displaystyle|~")
_SMALL_FRAC = re.compile(r"\\[dt]frac(?![A-Za-z])")
_SPACE_NEAR_SYMBOL = re.compile(r"\s+(?=[^A-Za-z0-9])|(?<=[^A-Za-z0-9])\s+")
_NUMBER = re.compile(  # integer, decimal, integer fraction (\frac{a}{b}, \frac12, a/b) or infinity
    r"(?P<sign>[-+]?)(?:(?P<int>\d+)|(?P<dec>\d+\.\d*|\.\d+)|\\frac\{(?P<fn>-?\d+)\}\{(?P<fd>-?\d+)\}"
    r"|\\frac(?P<sn>\d)(?P<sd>\d)|(?P<qn>\d+)/(?P<qd>\d+)|(?P<inf>\\infty))")
_BRACKETED = re.compile(r"([(\[])([^()\[\]]*)([)\]])")


def normalize_answer(s: str) -> str:
    """Verdict-preserving normalization used as cache key and by the fast path.

    Drops ``$`` and ``\\$``, spacing macros (``\\,`` ``\\!`` ...), ``\\left``/``\\right``, ``\\displaystyle``,
    maps ``\\dfrac``/``\\tfrac`` to ``\\frac``, removes spaces next to symbols and a final period.
    """
    s = _SMALL_FRAC.sub(r"\\frac", _DROP.sub(lambda m: m.group(1) or "", s))
    s = _SPACE_NEAR_SYMBOL.sub("", " ".join(s.split()))
    return s.rstrip(".")


def _number(s: str) -> tuple[Fraction | float, bool] | None:
    """(value, exact) of a plain number; exact is False when a decimal point is involved."""
    m = _NUMBER.fullmatch(s)
    if m is None:
        return None
    g = m.groupdict()
    try:
        if g["inf"]:
            value = math.inf
        elif g["int"] or g["dec"]:
            value = Fraction(g["int"] or g["dec"])
        else:
            num, den = (g["fn"], g["fd"]) if g["fn"] else (g["sn"], g["sd"]) if g["sn"] else (g["qn"], g["qd"])
            value = Fraction(int(num), int(den))
    except ZeroDivisionError:
        return None
    return (-value if g["sign"] == "-" else value), not g["dec"]


def _numbers(s: str) -> tuple[str, list] | None:
    """A plain number, or a bracketed tuple/interval of plain numbers, as (brackets, [(value, exact)])."""
    m = _BRACKETED.fullmatch(s)
    brackets, parts = (m.group(1) + m.group(3), m.group(2).split(",")) if m else ("", [s])
    values = [_number(p) for p in parts]
    return None if None in values else (brackets, values)


def _fast_verdict(a: str, b: str) -> bool | None:
    """Verdict for two normalized answers without math-verify, or None when it must decide.

    Equal strings are equivalent. Plain numbers (integers, decimals, integer fractions, infinity)
    and bracketed tuples/intervals of them with the same brackets are compared exactly by value:
    equal values are equivalent; a component that differs is a wrong answer when neither side has
    a decimal point (decimals are left to math-verify's rounding rules).
    """
    if a == b:
        return True
    x, y = _numbers(a), _numbers(b)
    if x is None or y is None or x[0] != y[0] or len(x[1]) != len(y[1]):
        return None
    pairs = list(zip(x[1], y[1]))
    if any(u != v and eu and ev for (u, eu), (v, ev) in pairs):
        return False
    return True if all(u == v for (u, _), (v, _) in pairs) else None


class _LRU:
    """Thread-safe LRU dict of verdicts."""

    def __init__(self, size: int):
        self._size, self._data, self._lock = size, OrderedDict(), threading.Lock()

    def get(self, key):
        with self._lock:
            if key in self._data:
                self._data.move_to_end(key)
                return self._data[key]
        return None

    def put(self, key, value) -> None:
        with self._lock:
            self._data[key] = value
            self._data.move_to_end(key)
            if len(self._data) > self._size:
                self._data.popitem(last=False)

    def clear(self) -> None:
        with self._lock:
            self._data.clear()


_VERDICTS = _LRU(VERDICT_CACHE_SIZE)


def clear_caches() -> None:
    """Forget cached verdicts (the workers' parse caches go with ``close_pool``)."""
    _VERDICTS.clear()


# ---------------------------------------------------------------- public API


def _check_timeout(timeout: float) -> None:
    if not isinstance(timeout, (int, float)) or not timeout > 0:
        raise ValueError(f"verifier: timeout must be a positive number of seconds, got {timeout!r}")


def verify_batch(responses: list[str], golds: list[str], *, timeout: float = 1.0) -> list[VerifyResult]:
    """Verify ``responses[i]`` against ``golds[i]``; identical normalized pairs are computed once.

    ``timeout`` is the hard wall-clock limit (seconds) of each math-verify call.
    """
    if len(responses) != len(golds):
        raise ValueError(f"verify_batch: {len(responses)} responses but {len(golds)} golds")
    _check_timeout(timeout)
    results: list[VerifyResult | None] = [None] * len(responses)
    pending: dict[tuple[str, str], list[tuple[int, str]]] = {}
    for i, (response, gold) in enumerate(zip(responses, golds)):
        for name, value in (("responses", response), ("golds", gold)):
            if not isinstance(value, str):
                raise TypeError(f"verify_batch: {name}[{i}] must be str, got {type(value).__name__}")
        extracted, status = extract_answer(response)
        if status != "ok":
            results[i] = VerifyResult(False, extracted, status)
            continue
        pred, ref = normalize_answer(extracted), normalize_answer(gold)
        fast = _fast_verdict(pred, ref)
        cached = ("ok", fast) if fast is not None else _VERDICTS.get(("verify", ref, pred))
        if cached is not None:
            results[i] = VerifyResult(cached[1], extracted, cached[0])
        else:
            pending.setdefault((ref, pred), []).append((i, extracted))
    if pending:
        keys = list(pending)
        for (ref, pred), (status, correct) in zip(keys, run_tasks([("verify", *k) for k in keys], timeout)):
            if status != "timeout":
                _VERDICTS.put(("verify", ref, pred), (status, correct))
            for i, extracted in pending[(ref, pred)]:
                results[i] = VerifyResult(correct, extracted, status)
    return results


def verify(response: str, gold: str, *, timeout: float = 1.0) -> VerifyResult:
    """Verify one response against its gold answer (see the module docstring for the pipeline)."""
    return verify_batch([response], [gold], timeout=timeout)[0]


def answers_equivalent(a: str, b: str, *, timeout: float = 1.0) -> bool | None:
    """Whether two extracted answers are mathematically equivalent (OM-GRPO answer clustering).

    Symmetric: math-verify is asked in both directions. None when either answer is too long, has
    unbalanced braces, cannot be parsed, or the comparison times out.
    """
    for name, x in (("a", a), ("b", b)):
        if not isinstance(x, str):
            raise TypeError(f"answers_equivalent: {name} must be str, got {type(x).__name__}")
    _check_timeout(timeout)
    if any(len(x) > MAX_ANSWER_CHARS or not braces_balanced(x) for x in (a, b)):
        return None
    x, y = sorted((normalize_answer(a), normalize_answer(b)))
    fast = _fast_verdict(x, y)
    if fast is not None:
        return fast
    cached = _VERDICTS.get(("equiv", x, y))
    if cached is None:
        cached = run_tasks([("equiv", x, y)], timeout)[0]
        if cached[0] != "timeout":
            _VERDICTS.put(("equiv", x, y), cached)
    status, same = cached
    return same if status == "ok" else None


def answer_classes(answers, timeout: float = 1.0) -> list:
    """Equivalence-class ids of answers (None stays None): each answer joins the first earlier class whose
    representative ``answers_equivalent`` accepts (OM-GRPO's answer clustering, spec algos_single §4.8.3)."""
    reps: list = []
    out: list = []
    for a in answers:
        if a is None:
            out.append(None)
            continue
        for ci, rep in enumerate(reps):
            if a == rep or answers_equivalent(a, rep, timeout=timeout) is True:
                out.append(ci)
                break
        else:
            reps.append(a)
            out.append(len(reps) - 1)
    return out
