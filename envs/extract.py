"""Final-answer extraction from a model response (first stage of graftzoo.envs.verifier).

Pure string scanning: no sympy, no eval. Limits keep adversarial text cheap: only the last
``MAX_RESPONSE_CHARS`` characters of a response are scanned, an answer longer than
``MAX_ANSWER_CHARS`` or nested deeper than ``MAX_BRACE_DEPTH`` braces is "unparsable".
"""
from __future__ import annotations

import re

MAX_RESPONSE_CHARS = 200_000
MAX_ANSWER_CHARS = 1_000
MAX_BRACE_DEPTH = 50

_BOX = re.compile(r"\\(?:boxed|fbox)(?![A-Za-z])")
# An explicit alternative inside one answer: "12 or 15", "12 \text{ or } 15", "either 3 or 4".
# `\lor` and words such as "for" do not count (the "or" must not follow a letter or a backslash).
_ALTERNATIVES = re.compile(r"(?<![A-Za-z\\])or(?![A-Za-z])")
# Two boxes joined by "or": "\boxed{12} or \boxed{15}" (text just before the last box).
_DELIMS = r"(?:\s|\$|\\[()\[\]])*"
_OR_BEFORE_BOX = re.compile(
    r"\}" + _DELIMS + r",?\s*(?:\\(?:text|textrm|mbox|mathrm)\s*\{\s*or\s*\}|or)" + _DELIMS + r"\Z")
_ANSWER_PHRASE = re.compile(r"(?i)\b(?:final[ \t]+answer|answer)[ \t]*(?:is\b|:)[ \t]*:?")
_MAX_PHRASES = 20  # answer phrases examined, from the last one back
_MATH_SPAN = re.compile(r"\$\$(.+?)\$\$|\$(.+?)\$|\\\((.+?)\\\)|\\\[(.+?)\\\]", re.S)
_SENTENCE_END = re.compile(r"\.(?=\s|$)")
_LAST_EQUALS = re.compile(r"(?<![<>!=:\\])=(?!=)")
_PROSE_AFTER = re.compile(r"\s+(?!or\b)[A-Za-z]{2,}\b")  # "2082 apples" -> "2082"; keeps "3 or 4"
_NUMBER = re.compile(r"-?\d+(?:\.\d+)?(?:/\d+(?:\.\d+)?)?")


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


def _last_box(text: str) -> tuple[str | None, int] | None:
    """Content of the last ``\\boxed``/``\\fbox`` and its start; content None when broken.

    Handles ``\\boxed{...}`` with brace matching and the brace-less ``\\boxed 5`` form.
    """
    last = None
    for last in _BOX.finditer(text):
        pass
    if last is None:
        return None
    start, j = last.start(), last.end()
    if text.startswith(" ", j) and not text[j:].lstrip(" ").startswith("{"):  # "\\boxed 5"
        return re.split(r"[$\n]", text[j:].strip(), maxsplit=1)[0].strip(), start
    while j < len(text) and text[j] in " \t\n":
        j += 1
    if j >= len(text) or text[j] != "{":
        return None, start
    end = _closing_brace(text, j)
    return (None if end is None else text[j + 1:end - 1].strip()), start


def _clean(span: str) -> str:
    """Trim an answer phrase tail to the answer: its first math span, else its first sentence."""
    s = span.strip().strip("*").strip()  # markdown bold: "**Answer:** 42"
    m = _MATH_SPAN.match(s)
    if m:
        return next(g for g in m.groups() if g is not None).strip()
    s = _SENTENCE_END.split(s, maxsplit=1)[0]
    return s.strip().strip("$").strip().rstrip(".").strip()


def _after_answer_phrase(text: str) -> str | None:
    """The answer after the last "final answer is X" / "answer: X" phrase, if any."""
    for m in list(_ANSWER_PHRASE.finditer(text))[-_MAX_PHRASES:][::-1]:
        end = m.end() + 2 * MAX_ANSWER_CHARS  # longer tails are over the answer limit anyway
        line_end = text.find("\n", m.end(), end)
        ans = _clean(text[m.end():end if line_end < 0 else line_end])
        if ans:
            return ans
    return None


def _after_last_equals(text: str) -> str | None:
    """Text after the last "=" on the response's last non-empty line (scratchpad answers)."""
    lines = text.rstrip().rsplit("\n", 1)
    line = lines[-1].strip().rstrip(".").strip().strip("$").strip()
    pos = None
    for pos in (m.start() for m in _LAST_EQUALS.finditer(line)):
        pass
    if pos is None:
        return None
    tail = _PROSE_AFTER.split(line[pos + 1:], maxsplit=1)[0]
    return tail.strip().rstrip(".,;").strip() or None


def _last_number(text: str) -> str | None:
    last = None
    for last in _NUMBER.finditer(text):
        pass
    return None if last is None else last.group(0)


def extract_answer(response: str) -> tuple[str | None, str]:
    """Extract the final answer of ``response``; returns ``(extracted, status)``.

    Order, first hit wins:
      1. the LAST ``\\boxed{...}`` or ``\\fbox{...}`` (braces matched, escaped braces skipped;
         ``\\boxed 5`` also accepted). A last box that is unclosed, empty or nested deeper than
         ``MAX_BRACE_DEPTH`` gives ``(None, "unparsable")``; earlier boxes are not consulted.
      2. no box: the text after the last "final answer is X" / "answer is X" / "answer: X"
         phrase (its first ``$...$`` span, else its first sentence);
      3. then the text after the last "=" on the last non-empty line, so scratchpads such as
         ``347*6=300*6+40*6+7*6=1800+240+42=2082`` give ``2082``;
      4. then the last number in the text.
    Nothing found: ``(None, "no_answer")``. An answer over ``MAX_ANSWER_CHARS`` characters or with
    unbalanced braces: ``(None, "unparsable")``. An answer offering alternatives ("12 or 15",
    "12 \\text{ or } 15", "\\boxed{12} or \\boxed{15}"): ``(answer, "multiple_answers")``;
    comma lists and tuples are not alternatives. Otherwise ``(answer, "ok")``.
    Only the last ``MAX_RESPONSE_CHARS`` characters of the response are scanned.
    """
    if not isinstance(response, str):
        raise TypeError(f"extract_answer: response must be str, got {type(response).__name__}")
    text = response[-MAX_RESPONSE_CHARS:]
    box = _last_box(text)
    if box is not None:
        answer, start = box
        if not answer:
            return None, "unparsable"
        if _OR_BEFORE_BOX.search(text[max(0, start - 200):start]):
            return answer, "multiple_answers"
    else:
        answer = _after_answer_phrase(text) or _after_last_equals(text) or _last_number(text)
        if answer is None:
            return None, "no_answer"
    if len(answer) > MAX_ANSWER_CHARS or not braces_balanced(answer):
        return None, "unparsable"
    if _ALTERNATIVES.search(answer):
        return answer, "multiple_answers"
    return answer, "ok"
