"""Tests of the hardened verifier (graftzoo.envs.verifier, graftzoo.envs.extract)."""
import importlib.util
import json
import os
import random
import signal
import time
from importlib import resources
from types import MethodType
from pathlib import Path

import math_verify.grader
import pytest

from graftzoo.envs import verifier as V
from graftzoo.envs import verify_pool as P
from graftzoo.envs import verify_worker as W
from graftzoo.envs.verify_worker import two_stage_latex2sympy
from graftzoo.envs.extract import MAX_RESPONSE_CHARS, extract_answer


@pytest.fixture(autouse=True)
def _fresh_verdicts():
    V.clear_caches()
    yield


# ---------------------------------------------------------------- extraction


@pytest.mark.parametrize("response, expected", [
    ("So \\boxed{3} ... no wait, \\boxed{4}.", ("4", "ok")),  # the LAST box
    ("$\\boxed{\\frac{1}{\\sqrt{2}}}$", ("\\frac{1}{\\sqrt{2}}", "ok")),  # nested braces
    ("\\boxed{\\{1,2\\}}", ("\\{1,2\\}", "ok")),  # escaped braces do not count
    ("\\fbox{7}", ("7", "ok")),
    ("\\boxed\n{8}", ("8", "ok")),
    ("The answer is \\boxed 5$.", ("5", "ok")),
    ("\\boxed{(1,2)} wait \\boxed{\\left( 3, 4 \\right)}", ("\\left( 3, 4 \\right)", "ok")),
    ("Final Answer: The final answer is $\\frac{3}{4}$. I hope it is correct.", ("\\frac{3}{4}", "ok")),
    ("**Answer:** 42", ("42", "ok")),
    ("The answer is 3.5. Done", ("3.5", "ok")),
    ("347*6=300*6+40*6+7*6=1800+240+42=2082", ("2082", "ok")),  # scratchpad: the last number token
    ("So the total = 2082 apples.", ("2082", "ok")),
    ("I think 3 then maybe 41 hmm", ("41", "ok")),  # last number
    ("no idea", (None, "no_answer")),
    ("", (None, "no_answer")),
    ("\\boxed{5", (None, "unparsable")),  # truncated box
    ("\\boxed{}", (None, "unparsable")),
    ("answer: 5}{6", ("6", "ok")),  # a whole number token, never a fragment
])
def test_extraction(response, expected):
    assert extract_answer(response) == expected


@pytest.mark.parametrize("response", [
    "\\boxed{12 \\text{ or } 15}", "\\boxed{12 or 15}", "\\boxed{\\text{either } 3 \\text{ or } 4}",
    "The answer is either 3 or 4.", "$\\boxed{12}$ or $\\boxed{15}$", "\\boxed{A} or \\boxed{B}", "x = 3 or 4",
])
def test_alternatives_are_multiple_answers(response):
    extracted, status = extract_answer(response)
    assert status == "multiple_answers" and extracted
    assert V.verify(response, "12") == V.VerifyResult(False, extracted, "multiple_answers", reason="hedge")


def test_lists_are_not_alternatives():
    assert V.verify("\\boxed{1, 2}", "1,2") == V.VerifyResult(True, "1, 2", "ok")
    assert V.verify("\\boxed{(1,2)}", "(1, 2)").correct
    assert V.verify("\\boxed{2,1}", "1,2").correct  # a set of roots in another order
    for not_alternative in ("x \\lor y", "\\text{for all } x", "\\overline{OR}"):
        assert extract_answer(f"\\boxed{{{not_alternative}}}") == (not_alternative, "ok")
    assert not V.verify("\\boxed{1, 2}", "1").correct  # a list does not match one value


def test_limits():
    assert extract_answer("\\boxed{" + "1" * 1001 + "}") == (None, "unparsable")
    assert extract_answer("\\boxed{" + "{" * 60 + "1" + "}" * 60 + "}") == (None, "unparsable")
    # only the tail of a huge response is scanned: an early box is out of reach
    assert extract_answer("\\boxed{7} " + "a" * MAX_RESPONSE_CHARS)[1] == "no_answer"
    assert extract_answer("a" * (3 * MAX_RESPONSE_CHARS) + " \\boxed{7}") == ("7", "ok")


# ---------------------------------------------------------------- normalization and fast path


def test_normalize_answer():
    assert V.normalize_answer("$\\dfrac{1}{2}$") == "\\frac{1}{2}"
    assert V.normalize_answer("\\left( 3, \\frac{\\pi}{2} \\right)") == "(3,\\frac{\\pi}{2})"
    assert V.normalize_answer("10,\\!000.") == "10,000"
    assert V.normalize_answer("288 \\pi") == "288\\pi"  # the space before a command is not needed
    assert V.normalize_answer("\\pi r^2") == "\\pi r^2"  # ... but after one it is


def test_fast_path_never_calls_math_verify(monkeypatch):
    def no_pool(tasks, timeout):
        raise AssertionError("math-verify pool used on the fast path")
    monkeypatch.setattr(V, "run_tasks", no_pool)
    assert V.verify("\\boxed{2082}", "2082") == V.VerifyResult(True, "2082", "ok")
    assert V.verify("\\boxed{2083}", "2082") == V.VerifyResult(False, "2083", "ok")
    assert V.verify("\\boxed{12.50}", "12.5").correct
    assert V.verify("\\boxed{12.0}", "12").correct
    assert V.verify("\\boxed{\\dfrac{1}{2}}", "\\frac{1}{2}").correct
    assert V.verify("\\boxed{\\text{(C)}}", "\\text{(C)}").correct
    assert V.verify("\\boxed{0.5}", "\\frac12").correct
    assert not V.verify("\\boxed{\\frac{11}{2}}", "\\frac{21}{2}").correct
    assert V.verify("\\boxed{\\left( 15, -\\frac{58}{2} \\right)}", "(15,-29)").correct
    assert not V.verify("\\boxed{(15,-39)}", "(15,-29)").correct
    assert not V.verify("\\boxed{(9, \\infty)}", "(5,\\infty)").correct
    assert V.answers_equivalent("3", "4") is False


def _bench():
    """bench/verifier.py as a module (its ``workload`` makes RL-shaped response/gold pairs)."""
    spec = importlib.util.spec_from_file_location("bench_verifier", Path(__file__).resolve().parents[1] / "bench" / "verifier.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _math500_golds():
    with resources.files("graftzoo.envs").joinpath("data/math500.jsonl").open() as f:
        return [json.loads(line)["answer"] for line in f]


def _numeric_pairs(rng, n):
    """(pred, gold) pairs of plain numbers in the forms the fast path reads, near and far apart."""
    def form(num, den):
        sign = "-" if num < 0 else ""
        a, b = abs(num), den
        return rng.choice([f"{sign}\\frac{{{a}}}{{{b}}}", f"{sign}\\dfrac{{{a}}}{{{b}}}", f"\\frac{{{num}}}{{{b}}}",
                           f"{sign}{a}/{b}", f"{sign}\\frac{a % 10}{{{b}}}", f"{sign}\\frac{{{a}}}{b % 10 or 1}",
                           f"{num / den:.{rng.choice([1, 2, 3, 6])}f}", str(num // den) if num % den == 0 else f"{num}/{den}"])
    out = []
    for _ in range(n):
        num, den = rng.randint(-40, 40), rng.randint(1, 12)
        other = rng.choice([(num, den), (num * 2, den * 2), (num + rng.choice([-1, 1]), den), (-num, den),
                            (num * 1000 + 1, den * 1000)])
        pred, gold = form(*other), form(num, den)
        if rng.random() < 0.2:  # a tuple or interval of two
            extra = form(rng.randint(-9, 9), 1)
            pred, gold = f"({pred},{extra})", rng.choice([f"({gold},{extra})", f"[{gold},{extra})"])
        out.append((pred, gold))
    return out + [("0.333333", "\\frac13"), ("0.3333", "\\frac13"), ("0.33", "\\frac{1}{3}"), ("3.1416", "3.14159"),
                  ("0.5", "50"), ("50", "0.5"), ("1000000.5", "1000000.4"), ("123456789.5", "123456789.4"),
                  ("0.0000001", "0"), ("0.00001", "0"), ("1.0000001", "1"), ("\\frac9{19}", "9/19"),
                  ("\\frac{12}3", "4"), ("-.5", "-\\frac12"), ("(1.5,2)", "(1.6,2)"), ("[1.5,2)", "(1.5,2)"),
                  ("(\\infty,1.5)", "(\\infty,1.6)"), ("2.50", "2.5"), ("2.", "2")]


def test_fast_path_agrees_with_math_verify():
    """Every verdict the fast path gives on two different strings is math-verify's (LaTeX path, as
    the workers run it; this process has no quick paths installed): RL-shaped pairs from the bench
    workload, and numbers of every form the fast path reads, near and far apart."""
    assert not hasattr(math_verify.grader.sympy_symbolic_eq, "original")
    rng = random.Random(7)
    pairs = [(extract_answer(r)[0], g) for step in _bench().workload(_math500_golds(), 64, 8, 2, seed=3)
             for r, g in step]
    pairs = [p for p in pairs if p[0] is not None] + _numeric_pairs(rng, 400)
    decided = disagree = 0
    for pred, gold in dict.fromkeys(pairs):
        a, b = V.normalize_answer(pred), V.normalize_answer(gold)
        fast = V._fast_verdict(a, b)
        if fast is None or a == b:
            continue
        decided += 1
        status, verdict = W._evaluate("verify", gold, pred)[:2]
        if (status, verdict) != ("ok", fast):
            disagree += 1
            print(f"fast path {fast}, math-verify {status} {verdict}: {pred!r} vs gold {gold!r}")
    assert disagree == 0
    assert decided > 300, decided  # the comparison covered the fast path


QUICK_EQ_CASES = [  # (pred, gold) where simplify decides, with identities, floats, symbols, sets
    ("\\sqrt{x^2}", "x"), ("|x|", "x"), ("\\sin^2x+\\cos^2x", "1"), ("e^{i\\pi}", "-1"), ("0.1+0.2", "0.3"),
    ("\\frac{1}{3}", "0.333333"), ("x^2-1", "(x-1)(x+1)"), ("(x-1)(x+1)", "x^2+1"), ("2^{10}", "1024"),
    ("\\sqrt{8}", "2\\sqrt{2}"), ("\\sqrt{8}", "3\\sqrt{2}"), ("\\log_2 8", "3"), ("\\pi", "3.14159"),
    ("\\pi", "3.1416"), ("1.5x", "\\frac{3}{2}x"), ("0.5x+0.5x", "x"), ("x^{0.5}", "\\sqrt{x}"),
    ("\\frac{x^2-1}{x-1}", "x+1"), ("\\tan x", "\\frac{\\sin x}{\\cos x}"), ("2x", "x+x"), ("3x", "3y"),
    ("\\sqrt{2}\\sqrt{3}", "\\sqrt{6}"), ("\\binom{5}{2}", "10"), ("5!", "120"), ("\\sqrt{-4}", "2i"),
    ("(1+i)^2", "2i"), ("(1+i)^2", "2"), ("10^{-3}", "0.001"), ("\\frac{\\sqrt{3}}{2}", "\\sin 60^\\circ"),
    ("\\sqrt{2}", "1.41421356"), ("x+1", "x+1.0000001"), ("x+1", "x+1.1"), ("x=2", "y=2"), ("y=2x+3", "2x-y+3=0"),
    ("y=2x+3", "y=2x+4"), ("\\{1,2\\}", "\\{2,1\\}"), ("\\{1,\\sqrt{2}\\}", "\\{1,\\sqrt{3}\\}"),
    ("(1,2)", "(1,2.0000001)"), ("\\begin{pmatrix}1\\\\2\\end{pmatrix}", "\\begin{pmatrix}1\\\\3\\end{pmatrix}"),
    ("\\cot x", "383"), ("\\frac{a}{b}", "a/b"), ("\\frac{1}{\\sqrt{2}}", "\\frac{\\sqrt{2}}{2}"),
    ("\\frac{1}{\\sqrt{2}}", "\\frac{\\sqrt{3}}{2}"), ("1e-20", "0"), ("\\sqrt{10^{-40}}", "0"),
    ("x^2+2x+1", "(x+1)^2"), ("x^2+2x+2", "(x+1)^2"), ("0.3x", "0.1x+0.2x"), ("n(n+1)/2", "\\frac{n^2+n}{2}"),
    ("\\frac{\\pi}{2}", "90^\\circ"), ("2\\pi r", "\\pi d"), ("\\ln(e^2)", "2"), ("\\infty", "-\\infty"),
    # not polynomials: decided at one point (``_nonzero_somewhere``) when the value there is clearly not 0
    ("\\sin 2x", "2\\sin x\\cos x"), ("\\sin 2x", "2\\sin x"), ("\\log(xy)", "\\log x+\\log y"),
    ("e^{x+1}", "e\\cdot e^x"), ("e^{x+1}", "e^x+1"), ("\\sqrt{x}", "x^{1/2}"), ("\\frac{1}{x}", "x^{-1}"),
    ("\\sin x", "\\cos x"), ("\\sqrt{x^2+1}", "x+1"), ("\\frac{\\sin x}{x}", "1"), ("2^x", "x^2"),
    ("\\cot x", "\\tan x"), ("\\cot x", "\\frac{1}{\\tan x}"), ("|x-1|", "x-1"), ("\\lfloor x\\rfloor", "x"),
    ("\\sqrt{x}\\sqrt{y}", "\\sqrt{xy}"), ("\\frac{x}{y}", "\\frac{y}{x}"), ("x^y", "y^x"), ("\\sqrt{2x}", "x\\sqrt{2}"),
    ("\\frac{1}{\\sqrt{x}}", "\\frac{\\sqrt{x}}{x}"), ("\\tan^2x+1", "\\sec^2x"), ("\\cos^2x", "1-\\sin^2x"),
    ("\\ln(e^x)", "x"), ("e^{\\ln x}", "x"), ("\\arcsin(\\sin x)", "x"), ("\\frac{x^2-4}{x-2}", "x+2"),
    ("\\sqrt[3]{x^3}", "x"), ("x!", "\\Gamma(x+1)"), ("\\binom{n}{2}", "\\frac{n(n-1)}{2}"), ("2^{n+1}", "2\\cdot 2^n"),
    ("10^{-30}x", "0"), ("\\sin(x)-\\sin(x+10^{-20})", "0"), ("\\sin(x+2\\pi)", "\\sin x"), ("\\frac{x+1}{2}", "0.5x+0.5"),
]


def test_quick_symbolic_eq_agrees_with_math_verify(monkeypatch):
    """The workers' shortcut for math-verify's last test (``quick_symbolic_eq``: no simplify when
    ``a - b`` is provably nonzero) never changes a verdict: compared with math-verify as shipped on
    the pairs of the bench workload that reach the workers and on identities, floats and symbols."""
    original = math_verify.grader.sympy_symbolic_eq
    assert not hasattr(original, "original")
    pairs = []
    for step in _bench().workload(_math500_golds(), 64, 8, 2, seed=5):
        for response, gold in step:
            pred, status = extract_answer(response)
            if status == "ok" and V._fast_verdict(V.normalize_answer(pred), V.normalize_answer(gold)) is None:
                pairs.append((pred, gold))
    pairs = list(dict.fromkeys(pairs)) + QUICK_EQ_CASES
    shortcuts, at_a_point = [], []
    quick = W.quick_symbolic_eq(original)

    def counting(a, b):
        try:
            if W._surely_nonzero(a - b):
                shortcuts.append((a, b))
                if (a - b).free_symbols and not (a - b).is_polynomial():
                    at_a_point.append((a, b))
        except Exception:
            pass
        return quick(a, b)

    def verdict(pred, gold):
        W.forget()
        return W._evaluate("verify", gold, pred)[:2]

    expected = [verdict(p, g) for p, g in pairs]
    monkeypatch.setattr(math_verify.grader, "sympy_symbolic_eq", counting)
    got = [verdict(p, g) for p, g in pairs]
    wrong = [(p, g, e, q) for (p, g), e, q in zip(pairs, expected, got) if e != q]
    assert not wrong, wrong
    assert len(shortcuts) > 40, len(shortcuts)  # the comparison covered the shortcut
    assert len(at_a_point) > 10, at_a_point  # and its test at one point
    assert sum(v == ("ok", True) for v in got) > 10


RELATION_CASES = [  # (gold, pred): one gold relation against several answers, as in a group
    ("y=2x+3", "y=2x+1"), ("y=2x+3", "2x+3=y"), ("y=2x+3", "y-2x=3"), ("y=2x+3", "x=2y+3"),
    ("5x-7y+11z+4=0", "5x-7y+z+4=0"), ("5x-7y+11z+4=0", "-5x+7y-11z-4=0"), ("x^2=1", "(x^2-1)^2=0"),
    ("x^2=1", "x=1"), ("x<3", "3>x"), ("x<3", "x\\le 3"), ("x\\ge 2", "2\\le x"),
]


def test_remembered_solve_changes_no_verdict(monkeypatch):
    """The workers' memo of sympy ``solve`` (``remembered_solve``) gives the verdicts math-verify
    gives without it, and a gold relation compared with several answers is solved once."""
    original = math_verify.grader.solve
    assert not hasattr(original, "original")

    def verdicts():
        W.forget()
        return [W._evaluate("verify", g, p)[:2] for g, p in RELATION_CASES]

    expected = verdicts()
    calls = []

    def counting(expr, symbols, *args, **kwargs):
        calls.append(expr)
        return original(expr, symbols, *args, **kwargs)

    monkeypatch.setattr(math_verify.grader, "solve", W.remembered_solve(counting))
    assert verdicts() == expected
    assert ("ok", True) in expected and ("ok", False) in expected
    gold = math_verify.parse("$y=2x+3$")[0]
    assert 0 < calls.count(gold) <= 1, calls  # solved once for its several answers


SET_CASES = [  # (pred, gold) where math-verify compares sets: radicals, near and far numbers, intervals
    ("\\{1\\pm\\sqrt{5},-2\\}", "\\{1\\pm\\sqrt{6},-2\\}"), ("\\{1\\pm\\sqrt{5},-2\\}", "\\{-2,1\\pm\\sqrt{5}\\}"),
    ("1\\pm\\sqrt{19}", "1\\pm\\sqrt{99}"), ("\\{1,2\\}", "\\{2,1\\}"), ("\\{\\frac{1}{2},1\\}", "\\{0.5,1\\}"),
    ("\\{\\frac{\\sqrt{2}}{2},1\\}", "\\{\\frac{1}{\\sqrt{2}},1\\}"), ("\\{1,2,3\\}", "\\{1,2\\}"),
    ("\\{1,2\\}", "\\{1,2.0000001\\}"), ("\\{1,2\\}", "\\{1,2.001\\}"), ("\\{0.333333,1\\}", "\\{\\frac{1}{3},1\\}"),
    ("\\{0.33333,1\\}", "\\{\\frac{1}{3},1\\}"), ("\\{1+i,1-i\\}", "\\{1-i,1+i\\}"), ("\\{1+i,1-i\\}", "\\{1+2i,1-i\\}"),
    ("\\{x,1\\}", "\\{1,x\\}"), ("\\{x,1\\}", "\\{2,x\\}"), ("346", "(-1,6)"), ("3", "(-1,6)"), ("0,1", "(0,1)"),
    ("\\{0,1\\}", "[0,1]"), ("\\{0,1\\}", "(-\\infty,0)\\cup(1,\\infty)"), ("5", "(-\\infty,5)\\cup(5,\\infty)"),
    ("(1,2)", "(1,2)"), ("(1,2)", "(2,1)"), ("(1,2)", "\\{1,2\\}"), ("\\{3,5,7\\}", "3,5,7"), ("\\{3,4,7\\}", "3,5,7"),
    ("\\{\\pi,e\\}", "\\{3.14159,2.71828\\}"), ("\\{\\sqrt{2},\\sqrt{3}\\}", "\\{\\sqrt{3},\\sqrt{2}\\}"),
]


def _shortcut_keeps_verdicts(monkeypatch, grader_fn: str, wrap, proof: str, pairs: list) -> tuple[list, list]:
    """Verdicts of ``("verify", gold, pred)`` for ``pairs`` with math-verify as shipped, then with its
    ``grader_fn`` replaced by ``wrap(original)``: they must be the same. Returns the verdicts and, per call
    of the worker's ``proof`` (the test that lets the shortcut skip the original's slow step), its answer."""
    original = getattr(math_verify.grader, grader_fn)
    assert not hasattr(original, "original")

    def verdicts():
        W.forget()
        return [W._evaluate("verify", g, p)[:2] for g, p in pairs]

    expected = verdicts()
    taken, real = [], getattr(W, proof)

    def counting(a, b):
        taken.append(real(a, b))
        return taken[-1]

    monkeypatch.setattr(W, proof, counting)
    monkeypatch.setattr(math_verify.grader, grader_fn, wrap(original))
    got = verdicts()
    wrong = [(g, p, e, q) for (g, p), e, q in zip(pairs, expected, got) if e != q]
    assert not wrong, wrong
    assert ("ok", True) in expected and ("ok", False) in expected
    return expected, taken


def test_quick_compare_sets_agrees_with_math_verify(monkeypatch):
    """The workers' shortcut in math-verify's set comparison (``quick_compare_sets``: no symmetric
    difference when the sets provably differ) never changes a verdict, it is taken, and sympy's
    ``Set.symmetric_difference`` is itself again afterwards."""
    from sympy import Set
    method = Set.symmetric_difference
    _, taken = _shortcut_keeps_verdicts(monkeypatch, "sympy_compare_sets", W.quick_compare_sets,
                                        "_sets_surely_differ", [(g, p) for p, g in SET_CASES])
    assert sum(taken) >= 10 and not all(taken), taken  # the shortcut was taken, and not everywhere
    assert Set.symmetric_difference is method


LINE_CASES = [  # (gold, pred) relations: lines and planes, multiples, other symbols, non-linear ones
    ("y=2x+3", "y=2x+1"), ("y=2x+3", "2y=4x+6"), ("y=2x+3", "y-2x=3"), ("y=2x+3", "x=2y+3"), ("y=2x+3", "y=2x+3.0001"),
    ("5x-7y+11z+4=0", "5x-7y+z+4=0"), ("5x-7y+11z+4=0", "-10x+14y-22z-8=0"), ("5x-7y+11z+4=0", "5x-7y+11z=-4"),
    ("x+y=1", "x+z=1"), ("x+y=1", "y+x=1"), ("x=5", "x=2"), ("x=5", "5=x"), ("y=x_1", "y=X_1"), ("y=\\frac{x}{3}", "3y=x"),
    ("x^2=1", "x=1"), ("x^2+y^2=1", "y^2+x^2=1"), ("x<3", "3>x"), ("a+b=c", "c-a=b"), ("a+b=c", "c-a=2b"),
]


def test_quick_solve_and_compare_agrees_with_math_verify(monkeypatch):
    """The workers' shortcut for math-verify's solve-and-compare of two relations
    (``quick_solve_and_compare``: no ``solve`` for two linear equations whose solutions provably
    differ) never changes a verdict, and it is taken."""
    _, taken = _shortcut_keeps_verdicts(monkeypatch, "sympy_solve_and_compare", W.quick_solve_and_compare,
                                        "_lines_surely_differ", LINE_CASES)
    assert sum(taken) >= 5 and not all(taken), taken


def test_an_answer_in_a_box_and_in_prose_is_compared_once(monkeypatch):
    """The workers' memo of comparisons (``_compare``): the same answer read in a box and in a
    sentence is compared with its gold once; a different answer, gold or option is compared anew."""
    calls = []
    real = math_verify.verify

    def counting(gold, pred, **kwargs):
        calls.append(pred[-1])
        return real(gold, pred, **kwargs)

    monkeypatch.setattr(math_verify, "verify", counting)
    W.forget()
    assert W._evaluate("verify", "\\frac{1}{2}", "\\frac{1}{2}")[:2] == ("ok", True)
    assert W._evaluate("text", "\\frac{1}{2}", "So the answer is $\\frac{1}{2}$.")[:2] == ("ok", True)
    assert len(calls) == 1, calls
    assert W._evaluate("text", "\\frac{1}{3}", "So the answer is $\\frac{1}{2}$.")[:2] == ("ok", False)
    assert W._evaluate("verify", "\\frac{1}{2}", "\\frac{1}{2}", (("float_rounding", 2),))[:2] == ("ok", True)
    assert len(calls) == 3, calls


def test_schedule_claims_relations_first():
    """A pool run hands out the costliest golds first (a relation, then long answers; prose last),
    so a slow comparison does not start at the end of the run."""
    tasks = [("text", "3", "The answer is $3$.", ()), ("verify", "3", "4", ()),
             ("verify", "\\frac{1+\\sqrt{5}}{2}", "\\frac{1+\\sqrt{6}}{2}", ()), ("verify", "y=2x+3", "y=2x+1", ())]
    queue = P._Schedule(tasks)
    order = [queue.take(0) for _ in range(len(tasks))]
    assert order[:2] == [3, 2], order
    assert set(order[2:]) == {0, 1}


# ---------------------------------------------------------------- equivalence (math-verify)


@pytest.mark.parametrize("pred, gold, correct", [
    ("0.5", "\\frac{1}{2}", True),
    ("\\sqrt{2}/2", "\\frac{\\sqrt2}{2}", True),
    ("10^\\circ", "10", True),
    ("(1,2]", "(1,2]", True),
    ("[1,2]", "(1,2]", False),
    ("\\begin{pmatrix}1\\\\2\\end{pmatrix}", "\\begin{pmatrix} 1 \\\\ 2 \\end{pmatrix}", True),
    ("\\begin{pmatrix}1\\\\3\\end{pmatrix}", "\\begin{pmatrix} 1 \\\\ 2 \\end{pmatrix}", False),
    ("(3, \\pi/2)", "\\left( 3, \\frac{\\pi}{2} \\right)", True),
    ("x^2+1", "1+x^{2}", True),
    ("50\\%", "50", True),
    ("C", "\\text{(C)}", True),
    ("0.34", "\\dfrac{17}{50}", True),
    ("\\frac{2}{3}", "\\frac{1}{2}", False),
    ("12.5", "12", False),
])
def test_equivalence(pred, gold, correct):
    assert V.verify(f"Thus $\\boxed{{{pred}}}$.", gold) == V.VerifyResult(correct, pred, "ok")


NUMBER_TEXTS = ["0", "00", "007", "123", "1,000", "1,000,000.25", "3.14159", "0.5", ".5", "00.5", "3.", "1.50",
                "2.500000000000000000001", "1" * 100, "1" * 101, "9" * 50 + ".5", "9" * 51 + ".5", "1e5", "1E5",
                "\u0661\u0662", "\u00b2", "12.3.4", "-5", "+5", "0.000001", "nan", "inf", "5j", "1_000", " 5", "5 ",
                "0x1F", "12,34.5", ",5", "5,"]


def test_plain_number_matches_sympy_number():
    """The workers build plain numbers directly; what they build is exactly (type, value and
    precision) what latex2sympy's ``parse_number`` builds through sympy's string parser."""
    from latex2sympy2_extended.latex2sympy2 import _Latex2Sympy
    from sympy import srepr
    fast = two_stage_latex2sympy().parser_class()

    def outcome(parser, text):
        try:
            return srepr(parser.parse_number(text))
        except Exception as e:
            return f"error: {type(e).__name__}"

    rng = random.Random(3)
    texts = NUMBER_TEXTS + ["".join(rng.choice("0123456789.,") for _ in range(rng.randint(1, 12))) for _ in range(300)]
    pairs = [(outcome(_Latex2Sympy(), t), outcome(fast, t)) for t in texts]
    assert [x for x, _ in pairs] == [y for _, y in pairs]
    assert sum(W.plain_number(t) is not None for t in texts) > 100  # the comparison covered the fast path


def test_number_from_string_matches_sympy_number():
    """math-verify's expression path (numbers read in prose) calls ``sympy.Number(text)``; the
    workers' drop-in builds exactly the same object (type, value and precision)."""
    from sympy import Number, srepr

    def outcome(make, text):
        try:
            return srepr(make(text)), getattr(make(text), "_prec", None)
        except Exception as e:
            return f"error: {type(e).__name__}"

    rng = random.Random(4)
    texts = NUMBER_TEXTS + ["".join(rng.choice("0123456789.,") for _ in range(rng.randint(1, 40))) for _ in range(300)]
    texts += [str(rng.randint(1, 10 ** rng.randint(1, 30))) + rng.choice(["", "." + str(rng.randint(0, 10 ** 20))])
              for _ in range(300)]
    assert [outcome(Number, t) for t in texts] == [outcome(W.number_from_string, t) for t in texts]
    assert sum(W._NUMBER_LITERAL.fullmatch(t) is not None for t in texts) > 300  # the comparison covered the fast path


def test_parse_caches_change_no_parse():
    """The bigger LaTeX parse cache and the number drop-in leave math-verify's reading of prose as it is."""
    import math_verify.parser as P
    from math_verify import parse
    texts = ["The answer is $\\frac{1}{2}$.", "So the total is 7,425,000 dollars.", "#### 1,000", "x = 3", "0.50",
             "It costs 12.5 dollars", "First, 97 \\cdot 9 = 829.\nThen we continue", "$x^2+1$ and then $3$"]
    before = [str(parse(t)) for t in texts]
    cached, number = P.parse_latex_cached, P.Number
    try:
        W._install_parse_caches()
        assert P.parse_latex_cached.cache_info().maxsize == W.LATEX_PARSE_CACHE_SIZE
        assert [str(parse(t)) for t in texts] == before
        assert [str(parse(t)) for t in texts] == before  # from the cache
    finally:
        P.parse_latex_cached, P.Number = cached, number


def _math500_answers_and_powers() -> list[str]:
    """MATH500's answers, powers of letters in many contexts (where SLL fails and LL predicts with
    full context), malformed inputs and numbers."""
    with resources.files("graftzoo.envs").joinpath("data/math500.jsonl").open() as f:
        answers = [json.loads(line)["answer"] for line in f]
    answers += ["\\frac{", "(1,2", "x^{2", "\\sqrt[3]{8}", "\\{1,2\\}", "1,234", "\\begin{pmatrix}1&2\\\\3&4\\end{pmatrix}"]
    answers += [f"x^{i}+{i + 1}x^2-y^{{{i + 2}}}" for i in range(12)] + [
        "3R^2", "x^3+3x-5", "(x^2,y^3]", "\\{x^2,y^2\\}", "f(x)=x^2", "x^2=y^2", "x^2<4", "\\sqrt{x^2+y^2}",
        "\\frac{x^2}{y^3}", "(x^2)^3", "x^2y^3", "x_1^2+x_2^2", "x^2_1", "a^b^c", "x^", "x^+1", "e^{x^2}",
        "\\sin^2x", "x^{2}^{3}", "2^x", "x^2,3", "x^2;y^2", "\\begin{pmatrix}x^2\\\\y^3\\end{pmatrix}",
        "x^2\\cdot y^2", "-x^2", "x^{-2}", "x^{1/2}", "x^\\circ", "x^2\\%", "|x^2|", "x^2!",
        "[x^2,\\frac{2}{0}]"] + NUMBER_TEXTS
    answers += CONVERSION_ERRORS
    return answers


CONVERSION_ERRORS = ["(\\frac{3}{5},\\frac{8}{0}]", "(1,\\frac{1}{0})", "(i,2]"]  # SLL parses them; sympy refuses


def test_two_stage_parser_matches_latex2sympy():
    """The SLL-first parser used in the workers (with its remembered full-context predictions and
    plain numbers) returns exactly what latex2sympy returns, and fails where it fails."""
    from latex2sympy2_extended.latex2sympy2 import latex2sympy
    from sympy import srepr
    answers = _math500_answers_and_powers()
    two_stage = two_stage_latex2sympy()

    def outcome(fn, latex):
        try:
            return srepr(fn(latex, is_real=True, convert_degrees=False, normalization_config=None))
        except Exception as e:  # syntax errors must stay errors
            return f"error: {type(e).__name__}"

    pairs = [(outcome(latex2sympy, a), outcome(two_stage, a)) for a in answers]
    assert [x for x, _ in pairs] == [y for _, y in pairs]
    assert [y for _, y in pairs] == [outcome(two_stage, a) for a in answers]  # again, from the memo
    assert sum(x.startswith("error") for x, _ in pairs) >= 5 + len(CONVERSION_ERRORS)  # the malformed inputs above


def test_a_plain_number_is_built_without_parsing(monkeypatch):
    """A LaTeX string that is one plain number (integer or decimal literal, no leading zero) gets
    from the workers' parser exactly what latex2sympy builds for it, without an ANTLR parse; every
    other string near it (a leading zero, a sign, a comma, an exponent, other digits) is parsed."""
    from latex2sympy2_extended.latex2sympy2 import latex2sympy
    from sympy import srepr
    rng = random.Random(11)
    digits = lambda n: str(rng.randint(1, 9)) + "".join(rng.choice("0123456789") for _ in range(n - 1))
    numbers = ["0", "0.5", "0.000001", "10.00", "8000.0", "3.14159265358979323846264338327950288"]
    numbers += [digits(rng.randint(1, 100)) for _ in range(40)]
    numbers += [f"{digits(rng.randint(1, 50))}.{digits(rng.randint(1, 50))[::-1]}" for _ in range(40)]
    others = ["01", "1.", ".5", "1,000", "-3", "+3", "1e5", "1.5.2", "2^{10}", "\\frac{1}{2}", "\u0661\u0662", "３"]
    two_stage = two_stage_latex2sympy()
    parsers = []
    create = two_stage.parser_class.create_parser
    monkeypatch.setattr(two_stage.parser_class, "create_parser", lambda self, s: parsers.append(s) or create(self, s))

    def outcome(fn, latex, is_real):
        try:
            return srepr(fn(latex, is_real=is_real, convert_degrees=False, normalization_config=None))
        except Exception as e:
            return f"error: {type(e).__name__}"

    for is_real in (True, False):
        for latex in numbers + others:
            parsers.clear()
            assert outcome(two_stage, latex, is_real) == outcome(latex2sympy, latex, is_real), latex
            assert bool(parsers) == (latex in others), latex


def test_two_stage_parser_retries_only_syntax_errors(monkeypatch):
    """The LL stage runs only after an SLL syntax error: an error in converting a complete tree is
    raised after one parse (LL would build the same tree)."""
    two_stage = two_stage_latex2sympy()
    parsers = []
    create = two_stage.parser_class.create_parser
    monkeypatch.setattr(two_stage.parser_class, "create_parser", lambda self, s: parsers.append(s) or create(self, s))

    def count(latex):
        parsers.clear()
        try:
            two_stage(latex, is_real=True)
        except Exception:
            pass
        return len(parsers)

    assert [count(a) for a in CONVERSION_ERRORS] == [1] * len(CONVERSION_ERRORS)
    assert count("\\frac{") == 2 and count("x^3+3x-5") == 2 and count("\\frac{2}{3}") == 1


def test_full_context_memo_is_used_and_matches(monkeypatch):
    """The LL stage's remembered full-context predictions: the same parse trees as ANTLR's own
    prediction, and most predictions of a second pass come from the memo."""
    from antlr4.atn.ParserATNSimulator import ParserATNSimulator
    from latex2sympy2_extended.latex2sympy2 import _Latex2Sympy
    answers = [a for a in _math500_answers_and_powers() if "^" in a]

    def trees(memo):
        out = []
        for a in answers:
            parser = _Latex2Sympy().create_parser(a)  # plain LL parser
            if memo is not None:
                parser._interp.execATNWithFullContext = MethodType(memo, parser._interp)
            try:
                out.append(parser.math().toStringTree(recog=parser))
            except Exception as e:
                out.append(f"error: {type(e).__name__}")
        return out

    calls = []
    original = ParserATNSimulator.execATNWithFullContext
    monkeypatch.setattr(ParserATNSimulator, "execATNWithFullContext",
                        lambda *a: calls.append(1) or original(*a))
    expected = trees(None)
    memo = W.remembered_full_context({})
    calls.clear()
    assert trees(memo) == expected
    first = len(calls)
    calls.clear()
    assert trees(memo) == expected
    assert first > 50 and len(calls) == 0, (first, len(calls))


def test_answers_equivalent():
    assert V.answers_equivalent("\\frac{1}{2}", "0.5") is True
    assert V.answers_equivalent("0.5", "\\frac{1}{2}") is True
    assert V.answers_equivalent("x=5", "5") is True  # symmetric even where math-verify is not
    assert V.answers_equivalent("\\frac{1}{3}", "0.5") is False
    assert V.answers_equivalent("1" * 1001, "1") is None
    assert V.answers_equivalent("5}{6", "5") is None
    assert V.answers_equivalent("9^{9^{9^9}}", "12") is None  # timeout


def test_unparsable_answer():
    assert V.verify("\\boxed{\\frac{}{}}", "12") == V.VerifyResult(False, "\\frac{}{}", "unparsable")


def test_verify_batch_dedupes_and_caches(sent):
    answers = ["\\sqrt{2}/2", "\\frac{\\sqrt{2}}{2}", "\\dfrac{\\sqrt2}{2}", "\\sqrt{2}/2", "\\sqrt{3}", "\\sqrt{2}/2",
               "1", "\\sqrt{3}"]
    responses = [f"Hence \\boxed{{{a}}}." for a in answers]
    gold = "\\frac{\\sqrt{2}}{2}"
    out = V.verify_batch(responses, [gold] * 8)
    assert [r.correct for r in out] == [True, True, True, True, False, True, False, False]
    assert [r.extracted for r in out] == answers
    # the gold itself is exact; each other distinct normalized answer goes to math-verify once
    assert sorted(t[2] for t in sent) == sorted(["\\sqrt{2}/2", "\\frac{\\sqrt2}{2}", "\\sqrt{3}", "1"])
    sent.clear()
    assert V.verify_batch(responses, [gold] * 8) == out
    assert sent == []  # all verdicts cached


def test_bad_input_is_named():
    with pytest.raises(ValueError, match="3 responses but 2 golds"):
        V.verify_batch(["a", "b", "c"], ["1", "2"])
    with pytest.raises(TypeError, match=r"golds\[1\]"):
        V.verify_batch(["a", "b"], ["1", None])
    with pytest.raises(TypeError, match=r"responses\[0\] must be str"):
        V.verify(None, "1")
    with pytest.raises(TypeError, match="response must be str"):
        extract_answer(b"\\boxed{1}")
    with pytest.raises(ValueError, match="timeout"):
        V.verify("\\boxed{1}", "1", timeout=0)


# ---------------------------------------------------------------- adversarial set and pool robustness


def _start_pool():
    """A query that needs math-verify, so the pool is started and its workers are ready."""
    assert V.verify("\\boxed{\\sqrt{3}}", "\\sqrt{2}").status == "ok"


def _injections(sentinel):
    return [
        f"__import__('os').system('touch {sentinel}')",
        f"open('{sentinel}', 'w').write('x')",
        f"eval(\"open('{sentinel}', 'w')\")",
        f"exec(\"open('{sentinel}', 'w')\")",
        "().__class__.__bases__[0].__subclasses__()",
        f"Symbol('x').__class__.__init__.__globals__['__builtins__']['open']('{sentinel}', 'w')",
    ]


def _adversarial(sentinel):
    inj = _injections(sentinel)
    return (
        ["\\boxed{9^{9^{9^9}}}", "\\boxed{9^{9^9}}", "\\boxed{10^{10^{10}}-1}", "\\boxed{(10^{10^7})!}",
         "\\boxed{100000!}", "\\boxed{" + "{" * 5000 + "}" * 5000 + "}", "\\boxed{" + "{" * 5000,
         "7" * 50_000, "x=" * 25_000, "\\frac{" * 10_000, "$" * 50_000, "answer: " * 6_000,
         "\\boxed{\\frac{1}{0}}", "\\boxed{0^0}", "\\boxed{\\frac{0}{0}}",
         "\\boxed{" + "\\sqrt{" * 40 + "2" + "}" * 40 + "}", "\\boxed{" + "+".join(["x"] * 300) + "}",
         "\\boxed{A or B}", "\\boxed{12} or \\boxed{13}", "\\boxed{\\infty}", "\\boxed{\\text{" + "a" * 900 + "}}",
         "\\boxed{\\begin{pmatrix}" + "1&" * 400 + "1\\end{pmatrix}}"]
        + inj + [f"\\boxed{{{s}}}" for s in inj] + [f"The answer is {s}" for s in inj] + [f"x = {s}" for s in inj]
    )


def test_adversarial_set_gets_a_verdict_within_2s(tmp_path):
    sentinel = tmp_path / "SENTINEL"
    _start_pool()  # outside the timed cases
    for case in _adversarial(sentinel):
        t0 = time.monotonic()
        result = V.verify(case, "12", timeout=1.0)
        elapsed = time.monotonic() - t0
        assert result.status in V.STATUSES and result.correct is False, case[:80]
        assert elapsed < 2.0, f"{elapsed:.2f}s for {case[:80]!r}"
    for s in _injections(sentinel):  # as gold and as clustered answers too
        V.verify(f"\\boxed{{{s}}}", s)
        V.answers_equivalent(s, "1")
    assert not sentinel.exists()
    assert V.verify("\\boxed{\\frac{6}{8}}", "0.75") == V.VerifyResult(True, "\\frac{6}{8}", "ok")


def test_timeout_then_normal_query():
    r = V.verify("\\boxed{9^{9^{9^9}}}", "12", timeout=0.5)
    assert r == V.VerifyResult(False, "9^{9^{9^9}}", "timeout", reason="timeout")
    assert V.verify("\\boxed{\\sqrt{8}}", "2\\sqrt{2}", timeout=0.5) == V.VerifyResult(True, "\\sqrt{8}", "ok")


def test_hard_kill_replaces_a_hung_worker(monkeypatch):
    _start_pool()
    before = {w.proc.pid for w in P._pool()._workers}
    monkeypatch.setattr(P, "SOFT_TIMEOUT_FRACTION", 20.0)  # the worker's own timer would fire too late
    t0 = time.monotonic()
    assert V.verify("\\boxed{9^{9^{9^9}}}", "12", timeout=0.5).status == "timeout"
    assert time.monotonic() - t0 < 2.0
    after = {w.proc.pid for w in P._pool()._workers}
    assert len(before - after) == 1  # exactly the hung worker was killed and replaced
    assert V.verify("\\boxed{\\frac{3}{6}}", "0.5").correct


def test_dead_worker_is_replaced():
    _start_pool()
    for w in P._pool()._workers:
        os.kill(w.proc.pid, signal.SIGKILL)
        w.proc.wait()
    assert V.verify_batch(["\\boxed{\\sqrt{4}}", "\\boxed{\\frac{4}{2}}", "\\boxed{3/2}"], ["2", "2", "2"]) == [
        V.VerifyResult(True, "\\sqrt{4}", "ok"), V.VerifyResult(True, "\\frac{4}{2}", "ok"),
        V.VerifyResult(False, "3/2", "ok")]


def test_close_pool_and_restart():
    _start_pool()
    procs = [w.proc for w in P._pool()._workers]
    V.close_pool()
    assert all(p.poll() is not None for p in procs)
    V.clear_caches()
    assert V.verify("\\boxed{\\sqrt{3}}", "\\sqrt{2}") == V.VerifyResult(False, "\\sqrt{3}", "ok")


def test_wait_ready_starts_every_worker():
    V.configure_pool(2)
    P.wait_ready()
    workers = P._pool()._workers
    assert len(workers) == 2 and all(w.ready and w.warm and w.proc.poll() is None for w in workers)
    assert V.verify("\\boxed{\\sqrt{3}}", "\\sqrt{2}") == V.VerifyResult(False, "\\sqrt{3}", "ok")
    V.configure_pool(V.DEFAULT_WORKERS)


def test_worker_dying_in_its_warm_up_is_a_failed_start(tmp_path, monkeypatch):
    """A worker that says "ready" and then dies before its parser warm-up is over counts as a failed
    start: ``wait_ready`` gives up after ``MAX_FAILED_STARTS`` of them instead of waiting forever."""
    script = tmp_path / "worker.py"
    script.write_text("import sys\nfrom multiprocessing.connection import Connection\n"
                      "Connection(int(sys.argv[1])).send('ready')\nsys.exit(3)\n")
    monkeypatch.setattr(P, "WORKER_SCRIPT", str(script))
    V.configure_pool(1)
    try:
        with pytest.raises(RuntimeError, match="failed to start"):
            P.wait_ready()
    finally:
        monkeypatch.undo()
        V.configure_pool(V.DEFAULT_WORKERS)


HUNG = "\\boxed{9^{9^{9^9}}}"


def test_task_waiting_behind_a_hung_one_is_retried(monkeypatch):
    """With one worker, the second task waits in its pipe behind a call that hangs; when the hard kill
    replaces the worker, that task runs on the new one and gets its own verdict."""
    V.configure_pool(1)
    try:
        P.wait_ready()
        monkeypatch.setattr(P, "SOFT_TIMEOUT_FRACTION", 20.0)  # only the hard kill stops the hung call
        out = V.verify_batch([HUNG, "\\boxed{\\sqrt{144}}"], ["12", "12"], timeout=0.5)
        assert out == [V.VerifyResult(False, "9^{9^{9^9}}", "timeout", reason="timeout"), V.VerifyResult(True, "\\sqrt{144}", "ok")]
    finally:
        V.configure_pool(V.DEFAULT_WORKERS)


def test_budget_expires_running_and_waiting_tasks_uncached(monkeypatch):
    """When the batch's budget is spent, the running call and the one waiting in the worker's pipe
    both get "timeout"; neither is cached, so a later call computes the waiting one."""
    V.configure_pool(1)
    try:
        P.wait_ready()
        monkeypatch.setattr(P, "SOFT_TIMEOUT_FRACTION", 20.0)  # the hung call runs until the budget is spent
        t0 = time.monotonic()
        out = V.verify_batch([HUNG, "\\boxed{\\sqrt{144}}"], ["12", "12"], timeout=5.0, budget=0.5)
        assert time.monotonic() - t0 < 2.0
        assert [r.status for r in out] == ["timeout", "timeout"]
        assert V.verify("\\boxed{\\sqrt{144}}", "12") == V.VerifyResult(True, "\\sqrt{144}", "ok")
    finally:
        V.configure_pool(V.DEFAULT_WORKERS)


def test_version_is_recorded():
    assert V.VERIFIER_VERSION.startswith("graftzoo-verifier-") and "math-verify-" in V.VERIFIER_VERSION
