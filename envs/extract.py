"""Where the final answer of a response is (first stage of graftzoo.envs.verifier).

Pure string scanning, in the caller's process: no sympy, no eval. What it decides:

- **boxed answers**: the last ``\\boxed{...}`` / ``\\fbox{...}`` (braces matched, escaped braces
  skipped), together with the boxes just before it when they are joined to it only by commas,
  "and" or math delimiters (``\\boxed{1}, \\boxed{2} and \\boxed{3}``: one answer of three parts,
  compared as one set). Boxes joined by "or" are a hedge: status "multiple_answers".
- **unboxed answers**: no box at all, or a "final answer is" phrase after the last box. The verifier gives the text to math-verify's own ``parse``
  (in a worker process); this module only rejects a hedge near the end ("12 or 15").
- **golds** (docs/verifier.md#golds-and-answers-of-several-parts): a gold written as a worked solution is read by
  its final answer (``final_answer``), and its parts are counted (``answer_parts``: a list, a set, a tuple or named
  parts); against a gold of several parts, boxes introduced as parts ("(b)", "y_2 = ") are read as one answer,
  each with its stated name or in order as the gold requires (``locate_parts``).
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
    parts_read: int = 0  # boxes read as the n parts of a gold (locate_parts: more boxes, names or order); 0 if not

    @property
    def answer(self) -> str | None:
        """The boxed answer as one string (several boxes joined by ", "), None without one."""
        return ", ".join(self.parts) if self.parts else None


def _closing_brace(text: str, open_idx: int, limit: int | None = None) -> int | None:
    """Index just past the brace matching ``text[open_idx] == "{"``; None if unclosed (before ``limit``) or too deep.

    Escaped braces (``\\{``, ``\\}``) and any other backslash pair are skipped.
    """
    depth, i, n = 0, open_idx, len(text) if limit is None else min(limit, len(text))
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


def _box_at(text: str, m: re.Match, limit: int | None = None) -> tuple[str | None, int]:
    """(content, end) of the box whose macro ``m`` matched; content None when the box is broken
    (unclosed before ``limit``, too deep, no brace). The brace-less ``\\boxed 5`` form ends at a ``$`` or newline."""
    j = m.end()
    if text.startswith(" ", j) and not text[j:].lstrip(" ").startswith("{"):
        tail = text[j:].lstrip(" ")
        content = re.split(r"[$\n]", tail, maxsplit=1)[0].strip()
        return content.rstrip(".").strip(), j + (len(text) - j - len(tail)) + len(content)
    while j < len(text) and text[j] in " \t\n":
        j += 1
    if j >= len(text) or text[j] != "{":
        return None, j
    end = _closing_brace(text, j, limit)
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


# ---------------------------------------------------------------- golds: the final answer, and answers of several parts

# A mark before a gold's final answer: "Final Answer: The final answer is $28\%$. I hope it is correct." (MATH and
# Minerva solutions), "The answer is 28%", "Answer: 5", "The answers are 3 and 5", GSM8K's "#### 72".
_ANSWER_MARK = re.compile(r"(?i)(?<![A-Za-z])(?:final\s+answer(?:\s+is)?|answers?\s+(?:is|are)|answer\s*:|####)")
# The answer after a mark: a math span, or plain text up to the end of its sentence or line.
_MARKED = re.compile(r"[\s*:]*(?:\$\$(?P<display>[^$]{1,1000}?)\$\$|\$(?P<inline>[^$\n]{1,1000}?)\$"
                     r"|\\\((?P<paren>[^\n]{1,1000}?)\\\)|\\\[(?P<bracket>.{1,1000}?)\\\]"
                     r"|(?P<plain>[^\n$]{1,300}?)(?=\.?[ \t\r]{0,8}(?:\n|\Z)|\.\s))", re.S)


def final_answer(gold: str) -> str:
    """The answer a gold states after an answer mark (docs/verifier.md#a-golds-final-answer): a gold written as a
    worked solution with no box after its last mark ("final answer is", "the answer is", "answer:", "####") is
    read by what follows that mark: the math span there, or the plain text up to the end of its sentence or line
    ("Final Answer: The final answer is $28\\%$. I hope it is correct." -> ``28\\%``). Any other gold is given back
    as it is: one with a box, which math-verify reads by its own rule for boxes (in the workers), one with no mark,
    and one whose marked answer is over the length limit or unbalanced. Pure string scanning of the last
    ``MAX_RESPONSE_CHARS`` characters."""
    if not isinstance(gold, str):
        raise TypeError(f"final_answer: gold must be str, got {type(gold).__name__}")
    if locate_answer(gold).kind == "boxes":
        return gold
    text, mark = gold[-MAX_RESPONSE_CHARS:], None
    for mark in _ANSWER_MARK.finditer(text):
        pass
    found = _MARKED.match(text, mark.end()) if mark else None
    if not found:
        return gold
    answer = next(g for g in found.groups() if g is not None).strip()
    answer = answer.rstrip(".").strip() if found.group("plain") is not None else answer
    if not answer or len(answer) > MAX_ANSWER_CHARS or not braces_balanced(answer):
        return gold
    return answer


def stated_answer(gold: str) -> str:
    """What a gold states as its answer, for counting its parts (docs/verifier.md#answers-of-several-parts): its
    last box with the boxes before it that are joined to it or introduced as other parts (``_names_part``:
    "(a) \\boxed{3} (b) \\boxed{5}" states "3, 5"), else ``final_answer``."""
    text = gold[-MAX_RESPONSE_CHARS:]
    if locate_answer(gold).kind != "boxes":
        return final_answer(gold)
    boxes = _part_boxes(text, MAX_BOXES)
    return ", ".join(c for _, c, _ in boxes) if boxes else gold


@dataclass(frozen=True)
class Parts:
    """The parts of a (normalized) gold answer (docs/verifier.md#answers-of-several-parts). ``kind``: "one" (a
    single answer: a number, an expression, an interval, a matrix), "list" (a comma list, read as a set),
    "set" (``\\{a, b\\}``), "tuple" (``(a, b)``: ordered) or "labeled" (``y_1 = 2x+1, y_2 = 3``: each part a
    definition of its own name)."""

    parts: tuple = ()
    kind: str = "one"


# What parts an answer at the top level (outside brackets): a comma (not one between thousands: 1,000),
# a semicolon, \quad, and "and" (as a word or in \text{}).
_PART_SEPARATOR = re.compile(r",(?!\d{3}(?!\d))|;|\\q?quad|\\text\s{0,8}\{\s{0,8}and\s{0,8}\}|\s{1,8}and\s{1,8}")
_OPENERS, _CLOSERS = "([{", ")]}"
# A name defined by a part or stated before a box: a letter or a macro (\alpha), a subscript, primes and
# arguments (y_1, x_{2}, f(x), a'); two spellings of one name (y_1, y_{1}) are one name.
_NAME = r"(?:\\[A-Za-z]+|[A-Za-z])(?:_\{?[A-Za-z0-9]+\}?)?'*(?:\([^()=<>]{0,20}\))?"
_DEFINITION = re.compile(rf"\s*({_NAME})\s*=(?!=)[^=<>]+")


def split_parts(answer: str) -> tuple:
    """``answer`` split at its top-level separators (``_PART_SEPARATOR``, docs/verifier.md#answers-of-several-parts),
    each part stripped and empty ones dropped; ``(answer,)`` when it has none, is longer than ``MAX_ANSWER_CHARS``,
    holds an environment (``\\begin``) or its brackets do not balance."""
    if len(answer) > MAX_ANSWER_CHARS or "\\begin" in answer:
        return (answer,)
    parts, depth, start, i = [], 0, 0, 0
    while i < len(answer):
        ch = answer[i]
        if depth == 0 and (sep := _PART_SEPARATOR.match(answer, i)) and not (ch == "," and i and answer[i - 1] == "\\"):
            parts.append(answer[start:i])
            start = i = sep.end()
            continue
        if ch == "\\" and answer[i + 1:i + 2] in ("{", "}"):
            depth += 1 if answer[i + 1] == "{" else -1
            i += 2
            continue
        if ch == "\\":
            i += 1
            while i < len(answer) and answer[i].isalpha():
                i += 1
            continue
        depth += (ch in _OPENERS) - (ch in _CLOSERS)
        if depth < 0:
            return (answer,)
        i += 1
    parts.append(answer[start:])
    parts = tuple(p.strip() for p in parts if p.strip())
    return parts if depth == 0 and len(parts) > 1 else (answer,)


def _enclosed(answer: str, opener: str, closer: str) -> str | None:
    """The inside of ``answer`` when one bracket pair (``opener`` ... ``closer``) encloses all of it."""
    if not (answer.startswith(opener) and answer.endswith(closer)) or len(answer) < len(opener) + len(closer):
        return None
    inner = answer[len(opener):len(answer) - len(closer)]
    return inner if _balanced(inner) else None


def _balanced(s: str) -> bool:
    """Whether the brackets of ``s`` (escaped braces too) never close more than they opened, and all close."""
    depth = 0
    for ch in s.replace("\\{", "(").replace("\\}", ")"):
        depth += (ch in _OPENERS) - (ch in _CLOSERS)
        if depth < 0:
            return False
    return depth == 0


def _name_of(definition: str) -> str | None:
    """The name a part defines (``y_{1} = 3`` -> ``y_1``), None when the part is not a definition."""
    m = _DEFINITION.fullmatch(definition)
    return None if m is None else re.sub(r"[{}\s]", "", m.group(1))


def answer_parts(answer: str) -> Parts:
    """The parts of a normalized gold answer (docs/verifier.md#answers-of-several-parts): the elements of a set
    ``\\{a, b\\}`` or of a tuple ``(a, b)`` enclosing the whole answer, else its top-level parts
    (``split_parts``): a "labeled" list when every part defines a name of its own, else a "list". An interval
    with a square bracket, a matrix or a single value is "one" part."""
    for opener, closer, kind in (("\\{", "\\}", "set"), ("(", ")", "tuple")):
        inner = _enclosed(answer, opener, closer)
        if inner is not None and len(split_parts(inner)) > 1:
            return Parts(split_parts(inner), kind)
    parts = split_parts(answer)
    if len(parts) < 2:
        return Parts((answer,), "one")
    names = [_name_of(p) for p in parts]
    labeled = None not in names and len(set(names)) == len(names)
    return Parts(parts, "labeled" if labeled else "list")


# What names the next part between two boxes: a part label ("(b)", "(ii)", "Part b", "\item"; "b)" opening a line
# or a sentence) or a list marker opening a line; a name stated just before the next box ("y_2 = ") is checked
# apart (_stated_name).
_PART_MARK = re.compile(r"(?<![A-Za-z0-9\\_^])\(\s*(?:[a-h]|i{1,3}|iv|vi{0,3})\s*\)"
                        r"|(?:\A|(?<=\n)|(?<=[.;:*]\s)|(?<=\*\*))[ \t]{0,8}(?:[a-h]|i{1,3}|iv)\)"
                        r"|(?i:(?<![A-Za-z])part(?![A-Za-z]))|\\item(?![A-Za-z])"
                        r"|\n[ \t]{0,8}(?:[-*\u2022]|\d{1,2}[.)])\s")
_STATED_NAME = re.compile(rf"({_NAME})\s*=\s*(?:\$|\\\(|\\\[|\s)*\Z")
NAME_CHARS = 60  # of the text just before a box, searched for the name it is stated for
_OPERATORS = "+-*/^=<>)]}|"
_SIZING = re.compile(r"\\(?:left|right)(?![A-Za-z])\s*|\$")  # what hides a box's brackets from answer_parts


def _stated_name(before: str) -> str | None:
    """The name stated just before a box (``$y_1 = \\boxed{...}``: ``y_1``), None when there is none or when
    it is the end of an expression (``2a = ``, ``x + y = ``: the box is not that name's value)."""
    before = before[-NAME_CHARS:]
    m = _STATED_NAME.search(before)
    if m is None:
        return None
    ahead = before[:m.start()]
    if ahead[-1:] and (ahead[-1].isalnum() or ahead[-1] in "_^}\\"):
        return None  # the tail of a longer name or of a product
    ahead = ahead.rstrip()
    return None if ahead[-1:] and (ahead[-1].isdigit() or ahead[-1] in _OPERATORS) else m.group(1)


def _names_part(between: str) -> bool:
    """Whether the text between two boxes introduces the second as another part of the answer
    (docs/verifier.md#answers-of-several-parts): a part label or list marker in it, a name stated just before the
    second box, or what joins boxes (``_joins``); never a hedge ("or")."""
    if _is_hedge(between):
        return False
    return _joins(between) or bool(_PART_MARK.search(between)) or _stated_name(between) is not None


def _part_boxes(text: str, wanted: int) -> list:
    """(start, content, end) of the last boxes of ``text`` that are parts of one answer, in order: going back from
    the last box, at most ``wanted`` (and ``MAX_BOXES``) of them, while each is readable and introduced as another
    part after the one before it (``_names_part``). Each box's closing brace is searched for before the next box
    only, so the scan stays linear in the text."""
    out: list = []
    limit = len(text)
    for m in reversed(list(_BOX.finditer(text))[-min(wanted, MAX_BOXES):]):
        content, end = _box_at(text, m, limit)
        if not content or (out and not _names_part(text[end:out[0][0]])):
            break
        out.insert(0, (m.start(), content, end))
        limit = m.start()
    return out


def locate_parts(response: str, gold: Parts) -> Located:
    """The answer of ``response`` against a gold of several parts (docs/verifier.md#answers-of-several-parts).

    ``locate_answer``'s answer, unless the gold has n >= 2 parts and the response boxes them one by one:
    - when the located boxes hold fewer than n parts, the last n boxes are read as one answer if each of them
      after the first is introduced as another part (``_names_part``: "(b)", "Part b", "y_2 = ", or the commas
      and "and" that already join boxes); a self-correction ("\\boxed{5} wait, \\boxed{6}") is not a part;
    - the n boxes read (or n boxes already joined) are read as the gold is: against a "labeled" gold, each box
      with the name stated just before it (``$y_1 = \\boxed{2x+1}$`` reads ``y_1 = 2x+1``, so that a part given
      for the wrong name is wrong); against a "tuple" gold, in order, as the tuple ``(a, b)``; otherwise as a set.
    Boxes that hold more parts than the gold, a single-part gold and anything but an "ok" boxed answer keep
    ``locate_answer``'s reading."""
    located = locate_answer(response)
    n = len(gold.parts)
    if n < 2 or located.kind != "boxes" or located.status != "ok" or len(located.parts) > n:
        return located
    if len(located.parts) < n and sum(len(answer_parts(_SIZING.sub("", p)).parts) for p in located.parts) >= n:
        return located  # the boxes hold the whole answer ("\boxed{3, 5}", "\boxed{\left(3, 5\right)}")
    text = response[-MAX_RESPONSE_CHARS:]
    boxes = _part_boxes(text, n)
    if len(boxes) < n or any(len(c) > MAX_ANSWER_CHARS or not braces_balanced(c) or _ALTERNATIVES.search(c)
                             or len(split_parts(c)) > 1 for _, c, _ in boxes):
        return located
    parts = tuple(c for _, c, _ in boxes)
    if gold.kind == "labeled":
        names = [_stated_name(text[max(0, start - NAME_CHARS):start]) if _name_of(c) is None else None
                 for start, c, _ in boxes]
        parts = tuple(f"{name} = {c}" if name else c for name, c in zip(names, parts))
    elif gold.kind == "tuple":
        parts = ("(" + ", ".join(parts) + ")",)
    if parts == located.parts:
        return located
    return Located("boxes", "ok", parts, boxes=located.boxes, parts_read=n)
