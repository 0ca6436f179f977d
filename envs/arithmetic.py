"""Procedural arithmetic with deterministic scratchpad answers (the CPU demo task).

Each problem has a short question (``347*6``) and a deterministic scratchpad solution that
restates the question, expands it by place value, then folds the partial results:

    add    347+586=300+500+40+80+7+6=800+120+13=933
    sub    586-347=586-300-40-7=286-40-7=246-7=239
    mul    347*6=300*6+40*6+7*6=1800+240+42=2082
    multi  47*6+38-25=282+38-25=320-25=295

Zeros are kept as terms (``307*6=300*6+0*6+7*6=1800+0+42=1842``). Every ``=``-separated
segment evaluates to the same integer, and the final answer is the integer after the last ``=``.
The scratchpads of ``sub`` (a left-to-right borrow chain) and ``mul`` (products, then a
multi-term sum) share little beyond the echo, so a model can be good at one and weak at the
other (docs/results.md).

Difficulty knob per skill: digits per operand for ``add`` and ``sub``, digits of the
multiplicand for ``mul`` (the multiplier is one digit, 2..9), number of operations for
``multi`` (a 2-digit x 1-digit product followed by ``difficulty - 1`` additions or
subtractions of 2-digit numbers, evaluated left to right, never going negative).

Held-out splits: a question belongs to the held-out partition iff a stable hash of its text
falls in 1 of ``HELDOUT_BUCKETS`` buckets. The ``train`` split only yields questions outside
that partition and every other split only questions inside it, so no held-out question is
ever trained on, whatever the seeds. Different non-train splits may share questions.
"""
from __future__ import annotations

import hashlib
import math
import random
from dataclasses import dataclass
from functools import lru_cache
from typing import Mapping, Sequence, Union

from graftzoo.contract.types import Prompt

SKILLS = ("add", "sub", "mul", "multi")
DEFAULT_DIFFICULTY = {"add": 3, "sub": 3, "mul": 3, "multi": 3}
HELDOUT_BUCKETS = 10  # 1/10 of all questions are reserved for held-out splits
TRAIN_SPLIT = "train"
_MAX_TRIES = 10_000
_MIX_RESOLUTION = 1000  # mix weights are quantised to 1/1000


@dataclass(frozen=True)
class ArithmeticProblem:
    question: str
    answer: int
    solution: str
    skill: str
    difficulty: int


def _digits(n: int, rng: random.Random) -> int:
    """A uniform ``n``-digit number (no leading zero; 0..9 when n == 1)."""
    return rng.randint(0 if n == 1 else 10 ** (n - 1), 10 ** n - 1)


def _places(x: int) -> list[int]:
    """Place-value terms, most significant first, zeros kept: 307 -> [300, 0, 7]."""
    s = str(x)
    return [int(ch) * 10 ** (len(s) - 1 - i) for i, ch in enumerate(s)]


def add_solution(a: int, b: int) -> str:
    """``347+586=300+500+40+80+7+6=800+120+13=933`` (place-value pairs, per-place sums, total)."""
    steps = [f"{a}+{b}"]
    pa, pb = _places(a), _places(b)
    if len(pa) != len(pb):
        raise ValueError(f"arithmetic: add operands need equal digit counts, got {a} and {b}")
    if len(pa) > 1:
        steps.append("+".join(f"{x}+{y}" for x, y in zip(pa, pb)))
        steps.append("+".join(str(x + y) for x, y in zip(pa, pb)))
    return "=".join(steps + [str(a + b)])


def sub_solution(a: int, b: int) -> str:
    """``586-347=586-300-40-7=286-40-7=246-7=239`` (subtract b's place values one at a time)."""
    if a < b:
        raise ValueError(f"arithmetic: sub needs a >= b, got {a} and {b}")
    steps = [f"{a}-{b}"]
    terms = _places(b)
    if len(terms) > 1:
        value = a
        for i in range(len(terms)):
            steps.append("-".join([str(value)] + [str(t) for t in terms[i:]]))
            value -= terms[i]
    return "=".join(steps + [str(a - b)])


def mul_solution(a: int, m: int) -> str:
    """``347*6=300*6+40*6+7*6=1800+240+42=2082`` (place-value products, then their sum)."""
    steps = [f"{a}*{m}"]
    pa = _places(a)
    if len(pa) > 1:
        steps.append("+".join(f"{x}*{m}" for x in pa))
        steps.append("+".join(str(x * m) for x in pa))
    return "=".join(steps + [str(a * m)])


def multi_solution(a: int, m: int, tail: Sequence[tuple[str, int]]) -> str:
    """``47*6+38-25=282+38-25=320-25=295`` (the product first, then one +/- per step, left to right)."""
    def render(head: int | str, rest) -> str:
        return str(head) + "".join(f"{op}{c}" for op, c in rest)

    steps = [render(f"{a}*{m}", tail)]
    value = a * m
    for i in range(len(tail) + 1):
        steps.append(render(value, tail[i:]))
        if i < len(tail):
            op, c = tail[i]
            value = value + c if op == "+" else value - c
            if value < 0:
                raise ValueError(f"arithmetic: multi goes negative at step {i + 1} of {steps[0]}")
    return "=".join(steps)


def _problem(solution: str, skill: str, difficulty: int) -> ArithmeticProblem:
    return ArithmeticProblem(solution.split("=", 1)[0], int(solution.rsplit("=", 1)[1]), solution, skill, difficulty)


def _add(d: int, rng: random.Random) -> ArithmeticProblem:
    return _problem(add_solution(_digits(d, rng), _digits(d, rng)), "add", d)


def _sub(d: int, rng: random.Random) -> ArithmeticProblem:
    a, b = _digits(d, rng), _digits(d, rng)
    return _problem(sub_solution(max(a, b), min(a, b)), "sub", d)


def _mul(d: int, rng: random.Random) -> ArithmeticProblem:
    return _problem(mul_solution(_digits(d, rng), rng.randint(2, 9)), "mul", d)


def _multi(ops: int, rng: random.Random) -> ArithmeticProblem:
    a, m = _digits(2, rng), rng.randint(2, 9)
    value, tail = a * m, []
    for _ in range(ops - 1):
        c = _digits(2, rng)
        op = "-" if rng.random() < 0.5 and c <= value else "+"
        tail.append((op, c))
        value = value + c if op == "+" else value - c
    return _problem(multi_solution(a, m, tail), "multi", ops)


_BUILDERS = {"add": _add, "sub": _sub, "mul": _mul, "multi": _multi}


def make_problem(skill: str, difficulty: int, rng: random.Random) -> ArithmeticProblem:
    """One random problem of ``skill`` at ``difficulty`` (see the module docstring)."""
    if skill not in _BUILDERS:
        raise ValueError(f"arithmetic: unknown skill {skill!r}; expected one of {SKILLS}")
    if not isinstance(difficulty, int) or difficulty < 1:
        raise ValueError(f"arithmetic: difficulty for {skill!r} must be an int >= 1, got {difficulty!r}")
    return _BUILDERS[skill](difficulty, rng)


def final_answer(text: str) -> str | None:
    """The text after the last '=' (stripped), or None when there is no '='."""
    if "=" not in text:
        return None
    return text.rsplit("=", 1)[1].strip()


def is_correct(response: str, gold: Union[int, str]) -> bool:
    """True iff the text after the last '=' is exactly the gold integer."""
    return final_answer(response) == str(gold)


def is_heldout(question: str) -> bool:
    """Stable hash rule that reserves 1/HELDOUT_BUCKETS of all questions for held-out splits."""
    h = int.from_bytes(hashlib.blake2b(question.encode(), digest_size=8).digest(), "big")
    return h % HELDOUT_BUCKETS == 0


def _normalise_mix(mix: Mapping[str, float]) -> tuple[tuple[str, int], ...]:
    """Mix -> integer weights over one period, in SKILLS order, zero weights dropped."""
    if not mix:
        raise ValueError("arithmetic: mix is empty; give e.g. {'add': 0.5, 'mul': 0.5}")
    for k, w in mix.items():
        if k not in SKILLS:
            raise ValueError(f"arithmetic: mix key {k!r} is not a skill; expected one of {SKILLS}")
        if not isinstance(w, (int, float)) or w < 0:
            raise ValueError(f"arithmetic: mix[{k!r}] must be a number >= 0, got {w!r}")
    total = float(sum(mix.values()))
    if total <= 0:
        raise ValueError(f"arithmetic: mix weights sum to {total}; at least one must be > 0")
    ints = {k: round(_MIX_RESOLUTION * mix[k] / total) for k in SKILLS if mix.get(k, 0) > 0}
    for k, v in ints.items():
        if v == 0:
            raise ValueError(f"arithmetic: mix[{k!r}]={mix[k]} is below the 1/{_MIX_RESOLUTION} resolution")
    g = math.gcd(*ints.values())
    return tuple((k, v // g) for k, v in ints.items())


@lru_cache(maxsize=64)
def _skill_cycle(weights: tuple[tuple[str, int], ...]) -> tuple[str, ...]:
    """One period of smooth weighted round-robin: every prefix is within 1 of its quota."""
    current = {k: 0 for k, _ in weights}
    total = sum(w for _, w in weights)
    cycle = []
    for _ in range(total):
        for k, w in weights:
            current[k] += w
        best = max(weights, key=lambda kw: current[kw[0]])[0]  # first max wins ties
        current[best] -= total
        cycle.append(best)
    return tuple(cycle)


def skill_for_index(index: int, mix: Mapping[str, float]) -> str:
    """The skill of item ``index`` of a stream: a fixed periodic, exactly proportioned schedule."""
    cycle = _skill_cycle(_normalise_mix(mix))
    return cycle[index % len(cycle)]


def _difficulty_of(skill: str, difficulty: Union[int, Mapping[str, int]]) -> int:
    if isinstance(difficulty, Mapping):
        for k in difficulty:
            if k not in SKILLS:
                raise ValueError(f"arithmetic: difficulty key {k!r} is not a skill; expected one of {SKILLS}")
        return int(difficulty.get(skill, DEFAULT_DIFFICULTY[skill]))
    return difficulty


def problem_at(index: int, seed: int, split: str, skill: str, difficulty: int) -> ArithmeticProblem:
    """The problem at ``index`` of the (seed, split) stream; rejects questions of the wrong partition."""
    rng = random.Random(f"arith:{seed}:{split}:{index}")
    want_heldout = split != TRAIN_SPLIT
    for _ in range(_MAX_TRIES):
        p = make_problem(skill, difficulty, rng)
        if is_heldout(p.question) == want_heldout:
            return p
    raise ValueError(f"arithmetic: no {split!r} question found for skill {skill!r} at difficulty "
                     f"{difficulty} after {_MAX_TRIES} tries (the problem space is too small)")


def generate_prompts(n: int, seed: int, mix: Mapping[str, float],
                     difficulty: Union[int, Mapping[str, int]] = DEFAULT_DIFFICULTY,
                     split: str = TRAIN_SPLIT, start: int = 0) -> list[Prompt]:
    """Items ``start .. start+n-1`` of the deterministic (seed, split) prompt stream.

    Skills follow ``skill_for_index`` (exact proportions over each period), problems come from
    a per-index rng, so any slice of the stream is the same whatever ``start`` and ``n`` are.
    """
    if n < 0 or start < 0:
        raise ValueError(f"arithmetic: n and start must be >= 0, got n={n}, start={start}")
    out = []
    for i in range(start, start + n):
        skill = skill_for_index(i, mix)
        p = problem_at(i, seed, split, skill, _difficulty_of(skill, difficulty))
        out.append(Prompt(id=f"arith-{split}-{seed}-{i}", text=p.question, gold=str(p.answer),
                          source="arithmetic",
                          metadata={"skill": p.skill, "difficulty": p.difficulty, "solution": p.solution}))
    return out


class ArithmeticDataset(Sequence[Prompt]):
    """A fixed-size slice (items 0..size-1) of the (seed, split) prompt stream."""

    def __init__(self, size: int, seed: int, mix: Mapping[str, float],
                 difficulty: Union[int, Mapping[str, int]] = DEFAULT_DIFFICULTY, split: str = TRAIN_SPLIT):
        self.seed, self.split = seed, split
        self.mix, self.difficulty = dict(mix), difficulty
        self._items = generate_prompts(size, seed, mix, difficulty, split)

    def __len__(self) -> int:
        return len(self._items)

    def __getitem__(self, i):
        return self._items[i]
