"""The verifier's worker processes (``graftzoo.envs.verify_pool`` starts and feeds them): each one
answers ``("verify", gold, pred)`` / ``("equiv", x, y)`` tasks with math-verify's LaTeX path and
``("text", gold, text)`` tasks with math-verify's own extraction from prose, under
a soft timer of its own (SIGALRM) and a capped address space. A verify or text task compares every
reading of the answer with every reading of the gold (``_judge``: a box or prose as math-verify
reads it, a short bare answer read whole, a mixed number, a gold as written in prose or with units)
and names the reason of a verdict that may differ from plain math-verify's
(docs/verifier.md#dominance-over-plain-math-verify).

A worker is a fresh interpreter running this file by path::

    python .../verify_worker.py FD PARENT_PID DEATHSIG

so it imports neither the caller's ``__main__`` (any script works: unguarded, ``python -m``,
``python -c``, a heredoc on stdin) nor the graftzoo packages (torch, gymnasium): only math-verify.
FD is its end of a socket pair, spoken through ``multiprocessing.connection.Connection``: it sends
"ready" after math-verify's first-use costs are paid and "warm" after its parser warm-up (which
stops at the first task), answers each ``(task, soft_timeout)`` with ``(status, verdict)``, in
order (the caller may send the next task before the answer), and exits at end of file (the parent
closed its end or died). With DEATHSIG=1 (Linux) the kernel also kills it when the parent exits,
even in the middle of a call.

Workers keep LRU caches of parsed gold and predicted answers, parse with two-stage (SLL, then LL)
ANTLR prediction (same results, about 2x faster) with remembered full-context predictions and
numbers built without sympy's string parser (same results, about 2x faster again; a string that
is one plain number is not parsed at all), keep 8,192 parsed LaTeX strings instead of
math-verify's 20 (golds, boxed answers and answers read in prose share them), remember each
comparison of a gold with a parsed answer (``_compare``), pay math-verify's first-use costs before
they take calls and build ANTLR's prediction DFA on MATH-like answers (and their ``a/b`` forms)
while they wait for their first one. Three of math-verify's slow tests are skipped where their
answer is provably "not equal", each with the same verdicts as math-verify (tested against it):
sympy's ``simplify`` of a difference that is provably nonzero (``quick_symbolic_eq``), the
symmetric difference of two sets that provably differ (``quick_compare_sets``) and sympy's
``solve`` of two linear equations with provably different solutions (``quick_solve_and_compare``).
math-verify is imported inside the functions: the caller's process never needs it.
"""
from __future__ import annotations

import ctypes
import gc
import json
import logging
import math
import os
import re
import signal
import sys
from collections import OrderedDict
from functools import lru_cache
from multiprocessing.connection import Connection
from types import MethodType

if __name__ == "__main__" and not getattr(sys.flags, "safe_path", False):
    del sys.path[0]  # run by path: this package folder (datasets.py, ...) must not shadow installed modules

__all__ = ["die_with_parent", "forget", "number_from_string", "quick_compare_sets", "quick_solve_and_compare", "quick_symbolic_eq", "remembered_solve", "two_stage_latex2sympy", "worker_main"]

PR_SET_PDEATHSIG = 1

WORKER_MEMORY_HEADROOM = 2 << 30  # bytes of address space a worker may add after start-up

log = logging.getLogger(__name__)


class _SoftTimeout(BaseException):
    """Raised by SIGALRM inside a worker; a BaseException so math-verify's handlers let it pass."""


def _on_alarm(signum, frame):
    raise _SoftTimeout()


@lru_cache(maxsize=1)
def _latex_config():
    from math_verify import LatexExtractionConfig
    return [LatexExtractionConfig(boxed_match_priority=0, try_extract_without_anchor=False)]


@lru_cache(maxsize=1)
def _text_config():
    """math-verify's extraction of an answer from prose: LaTeX (boxes first, then answer phrases,
    then the last math span) and plain expressions (numbers with separators, percentages)."""
    from math_verify import ExprExtractionConfig, LatexExtractionConfig
    return [LatexExtractionConfig(boxed_match_priority=0), ExprExtractionConfig()]


def _parse(answer: str) -> list:
    """math-verify parse of one extracted answer via its LaTeX path only (no eval, no parse_expr)."""
    from math_verify import parse
    return parse("\\boxed{" + answer + "}", extraction_config=_latex_config(),
                 fallback_mode="no_fallback", parsing_timeout=None)


_parse_gold = lru_cache(maxsize=2048)(_parse)
_parse_pred = lru_cache(maxsize=8192)(_parse)


def _parse_parts(parts) -> list:
    """One answer given as one string, or as several box contents read as one set: each part is
    parsed on its own (no two parts can merge into one number) and the values are joined in a
    sympy ``FiniteSet``, a part that is a set giving its elements, as math-verify joins the boxes
    it reads together. Empty when any part cannot be parsed."""
    if isinstance(parts, str):
        return _parse_pred(parts)
    from sympy import FiniteSet
    values = []
    for part in parts:
        parsed = _parse_pred(part)
        if not parsed:
            return []
        values.extend(parsed[0].args if isinstance(parsed[0], FiniteSet) else [parsed[0]])
    return [FiniteSet(*values), ", ".join(parts)]


def extract_text(text: str) -> tuple:
    """``(status, value, answer)`` for the answer math-verify's ``parse`` reads in unboxed ``text``:
    ``("ok", parsed, matched string)``; ``("unparsable", None, matched)`` when it matches text it
    cannot parse; ``("no_answer", None, None)`` when it reads none."""
    from math_verify import parse
    found = parse(text, extraction_config=_text_config(), fallback_mode="first_match", parsing_timeout=None)
    if len(found) == 1 and isinstance(found[0], str) and found[0].strip():
        return "unparsable", None, found[0].strip()
    if len(found) < 2 or not isinstance(found[1], str) or not found[1].strip():
        return "no_answer", None, None
    value, matched = found[0], found[1].strip()
    if _PERCENT_OF.fullmatch(matched) and _is_percent_of(value, float(matched)):
        matched += "\\%"  # math-verify read "50%" as 0.5 but matched only "50"
    return "ok", [value, matched], matched


def _is_percent_of(value, number: float) -> bool:
    """Whether the sympy ``value`` is ``number`` percent (``number / 100``, ``number`` nonzero)."""
    try:
        v = complex(value.doit())
    except (TypeError, ValueError, AttributeError):
        return False
    return number != 0 and v.imag == 0 and abs(100 * v.real - number) < 1e-9 * max(1.0, abs(number))


_PERCENT_OF = re.compile(r"-?\d+(?:\.\d+)?")


COMPARE_MEMO_SIZE = 8192  # remembered comparisons of a gold with a parsed answer
_COMPARED: OrderedDict = OrderedDict()


def _values_key(pred: list) -> tuple | None:
    """(the ``srepr`` of an answer's values, its strings), the answer's part of ``_compare``'s memo
    key; None for a value without ``srepr``."""
    from sympy import srepr
    try:
        return (tuple(srepr(x) for x in pred if not isinstance(x, str)), tuple(x for x in pred if isinstance(x, str)))
    except Exception:
        return None


def _compare(gold_key: tuple, parsed: list, pred: list, options: tuple, values: tuple | None = None) -> bool:
    """math-verify's ``verify`` of a parsed gold reading (``gold_key``: its name and the gold's
    text) against a parsed answer (math-verify's list of values and matched strings), remembered by
    the gold key, the answer's values (each one's ``srepr``: types, assumptions, a float's precision)
    and the options, of which it is a pure function: ``verify`` is true when one gold item equals
    one answer item, and a string equals only a string, so the answer's strings count only against
    a gold that has one. One answer read in a box and in prose is thus compared with its gold once.
    A call that is interrupted or raises is not remembered. ``values``: the answer's ``_values_key``
    when the caller has it."""
    from math_verify import verify as mv_verify
    values = values or _values_key(pred)
    strings = any(isinstance(g, str) for g in parsed)
    key = None if values is None else (gold_key, values[0] + (values[1] if strings else ()), options)
    if key in _COMPARED:
        _COMPARED.move_to_end(key)
        return _COMPARED[key]
    verdict = bool(mv_verify(parsed, pred, timeout_seconds=None, **dict(options)))
    if key is not None:
        _COMPARED[key] = verdict
        if len(_COMPARED) > COMPARE_MEMO_SIZE:
            _COMPARED.popitem(last=False)
    return verdict


# ---------------------------------------------------------------- readings (docs/verifier.md#dominance-over-plain-math-verify)

# What may surround an answer in prose or after a number without being part of it: \text{} notes,
# unit exponents, currency, percent and degree marks, spacing macros, sentence punctuation.
_NOTES = re.compile(r"\\(?:text|textbf|textit|textrm|mathrm|mbox|operatorname)\s*\{[^{}]*\}|\^\{?[23]\}?|\\[%$,;:! ]"
                    r"|[%$€£°²³]|\\circ|\\degree|\\!|^\s*#+")  # "#### 72": GSM8K's answer mark
# Words: runs of two or more letters, or a one-letter unit (m, g, s, h, L, K, N, J, W, V, A).
_WORDS = re.compile(r"(?:[A-Za-z]{2,}|[mgshLKNJWVA])(?:[\s.,:;!?'\"]+(?:[A-Za-z]{2,}|[mgshLKNJWVA]))*")
# Prose: a word of three letters or more that is not a function's name or a macro's argument
# (\begin{pmatrix}), or a \text{} note.
_WORD = re.compile(r"(?<![\\A-Za-z{])(?!(?:sin|cos|tan|cot|sec|csc|log|exp|max|min|gcd|lcm|mod|deg|det|arg)(?![A-Za-z]))"
                   r"[A-Za-z]{3,}")
_PROSE = re.compile(_WORD.pattern + r"|\\(?:text|textbf|textit|textrm|mbox)\s*\{")
# A mixed number ("4 4/9" is 40/9; math-verify reads 4 in prose, 16/9 in a box).
NEAR_ANSWER_CHARS = 64  # of prose before and after the answer math-verify read, searched for a relation or a mixed number
_MIXED = re.compile(r"(?P<whole>[-+]?\d{1,3}(?: \d{3})*) +(?P<num>\d+) */ *(?P<den>\d+)"
                    r"(?P<percent>\s*(?:\\?%|percent(?:age)?|pct))?")
# A relation stated just before an answer read in prose ("so $y = $ 2", "f(x) = 3"): a name, a name
# with a subscript or primes, a function of it, or a macro applied to one (\sin x), then the relation.
_STATED = re.compile(r"(?:^|(?<=[\s$(]))((?:\\[A-Za-z]+\s*)?[A-Za-z](?:_\{?\w+\}?)?'*(?:\([^()=<>]*\))?)\s*"
                     r"(=|<|>|\\le|\\ge|\\leq|\\geq|\\ne|\\neq)\s*\$?\s*\Z")


def _only_words(rest: str) -> bool:
    """Whether ``rest`` (what surrounds an answer) is prose or units: words, notes and punctuation, with no
    digit, operator or bracket (``" meters"``, ``"The answer is "``; not ``"g(t) = 3t - "`` or ``"{y + , y}"``)."""
    rest = _NOTES.sub(" ", rest).strip(" \t\n.,:;!?'\"")
    return not rest or _WORDS.fullmatch(rest) is not None


def _around(text: str, matched: str) -> str | None:
    """``text`` without the last occurrence of ``matched``; None when ``matched`` is not in it."""
    at = text.rfind(matched)
    return None if at < 0 or not matched else text[:at] + " " + text[at + len(matched):]


@lru_cache(maxsize=1)
def _sympy_types() -> tuple:
    """sympy's ``Add``, ``And``, ``Eq`` and ``Relational``, imported once (not on every comparison)."""
    from sympy import Add, And, Eq
    from sympy.core.relational import Relational
    return Add, And, Eq, Relational


def _is_relation(value) -> bool:
    """math-verify's ``is_relation``: a relation, or an ``And`` of relations."""
    _, And, _, Relational = _sympy_types()
    return isinstance(value, Relational) or (isinstance(value, And) and bool(value.args)
                                             and all(isinstance(a, Relational) for a in value.args))


@lru_cache(maxsize=2048)
def _gold_prose(raw: str) -> tuple[tuple, bool]:
    """(math-verify's own reading of a gold as written (its default ``parse``: prose, units, a
    number with a decimal comma), whether it is kept). It is kept when what surrounds the answer it
    read is prose or units (``_only_words``): ``The answer is 250`` is 250, ``15 meters`` 15, ``1,22``
    1.22; the ``1`` it reads in ``g(t) = 3t - 1`` or the ``2`` of ``{y + 2, y}`` is a fragment, not
    kept. ``()`` when it reads nothing."""
    from math_verify import parse
    found = parse(raw, parsing_timeout=None)
    if len(found) != 2 or not isinstance(found[1], str) or not found[1].strip():
        return (), False
    rest = _around(raw, found[1].strip())
    if rest is None:  # math-verify rewrote what it read ("1,22" as "1.22"): keep it when only digits were there
        digits = lambda s: re.sub(r"\D", "", s)
        return tuple(found), digits(raw) == digits(found[1]) and not re.search(r"[A-Za-z\\=]", raw)
    return tuple(found), _only_words(rest)


@lru_cache(maxsize=2048)
def _gold_readings(gold: str, raw: str | None) -> tuple[list, list]:
    """(readings, dropped) of a gold, each ``(name, key, parsed)``: the normalized gold read as a
    boxed answer (math-verify's LaTeX path), named "gold" where math-verify's own reading of the gold
    as written (``_gold_prose``) is the same, else "gold_as_answer"; and "gold_prose", that own
    reading, when it reads something else: kept when it reads prose or units, else dropped (it names
    a refusal). A prediction that states a relation is compared with the first reading only."""
    parsed = _parse_gold(gold)
    as_written = raw is not None and not _SIGNED_NUMBER.fullmatch(raw)  # math-verify reads a plain number as we do
    prose, kept = _gold_prose(raw) if as_written else (tuple(parsed), True)
    same = bool(prose) and bool(parsed) and str(prose[0]) == str(parsed[0])
    readings, dropped = [("gold" if same else "gold_as_answer", ("gold", gold), parsed)], []
    if prose and not same:
        (readings if kept else dropped).append(("gold_prose", ("gold_prose", raw), list(prose)))
    return [r for r in readings if r[2]], dropped


def _prose_reading(text: str) -> tuple[str, tuple | None, list, str | None]:
    """(status, reading, dropped, answer): math-verify's own reading of prose ("text"), with the
    relation stated just before the answer it read kept whole ("so y = 2" is ``y = 2``, not 2), and
    a mixed number read whole ("mixed_number": "4 4/9" is 40/9, "4 4/9 %" is 40/900; math-verify reads
    its integer part, which is ``dropped``). A mixed number whose fraction is not proper ("4 0/0") is
    no answer."""
    status, pred, answer = extract_text(text)
    if status != "ok":
        return status, None, [], answer
    mixed = _mixed_number(text, answer)
    if mixed is not None:
        if not mixed:
            return "no_answer", None, [("text", pred)], answer
        return "ok", ("mixed_number", mixed), [("text", pred)], mixed[1]
    at = text.rfind(answer)
    stated = _STATED.search(text[max(0, at - NEAR_ANSWER_CHARS):at]) if at >= 0 else None
    if stated:
        relation = _parse_pred(f"{stated.group(1)}{stated.group(2)}{answer}")
        pred = relation if relation and _is_relation(relation[0]) else pred
    return "ok", ("text", pred), [], answer


def _text_readings(text: str, bare: str | None) -> tuple[str, list, list, str | None]:
    """(status, readings, dropped, answer) of an unboxed text: ``_prose_reading``, and "bare_answer",
    the whole text read as a boxed answer when it is short (``bare``: the caller's normalized text,
    None when long), has no prose and is not a mixed number. A "text" reading that is a piece of
    such a bare answer (the ``1`` of ``3t - 1``, the ``7`` of ``7:30``) is dropped: the whole answer
    is read instead."""
    status, reading, dropped, answer = _prose_reading(text)
    bare = bare if bare is not None and not _PROSE.search(text) else None  # a short answer with no prose
    readings = []
    if reading is not None:
        rest = _around(bare, answer.replace(" ", "")) if bare is not None and reading[0] == "text" else None
        (dropped if rest is not None and not _only_words(rest) else readings).append(reading)
    plain = reading[0] == "text" if reading is not None else not dropped  # not a mixed number
    whole = _parse_pred(bare) if bare is not None and plain else []
    if whole:
        readings.append(("bare_answer", whole))
        answer = bare if readings[0][0] == "bare_answer" else answer
    return ("ok" if readings else status if status != "ok" else "no_answer"), readings, dropped, answer


def _mixed_number(text: str, answer: str | None = None):
    """The reading of the mixed number ("4 4/9": 40/9, "-1 000 1/2", "4 4/9 %": 40/900) that is
    ``text`` (a box), or that holds the ``answer`` math-verify read in the prose ``text`` (it reads
    the 4 or the 4/9 of "4 4/9"): None when there is none, ``[]`` when its fraction is not a proper
    one ("4 4/0", "4 9/4": no answer at all)."""
    from sympy import Rational
    if answer is None:
        found = _MIXED.fullmatch(text.strip().rstrip("."))
    else:
        answer, at = answer.strip().rstrip("."), text.rfind(answer.strip().rstrip("."))
        start = max(0, at - NEAR_ANSWER_CHARS)  # the answer's neighbourhood, not the whole text
        near = text[start:at + len(answer) + NEAR_ANSWER_CHARS] if at >= 0 else ""
        at -= start
        found = next((m for m in _MIXED.finditer(near) if m.start() <= at and at + len(answer) <= m.end()), None)
    if not found:
        return None
    whole, num, den = (int(found.group(k).replace(" ", "")) for k in ("whole", "num", "den"))
    if not 0 <= num < den:
        return []
    value = (abs(whole) + Rational(num, den)) / (100 if found.group("percent") else 1)
    return [-value if found.group("whole").startswith("-") else value, found.group(0)]


def _box_readings(parts, written: str | None) -> tuple[list, list]:
    """(readings, dropped) of a located answer (``written``: one box's content as written): "box",
    its LaTeX reading (several boxes as one set), or "mixed_number" for a box holding one
    ("\\boxed{4 4/9}": 40/9, where the LaTeX reading, 16/9, is dropped); and for a box holding prose
    ("\\boxed{The answer is 3.5}") "box_prose", math-verify's reading of that prose
    (``_prose_reading``), its LaTeX reading (a product of letters) being dropped when it has words."""
    box = [("box", pred) for pred in (_parse_parts(parts),) if pred]
    mixed = _mixed_number(written or parts) if isinstance(parts, str) else None  # as written: "11\n5/6" is two lines
    if mixed is not None:
        return [("mixed_number", mixed)] if mixed else [], box
    if written is None or not _PROSE.search(written):
        return box, []
    _, reading, dropped, _ = _prose_reading(written)
    readings = [("box_prose", reading[1])] if reading is not None else []
    return (readings, dropped + box) if _WORD.search(written) else (box + readings, dropped)


# the readings a correct verdict names as its reason (the verifier's NORMALIZATIONS)
LENIENT_READINGS = ("bare_answer", "box_prose", "mixed_number", "gold_prose", "gold_as_answer")


def _judge(golds: tuple[list, list], preds: list, dropped: list, options: tuple) -> tuple[bool, str | None]:
    """(verdict, reason) of the readings of a gold and an answer: correct when one pair of readings
    is equal to math-verify, a relation stated by the answer being compared with the gold's own
    reading only (never with a value read out of prose). The reason of a correct verdict names a
    lenient reading that paid (``LENIENT_READINGS``, the answer's first); of a wrong one, a refusal: "fragment" (only a dropped
    piece of the answer or of the gold makes them equal) or "relation_lhs" (the answer's relation
    differs from the gold's, its right side does not)."""
    golds, dropped_golds = golds
    values: dict = {}  # each answer's memo key, computed once
    key_of = lambda pred: values[id(pred)] if id(pred) in values else values.setdefault(id(pred), _values_key(pred))
    for pname, pred in preds:
        relation = _is_relation(pred[0])
        for gname, key, gold in golds:
            if relation and gname == "gold_prose" or not relation and _is_equation_of_terms(gold[0]):
                continue
            if _compare(key, gold, pred, options, key_of(pred)):
                return True, next((n for n in (pname, gname) if n in LENIENT_READINGS), None)
    if any(not _is_relation(pred[0]) for _, pred in preds) and any(_is_equation_of_terms(g[0]) for _, _, g in golds):
        return False, "gold_relation"
    for _, pred in preds:
        if _is_relation(pred[0]) and _right_side_equal(golds + dropped_golds, pred[0], options):
            return False, "relation_lhs"
    pieces = [(key, gold, pred) for _, pred in dropped for _, key, gold in golds + dropped_golds]
    pieces += [(key, gold, pred) for _, pred in preds for _, key, gold in dropped_golds]
    if any(_compare(key, gold, pred, options, key_of(pred)) for key, gold, pred in pieces):
        return False, "fragment"
    return False, None


def _is_equation_of_terms(value) -> bool:
    """Whether a gold value is an equation whose left side is a sum of terms (``a + z = 0``,
    a plane): no value answers it, unlike a definition (``x = 5``, ``g(t) = 3t - 1``, ``\\sin x = 3/7``)."""
    Add, _, Eq, _ = _sympy_types()
    return isinstance(value, Eq) and isinstance(value.lhs, Add)


def _right_side_equal(golds: list, relation, options: tuple) -> bool:
    """Whether the right side of ``relation`` equals a gold reading (a gold relation's right side too)."""
    from math_verify.grader import take_last_relation
    rhs = [take_last_relation(relation).rhs]
    for _, key, gold in golds:
        values = [take_last_relation(g).rhs if _is_relation(g) else g for g in gold if not isinstance(g, str)]
        if values and _compare(("rhs",) + key, values, rhs, options):
            return True
    return False


def forget() -> None:
    """Empty this process's memos of parsed answers and comparisons (for tests that compare fresh
    evaluations; math-verify's own parse cache and the DFA stay)."""
    _parse_gold.cache_clear()
    _parse_pred.cache_clear()
    _gold_prose.cache_clear()
    _gold_readings.cache_clear()
    _COMPARED.clear()


def _evaluate(kind: str, a, b, options=(), raw=None, bare=None) -> tuple:
    """``("verify", gold, parts)`` and ``("text", gold, text)`` -> (status, verdict, the answer read
    in prose or None, reason) (``_judge``; ``raw``: the gold as written; ``bare``: the normalized
    text when it is short, or one box's content as written when normalizing changed it);
    ``("equiv", x, y)`` -> (status, verdict). ``options``: (name, value) pairs of math-verify
    ``verify`` options."""
    from math_verify import verify as mv_verify
    opts = dict(options)
    if kind == "equiv":
        x, y = _parse_parts(a), _parse_parts(b)
        if not x or not y:
            return "unparsable", False
        return "ok", bool(mv_verify(x, y, timeout_seconds=None, **opts) or mv_verify(y, x, timeout_seconds=None, **opts))
    golds = _gold_readings(a, raw)
    if kind == "text":
        status, preds, dropped, answer = _text_readings(b, bare)
    else:
        (preds, dropped), answer = _box_readings(b, bare or (b if isinstance(b, str) else None)), None
        status = "ok" if preds else "unparsable"
    if not golds[0] or not preds and not dropped:
        return (status if status != "ok" else "unparsable"), False, answer, None
    correct, reason = _judge(golds, preds, dropped, tuple(options))
    status = "ok" if preds else status
    if reason == "box_prose":  # the answer is what math-verify read in the box's prose
        answer = next(pred[1] for name, pred in preds if name == "box_prose")
    return status, correct, answer, reason


_PLAIN_INTEGER = re.compile(r"[0-9]{1,100}")
_SIGNED_NUMBER = re.compile(r"-?[0-9]{1,100}(?:\.[0-9]{1,50})?")
_PLAIN_DECIMAL = re.compile(r"[0-9]{0,50}\.[0-9]{1,50}")


def plain_number(text: str):
    """What latex2sympy's ``parse_number(text)`` returns when ``text`` without its commas is a plain
    integer or decimal (ASCII digits, one point with digits after it): the same ``Integer``/``Float``
    built directly; None for any other text. latex2sympy gets there through ``sympy.Number(str)``, that
    is sympy's string parser, which runs ``from sympy import *`` on every call: ~1.5 ms a number,
    about half of a warm parse."""
    from sympy import Float, Integer
    s = text.replace(",", "")
    if _PLAIN_INTEGER.fullmatch(s):
        return Integer(int(s))  # latex2sympy drops leading zeros first; int() ignores them
    if _PLAIN_DECIMAL.fullmatch(s):
        return Float(s)  # what sympify's auto_number makes of a decimal literal
    return None


FULL_CONTEXT_MEMO_SIZE = 20_000  # remembered full-context predictions (a few hundred bytes each)


class _ReadTracker:
    """A token stream as ANTLR's full-context prediction sees it, noting the tokens it reads."""

    def __init__(self, stream):
        self._stream, self.reads, self.complete = stream, {}, True

    @property
    def index(self):
        return self._stream.index

    def LA(self, i):
        t = self._stream.LA(i)
        if i == 1:  # what ANTLR 4.13 reads: the current token, then consume()
            self.reads[self._stream.index] = t
        else:
            self.complete = False  # some other read: do not remember this prediction
        return t

    def __getattr__(self, name):
        return getattr(self._stream, name)


def remembered_full_context(memo: dict):
    """A drop-in for ANTLR's ``ParserATNSimulator.execATNWithFullContext`` (full-context LL
    prediction, which ANTLR never caches: latex2sympy's grammar needs it at every ``x^2``, ~3 ms each)
    that remembers its answers in ``memo``. The prediction is a function of the decision, the
    invoking states of the outer rule contexts, the parser's precedence (latex2sympy's only semantic
    predicates are precedence predicates) and the types of the tokens it reads from ``startIndex``
    on; it reports only ambiguities, which latex2sympy's error listener ignores. So an answer is
    reused when all of those match, and an exception (no viable alternative) is never remembered."""
    from antlr4.atn.ParserATNSimulator import ParserATNSimulator
    original = ParserATNSimulator.execATNWithFullContext
    size = [0]

    def predict(self, dfa, D, s0, input, startIndex, outerContext):
        chain, ctx = [], outerContext
        while ctx is not None:
            chain.append(ctx.invokingState)
            ctx = ctx.parentCtx
        precedence = self.parser._precedenceStack
        key = (dfa.decision, tuple(chain), precedence[-1] if precedence else None)
        for types, alt in memo.get(key, ()):
            input.seek(startIndex)
            for k, t in enumerate(types):  # the same reads as the prediction (it never consumes EOF)
                if input.LA(1) != t:
                    break
                if k + 1 < len(types):
                    input.consume()
            else:
                return alt  # the input stays where the full prediction stops
        tracker = _ReadTracker(input)
        alt = original(self, dfa, D, s0, tracker, startIndex, outerContext)
        if tracker.complete:
            if size[0] >= FULL_CONTEXT_MEMO_SIZE:
                memo.clear()
                size[0] = 0
            size[0] += 1
            memo.setdefault(key, []).append((tuple(tracker.reads[i] for i in sorted(tracker.reads)), alt))
        return alt

    return predict


def two_stage_latex2sympy():
    """A drop-in for latex2sympy as math-verify calls it, with two-stage ANTLR parsing.

    The first attempt uses SLL prediction; only when it fails with a syntax error is the input parsed
    again with the full LL prediction latex2sympy uses. ANTLR guarantees that SLL returns either the
    parse tree LL would return or a syntax error, and latex2sympy's error listener raises on every
    syntax error, so results are unchanged (an error in converting a complete SLL tree, such as a
    zero denominator, is the error LL would meet: it is raised at once); parsing is about 2x faster
    because ANTLR never caches full-context LL predictions. The LL stage (``x^2`` needs it) remembers
    its full-context predictions (``remembered_full_context``), and numbers are built without
    sympy's string parser (``plain_number``); a string that is one plain number (``_NUMBER_LITERAL``)
    is not parsed at all: it gets the same ``Integer``/``Float`` at once. Calls with options math-verify does not use go to the
    original function.
    """
    from antlr4.atn.PredictionMode import PredictionMode
    from latex2sympy2_extended.latex2sympy2 import _Latex2Sympy, latex2sympy

    full_context = remembered_full_context({})

    class TwoStage(_Latex2Sympy):
        sll = True

        def create_parser(self, latex_str):
            parser = super().create_parser(latex_str)
            if self.sll:
                parser._interp.predictionMode = PredictionMode.SLL
                build = parser.math

                def math():
                    tree = build()
                    self.built = True  # SLL built the whole tree: it is LL's tree
                    return tree
                parser.math = math
            else:
                parser._interp.execATNWithFullContext = MethodType(full_context, parser._interp)
            return parser

        def parse_number(self, text):
            number = plain_number(text)
            return super().parse_number(text) if number is None else number

        def parse(self, latex_str):
            self.built = False
            try:
                return super().parse(latex_str)
            except Exception:
                if not self.sll or self.built:  # an error converting LL's own tree: LL would fail the same way
                    raise
                self.sll = False
                return super().parse(latex_str)

    def two_stage(latex_str, is_real=None, convert_degrees=False, normalization_config=None, **options):
        if normalization_config is not None or options:
            return latex2sympy(latex_str, is_real=is_real, convert_degrees=convert_degrees,
                               normalization_config=normalization_config, **options)
        if _NUMBER_LITERAL.fullmatch(latex_str):  # what the parse of a plain number builds, without parsing
            return plain_number(latex_str)
        return TwoStage(is_real=is_real, convert_degrees=convert_degrees).parse(latex_str)

    two_stage.parser_class = TwoStage
    return two_stage


def _install_two_stage_parser() -> None:
    """Make math-verify's parser use ``two_stage_latex2sympy`` (in worker processes only)."""
    import math_verify.parser
    try:
        math_verify.parser.latex2sympy = two_stage_latex2sympy()
    except (ImportError, AttributeError) as e:  # another latex2sympy2_extended layout: keep LL only
        log.warning("verifier: two-stage LaTeX parsing unavailable (%s); using math-verify as is", e)


LATEX_PARSE_CACHE_SIZE = 8192  # math-verify keeps 20 parsed LaTeX strings; a worker keeps this many


# What plain_number builds, without commas or leading zeros: an integer or a decimal literal.
_NUMBER_LITERAL = re.compile(r"0|[1-9][0-9]{0,99}|(?:0|[1-9][0-9]{0,49})\.[0-9]{1,50}")


def number_from_string(text: str):
    """A drop-in for ``sympy.Number(text)`` as math-verify's expression path calls it (on a number it
    read in prose, commas and leading zeros removed): an integer or decimal literal without leading
    zeros is built by ``plain_number`` (the same ``Integer``/``Float``, without sympy's string
    parser); any other text goes to ``sympy.Number`` itself."""
    from sympy import Number
    return plain_number(text) if _NUMBER_LITERAL.fullmatch(text) else Number(text)


def _install_parse_caches() -> None:
    """Make math-verify remember more parsed LaTeX strings (its ``parse_latex_cached`` is a pure
    function of the string: a bigger cache changes no result; a batch's golds, boxed answers and the
    answers read in prose share it) and read plain numbers in prose with ``number_from_string``
    (in worker processes only)."""
    import math_verify.parser
    cached = math_verify.parser.parse_latex_cached
    if cached.cache_info().maxsize != LATEX_PARSE_CACHE_SIZE:
        math_verify.parser.parse_latex_cached = lru_cache(maxsize=LATEX_PARSE_CACHE_SIZE)(cached.__wrapped__)
    math_verify.parser.Number = number_from_string


NONZERO_TOL = 1e-6  # a constant whose 15-digit value is this far from 0 is not zero
# Distinct, unremarkable positive values given to an expression's symbols (sorted by name) when it
# is evaluated at one point; an integer symbol gets a prime instead.
POINT_VALUES = ((37, 29), (53, 71), (89, 41), (113, 97), (61, 83), (131, 59), (23, 67), (97, 43))
POINT_PRIMES = (7, 11, 13, 17, 19, 23, 29, 31)


def _point(symbols) -> dict | None:
    """One point for ``symbols``: distinct positive rationals (a prime for an integer symbol), each
    consistent with every assumption its symbol carries (real, positive, integer, ...); None when
    there are more symbols than values or one has assumptions no candidate meets."""
    from sympy import Integer, Rational, Symbol
    symbols = sorted(symbols, key=str)
    if len(symbols) > len(POINT_VALUES) or not all(isinstance(s, Symbol) for s in symbols):
        return None
    point = {}
    for k, s in enumerate(symbols):
        for value in (Rational(*POINT_VALUES[k]), Integer(POINT_PRIMES[k])):
            if all(getattr(value, "is_" + key, None) in (None, want) for key, want in s.assumptions0.items()):
                point[s] = value
                break
        else:
            return None
    return point


def _nonzero_somewhere(d) -> bool:
    """Whether ``d`` (an expression with symbols) has a value clearly away from 0 at ``_point``:
    sympy's evalf with ``strict=True`` (15 correct digits or an error, so a cancellation to zero
    is never taken for a value). Then ``d`` is not zero as a function, and ``simplify(d)``, which
    keeps an expression's value, is not zero either."""
    from sympy import Integral, Limit, Product, Sum
    if d.has(Integral, Sum, Product, Limit):  # unevaluated operators: numeric evaluation may be slow
        return False
    point = _point(d.free_symbols)
    if point is None:
        return False
    try:
        v = complex(d.evalf(15, subs=point, strict=True))
    except Exception:  # no 15-digit value, not a number, a pole at the point
        return False
    return math.isfinite(abs(v)) and abs(v) > NONZERO_TOL


def _surely_nonzero(d) -> bool:
    """Whether the sympy expression ``d`` is provably not zero, cheaply: a constant whose numeric
    value (sympy's error-controlled evalf) is clearly away from 0, a nonzero polynomial with
    rational coefficients (which no real, integer or positive values of its symbols make zero
    everywhere), or any other expression with a value clearly away from 0 at one point
    (``_nonzero_somewhere``). False means "don't know"."""
    from sympy import QQ, Expr, Poly
    if not isinstance(d, Expr) or d.is_Matrix:
        return False
    symbols = d.free_symbols
    if not symbols:
        v = d.evalf(15)
        return bool(v.is_Number and v.is_finite and abs(v) > NONZERO_TOL)
    try:
        return not Poly(d, *sorted(symbols, key=str), domain=QQ).is_zero
    except Exception:  # not a polynomial over QQ
        return _nonzero_somewhere(d)


def quick_symbolic_eq(symbolic_eq):
    """A drop-in for math-verify's ``sympy_symbolic_eq(a, b)`` (true when ``simplify(a - b)`` is
    zero), its last and often slowest test (sympy ``simplify``, 10-150 ms): when ``a - b`` is
    provably not zero (``_surely_nonzero``) the answer is False without simplifying, since simplify
    keeps an expression's value; otherwise the original decides. Verdicts are unchanged, and a
    wrong answer such as ``12\\pi`` for ``92\\pi`` or ``x^3+3x-5`` for ``x^3+3x-6`` costs
    well under a millisecond."""

    def quick(a, b):
        try:
            if _surely_nonzero(a - b):
                return False
        except Exception:  # the original handles (and swallows) whatever went wrong
            pass
        return symbolic_eq(a, b)

    quick.original = symbolic_eq
    return quick


def _values(finite_set) -> list[complex] | None:
    """The elements of a sympy ``FiniteSet`` of constants as complex numbers with 15 correct digits
    (sympy's evalf, ``strict=True``); None when one has symbols or no such value."""
    try:
        return [complex(e.evalf(15, strict=True)) for e in finite_set.args if e.is_number]
    except Exception:
        return None


def _sets_surely_differ(a, b) -> bool:
    """Whether two sympy sets are provably different, cheaply: a finite set against an interval or a
    union of intervals of positive length (which has infinitely many points), or two finite sets of
    constants where an element of one is clearly away (``NONZERO_TOL``) from every element of the
    other. False means "don't know"."""
    from sympy import FiniteSet, Interval, Union
    for x, y in ((a, b), (b, a)):
        if isinstance(x, FiniteSet) and isinstance(y, (Interval, Union)):
            try:
                return y.measure.is_positive is True
            except Exception:
                return False
    if not (isinstance(a, FiniteSet) and isinstance(b, FiniteSet)):
        return False
    u, v = _values(a), _values(b)
    if u is None or v is None or len(u) != len(a.args) or len(v) != len(b.args) or not (u and v):
        return False
    far = lambda p, q: abs(p - q) > NONZERO_TOL * max(1.0, abs(p), abs(q))
    return any(all(far(p, q) for q in v) for p in u) or any(all(far(q, p) for p in u) for q in v)


def quick_compare_sets(compare_sets):
    """A drop-in for math-verify's ``sympy_compare_sets(gold, pred, ...)``, one of whose tests is
    whether the symmetric difference of the two sets is empty (sympy set algebra, 5-25 ms for sets
    of radicals or an interval against a number). When the two sets provably differ
    (``_sets_surely_differ``) that difference is not empty, and this call of the original skips
    computing it (sympy's ``Set.symmetric_difference`` answers a non-empty set for this pair only);
    every other test of the original runs as it is, so verdicts are unchanged."""
    from sympy import FiniteSet, Set, Tuple

    def quick(gold, pred, *args, **kwargs):
        a = gold if isinstance(gold, (Set, Tuple)) else FiniteSet(gold)
        b = pred if isinstance(pred, (Set, Tuple)) else FiniteSet(pred)
        try:
            differ = isinstance(a, Set) and isinstance(b, Set) and _sets_surely_differ(a, b)
        except Exception:
            differ = False
        if not differ:
            return compare_sets(gold, pred, *args, **kwargs)
        symmetric_difference = Set.symmetric_difference

        def known(self, other):
            if self == a and other == b:
                return FiniteSet(0)  # stands for the difference: not empty
            return symmetric_difference(self, other)
        Set.symmetric_difference = known
        try:
            return compare_sets(gold, pred, *args, **kwargs)
        finally:
            Set.symmetric_difference = symmetric_difference

    quick.original = compare_sets
    return quick


def _linear_form(relation):
    """``lhs - rhs`` of a sympy ``Eq`` as a ``Poly`` over QQ when it is linear in its symbols (one at
    least, each plain or merely real, as math-verify's parser makes them) with exact coefficients
    (no float, which math-verify compares with rounding); else None."""
    from sympy import QQ, Eq, Float, Poly, Symbol
    if not isinstance(relation, Eq):
        return None
    d = relation.lhs - relation.rhs
    if d.has(Float):
        return None
    symbols = sorted(d.free_symbols, key=str)
    plain = (Symbol("_").assumptions0.items(), Symbol("_", real=True).assumptions0.items())
    if not symbols or not all(isinstance(s, Symbol) and any(s.assumptions0.items() <= p for p in plain)
                              for s in symbols):
        return None
    try:
        poly = Poly(d, *symbols, domain=QQ)
    except Exception:
        return None
    return poly if poly.total_degree() == 1 else None


def _lines_surely_differ(gold, pred) -> bool:
    """Whether two linear equations (``_linear_form``) provably have different solution sets: one is
    not a constant multiple of the other, and clearly so (some coefficient of the difference of
    the two, each scaled to a leading 1, is above ``NONZERO_TOL``, not a rounding-size gap), and no
    two of their symbols have names that differ only in case (math-verify's comparison of symbols
    may join those). False means "don't know"."""
    g, p = _linear_form(gold), _linear_form(pred)
    if g is None or p is None:
        return False
    symbols = tuple(sorted(set(g.gens) | set(p.gens), key=str))
    if len({s.name.lower() for s in symbols}) < len(symbols):  # math-verify may take x_1 for X_1
        return False
    g, p = g.as_expr().as_poly(*symbols), p.as_expr().as_poly(*symbols)
    g, p = g.monic(), p.monic()
    return any(abs(c) > NONZERO_TOL for c in (g - p).coeffs())


def quick_solve_and_compare(solve_and_compare):
    """A drop-in for math-verify's ``sympy_solve_and_compare(gold, pred, ...)``, its last test of
    two relations: sympy ``solve`` of each (50-150 ms for a plane ``5x-7y+11z+4=0``) and a
    comparison of the solutions. Two linear equations whose solution sets provably differ
    (``_lines_surely_differ``) cannot have equal solutions, so the answer is False without solving;
    otherwise the original decides. Verdicts are unchanged."""

    def quick(gold, pred, *args, **kwargs):
        try:
            if _lines_surely_differ(gold, pred):
                return False
        except Exception:  # the original handles (and swallows) whatever went wrong
            pass
        return solve_and_compare(gold, pred, *args, **kwargs)

    quick.original = solve_and_compare
    return quick


SOLVE_CACHE_SIZE = 1024


def remembered_solve(solve):
    """A drop-in for sympy's ``solve(relation, symbols)`` as math-verify's relation comparison calls
    it, remembering the last ``SOLVE_CACHE_SIZE`` results: a gold relation (``y=2x+3``) is solved
    once, not once per answer it is compared with (10-60 ms each). ``solve`` is deterministic, so
    verdicts are unchanged; a call that raises (or is interrupted) is not remembered."""
    @lru_cache(maxsize=SOLVE_CACHE_SIZE)
    def remembered(expr, symbols):
        return solve(expr, set(symbols))

    def cached(expr, symbols, *args, **kwargs):
        if args or kwargs:
            return solve(expr, symbols, *args, **kwargs)
        try:
            result = remembered(expr, frozenset(symbols))
        except TypeError:  # an unhashable argument: solve it as it is
            return solve(expr, symbols)
        return [dict(r) if isinstance(r, dict) else r for r in result]

    cached.original = solve
    return cached


# math-verify's grader functions replaced in the workers, each by a drop-in with the same verdicts
GRADER_DROP_INS = (("sympy_symbolic_eq", quick_symbolic_eq), ("sympy_compare_sets", quick_compare_sets),
                   ("sympy_solve_and_compare", quick_solve_and_compare), ("solve", remembered_solve))


def _install_in_grader(name: str, wrapper) -> None:
    """Make math-verify's grader call ``wrapper(original)`` for its function ``name`` (in worker processes
    only; once: a drop-in marks itself with ``original``)."""
    import math_verify.grader
    if not hasattr(getattr(math_verify.grader, name), "original"):
        setattr(math_verify.grader, name, wrapper(getattr(math_verify.grader, name)))


# One pair per common answer shape; evaluating them once in a new worker pays math-verify's
# first-use costs (grammar and sympy initialisation, ~1 s) before the worker takes timed calls.
_WARMUP = (("\\frac{\\sqrt{2}}{2}", "\\sqrt{3}"), ("(1,2]", "[1,2)"), ("(1,-2)", "(-\\infty,2)\\cup(3,\\infty)"),
           ("x^2+2x-1", "(x+1)^2"), ("\\begin{pmatrix}1\\\\2\\end{pmatrix}", "6+9i"), ("10^\\circ", "50\\%"),
           ("\\text{(C)}", "y=2x+3"))
# Answers of the most common shapes in MATH's training split (digits and letters aside), parsed
# first by ``_warm_parser``.
_WARMUP_ANSWERS = (
    "0", "-7", "-\\frac{5}{2}", "\\frac14", "\\frac 92", "\\frac{29}4", ".3", "1,000,000", "1:4", "73^\\circ",
    "50^{\\circ}", "17\\%", "2\\sqrt{41}", "10\\sqrt3", "63\\pi", "\\frac{\\pi}{6}", "\\frac{35}{2}\\pi",
    "\\frac{2\\sqrt{35}}{35}", "\\frac{1+\\sqrt{5}}{2}", "-\\frac{\\sqrt{2}}{2}", "12-6\\sqrt{3}", "7-2\\pi",
    "10\\frac{1}{12}", "12_5", "29i", "5-12i", "-i", "(0,5)", "(\\frac{1}{8},\\frac{1}{3})", "(10,8,6)", "[0,3)",
    "[1,\\infty)", "(-\\infty,5)\\cup(5,\\infty)", "5,-11", "\\text{(E)}", "\\text{B}", "B", "\\text{odd}",
    "\\text{H,E}", "8\\text{cm}", "x=2", "b=\\frac{1}{49}", "32x+80", "x^2+7x+10", "16x^2+4x+5", "19x^4",
    "3x^2-12", "\\begin{pmatrix}4\\\\-3\\end{pmatrix}", "\\begin{pmatrix}1&2500\\\\0&1\\end{pmatrix}")


_WARMUP_TEXTS = ("The answer is $\\frac{1}{2}$.", "So the total is 7,425,000 dollars.", "#### 1,000", "x = 3")

TRAINING_ANSWERS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "data", "math_train.jsonl")
PARSER_WARMUP_ANSWERS = 1000  # of the training split, spread over it: ~1 s of parsing


def _warm_up() -> None:
    """Pay math-verify's first-use costs (imports, grammar, regexes, sympy caches) before taking calls."""
    for gold, pred in _WARMUP:
        _evaluate("verify", gold, pred)
    for text in _WARMUP_TEXTS:
        extract_text(text)
        _gold_prose(text)  # math-verify's default extraction, which reads golds as written


def _training_answers(n: int) -> list[str]:
    """``n`` answers spread evenly over the packaged MATH training split; none if it is missing."""
    try:
        with open(TRAINING_ANSWERS, encoding="utf-8") as f:
            lines = [line for line in f if line.strip()]
        return [str(json.loads(line)["answer"]) for line in lines[::max(1, len(lines) // max(1, n))][:n]]
    except (OSError, ValueError, KeyError, TypeError):
        return []


_FRACTION = re.compile(r"\\[dt]?frac\{((?:[^{}]|\{[^{}]*\})+)\}\{((?:[^{}]|\{[^{}]*\})+)\}")
_BARE_PART = re.compile(r"-?\d+(?:\.\d+)?|[A-Za-z]")


def slash_form(answer: str) -> str | None:
    """``answer`` with each ``\\frac{a}{b}`` written ``a/b`` as models often write it (a part other
    than a number or a letter in parentheses: ``\\frac{\\sqrt{3}}{2}`` -> ``(\\sqrt{3})/2``);
    None when it has no fraction."""
    if not _FRACTION.search(answer):
        return None
    part = lambda x: x if _BARE_PART.fullmatch(x) else f"({x})"
    return _FRACTION.sub(lambda m: f"{part(m.group(1))}/{part(m.group(2))}", answer)


def _warmup_answers() -> list[str]:
    """What ``_warm_parser`` parses: ``_WARMUP_ANSWERS`` and ``PARSER_WARMUP_ANSWERS`` answers of
    MATH's training split, each followed by its ``slash_form`` when it has one."""
    out = []
    for answer in _WARMUP_ANSWERS + tuple(_training_answers(PARSER_WARMUP_ANSWERS)):
        out += [answer] + [f for f in (slash_form(answer),) if f]
    return out


def _warm_parser(conn) -> None:
    """Build ANTLR's prediction DFA for common answer shapes: parse ``_warmup_answers()`` one at a
    time, and stop as soon as a task is waiting. The DFA grows as inputs need it and a cold one makes a worker's first parse
    of each shape several times slower; this runs after "ready", so it never delays a call by more
    than one parse. It leaves no parsed answer in math-verify's cache: only the DFA stays warm."""
    import math_verify.parser
    for answer in _warmup_answers():
        try:
            if conn.poll():
                break
            _parse(answer)
        except (EOFError, OSError):  # the parent is gone: the task loop ends at end of file
            break
        except Exception:  # an answer math-verify cannot read warms the DFA all the same
            pass
    math_verify.parser.parse_latex_cached.cache_clear()


def _limit_memory() -> None:
    """Cap the worker's address space (Linux) so a memory bomb raises MemoryError, not OOM."""
    try:
        import resource
        with open("/proc/self/statm") as f:
            current = int(f.read().split()[0]) * resource.getpagesize()
        _, hard = resource.getrlimit(resource.RLIMIT_AS)
        cap = current + WORKER_MEMORY_HEADROOM
        resource.setrlimit(resource.RLIMIT_AS, (cap if hard == resource.RLIM_INFINITY else min(cap, hard), hard))
    except (ImportError, OSError, ValueError):
        pass


def die_with_parent(parent_pid: int, exit_code: int = 0) -> None:
    """Linux: have the kernel SIGKILL this process when its parent exits (best effort); exit now (with
    ``exit_code``) if the parent is already gone. Also the grid's ``preexec_fn`` for its train children."""
    if sys.platform.startswith("linux"):
        try:
            ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
        except (OSError, AttributeError):
            pass
    if os.getppid() != parent_pid:
        os._exit(exit_code)


def worker_main(conn) -> None:
    """Start up ("ready"), warm the parser until a task arrives ("warm"), then the loop: receive
    (task, soft_timeout), answer (status, verdict); exit on EOF."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is for the caller, which closes the pool
    signal.signal(signal.SIGALRM, _on_alarm)
    for name in ("math_verify", "latex2sympy2_extended"):
        logging.getLogger(name).setLevel(logging.CRITICAL)
    _install_two_stage_parser()  # imports math-verify, before the memory cap is measured
    for name, wrapper in GRADER_DROP_INS:
        _install_in_grader(name, wrapper)
    _install_parse_caches()
    _limit_memory()
    _warm_up()
    gc.collect()
    gc.freeze()  # start-up's objects (modules, grammar, DFA, sympy caches) leave the collector's scans: ~10% less CPU
    conn.send("ready")
    _warm_parser(conn)
    gc.freeze()  # and the DFA built since
    conn.send("warm")
    while True:
        try:
            task, soft = conn.recv()
        except (EOFError, OSError):
            return
        try:
            signal.setitimer(signal.ITIMER_REAL, max(soft, 1e-3))
            try:
                out = _evaluate(*task)
            except Exception:  # math-verify / sympy failure on this input
                out = ("unparsable", False)
            finally:
                signal.setitimer(signal.ITIMER_REAL, 0)
        except _SoftTimeout:
            out = ("timeout", False)
        try:
            conn.send(out)
        except OSError:  # the parent is gone
            return


if __name__ == "__main__":
    _fd, _parent, _deathsig = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3] == "1"
    if _deathsig:
        die_with_parent(_parent)
    worker_main(Connection(_fd))
