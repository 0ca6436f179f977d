"""Hardened math verifier: ``graftzoo.envs.verify(response, gold)`` (docs/verifier.md;
docs/verifier.md row "Math verifier" and pain point 6; docs/scaling.md).

Per (response, gold):
  0. read the gold (``_read_gold``): a gold written as a worked solution by its final answer (the answer after
     "final answer is", "the answer is", "####": ``final_answer``; its boxes math-verify reads), and its parts
     (``answer_parts``: one, a list, a set, a tuple or named parts such as ``y_1 = 2x+1, y_2 = 3``);
  1. locate the answer (graftzoo.envs.extract), in the caller's process, with length and nesting
     limits: the last ``\\boxed{}`` (with the boxes joined to it by commas or "and": one answer
     read as a set), or, without any box, the text for math-verify to read. Against a gold of several
     parts, the last boxes, one a part, where each is introduced as a part ("(b)", "y_2 = "), read as the
     gold is read: a set, a tuple in order, or named parts (``locate_parts``). Hedges ("12 or 15",
     boxes joined by "or") are "multiple_answers", never paid;
  2. unboxed text: math-verify's own ``parse`` (``LatexExtractionConfig`` with boxed priority,
     ``ExprExtractionConfig``: answer phrases, the last math span, plain numbers with thousands
     separators) finds the answer and math-verify's ``verify`` compares it with the gold, in a
     worker process (one call, cached by gold and text); nothing found is "no_answer";
  3. normalize both answers (``normalize_answer``: rules that cannot change math-verify's verdict)
     and take the fast exact path without math-verify: equal strings, or equal plain numbers
     (integers, decimals, integer fractions, and tuples/intervals of them) are correct; numbers that
     differ without a decimal point (e.g. two different integers) are wrong;
  4. look up the LRU of verdicts keyed by the normalized pair and the ``VerifierOptions`` (timeouts
     included: a pair that timed out is not tried again under the same or a shorter timeout);
  5. otherwise run math-verify's ``verify`` with those options in a bounded pool of worker
     processes with a hard wall-clock kill per call and, optionally, a time budget per batch
     (``graftzoo.envs.verify_pool``); a batch's unboxed texts and answers go in one pool run. The workers never import the caller's ``__main__``: any script
     may call the verifier, with or without an ``if __name__ == "__main__":`` guard. The budget may be
     ``"auto"``: computed per batch from its number of calls, the timeout and the pool's size
     (``auto_budget``); an answer the budget cut off is marked ``unverified`` (not judged wrong).

``reward_fn`` wraps the same pipeline as a reward function with TRL's ``reward_funcs`` signature.
"""
from __future__ import annotations

import math
import re
import threading
from collections import OrderedDict
from dataclasses import dataclass, field, fields, replace
from fractions import Fraction
from importlib.metadata import version

from graftzoo.envs.extract import (MAX_ANSWER_CHARS, _ALTERNATIVES, Located, Parts, answer_parts, braces_balanced,
                                   extract_answer, fallback_answer, final_answer, locate_parts, stated_answer)
from graftzoo.envs.verify_pool import (AUTO, DEFAULT_WORKERS, EXPIRED, auto_budget, auto_workers, close_pool,
                                       configure_pool, pool_size, run_tasks, start_pool)

__all__ = ["VerifyResult", "VerifierOptions", "REFUSALS", "NORMALIZATIONS", "verify", "verify_batch", "answers_equivalent", "answer_classes",
           "extract_answer", "normalize_answer", "reward_fn", "configure_pool", "close_pool", "start_pool",
           "clear_caches", "verifier_version", "VERIFIER_VERSION", "DEFAULT_WORKERS", "auto_budget", "auto_workers",
           "pool_size"]

STATUSES = ("ok", "no_answer", "unparsable", "timeout", "multiple_answers")
VERDICT_CACHE_SIZE = 65_536


@dataclass(frozen=True)
class VerifierOptions:
    """The options of math-verify's ``verify`` that the verifier passes on; the defaults are
    math-verify's own (0.9.0).

    - ``float_rounding``: decimal places floats are rounded to before they are compared;
    - ``numeric_precision``: significant digits of numeric evaluation;
    - ``strict``: variables must match and ``x = 2`` is not the answer ``2`` (False: looser);
    - ``allow_set_relation_comp``: a set may equal a relation (``{1,2}`` against ``x=1 or x=2``).
    """

    float_rounding: int = 6
    numeric_precision: int = 15
    strict: bool = True
    allow_set_relation_comp: bool = False

    def __post_init__(self):
        for f in fields(self):
            value = getattr(self, f.name)
            if f.type in ("int", int):
                if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                    raise ValueError(f"VerifierOptions.{f.name} must be a non-negative int, got {value!r}")
            elif not isinstance(value, bool):
                raise ValueError(f"VerifierOptions.{f.name} must be True or False, got {value!r}")

    def items(self) -> tuple:
        """(name, value) pairs, in field order: what the workers pass to math-verify's ``verify``."""
        return tuple((f.name, getattr(self, f.name)) for f in fields(self))

    def tag(self) -> str:
        """``float_rounding=6,numeric_precision=15,strict=True,allow_set_relation_comp=False``."""
        return ",".join(f"{k}={v}" for k, v in self.items())


DEFAULT_OPTIONS = VerifierOptions()


def verifier_version(options: VerifierOptions | None = None) -> str:
    """The verifier's version with math-verify's and the options: recorded in every eval artifact."""
    return f"graftzoo-verifier-4+math-verify-{version('math-verify')}+{_options(options).tag()}"


def _options(options) -> VerifierOptions:
    if options is None:
        return DEFAULT_OPTIONS
    if isinstance(options, dict):
        return VerifierOptions(**options)
    if not isinstance(options, VerifierOptions):
        raise TypeError(f"verifier: options must be a VerifierOptions, a dict of its fields or None, "
                        f"got {type(options).__name__}")
    return options


VERIFIER_VERSION = verifier_version()


# Why a verdict may be wrong where plain math-verify (``verify(parse(gold), parse(response))``) pays:
# each refusal is named in ``VerifyResult.reason`` (docs/verifier.md "Dominance").
REFUSALS = {
    "hedge": 'the answer offers alternatives ("12 or 15", boxes joined by "or")',
    "last_box": "several boxes that are not one answer: the last one and the boxes joined to it are read, "
                "where math-verify joins every box of the text",
    "boxes_apart": "boxes joined into one answer are read apart (as a set, or in order against a tuple), never merged "
                   "into one number",
    "fragment": "math-verify reads a piece of the answer or of the gold (the 1 of 3t - 1, the 4 of 4 4/9); "
                "graftzoo reads the whole",
    "relation_lhs": "the answer states a relation whose left side differs from the gold's",
    "gold_relation": "the gold is an equation of several terms (a + z = 0), which a value does not answer",
    "unreadable": "a box that is broken, or an answer over the length or nesting limits",
    "timeout": "its math-verify call ran out of its timeout",
    "budget": "the batch's budget ran out before its call finished (unverified)",
}
# Why a verdict may be correct where plain math-verify does not pay: the reading that paid, each kept
# apart from a different answer by its own test (tests/test_verifier_suite.py).
NORMALIZATIONS = {
    "same_string": "the answer and the gold are the same string once normalized (``normalize_answer``)",
    "same_number": "plain numbers (integers, decimals, integer fractions, tuples and intervals of them) of equal value",
    "gold_as_answer": "the gold read as a boxed answer, where math-verify reads the gold as written otherwise "
                      "([0,1) or 7:30 bare: nothing, or a piece of it)",
    "bare_answer": "a short unboxed answer read whole, as if boxed",
    "box_prose": "a box holding prose read as math-verify reads prose",
    "gold_prose": "a gold in prose or with units read as math-verify reads it, or a worked solution read by its "
                  "final answer (the answer after \"final answer is\", \"the answer is\", \"####\")",
    "gold_parts": "several boxes read as one answer where the gold has several parts, each box introduced as a "
                  "part (\"(b)\", \"y_2 = \"), where math-verify reads the last box alone",
    "mixed_number": 'a mixed number in prose ("4 4/9") read whole (40/9), not as its integer part',
}


@dataclass(frozen=True)
class VerifyResult:
    """Verdict for one response. ``status`` is one of STATUSES; "ok" means parsed and compared.
    ``unverified``: the batch's budget ran out before math-verify decided it (status "timeout", never
    correct, not cached), as opposed to a call that ran out of its own timeout. ``reason``: for a
    wrong verdict the refusal that applied (a key of ``REFUSALS``), for a correct one the lenient
    reading that paid (a key of ``NORMALIZATIONS``); None otherwise."""

    correct: bool
    extracted: str | None
    status: str
    unverified: bool = False
    reason: str | None = field(default=None, compare=False)  # explains the verdict; not part of it


# ---------------------------------------------------------------- normalization and fast path

# Group 1 keeps a LaTeX row break (two backslashes) whole, so that in "1 \\\\ 2" its second
# backslash is not taken for the space macro "\\ ". Group 2, the spacing macros and "~", becomes a
# space: math-verify reads "1,\\,000" as the set {1, 0}, so the space after a comma must stay.
# Dollars, escaped or not, the negative space "\\!" and \\left/\\right are dropped.
_DROP = re.compile(r"(\\\\)|(\\[,;: ]|~)|\\?\$|\\(?:left|right)\.|\\(?:left|right)(?![A-Za-z])|\\! *|\\displaystyle")
_SMALL_FRAC = re.compile(r"\\[dt]frac(?![A-Za-z])")
_UPRIGHT_E = re.compile(r"\\mathrm\s*\{\s*e\s*\}")  # Euler's number set upright; math-verify reads e, not \mathrm{e}
# A space next to a symbol other than a comma (a comma's spaces tell "32, 349" from 32349).
_SPACE_NEAR_SYMBOL = re.compile(r"\s+(?=[^A-Za-z0-9,\s])|(?<=[^A-Za-z0-9,\s])\s+")
_WHITESPACE = re.compile(r"[ \t\n\r]+")  # ASCII only: "\f" in "\frac" typed as a form feed stays as it is
_TRAILING_BREAK = re.compile(r"(?:\\\\)+\Z")  # a row break that ends the answer ("185\\\\"): math-verify fails on it
_SPACE_BEFORE_COMMA = re.compile(r"(?<=[^\d\s])\s+,")
_NUMBER = re.compile(  # integer, decimal, integer fraction (\frac{a}{b}, \frac12, \frac9{19}, a/b) or infinity
    r"(?P<sign>[-+]?)(?:(?P<int>\d+)|(?P<dec>\d+\.\d*|\.\d+)"
    r"|\\frac(?:\{(?P<fn>-?\d+)\}|(?P<sn>\d))(?:\{(?P<fd>-?\d+)\}|(?P<sd>\d))|(?P<qn>\d+)/(?P<qd>\d+)|(?P<inf>\\infty))")
DECIMAL_GAP = 1e-4  # relative gap beyond which math-verify's rounding (6 places, 15 digits) cannot join two numbers
_BRACKETED = re.compile(r"([(\[])([^()\[\]]*)([)\]])")


def normalize_answer(s: str) -> str:
    """Verdict-preserving normalization used as cache key and by the fast path.

    Drops ``$`` and ``\\$``, ``\\!`` (with the spaces after it, as math-verify does: "32,\\! 349" is 32349), ``\\left``/``\\right``, ``\\displaystyle``; turns the
    spacing macros (``\\,`` ``\\;`` ``\\:`` ``\\ `` ``~``) into spaces; maps ``\\dfrac``/``\\tfrac``
    to ``\\frac`` and ``\\mathrm{e}`` (Euler's number set upright) to ``e``; removes spaces next to symbols other than commas (and before a comma that
    follows no digit), a final period and a final row break. Two different answers never normalize to one string:
    the spaces that separate numbers ("32, 349", "1 234") stay.
    """
    s = _UPRIGHT_E.sub("e", s)
    s = _SMALL_FRAC.sub(r"\\frac", _DROP.sub(lambda m: m.group(1) or (" " if m.group(2) else ""), s))
    s = _SPACE_NEAR_SYMBOL.sub("", _WHITESPACE.sub(" ", s).strip())
    return _TRAILING_BREAK.sub("", _SPACE_BEFORE_COMMA.sub(",", s).rstrip("."))
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
    values = [_number(p.strip()) for p in parts]
    return None if None in values else (brackets, values)


def _fast_verdict(a: str, b: str, options: VerifierOptions = DEFAULT_OPTIONS) -> bool | None:
    """Verdict for two normalized answers without math-verify, or None when it must decide.

    Equal strings are equivalent. With math-verify's default options (the rounding below assumes
    them; other options leave numbers to math-verify): Plain numbers (integers, decimals, integer fractions, infinity)
    and bracketed tuples/intervals of them with the same brackets are compared exactly by value:
    equal values are equivalent; a component that differs is a wrong answer when neither side has
    a decimal point, or when the values are too far apart for math-verify's rounding of decimals
    to join them (``DECIMAL_GAP``); nearby decimals (0.333333 for 1/3) are left to math-verify.
    """
    if a == b:
        return True
    if options != DEFAULT_OPTIONS:
        return None
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


def _cached(key, timeout: float) -> tuple | None:
    """The outcome cached for ``key``: (status, verdict), and for an unboxed text also the answer
    math-verify read in it. A timeout counts only for a timeout no longer than the one it happened
    under (with more time the call may finish)."""
    hit = _VERDICTS.get(key)
    if hit is None or (hit[0][0] == "timeout" and timeout > hit[1]):
        return None
    return hit[0]


def _store(key, outcome: tuple, timeout: float) -> None:
    """Cache an outcome of math-verify (a call that ran out of budget, ``EXPIRED``, is not one)."""
    if outcome[0] != EXPIRED:
        _VERDICTS.put(key, (tuple(outcome), timeout))


def clear_caches() -> None:
    """Forget cached verdicts (the workers' parse caches go with ``close_pool``)."""
    _VERDICTS.clear()


# ---------------------------------------------------------------- public API


def _check_seconds(name: str, value, none_ok: bool = False) -> None:
    """A positive number of seconds; with ``none_ok`` (a budget) also None or ``"auto"``."""
    if none_ok and (value is None or value == AUTO):
        return
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0:
        raise ValueError(f"verifier: {name} must be a positive number of seconds{', None or auto' if none_ok else ''}, "
                         f"got {value!r}")


def _pred_key(parts: tuple) -> str | tuple:
    """The normalized prediction sent to math-verify: one string, or a tuple of box contents."""
    normalized = tuple(normalize_answer(p) for p in parts)
    return normalized[0] if len(normalized) == 1 else normalized


def _result(kind: str, outcome: tuple, extracted: str | None, refusal: str | None = None) -> VerifyResult:
    """The verdict of one math-verify outcome: (status, verdict, the answer read in prose or None,
    reason) (a call that failed or ran out of time gives the first two only). An answer read in
    prose that is over the length limit or offers alternatives ("12 or 15") is not paid. ``EXPIRED``
    is reported as "timeout", marked ``unverified``. ``refusal``: the reason of a wrong verdict on
    the located boxes ("last_box", "boxes_apart") when the workers give none."""
    status, correct, answer, reason = (tuple(outcome) + (None, None))[:4]
    if status == EXPIRED:
        return VerifyResult(False, None if kind == "text" else extracted, "timeout", True, "budget")
    if status == "timeout":
        return VerifyResult(False, None if kind == "text" else extracted, "timeout", reason="timeout")
    shown = answer if kind == "text" else extracted
    if status == "ok" and answer is not None and _ALTERNATIVES.search(answer):
        return VerifyResult(False, shown, "multiple_answers", reason="hedge")
    if status == "ok" and answer is not None and len(answer) > MAX_ANSWER_CHARS:
        return VerifyResult(False, shown, "unparsable", reason="unreadable")
    correct = bool(correct) and status == "ok"
    if not correct and reason is None and status == "ok":
        reason = refusal  # the boxes graftzoo read apart from the others
    return VerifyResult(correct, shown, status, reason=reason)


MAX_BARE_CHARS = 300  # an unboxed response this short is also read whole, as a bare answer
_STATUS_REASON = {"multiple_answers": "hedge", "unparsable": "unreadable"}
_ANSWER_READINGS = ("bare_answer", "box_prose", "mixed_number")  # lenient readings of the answer, not of the gold


def _read_gold(gold: str) -> tuple[str, str, Parts]:
    """(answer, normalized answer, parts) of a gold: its final answer (``final_answer``: a worked solution is read
    by the answer after its last answer mark, docs/verifier.md#a-golds-final-answer), normalized, and the parts of
    what it states (its boxes, else that answer: ``answer_parts``, docs/verifier.md#answers-of-several-parts)."""
    answer = final_answer(gold)
    return answer, normalize_answer(answer), answer_parts(normalize_answer(stated_answer(gold)))


def _paid_reason(result: VerifyResult, parts_read: bool, final: bool) -> VerifyResult:
    """A correct verdict named by the gold's reading that paid it (docs/verifier.md#answers-of-several-parts):
    "gold_parts" when boxes were read as the gold's parts (more boxes than those joined, with their names, or in
    order), else "gold_prose" when the gold was read by its final answer (docs/verifier.md#a-golds-final-answer);
    a lenient reading of the answer itself (``_ANSWER_READINGS``) keeps its name."""
    if not result.correct or result.reason in _ANSWER_READINGS or not (parts_read or final):
        return result
    return replace(result, reason="gold_parts" if parts_read else "gold_prose")


def _decide(loc: Located, gold: str, ref: str, opts: VerifierOptions) -> VerifyResult | tuple:
    """The verdict of a located answer against the gold (``ref``: normalized) when the caller can
    give it (no answer, a hedge, a limit, the fast exact path, an unboxed answer identical to the
    gold), else (the key of the math-verify call that decides it, the extracted answer, the refusal
    of a wrong verdict on several boxes): the unboxed text (with its normalized form when it is short
    enough to be a bare answer), or the boxed answer(s)."""
    parts, status = loc.parts, loc.status
    if loc.kind == "text" and status == "ok":
        bare = normalize_answer(loc.text) if len(loc.text.strip()) <= MAX_BARE_CHARS else None
        if bare == ref:
            return VerifyResult(True, bare, "ok", reason="same_string")
        return ("text", ref, loc.text, opts, gold, bare), None, None
    if loc.kind == "text":
        parts = (fallback_answer(loc.text),) if loc.text and fallback_answer(loc.text) else ()
    extracted = ", ".join(parts) if parts else None
    if status == "ok" and any(len(p) > MAX_ANSWER_CHARS or not braces_balanced(p) for p in parts):
        extracted, status = None, "unparsable"
    if status != "ok":
        return VerifyResult(False, extracted, status, reason=_STATUS_REASON.get(status))
    read = loc.parts_read or len(parts)  # boxes read (a tuple of parts is one string)
    refusal = "last_box" if loc.boxes > read else "boxes_apart" if read > 1 else None
    pred = _pred_key(parts)
    fast = _fast_verdict(pred, ref, opts) if isinstance(pred, str) else None
    if fast is not None:
        paid = "same_string" if pred == ref else "same_number"
        return VerifyResult(fast, extracted, "ok", reason=paid if fast else refusal)
    written = parts[0] if len(parts) == 1 and parts[0] != pred else None  # the box as written, when normalizing changed it
    return ("verify", ref, pred, opts, gold, written), extracted, refusal


def verify_batch(responses: list[str], golds: list[str], *, timeout: float = 1.0,
                 budget: float | str | None = None, options: VerifierOptions | None = None) -> list[VerifyResult]:
    """Verify ``responses[i]`` against ``golds[i]``; identical normalized pairs are computed once.

    ``timeout`` is the hard wall-clock limit (seconds) of each math-verify call; a call that hits
    it gets status "timeout", and that verdict is cached like any other. ``budget`` (seconds, None
    for no limit) bounds the wall-clock time of all of the batch's math-verify calls together
    (waiting for workers to start included): once it is spent, the calls not yet started get status
    "timeout" without running, and the running ones are stopped and get "timeout" too, marked
    ``unverified``. Those verdicts are not cached (the calls never had their full ``timeout``): a later
    batch tries again. ``budget="auto"``: ``auto_budget`` of the batch's math-verify calls (those the
    fast path and the cache left), ``timeout`` and the pool's size.
    ``options``: math-verify's ``verify`` options (``VerifierOptions``; None: math-verify's defaults).
    """
    if len(responses) != len(golds):
        raise ValueError(f"verify_batch: {len(responses)} responses but {len(golds)} golds")
    _check_seconds("timeout", timeout)
    _check_seconds("budget", budget, none_ok=True)
    opts = _options(options)
    for i, (response, gold) in enumerate(zip(responses, golds)):
        for name, value in (("responses", response), ("golds", gold)):
            if not isinstance(value, str):
                raise TypeError(f"verify_batch: {name}[{i}] must be str, got {type(value).__name__}")
    read = {gold: _read_gold(gold) for gold in set(golds)}
    results: list[VerifyResult | None] = [None] * len(responses)
    decided: dict[tuple, VerifyResult | tuple] = {}  # a group repeats its answers: each is decided once
    pending: dict[tuple, list[tuple[int, str | None, str | None]]] = {}
    readings = []  # per response: (boxes read as the gold's parts, the gold read by its final answer)
    for i, (response, gold) in enumerate(zip(responses, golds)):
        answer, ref, parts = read[gold]
        loc = locate_parts(response, parts)
        readings.append((loc.parts_read > 0, answer != gold))
        d = decided.get((loc, gold))
        if d is None:
            d = decided[(loc, gold)] = _decide(loc, answer, ref, opts)
        if isinstance(d, VerifyResult):
            results[i] = d
            continue
        key, extracted, refusal = d
        cached = _cached(key, timeout)
        if cached is not None:
            results[i] = _result(key[0], cached, extracted, refusal)
        else:
            pending.setdefault(key, []).append((i, extracted, refusal))
    if pending:
        keys, items = list(pending), opts.items()
        if budget == AUTO:
            budget = auto_budget(len(keys), timeout, pool_size())
        tasks = [(kind, ref, b, items, raw, bare) for kind, ref, b, _, raw, bare in keys]
        for key, outcome in zip(keys, run_tasks(tasks, timeout, budget)):
            _store(key, outcome, timeout)
            for i, extracted, refusal in pending[key]:
                results[i] = _result(key[0], outcome, extracted, refusal)
    return [_paid_reason(r, *how) for r, how in zip(results, readings)]


def verify(response: str, gold: str, *, timeout: float = 1.0, options: VerifierOptions | None = None) -> VerifyResult:
    """Verify one response against its gold answer (see the module docstring for the pipeline)."""
    return verify_batch([response], [gold], timeout=timeout, options=options)[0]


def answers_equivalent(a: str, b: str, *, timeout: float = 1.0, options: VerifierOptions | None = None) -> bool | None:
    """Whether two extracted answers are mathematically equivalent (OM-GRPO answer clustering).

    Symmetric: math-verify is asked in both directions. None when either answer is too long, has
    unbalanced braces, cannot be parsed, or the comparison times out (a timeout is cached too).
    """
    for name, x in (("a", a), ("b", b)):
        if not isinstance(x, str):
            raise TypeError(f"answers_equivalent: {name} must be str, got {type(x).__name__}")
    _check_seconds("timeout", timeout)
    opts = _options(options)
    if any(len(x) > MAX_ANSWER_CHARS or not braces_balanced(x) for x in (a, b)):
        return None
    x, y = sorted((normalize_answer(a), normalize_answer(b)))
    fast = _fast_verdict(x, y, opts)
    if fast is not None:
        return fast
    key = ("equiv", x, y, opts)
    cached = _cached(key, timeout)
    if cached is None:
        cached = run_tasks([("equiv", x, y, opts.items())], timeout)[0]
        _store(key, cached, timeout)
    status, same = cached
    return same if status == "ok" else None


def answer_classes(answers, timeout: float = 1.0, options: VerifierOptions | None = None) -> list:
    """Equivalence-class ids of answers (None stays None): each answer joins the first earlier class whose
    representative ``answers_equivalent`` accepts (OM-GRPO's answer clustering, docs/algorithms.md#om-grpo-consensus-reward)."""
    reps: list = []
    out: list = []
    for a in answers:
        if a is None:
            out.append(None)
            continue
        for ci, rep in enumerate(reps):
            if a == rep or answers_equivalent(a, rep, timeout=timeout, options=options) is True:
                out.append(ci)
                break
        else:
            reps.append(a)
            out.append(len(reps) - 1)
    return out


# ---------------------------------------------------------------- reward function for other trainers


def _completion_text(completion) -> str:
    """The response text of one completion: a string, or a chat message list (the assistant
    messages' contents, joined; a content may itself be a list of ``{"type": "text"}`` parts)."""
    if isinstance(completion, str):
        return completion
    if isinstance(completion, dict):
        completion = [completion]
    if not isinstance(completion, (list, tuple)):
        raise TypeError(f"reward_fn: a completion must be a string or a list of chat messages, "
                        f"got {type(completion).__name__}")
    messages = [m for m in completion if isinstance(m, dict)]
    mine = [m for m in messages if m.get("role") == "assistant"] or messages
    texts = []
    for m in mine:
        content = m.get("content", "")
        if isinstance(content, list):
            content = "".join(p.get("text", "") for p in content if isinstance(p, dict))
        texts.append(content if isinstance(content, str) else str(content))
    return "\n".join(texts)


def reward_fn(gold_key: str = "answer", *, timeout: float = 2.0, budget: float | str | None = None,
              options: VerifierOptions | None = None, reward_correct: float = 1.0, reward_wrong: float = 0.0,
              workers: int | str | None = None):
    """A reward function with TRL's ``reward_funcs`` signature, backed by this verifier's pool.

    The returned callable takes ``(prompts, completions, **kwargs)`` and returns one float per
    completion: ``reward_correct`` when ``verify`` finds it correct, else ``reward_wrong``; None
    (TRL skips it) where the gold answer is None. Completions are plain strings or chat-format
    message lists (``[{"role": "assistant", "content": ...}]``). The gold answers are read from the
    dataset column named ``gold_key`` (default ``"answer"``; e.g. ``"solution"``), which TRL passes
    as a keyword argument; non-string golds (an int) are turned into strings. ``timeout``,
    ``budget`` and ``options`` are those of ``verify_batch``. The pool starts in the background now;
    ``workers`` (a count or ``"auto"``) sets its size (None: the size it has, 2 unless set).

        from trl import GRPOTrainer
        from graftzoo.envs import reward_fn
        trainer = GRPOTrainer(model=..., reward_funcs=[reward_fn("answer")], train_dataset=dataset)
    """
    _check_seconds("timeout", timeout)
    _check_seconds("budget", budget, none_ok=True)
    opts = _options(options)
    start_pool(workers)

    def graftzoo_verifier_reward(prompts, completions, **kwargs) -> list:
        if gold_key not in kwargs:
            raise KeyError(f"reward_fn: no {gold_key!r} column among the keyword arguments "
                           f"{sorted(kwargs)}; pass gold_key= the name of the gold answer column")
        golds = list(kwargs[gold_key])
        if len(golds) != len(completions):
            raise ValueError(f"reward_fn: {len(completions)} completions but {len(golds)} {gold_key!r} values")
        texts = [_completion_text(c) for c in completions]
        scored = [i for i, g in enumerate(golds) if g is not None]
        results = verify_batch([texts[i] for i in scored], [str(golds[i]) for i in scored], timeout=timeout,
                               budget=budget, options=opts)
        rewards: list = [None] * len(texts)
        for i, r in zip(scored, results):
            rewards[i] = float(reward_correct if r.correct else reward_wrong)
        return rewards

    return graftzoo_verifier_reward
