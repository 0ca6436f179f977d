"""Tests of the hardened verifier (graftzoo.envs.verifier, graftzoo.envs.extract)."""
import json
import os
import signal
import time
from importlib import resources

import pytest

from graftzoo.envs import verifier as V
from graftzoo.envs import verify_pool as P
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
    ("347*6=300*6+40*6+7*6=1800+240+42=2082", ("2082", "ok")),  # scratchpad: after the last "="
    ("So the total = 2082 apples.", ("2082", "ok")),
    ("I think 3 then maybe 41 hmm", ("41", "ok")),  # last number
    ("no idea", (None, "no_answer")),
    ("", (None, "no_answer")),
    ("\\boxed{5", (None, "unparsable")),  # truncated box
    ("\\boxed{}", (None, "unparsable")),
    ("answer: 5}{6", (None, "unparsable")),  # unbalanced braces
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
    assert V.verify(response, "12") == V.VerifyResult(False, extracted, "multiple_answers")


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


def test_two_stage_parser_matches_latex2sympy():
    """The SLL-first parser used in the workers returns exactly what latex2sympy returns."""
    from latex2sympy2_extended.latex2sympy2 import latex2sympy
    with resources.files("graftzoo.envs").joinpath("data/math500.jsonl").open() as f:
        answers = [json.loads(line)["answer"] for line in f][:150]
    answers += ["\\frac{", "(1,2", "x^{2", "\\sqrt[3]{8}", "\\{1,2\\}", "1,234", "\\begin{pmatrix}1&2\\\\3&4\\end{pmatrix}"]
    two_stage = two_stage_latex2sympy()

    def outcome(fn, latex):
        try:
            return str(fn(latex, is_real=True, convert_degrees=False, normalization_config=None))
        except Exception as e:  # syntax errors must stay errors
            return f"error: {type(e).__name__}"

    pairs = [(outcome(latex2sympy, a), outcome(two_stage, a)) for a in answers]
    assert [x for x, _ in pairs] == [y for _, y in pairs]
    assert sum(x.startswith("error") for x, _ in pairs) >= 3  # the malformed inputs above


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


def test_verify_batch_dedupes_and_caches(monkeypatch):
    sent = []
    run = P._Pool.run

    def counting_run(self, tasks, timeout):
        sent.extend(tasks)
        return run(self, tasks, timeout)

    monkeypatch.setattr(P._Pool, "run", counting_run)
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
    assert r == V.VerifyResult(False, "9^{9^{9^9}}", "timeout")
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
        w.proc.join()
    assert V.verify_batch(["\\boxed{\\sqrt{4}}", "\\boxed{\\frac{4}{2}}", "\\boxed{3/2}"], ["2", "2", "2"]) == [
        V.VerifyResult(True, "\\sqrt{4}", "ok"), V.VerifyResult(True, "\\frac{4}{2}", "ok"),
        V.VerifyResult(False, "3/2", "ok")]


def test_close_pool_and_restart():
    _start_pool()
    procs = [w.proc for w in P._pool()._workers]
    V.close_pool()
    assert not any(p.is_alive() for p in procs)
    V.clear_caches()
    assert V.verify("\\boxed{\\sqrt{3}}", "\\sqrt{2}") == V.VerifyResult(False, "\\sqrt{3}", "ok")


def test_version_is_recorded():
    assert V.VERIFIER_VERSION.startswith("graftzoo-verifier-") and "math-verify-" in V.VERIFIER_VERSION
