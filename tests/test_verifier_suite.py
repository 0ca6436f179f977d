"""The verifier suite: answer-checking cases from public graders' tests, rewritten as rows of
``tests/data/verifier_cases.jsonl`` (one JSON object a line: ``response``, ``gold``, math-verify
``options``, the source's own label ``truth``, the verdict graftzoo must give ``expected``, plain
math-verify's verdict ``math_verify``, the case's ``class``, and ``why``/``note`` where the verdicts
part). Rows with the same ``pair`` hold one answer as the grader records it (bare) and boxed.
Sources, each row naming its own file:

- huggingface/Math-Verify: tests/test_all.py, test_boxed.py, test_numina_cases.py,
  test_open_thoughts.py, test_strict.py, test_yujianll.py, test_mixed_number_extraction.py,
  test_failed_latex_span.py (golds given as text are reduced to the answer math-verify reads in them);
- NVIDIA/NeMo-Skills tests/test_math_equal.py (both orders, each answer boxed and bare in a sentence);
- the tests of further graders, each answer bare and boxed: huggingface/lighteval (extractive match
  and its pass@k cases), QwenLM/Qwen2.5-Math evaluation/grader.py, hendrycks/math
  modeling/math_equivalence_test.py, EleutherAI/lm-evaluation-harness (hendrycks_math, minerva_math,
  gsm8k), inclusionAI/AReaL, NovaSky-AI/SkyThought, allenai/open-instruct, rllm-org/rllm,
  OpenRLHF/OpenRLHF, PrimeIntellect-ai/verifiers, volcengine/verl;
- graftzoo's own rows: the verifier issue's examples and reward hacks (fragments, merged boxes,
  hedges, broken boxes, over-long answers), boxed/bare pairs of common answer shapes, and the
  dominance issue's classes (clock times, \\mathrm{e}, golds in prose or with units, named functions
  and variables, bare sets and matrices, equations up to a factor, relations, mixed numbers).

"Plain math-verify" is ``verify(parse(gold), parse(response))`` on the strings as written, with
math-verify's default extraction and the row's options (``tests/data/plain_math_verify.py``).
"""
import json
from collections import Counter
from pathlib import Path

import pytest

from graftzoo.envs import verifier as V

DATA = Path(__file__).parent / "data"
CASES = [json.loads(line) for line in (DATA / "verifier_cases.jsonl").open()]
HACKS = "adversarial reward hacks"
CLASSES = {"numbers with separators", "fractions", "intervals", "sets", "tuples", "matrices", "relations", "percent",
           "units", "text answers", "multiple boxes", "unboxed answers", "clock times", "constants", "golds in prose",
           "named functions and variables", "equations up to a factor", "decimals", "mixed numbers", "expressions", HACKS}


def _verdicts(cases):
    """graftzoo's verdicts, one ``verify_batch`` per options setting."""
    out = {}
    for opts in {json.dumps(c["options"], sort_keys=True) for c in cases}:
        group = [c for c in cases if json.dumps(c["options"], sort_keys=True) == opts]
        options = V.VerifierOptions(**json.loads(opts)) if json.loads(opts) else None
        results = V.verify_batch([c["response"] for c in group], [c["gold"] for c in group], timeout=5.0,
                                 options=options)
        out.update({c["id"]: r for c, r in zip(group, results)})
    return out


@pytest.fixture(scope="module")
def verdicts():
    return _verdicts(CASES)


def _plain_verdict():
    """``tests/data/plain_math_verify.py``'s ``plain_verdict``: plain math-verify on a case."""
    import importlib.util
    spec = importlib.util.spec_from_file_location("plain_math_verify", DATA / "plain_math_verify.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.plain_verdict


def _form(case) -> str:
    return "boxed" if "\\boxed" in case["response"] else "bare"


def test_suite_size_sources_and_classes():
    assert len(CASES) >= 1000
    sources = Counter(c["source"].split(" ")[0] for c in CASES)
    assert len(sources) >= 12, sources
    assert CLASSES == {c["class"] for c in CASES}
    for form in ("bare", "boxed"):  # every class of the issue, both ways
        assert CLASSES - {"multiple boxes", "unboxed answers"} <= {c["class"] for c in CASES if _form(c) == form}


def test_the_plain_math_verify_column_is_plain_math_verify():
    """A sample of the ``math_verify`` column, recomputed (``tests/data/plain_math_verify.py``)."""
    plain_verdict = _plain_verdict()
    sample = [c for c in CASES[::23] if "0/0" not in c["response"]]  # sympy's cache decides those (nan)
    assert [plain_verdict(c["response"], c["gold"], c["options"]) for c in sample] == [c["math_verify"] for c in sample]


def test_every_case_gets_its_expected_verdict(verdicts):
    wrong = [(c["id"], c["response"][-80:], c["gold"], c["expected"], verdicts[c["id"]]) for c in CASES
             if verdicts[c["id"]].correct != c["expected"]]
    assert not wrong, wrong


def test_no_reward_hack_is_paid(verdicts):
    hacks = [c for c in CASES if c["class"] == HACKS]
    assert len(hacks) >= 30
    assert not [c["response"] for c in hacks if verdicts[c["id"]].correct]


def test_never_wrong_where_plain_math_verify_pays_but_for_a_named_refusal(verdicts):
    """Dominance, one way: where plain math-verify pays, graftzoo pays too, or its result names the
    refusal (``V.REFUSALS``: a hedge, the last box, a fragment, a relation's left side, a limit...)."""
    unnamed = [(c["id"], c["response"][-60:], c["gold"], verdicts[c["id"]].reason) for c in CASES
               if c["math_verify"] and not verdicts[c["id"]].correct and verdicts[c["id"]].reason not in V.REFUSALS]
    assert not unnamed, unnamed
    refused = Counter(verdicts[c["id"]].reason for c in CASES if c["math_verify"] and not verdicts[c["id"]].correct)
    assert {"hedge", "last_box", "boxes_apart", "fragment", "relation_lhs", "gold_relation"} <= set(refused), refused


def test_never_pays_where_plain_math_verify_does_not_but_by_a_named_normalization(verdicts):
    """Dominance, the other way: where plain math-verify does not pay, graftzoo pays only through a
    named reading (``V.NORMALIZATIONS``), each kept apart from a different answer by
    ``test_each_normalization_keeps_apart_what_differs``."""
    unnamed = [(c["id"], c["response"][-60:], c["gold"], verdicts[c["id"]].reason) for c in CASES
               if not c["math_verify"] and verdicts[c["id"]].correct and verdicts[c["id"]].reason not in V.NORMALIZATIONS]
    assert not unnamed, unnamed


@pytest.mark.parametrize("form", ["bare", "boxed"])
def test_agrees_with_the_sources_at_least_as_often_as_plain_math_verify_in_every_class(form, verdicts):
    """Per class and form, graftzoo's verdicts (live) match the sources' labels at least as often as
    plain math-verify's do; a label graftzoo misses says why (``note``)."""
    rows = [c for c in CASES if _form(c) == form]
    for cls in {c["class"] for c in rows}:
        mine = [c for c in rows if c["class"] == cls]
        ours = sum(verdicts[c["id"]].correct == c["truth"] for c in mine)
        plain = sum(c["math_verify"] == c["truth"] for c in mine)
        assert ours >= plain, (form, cls, ours, plain)
    paid_wrong = [c for c in rows if verdicts[c["id"]].correct and not c["truth"]]
    assert not [c["id"] for c in paid_wrong if not c.get("note")]
    assert len(paid_wrong) <= 4  # grader conventions (a comma list in order) and math-verify's own multi-line reading


def test_a_miss_against_the_source_label_is_explained():
    assert not [c["id"] for c in CASES if c["expected"] != c["truth"] and not c.get("note")]


def test_the_hack_rows_catch_plain_math_verify():
    assert sum(c["math_verify"] for c in CASES if c["class"] == HACKS) >= 10


def test_bare_and_boxed_forms_agree_where_math_verify_reads_the_bare_one(verdicts):
    """Rows with the same ``pair`` hold one answer boxed and bare: where the bare form is read
    (status "ok"), both forms get one verdict, except where the boxed row says why graftzoo's
    normalization of boxed answers reads it better."""
    pairs: dict = {}
    for c in CASES:
        if "pair" in c:
            pairs.setdefault(c["pair"], []).append(c)
    assert len(pairs) >= 50
    split = []
    for rows in pairs.values():
        boxed = [c for c in rows if "\\boxed" in c["response"] and not c.get("why")]  # "why": a boxed-only win
        bare = [c for c in rows if "\\boxed" not in c["response"]]
        for b in bare:
            if verdicts[b["id"]].status == "ok":
                split += [(b["response"], b["gold"]) for x in boxed if verdicts[x["id"]].correct != verdicts[b["id"]].correct]
    assert not split, split


# ---------------------------------------------------------------- the issue's examples


@pytest.mark.parametrize("response, gold", [
    ("So the result is $\\frac{1}{2}$", "2"), ("$x^2$", "2"), ("The interval is $[0,1)$", "1"),
    ("$\\frac{1+\\sqrt{5}}{2}$", "2"), ("asdkfj;qwe2", "2"), ("\\boxed{32, 349}", "32349"),
    ("\\boxed{32}, \\boxed{349}", "32349"), ("\\boxed{12} or \\boxed{15}", "12"), ("The answer is 12 or 15.", "12"),
])
def test_issue_wrong_answers_are_not_paid(response, gold):
    assert not V.verify(response, gold).correct


@pytest.mark.parametrize("response, gold, extracted", [
    ("$\\frac{1}{3}$", "\\frac13", "\\frac{1}{3}"), ("The interval is $[0,1)$", "[0,1)", "[0,1)"),
    ("The matrix is $\\begin{pmatrix}1&2\\\\3&4\\end{pmatrix}$.", "\\begin{pmatrix}1&2\\\\3&4\\end{pmatrix}", None),
    ("The total is 7,425,000.", "7425000", "7425000"), ("#### 1,000", "1000", "1000"),
    ("Final Answer: The largest $n$ is 34.", "34", "34"), ("We get $\\sum_{k=0}^{3} k = 6$", "6", None),
    ("\\boxed{1}, \\boxed{2} and \\boxed{3}", "1,2,3", "1, 2, 3"),
    ("\\boxed{(1,2)} and \\boxed{(3,4)}", "(1,2),(3,4)", "(1,2), (3,4)"),
])
def test_issue_right_answers_are_paid(response, gold, extracted):
    r = V.verify(response, gold)
    assert r.correct and r.status == "ok", r
    assert extracted is None or r.extracted == extracted


def test_no_answer_is_never_a_fragment():
    assert V.verify("no idea at all", "1") == V.VerifyResult(False, None, "no_answer")
    assert V.verify("XYZ2K", "2").status == "no_answer"


@pytest.mark.parametrize("a, b", [
    ("32, 349", "32349"), ("1,\\,000", "1000"), ("1, 000", "1000"), ("1 234", "1234"), ("(1, 2)", "12"),
    ("12, 15", "1215"), ("1~000", "1000"),
])
def test_normalization_never_merges_two_answers(a, b):
    """Each rule of ``normalize_answer`` keeps apart what math-verify keeps apart."""
    assert V.normalize_answer(a) != V.normalize_answer(b)
    assert not V.verify(f"\\boxed{{{a}}}", b).correct


def test_normalization_keeps_math_verify_verdicts():
    """math-verify's verdict on a normalized answer is its verdict on the answer as written."""
    from graftzoo.envs import verify_worker as W
    answers = ["32,\\! 349", "10,\\!000", "1,\\,000", "\\left( 3, \\frac{\\pi}{2} \\right)", "\\dfrac{1}{2}", "288 \\pi",
               "(1, 2)", "\\{1, 2\\}", "\\$10", "\\displaystyle\\frac{3}{4}"]
    for a in answers:
        for gold in ("32349", "10000", "1000", "(3,\\frac{\\pi}{2})", "0.5", "288\\pi", "(1,2)", "\\{1,2\\}", "12.5", "10", "0.75"):
            assert W._evaluate("verify", gold, a) == W._evaluate("verify", gold, V.normalize_answer(a)), (a, gold)


def test_options_reach_math_verify_and_the_cache_key():
    assert V.VerifierOptions() == V.VerifierOptions(6, 15, True, False)
    assert V.verify("\\boxed{f(y)}", "f(x)").correct is False
    assert V.verify("\\boxed{f(y)}", "f(x)", options=V.VerifierOptions(strict=False)).correct is True
    assert "strict=False" in V.verifier_version(V.VerifierOptions(strict=False))
    assert "strict=True" in V.VERIFIER_VERSION
    with pytest.raises(ValueError, match="float_rounding"):
        V.VerifierOptions(float_rounding=-1)


def test_reward_fn_matches_verify():
    from graftzoo.envs import reward_fn
    fn = reward_fn("answer")
    completions = ["\\boxed{2}", [{"role": "assistant", "content": "So it is $\\frac{1}{2}$."}],
                   [{"role": "user", "content": "hi"}, {"role": "assistant", "content": [{"type": "text", "text": "#### 1,000"}]}],
                   "\\boxed{12} or \\boxed{15}", "no idea"]
    golds = [2, "2", "1000", "12", None]
    rewards = fn(["p"] * 5, completions, answer=golds)
    assert rewards == [1.0, 0.0, 1.0, 0.0, None]
    texts = ["\\boxed{2}", "So it is $\\frac{1}{2}$.", "#### 1,000", "\\boxed{12} or \\boxed{15}"]
    assert rewards[:4] == [float(V.verify(t, str(g)).correct) for t, g in zip(texts, golds)]
    with pytest.raises(KeyError, match="solution"):
        reward_fn("solution")(["p"], ["x"], answer=["1"])


# ---------------------------------------------------------------- the dominance rule's named readings

# Each normalization: (response, gold) pairs it pays, and pairs that differ and that it must keep apart.
KEEP_APART = {
    "same_string": ([("7:30", "7:30"), ("$2 + \\frac{1}{\\mathrm{e}}$", "2+\\frac{1}{\\mathrm{e}}")],
                    [("7:31", "7:30"), ("2 + \\frac{1}{\\mathrm{e}}", "2 + \\frac{1}{e^2}")]),
    "same_number": ([("\\boxed{0.5}", "\\frac {1}{2}"), ("\\boxed{(1,4.5)}", "(1,\\frac{9}{2})")],
                    [("\\boxed{0.5}", "\\frac {1}{3}"), ("\\boxed{(1,4.5)}", "(1,\\frac{9}{4})")]),
    "bare_answer": ([("3t - 1", "g(t) = 3t - 1"), ("{y, y + 2}", "{y + 2, y}"), ("\\sqrt5", "\\sqrt{5}")],
                    [("3t + 1", "g(t) = 3t - 1"), ("{y, y + 3}", "{y + 2, y}"), ("\\sqrt6", "\\sqrt{5}"),
                     ("y=2", "x=2"), ("7a^3(2+7a^3)", "7"), ("g(t)", "g(t) = 3t - 1"), ("3t - 7", "7"), ("x^2 + 2", "2")]),
    "box_prose": ([("\\boxed{The answer is 3.5}", "3.5")],
                  [("\\boxed{The answer is 3.6}", "3.5"), ("\\boxed{The answer is 4 0/9 or 5}", "4")]),
    "gold_prose": ([("250", "The answer is 250"), ("3", "3 cm^2"), ("72.", "#### 72")],
                   [("25", "The answer is 250"), ("150", "15 meters"), ("meters", "15 meters"), ("1", "g(t) = 3t - 1"),
                    ("2", "{y + 2, y}"), ("0", "2x-3y+z-4=0"), ("7", "#### 72")]),
    "gold_as_answer": ([("\\boxed{\\frac{\\pi}{2}}", "\\pi/2"), ("\\boxed{(x+1)^2}", "x^2+2x+1")],
                       [("\\boxed{\\frac{\\pi}{3}}", "\\pi/2"), ("\\boxed{(x+1)^2}", "x^2+2x-1"), ("\\boxed{7}", "7:30"),
                        ("\\boxed{30}", "7:30")]),
    "gold_parts": ([("Part (a): \\boxed{3}. Part (b): \\boxed{5}.", "\\{3, 5\\}"),
                    ("$y_1 = \\boxed{2x+1}$ and $y_2 = \\boxed{3}$", "y_1 = 2x+1, y_2 = 3")],
                   [("Part (a): \\boxed{3}. Part (b): \\boxed{6}.", "\\{3, 5\\}"),
                    ("$y_1 = \\boxed{3}$ and $y_2 = \\boxed{2x+1}$", "y_1 = 2x+1, y_2 = 3"),
                    ("(a) \\boxed{5} (b) \\boxed{3}", "(3, 5)"), ("\\boxed{5} wait, \\boxed{6}", "5, 6")]),
    "mixed_number": ([("4 4/9", "\\frac{40}{9}"), ("The answer is 2 1/2 cups.", "2.5"), ("\\boxed{4 4/9}", "40/9")],
                     [("4 4/9", "4"), ("4 4/9", "\\frac{16}{9}"), ("\\boxed{4 4/9}", "16/9"), ("4 0/0", "0"),
                      ("4 4/9 %", "40/9")]),
}


@pytest.mark.parametrize("reason", sorted(V.NORMALIZATIONS))
def test_each_normalization_keeps_apart_what_differs(reason):
    from graftzoo.envs import verify_worker as W
    assert set(KEEP_APART) == set(V.NORMALIZATIONS) >= set(W.LENIENT_READINGS)
    pays, apart = KEEP_APART[reason]
    results = V.verify_batch([r for r, _ in pays + apart], [g for _, g in pays + apart], timeout=5.0)
    assert [(r.correct, r.reason) for r in results[:len(pays)]] == [(True, reason)] * len(pays), results
    assert not [p for p, r in zip(apart, results[len(pays):]) if r.correct], results[len(pays):]


# Each refusal: a (response, gold) that plain math-verify pays and graftzoo refuses, with that reason.
REFUSED = {
    "hedge": ("The answer is 12 or 15.", "12"), "last_box": ("\\boxed{5} wait, \\boxed{6}", "$5, 6$"),
    "boxes_apart": ("\\boxed{32}, \\boxed{349}", "32349"), "fragment": ("5t - 1", "g(t) = 3t - 1"),
    "relation_lhs": ("\\boxed{\\tan(x)=\\frac{3}{7}}", "\\sin(x)=\\frac{3}{7}"), "gold_relation": ("0", "a + z = 0"),
}


@pytest.mark.parametrize("reason", sorted(V.REFUSALS))
def test_each_refusal_is_named_in_the_result(reason):
    plain_verdict = _plain_verdict()
    if reason in REFUSED:
        response, gold = REFUSED[reason]
        assert plain_verdict(response, gold)
        r = V.verify(response, gold, timeout=5.0)
    elif reason == "unreadable":
        r = V.verify("\\boxed{" + "+".join(["1"] * 600) + "}", "600")
    elif reason == "timeout":
        r = V.verify("\\boxed{9^{9^{9^{9^9}}}}", "2", timeout=0.3)
    else:  # "budget"
        r = V.verify_batch(["\\boxed{9^{9^{9^{9^9}}}}"], ["3"], timeout=30.0, budget=0.3)[0]
    assert (r.correct, r.reason) == (False, reason), r


@pytest.mark.parametrize("response, gold", [
    ("\\boxed{\\tan(x)=\\frac{3}{7}}", "\\sin(x)=\\frac{3}{7}"), ("\\tan(x)=\\frac{3}{7}", "\\sin(x)=\\frac{3}{7}"),
    ("y = 2", "x = 2"), ("\\boxed{y=2}", "x=2"), ("So y = 2.", "x = 2"), ("So $f(x) = 2x$.", "g(x) = 2x"),
    ("\\boxed{h(t) = 3t - 1}", "g(t) = 3t - 1"), ("0", "a + z = 0"), ("\\boxed{0}", "x + y - 1 = 0"),
])
def test_a_relation_is_compared_whole_bare_or_boxed(response, gold):
    """A relation whose left side differs from the gold's is never paid; nor is a value read out of an
    equation of several terms."""
    assert not V.verify(response, gold, timeout=5.0).correct
