"""Where the final answer of a response is (first stage of graftzoo.envs.verifier).

Pure string scanning, in the caller's process: no sympy, no eval. What it decides:

- **boxed answers**: the last ``\\boxed{...}`` / ``\\fbox{...}`` (braces matched, escaped braces
  skipped), together with the boxes just before it when they are joined to it only by commas,
  "and" or math delimiters (``\\boxed{1}, \\boxed{2} and \\boxed{3}``: one answer of three parts,
  compared as one set). Boxes joined by "or" are a hedge: status "multiple_answers".
- **unboxed answers**: no box at all, or a "final answer is" phrase after the last box. The verifier gives the text to math-verify's own ``parse``
  (in a worker process); this module only rejects a hedge near the end ("12 or 15").
- **limits** that keep hostile text cheap: only the last ``MAX_RESPONSE_CHARS`` characters are
  scanned; an answer longer than ``MAX_ANSWER_CHARS`` or nested deeper than ``MAX_BRACE_DEPTH``
  braces is "unparsable".

``extract_answer`` gives one string for callers that cluster answers (OM-GRPO): the boxed answer,
else the last whole math span or whole number token of the text (never a fragment of one).
"""
from __future__ import annotations

import re
from dataclasses import dataclass

MAX_RESPONSE_CHARS = 200_000
MAX_ANSWER_CHARS = 1_000
MAX_BRACE_DEPTH = 50
MAX_BOXES = 20  # boxes joined into one answer, at most
HEDGE_LINES = 3  # last non-empty lines of an unboxed response searched for a hedge
HEDGE_LINE_CHARS = 500  # of each, the last characters

_BOX = re.compile(r"\\(?:boxed|fbox)(?![A-Za-z])")
# An explicit alternative inside one answer: "12 or 15", "12 \text{ or } 15", "either 3 or 4".
# `\lor` and words such as "for" do not count (the "or" must not follow a letter or a backslash).
_ALTERNATIVES = re.compile(r"(?<![A-Za-z\\])or(?![A-Za-z])")
# Text between two boxes that joins them into one answer, once math delimiters, spacing macros and
# \text{} wrappers are taken out: commas, or a few words ending in "and" ("and", "for part (a) and").
_JOIN_NOISE = re.compile(r"\\q?quad(?![A-Za-z])|\\[,;:!()\[\] ]|\$|\\(?:text|textrm|mbox|mathrm)\s*\{([^{}]*)\}|&")
_JOIN_WORDS = re.compile(r"[\s,;.]*(?:(?:[A-Za-z()]+\s+){0,4}and[\s,;]*)?", re.S)
_SPAN = r"(?:\$[^$\n]{1,200}\$|\\\(.{1,200}?\\\)|[A-Za-z] ?= ?-?\d[\d,.]{0,30}|(?<![\d,.])-?\d[\d,.]{0,30})"
# Two answers offered side by side in prose: "12 or 15", "$x=3$ or $x=4$", "x = 3 or x = 4".
_HEDGE = re.compile(_SPAN + r"\s*,?\s*(?:or|\\text\s*\{\s*or\s*\})\s*" + _SPAN)
# "The final answer is $X$" after the last box: math-verify reads that phrase (it outranks an earlier box).
_FINAL_ANSWER_AFTER = re.compile(r"(?i)final answer is")
_MATH_SPAN = re.compile(r"\$\$(.+?)\$\$|(?<!\\)\$(.+?)(?<!\\)\$|\\\((.+?)\\\)|\\\[(.+?)\\\]", re.S)
# A whole number token: not glued to letters or other digits; thousands separators kept.
_NUMBER_TOKEN = re.compile(r"(?<![\w.,])-?(?:\d{1,3}(?:,\d{3})+|\d+)(?:\.\d+)?(?![\w])")


@dataclass(frozen=True)
class Located:
    """Where a response's answer is. ``kind`` is "boxes" (``parts`` are the box contents, in order)
    or "text" (no box: ``text`` is the scanned tail for math-verify to read); ``status`` is "ok",
    "multiple_answers" (a hedge), "unparsable" (a broken or over-limit box) or "no_answer";
    ``boxes`` counts the boxes of the scanned text."""

    kind: str
    status: str
    parts: tuple = ()
    text: str = ""
    boxes: int = 0  # boxes in the scanned text (math-verify would read them all)

    @property
    def answer(self) -> str | None:
        """The boxed answer as one string (several boxes joined by ", "), None without one."""
        return ", ".join(self.parts) if self.parts else None


def _closing_brace(text: str, open_idx: int) -> int | None:
    """Index just past the brace matching ``text[open_idx] == "{"``; None if unclosed or too deep.

    Escaped braces (``\\{``, ``\\}``) and any other backslash pair are skipped.
    """
    depth, i, n = 0, open_idx, len(text)
    while i < n:
        ch = text[i]
        if ch == "\\":
            i += 2
            continue
        if ch == "{":
            depth += 1
            if depth > MAX_BRACE_DEPTH:
                return None
        elif ch == "}":
            depth -= 1
            if depth == 0:
                return i + 1
        i += 1
    return None


def braces_balanced(s: str) -> bool:
    """True when every unescaped brace of ``s`` is matched and nesting stays within the limit."""
    if "{" not in s and "}" not in s:
        return True
    depth, i = 0, 0
    while i < len(s):
        ch = s[i]
        if ch == "\\":
            i += 2
            continue
        depth += (ch == "{") - (ch == "}")
        if depth < 0 or depth > MAX_BRACE_DEPTH:
            return False
        i += 1
    return depth == 0


def _box_at(text: str, m: re.Match) -> tuple[str | None, int]:
    """(content, end) of the box whose macro ``m`` matched; content None when the box is broken
    (unclosed, too deep, no brace). The brace-less ``\\boxed 5`` form ends at a ``$`` or newline."""
    j = m.end()
    if text.startswith(" ", j) and not text[j:].lstrip(" ").startswith("{"):
        tail = text[j:].lstrip(" ")
        content = re.split(r"[$\n]", tail, maxsplit=1)[0].strip()
        return content.rstrip(".").strip(), j + (len(text) - j - len(tail)) + len(content)
    while j < len(text) and text[j] in " \t\n":
        j += 1
    if j >= len(text) or text[j] != "{":
        return None, j
    end = _closing_brace(text, j)
    return (None, j) if end is None else (text[j + 1:end - 1].strip(), end)


def _joins(between: str) -> bool:
    """Whether the text between two boxes makes them parts of one answer (commas, "and")."""
    words = _JOIN_NOISE.sub(lambda m: f" {m.group(1)} " if m.group(1) is not None else " ", between)
    return len(words) <= 60 and not _ALTERNATIVES.search(words) and bool(_JOIN_WORDS.fullmatch(words))


def _is_hedge(between: str) -> bool:
    """Whether the short text between two boxes offers them as alternatives ("or", "or maybe")."""
    words = _JOIN_NOISE.sub(lambda m: f" {m.group(1)} " if m.group(1) is not None else " ", between)
    return len(words) <= 60 and re.search(r"(?<![A-Za-z\\])or(?![A-Za-z])", words) is not None


def _final_boxes(text: str, macros: list) -> Located:
    """The last box and the boxes joined to it (see the module docstring)."""
    content, end = _box_at(text, macros[-1])
    if not content:
        return Located("boxes", "unparsable", boxes=len(macros))
    parts, status = [content], "ok"
    for m in reversed(macros[-MAX_BOXES:-1]):
        prev, prev_end = _box_at(text, m)
        if not prev:
            break
        between = text[prev_end:macros[-len(parts)].start()]
        if _is_hedge(between):
            status = "multiple_answers"
        elif not _joins(between):
            break
        parts.insert(0, prev)
    if any(len(p) > MAX_ANSWER_CHARS or not braces_balanced(p) for p in parts):
        return Located("boxes", "unparsable", boxes=len(macros))
    if status == "ok" and any(_ALTERNATIVES.search(p) for p in parts):
        status = "multiple_answers"
    return Located("boxes", status, tuple(parts), boxes=len(macros))


def locate_answer(response: str) -> Located:
    """Find the answer of ``response`` (module docstring); raises TypeError for a non-string."""
    if not isinstance(response, str):
        raise TypeError(f"extract_answer: response must be str, got {type(response).__name__}")
    text = response[-MAX_RESPONSE_CHARS:]
    macros = list(_BOX.finditer(text))
    if macros and not _FINAL_ANSWER_AFTER.search(text, macros[-1].end()):
        return _final_boxes(text, macros)
    if not text.strip():
        return Located("text", "no_answer")
    lines = [line for line in text.rstrip().split("\n") if line.strip()][-HEDGE_LINES:]
    if any(_HEDGE.search(line[-HEDGE_LINE_CHARS:]) for line in lines):
        return Located("text", "multiple_answers", text=text)
    return Located("text", "ok", text=text)


def fallback_answer(text: str) -> str | None:
    """The last whole math span (``$...$``, ``\\(...\\)``, ``\\[...\\]``) or whole number token of
    ``text``, whichever ends later; None when there is neither. Never part of a span or a token."""
    best, best_end = None, -1
    for m in _MATH_SPAN.finditer(text):
        best, best_end = next(g for g in m.groups() if g is not None).strip(), m.end()
    for m in _NUMBER_TOKEN.finditer(text):
        if m.end() > best_end and not _inside_span(text, m.start()):
            best, best_end = m.group(0), m.end()
    return best or None


def _inside_span(text: str, pos: int) -> bool:
    """Whether ``pos`` falls inside a math span of ``text``."""
    return any(m.start() < pos < m.end() for m in _MATH_SPAN.finditer(text))


def extract_answer(response: str) -> tuple[str | None, str]:
    """``(answer, status)`` of ``response``: the boxed answer (several joined boxes as one string,
    "a, b"), else the text's last whole math span or whole number token (``fallback_answer``).

    Status "no_answer" when there is none, "unparsable" for a broken or over-limit box,
    "multiple_answers" for a hedge ("12 or 15", boxes joined by "or"), else "ok". The verifier
    reads unboxed text with math-verify instead of ``fallback_answer``.
    """
    located = locate_answer(response)
    if located.kind == "boxes":
        return located.answer, located.status
    answer = fallback_answer(located.text) if located.text else None
    if answer is None:
        return None, "no_answer"
    if len(answer) > MAX_ANSWER_CHARS or not braces_balanced(answer):
        return None, "unparsable"
    return answer, located.status
