"""Hardened math verifier: ``graftzoo.envs.verify(response, gold)`` (DESIGN.md "Real parts: Verifier";
spec anchors §3 row "Math verifier" and pain point 6; baseline_perf §3).

Per (response, gold):
  1. extract the final answer (graftzoo.envs.extract: last ``\\boxed``, then fallbacks), in the
     caller's process, with length and nesting limits;
  2. normalize both strings (spacing macros, ``\\left``/``\\right``, ``\\dfrac``) and take the fast
     exact path without math-verify: equal strings, or equal plain numbers (integers, decimals,
     integer fractions, and tuples/intervals of them) are correct; numbers that differ without a
     decimal point (e.g. two different integers) are wrong;
  3. look up the LRU of verdicts keyed by the normalized pair (timeouts included: a pair that timed
     out is not tried again under the same or a shorter timeout);
  4. otherwise run math-verify (its LaTeX path only: no ExprExtractionConfig, so no sympy string
     parser or eval on model text; latex2sympy passes sympy only digit tokens from its lexer)
     in a bounded pool of worker processes with a hard wall-clock kill per call and, optionally,
     a time budget per batch (``graftzoo.envs.verify_pool``: workers, timeouts, start-up and
     shutdown). The workers never import the caller's ``__main__``: any script may call the
     verifier, with or without an ``if __name__ == "__main__":`` guard.
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
from graftzoo.envs.verify_pool import DEFAULT_WORKERS, EXPIRED, close_pool, configure_pool, run_tasks

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
_NUMBER = re.compile(  # integer, decimal, integer fraction (\frac{a}{b}, \frac12, \frac9{19}, a/b) or infinity
    r"(?P<sign>[-+]?)(?:(?P<int>\d+)|(?P<dec>\d+\.\d*|\.\d+)"
    r"|\\frac(?:\{(?P<fn>-?\d+)\}|(?P<sn>\d))(?:\{(?P<fd>-?\d+)\}|(?P<sd>\d))|(?P<qn>\d+)/(?P<qd>\d+)|(?P<inf>\\infty))")
DECIMAL_GAP = 1e-4  # relative gap beyond which math-verify's rounding (6 places, 15 digits) cannot join two numbers
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
        elif g["qn"]:
            value = Fraction(int(g["qn"]), int(g["qd"]))
        else:
            value = Fraction(int(g["fn"] or g["sn"]), int(g["fd"] or g["sd"]))
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
    a decimal point, or when the values are too far apart for math-verify's rounding of decimals
    to join them (``DECIMAL_GAP``); nearby decimals (0.333333 for 1/3) are left to math-verify.
    """
    if a == b:
        return True
    x, y = _numbers(a), _numbers(b)
    if x is None or y is None or x[0] != y[0] or len(x[1]) != len(y[1]):
        return None
    pairs = list(zip(x[1], y[1]))
    if any(u != v and (eu and ev or _far_apart(u, v)) for (u, eu), (v, ev) in pairs):
        return False
    return True if all(u == v for (u, _), (v, _) in pairs) else None


def _far_apart(u, v) -> bool:
    """Whether two finite numbers differ by more than ``DECIMAL_GAP`` relative to the larger (or 1)."""
    if math.inf in (abs(u), abs(v)):
        return False
    return abs(u - v) > DECIMAL_GAP * max(1, abs(u), abs(v))


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


def _cached(key, timeout: float) -> tuple[str, bool] | None:
    """(status, verdict) cached for ``key``; a timeout counts only for a timeout no longer than the
    one it happened under (with more time the call may finish)."""
    hit = _VERDICTS.get(key)
    if hit is None or (hit[0] == "timeout" and timeout > hit[2]):
        return None
    return hit[0], hit[1]


def _store(key, status: str, verdict: bool, timeout: float) -> None:
    """Cache a verdict of math-verify (a call that ran out of budget, ``EXPIRED``, is not one)."""
    if status != EXPIRED:
        _VERDICTS.put(key, (status, verdict, timeout))


def clear_caches() -> None:
    """Forget cached verdicts (the workers' parse caches go with ``close_pool``)."""
    _VERDICTS.clear()


# ---------------------------------------------------------------- public API


def _check_seconds(name: str, value, none_ok: bool = False) -> None:
    if none_ok and value is None:
        return
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0:
        raise ValueError(f"verifier: {name} must be a positive number of seconds{' or None' if none_ok else ''}, "
                         f"got {value!r}")


def verify_batch(responses: list[str], golds: list[str], *, timeout: float = 1.0,
                 budget: float | None = None) -> list[VerifyResult]:
    """Verify ``responses[i]`` against ``golds[i]``; identical normalized pairs are computed once.

    ``timeout`` is the hard wall-clock limit (seconds) of each math-verify call; a call that hits
    it gets status "timeout", and that verdict is cached like any other. ``budget`` (seconds, None
    for no limit) bounds the wall-clock time of all of the batch's math-verify calls together
    (waiting for workers to start included): once it is spent, the calls not yet started get status
    "timeout" without running, and the running ones are stopped and get "timeout" too. Those
    verdicts are not cached (the calls never had their full ``timeout``): a later batch tries again.
    """
    if len(responses) != len(golds):
        raise ValueError(f"verify_batch: {len(responses)} responses but {len(golds)} golds")
    _check_seconds("timeout", timeout)
    _check_seconds("budget", budget, none_ok=True)
    results: list[VerifyResult | None] = [None] * len(responses)
    pending: dict[tuple[str, str], list[tuple[int, str]]] = {}
    seen: dict[tuple[str, str], tuple[str, str, bool | None]] = {}  # answers repeat within a group
    for i, (response, gold) in enumerate(zip(responses, golds)):
        for name, value in (("responses", response), ("golds", gold)):
            if not isinstance(value, str):
                raise TypeError(f"verify_batch: {name}[{i}] must be str, got {type(value).__name__}")
        extracted, status = extract_answer(response)
        if status != "ok":
            results[i] = VerifyResult(False, extracted, status)
            continue
        known = seen.get((extracted, gold))
        if known is None:
            pred, ref = normalize_answer(extracted), normalize_answer(gold)
            known = seen[(extracted, gold)] = (pred, ref, _fast_verdict(pred, ref))
        pred, ref, fast = known
        cached = ("ok", fast) if fast is not None else _cached(("verify", ref, pred), timeout)
        if cached is not None:
            results[i] = VerifyResult(cached[1], extracted, cached[0])
        else:
            pending.setdefault((ref, pred), []).append((i, extracted))
    if pending:
        keys = list(pending)
        outcomes = run_tasks([("verify", *k) for k in keys], timeout, budget)
        for (ref, pred), (status, correct) in zip(keys, outcomes):
            _store(("verify", ref, pred), status, correct, timeout)
            status = "timeout" if status == EXPIRED else status
            for i, extracted in pending[(ref, pred)]:
                results[i] = VerifyResult(correct, extracted, status)
    return results


def verify(response: str, gold: str, *, timeout: float = 1.0) -> VerifyResult:
    """Verify one response against its gold answer (see the module docstring for the pipeline)."""
    return verify_batch([response], [gold], timeout=timeout)[0]


def answers_equivalent(a: str, b: str, *, timeout: float = 1.0) -> bool | None:
    """Whether two extracted answers are mathematically equivalent (OM-GRPO answer clustering).

    Symmetric: math-verify is asked in both directions. None when either answer is too long, has
    unbalanced braces, cannot be parsed, or the comparison times out (a timeout is cached too).
    """
    for name, x in (("a", a), ("b", b)):
        if not isinstance(x, str):
            raise TypeError(f"answers_equivalent: {name} must be str, got {type(x).__name__}")
    _check_seconds("timeout", timeout)
    if any(len(x) > MAX_ANSWER_CHARS or not braces_balanced(x) for x in (a, b)):
        return None
    x, y = sorted((normalize_answer(a), normalize_answer(b)))
    fast = _fast_verdict(x, y)
    if fast is not None:
        return fast
    cached = _cached(("equiv", x, y), timeout)
    if cached is None:
        cached = run_tasks([("equiv", x, y)], timeout)[0]
        _store(("equiv", x, y), *cached, timeout)
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
