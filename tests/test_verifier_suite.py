"""The verifier suite: answer-checking cases from public graders' tests, rewritten as rows of
``tests/data/verifier_cases.jsonl`` (one JSON object a line: ``response``, ``gold``, math-verify
``options``, the source's own label ``truth``, the verdict graftzoo must give ``expected``, plain
math-verify's verdict ``math_verify``, the case's ``class``, and ``why``/``note`` where the verdicts
part). Sources, each row naming its own:

- huggingface/Math-Verify: tests/test_all.py, tests/test_boxed.py, tests/test_numina_cases.py,
  tests/test_open_thoughts.py, tests/test_strict.py, tests/test_yujianll.py (prediction/gold pairs
  with expected verdicts; golds given as text are reduced to the answer math-verify reads in them);
- NVIDIA/NeMo-Skills: tests/test_math_equal.py (equivalent and non-equivalent answer pairs, both
  orders, each answer once boxed and once bare in a sentence);
- graftzoo's own rows: the verifier issue's examples and reward hacks (fragments, merged boxes,
  hedges, broken boxes, over-long answers), and boxed/bare pairs of common answer shapes.

"Plain math-verify" is ``verify(parse("$gold$"), parse(response))`` with math-verify's default
extraction and options (the source's gold text for the Math-Verify rows).
"""
import json
from collections import Counter
from pathlib import Path

import pytest

from graftzoo.envs import verifier as V

CASES = [json.loads(line) for line in (Path(__file__).parent / "data" / "verifier_cases.jsonl").open()]
HACKS = "adversarial reward hacks"
CLASSES = {"numbers with separators", "fractions", "intervals", "sets", "tuples", "matrices", "relations", "percent",
           "units", "text answers", "multiple boxes", "unboxed answers", HACKS}


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


def test_suite_size_sources_and_classes():
    assert len(CASES) >= 300
    sources = Counter(c["source"].split(" ")[0] for c in CASES)
    assert len(sources) >= 3, sources
    assert CLASSES <= {c["class"] for c in CASES}


def test_every_case_gets_its_expected_verdict(verdicts):
    wrong = [(c["id"], c["response"][-80:], c["gold"], c["expected"], verdicts[c["id"]]) for c in CASES
             if verdicts[c["id"]].correct != c["expected"]]
    assert not wrong, wrong


def test_no_reward_hack_is_paid(verdicts):
    hacks = [c for c in CASES if c["class"] == HACKS]
    assert len(hacks) >= 30
    assert not [c["response"] for c in hacks if verdicts[c["id"]].correct]


def test_never_pays_what_plain_math_verify_rejects_without_a_reason():
    """A row where graftzoo pays and plain math-verify (default options) does not says why."""
    assert not [c["id"] for c in CASES if c["expected"] and not c["math_verify"] and not c.get("why")]


def test_a_miss_against_the_source_label_is_explained():
    assert not [c["id"] for c in CASES if c["expected"] != c["truth"] and not c.get("note")]


def test_agreement_is_at_least_math_verify_on_boxed_and_no_hack():
    graftzoo = sum(c["expected"] == c["truth"] for c in CASES)
    plain = sum(c["math_verify"] == c["truth"] for c in CASES)
    assert graftzoo >= plain - 5, (graftzoo, plain)  # within a few rows overall; docs/verifier.md has the table
    assert sum(c["math_verify"] for c in CASES if c["class"] == HACKS) > 0  # the hack rows do catch plain math-verify


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
