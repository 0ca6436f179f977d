"""Procedural arithmetic: exact gold, true scratchpads, determinism, mixes, held-out splits."""
import random
import re
from collections import Counter

import pytest

from graftzoo.envs.arithmetic import (SKILLS, ArithmeticDataset, add_solution, final_answer,
                                      generate_prompts, is_correct, is_heldout, make_problem,
                                      mul_solution, multi_solution, skill_for_index, sub_solution)
from graftzoo.contract.types import Prompt


def safe_eval(expr: str) -> int:
    """Independent evaluator for + - * over non-negative integers (* binds tighter)."""
    assert re.fullmatch(r"\d+([+\-*]\d+)*", expr), expr
    tokens = re.findall(r"\d+|[+\-*]", expr)
    terms, sign, i = [], 1, 0
    while i < len(tokens):
        value = int(tokens[i])
        i += 1
        while i < len(tokens) and tokens[i] == "*":
            value *= int(tokens[i + 1])
            i += 2
        terms.append(sign * value)
        if i < len(tokens):
            sign = 1 if tokens[i] == "+" else -1
            i += 1
    return sum(terms)


def test_worked_examples():
    assert add_solution(347, 586) == "347+586=300+500+40+80+7+6=800+120+13=933"
    assert mul_solution(347, 6) == "347*6=300*6+40*6+7*6=1800+240+42=2082"
    assert mul_solution(307, 6) == "307*6=300*6+0*6+7*6=1800+0+42=1842"  # zeros kept
    assert sub_solution(586, 347) == "586-347=586-300-40-7=286-40-7=246-7=239"
    assert multi_solution(47, 6, [("+", 38), ("-", 25)]) == "47*6+38-25=282+38-25=320-25=295"
    assert add_solution(7, 6) == "7+6=13"
    with pytest.raises(ValueError, match="a >= b"):
        sub_solution(3, 5)


@pytest.mark.parametrize("skill", SKILLS)
@pytest.mark.parametrize("difficulty", [1, 2, 3, 4])
def test_gold_and_every_scratchpad_step_true(skill, difficulty):
    rng = random.Random(f"{skill}{difficulty}")
    for _ in range(200):
        p = make_problem(skill, difficulty, rng)
        assert p.answer == safe_eval(p.question) and p.answer >= 0
        steps = p.solution.split("=")
        assert steps[0] == p.question and steps[-1] == str(p.answer)
        assert p.solution.endswith(f"={p.answer}")
        assert all(safe_eval(s) == p.answer for s in steps), p.solution
        assert final_answer(p.solution) == str(p.answer) and is_correct(p.solution, p.answer)


def test_difficulty_sets_digits_and_steps():
    rng = random.Random(0)
    for d in (2, 3, 4):
        add = make_problem("add", d, rng)
        assert [len(x) for x in add.question.split("+")] == [d, d]
        a, b = make_problem("sub", d, rng).question.split("-")
        assert len(a) == len(b) == d and int(a) >= int(b)
        a, m = make_problem("mul", d, rng).question.split("*")
        assert len(a) == d and 2 <= int(m) <= 9
        assert len(re.findall(r"[+\-*]", make_problem("multi", d, rng).question)) == d
    lengths = [len(make_problem(s, 3, rng).solution) for s in ("add", "sub", "mul") for _ in range(100)]
    assert 30 <= min(lengths) and max(lengths) <= 50


def test_scratchpad_lengths_at_default_difficulty():
    ps = generate_prompts(300, 0, {"add": 1, "sub": 1, "mul": 1, "multi": 1}, 3)
    lengths = [len(p.metadata["solution"]) for p in ps]
    assert 25 <= min(lengths) and max(lengths) <= 50


def test_prompts_are_deterministic_and_sliceable():
    mix = {"add": 0.5, "mul": 0.5}
    a = generate_prompts(40, 7, mix, 3)
    assert a == generate_prompts(40, 7, mix, 3)
    assert a[10:25] == generate_prompts(15, 7, mix, 3, start=10)
    assert a != generate_prompts(40, 8, mix, 3)
    assert len({p.id for p in a}) == 40 and a[3].id == "arith-train-7-3"
    p = a[0]
    assert isinstance(p, Prompt) and p.source == "arithmetic" and p.gold == str(safe_eval(p.text))
    assert set(p.metadata) == {"skill", "difficulty", "solution"}


def test_mix_gives_exact_proportions():
    assert Counter(p.metadata["skill"] for p in generate_prompts(10, 0, {"add": 0.8, "mul": 0.2}, 2)) \
        == {"add": 8, "mul": 2}
    counts = Counter(skill_for_index(i, {"add": 1, "sub": 1, "mul": 1}) for i in range(100))
    assert sorted(counts.values()) == [33, 33, 34]
    for n in range(1, 60):  # every prefix within 1 of its quota
        c = Counter(skill_for_index(i, {"add": 0.45, "sub": 0.45, "multi": 0.1}) for i in range(n))
        assert abs(c["multi"] - 0.1 * n) < 1 and abs(c["add"] - 0.45 * n) < 1


def test_per_skill_difficulty_dict():
    ps = generate_prompts(20, 0, {"add": 1, "mul": 1}, {"add": 2, "mul": 4})
    for p in ps:
        want = 2 if p.metadata["skill"] == "add" else 4
        assert p.metadata["difficulty"] == want and len(re.split(r"[+*]", p.text)[0]) == want


def test_heldout_splits_never_meet_train():
    mix = {"add": 1, "mul": 1}
    train = {p.text for p in generate_prompts(3000, 0, mix, 2)}
    test = {p.text for p in generate_prompts(300, 0, mix, 2, split="test")}
    assert train and test and not train & test
    assert all(is_heldout(q) for q in test) and not any(is_heldout(q) for q in train)


def test_dataset_wraps_the_stream():
    ds = ArithmeticDataset(12, 3, {"sub": 1.0}, {"sub": 3}, split="eval")
    assert len(ds) == 12 and ds[5] == generate_prompts(12, 3, {"sub": 1.0}, {"sub": 3}, "eval")[5]
    assert all(p.metadata["skill"] == "sub" for p in ds)


def test_bad_input_is_named():
    with pytest.raises(ValueError, match="'div'"):
        make_problem("div", 2, random.Random(0))
    with pytest.raises(ValueError, match="'mull'"):
        generate_prompts(2, 0, {"mull": 1.0}, 2)
    with pytest.raises(ValueError, match="sum"):
        generate_prompts(2, 0, {"add": 0.0}, 2)
    with pytest.raises(ValueError, match="difficulty"):
        make_problem("add", 0, random.Random(0))
