"""The verifier against golds of several parts and golds written as worked solutions
(docs/verifier.md#a-golds-final-answer, docs/verifier.md#answers-of-several-parts): several boxes are read as one
answer where the gold has several parts, and a worked solution is read by its final answer; each rule both ways (a
right answer paid, a wrong one not), and under the limits that keep hostile text cheap."""
import time

import pytest

from graftzoo.envs import verifier as V
from graftzoo.envs.extract import (MAX_RESPONSE_CHARS, Parts, answer_parts, final_answer, locate_answer, locate_parts,
                                   stated_answer)

MINERVA = ("A share loses 10% on Monday and 20% of what is left on Tuesday, so $0.9 \\cdot 0.8 = 0.72$ of its value "
           "remains: a loss of $100 \\% - 72 \\% = 28 \\%$. Final Answer: The final answer is $28 \\%$. I hope it is correct.")
GSM8K = "Tom fills 3 boxes with 24 pens each.\nHe packs 3 * 24 = <<3*24=72>>72 pens in all.\n#### 72"
LABELED = "y_{1}=x^{2}-2 x+1, y_{2}=2 x^{2}+4 x+5"
Y1, Y2 = "(x - 1)^2", "2(x + 1)^2 + 3"


# ---------------------------------------------------------------- the pure rules (no worker)


@pytest.mark.parametrize("gold, answer", [
    (MINERVA, "28 \\%"),
    ("So the sum is 3 + 7. The answer is 10.", "10"),
    ("The final answer is 3.5.", "3.5"),
    ("The answer is 28%", "28%"),
    ("Answer: $\\frac{1}{2}$", "\\frac{1}{2}"),
    ("**Answer:** 42", "42"),
    ("We find the roots.\n**Final Answer**\n$x = 3$", "x = 3"),
    ("The width is 5 m, so the answer is 15 meters.", "15 meters"),
    (GSM8K, "72"),
    ("The answers are 3 and 5.", "3 and 5"),
    ("Thus the final answer is \\(y_1 = 2x+1, y_2 = 3\\).", "y_1 = 2x+1, y_2 = 3"),
    # given back as it is: no mark, a box (math-verify reads a gold's boxes itself), an unbalanced answer
    ("15 meters", "15 meters"), ("\\frac12", "\\frac12"), ("so $x = \\boxed{10}$.", "so $x = \\boxed{10}$."),
    ("The answer is \\frac{1}{2", "The answer is \\frac{1}{2"), ("\\text{The answer is yes}", "\\text{The answer is yes}"),
])
def test_final_answer_reads_a_worked_solution_by_its_final_answer(gold, answer):
    assert final_answer(gold) == answer


@pytest.mark.parametrize("answer, parts", [
    ("3, 5", Parts(("3", "5"), "list")), ("3 \\text{ and } 5", Parts(("3", "5"), "list")),
    ("1;2;3", Parts(("1", "2", "3"), "list")), ("\\{3, 5\\}", Parts(("3", "5"), "set")),
    ("(3, 5)", Parts(("3", "5"), "tuple")), ("(2,1),(1,2)", Parts(("(2,1)", "(1,2)"), "list")),
    ("y_{1}=2x+1, y_{2}=3", Parts(("y_{1}=2x+1", "y_{2}=3"), "labeled")),
    ("x_{1}=1,\\quadx_{2}=2", Parts(("x_{1}=1", "x_{2}=2"), "labeled")),
    ("x=1, x=2", Parts(("x=1", "x=2"), "list")),  # one name twice: roots, a list
    # one part: a number with thousands separators, intervals, a union, a matrix, a function of two variables
    ("1,000,000", Parts(("1,000,000",), "one")), ("[0,1)", Parts(("[0,1)",), "one")),
    ("\\{-1\\}\\cup[0,7)", Parts(("\\{-1\\}\\cup[0,7)",), "one")), ("f(x,y)", Parts(("f(x,y)",), "one")),
    ("\\begin{pmatrix}1,2\\end{pmatrix}", Parts(("\\begin{pmatrix}1,2\\end{pmatrix}",), "one")),
])
def test_answer_parts(answer, parts):
    assert answer_parts(answer) == parts


def test_a_gold_states_its_boxes_as_parts():
    assert stated_answer("(a) $\\boxed{3}$ (b) $\\boxed{5}$") == "3, 5"
    assert stated_answer("\\boxed{1} papers and \\boxed{2} bins") == "1, 2"
    assert stated_answer("\\boxed{1} no no no no no \\boxed{2}") == "2"  # not another part: the last box
    assert stated_answer(MINERVA) == "28 \\%"


@pytest.mark.parametrize("response, gold, parts", [
    # each box after the first introduced as another part: a label, a part word, a name stated before it
    ("Part (a): \\boxed{3}. Part (b): \\boxed{5}.", "3, 5", ("3", "5")),
    ("**(a)** $\\boxed{3}$\n\n**(b)** $\\boxed{5}$", "3, 5", ("3", "5")),
    ("- \\boxed{3}\n- \\boxed{5}", "3, 5", ("3", "5")),
    ("$y_1 = \\boxed{2x+1}$ and $y_2 = \\boxed{3}$", "y_1 = 2x+1, y_2 = 3", ("y_1 = 2x+1", "y_2 = 3")),
    ("$\\boxed{y_1 = 2x+1}$, then $y_2 = \\boxed{3}$", "y_1 = 2x+1, y_2 = 3", ("y_1 = 2x+1", "y_2 = 3")),
    ("(a) \\boxed{3} (b) \\boxed{5}", "(3, 5)", ("(3, 5)",)),  # a tuple: in order
    ("\\boxed{5} and \\boxed{3}", "(3, 5)", ("(5, 3)",)),
    # kept as located: a self-correction, a hedge, one box holding the whole answer, more boxes than parts,
    # too few boxes, a single-part gold, a value stated for an expression ("2a = ")
    ("\\boxed{5} wait, \\boxed{6}", "5, 6", ("6",)),
    ("(a) \\boxed{7} (b) \\boxed{3, 5}", "3, 5", ("3, 5",)),
    ("(a) \\boxed{2} (b) \\boxed{\\left(3, 5\\right)}", "(3, 5)", ("\\left(3, 5\\right)",)),
    ("\\boxed{3}, \\boxed{5} and \\boxed{7}", "3, 5", ("3", "5", "7")),
    ("(b) \\boxed{5}", "3, 5", ("5",)),
    ("(a) \\boxed{3} (b) \\boxed{5}", "5", ("5",)),
    ("$2a = \\boxed{6}$ and $b = \\boxed{5}$", "a = 3, b = 5", ("6", "b = 5")),
])
def test_locate_parts(response, gold, parts):
    assert locate_parts(response, answer_parts(V.normalize_answer(gold))).parts == parts


def test_new_paths_stay_cheap_on_hostile_text():
    """Each new scan is linear in the text (box ends searched for before the next box only, bounded patterns):
    hostile responses against a gold of several parts, and hostile golds, each well under the verifier's limits. The
    bound (10 s, milliseconds unloaded) catches a scan that goes quadratic or backtracks, not a slow machine."""
    gold = answer_parts("y_1 = 1, y_2 = 2, y_3 = 3")
    responses = ["\\boxed{" * 19 + "a" * (MAX_RESPONSE_CHARS - 1000) + "(b) \\boxed{3}", "(a) \\boxed{1} (b) " * 20_000,
                 "\\boxed{1}" + "\n" * MAX_RESPONSE_CHARS + "- \\boxed{2}", "$y_1 = \\boxed{1}$ and " * 10_000,
                 "\\boxed{" * 5000 + "}" * 5000, "(a) \\boxed{" + "{" * 60 + "1" + "}" * 60 + "} (b) \\boxed{2}"]
    golds = ["The answer is " * 15_000, "final answer is $" + "1" * MAX_RESPONSE_CHARS, "The answer is " + " " * 200_000,
             "(a) \\boxed{1} (b) " * 20_000, ", " * 100_000, "answer: " + "(" * 1000]
    for text in responses:
        t0 = time.perf_counter()
        located = locate_parts(text, gold)
        assert time.perf_counter() - t0 < 10.0 and located.status in ("ok", "unparsable"), text[:60]
    for text in golds:
        t0 = time.perf_counter()
        answer_parts(V.normalize_answer(stated_answer(text)))
        assert time.perf_counter() - t0 < 10.0, text[:60]


# ---------------------------------------------------------------- verdicts, both ways (one batch)

PAID = [
    # several boxes for a gold of several parts: a list, a set, boxes, named parts, a tuple in order
    ("Part (a): \\boxed{3}. Part (b): \\boxed{5}.", "3, 5", "gold_parts"),
    ("For part (a) we get \\boxed{5}. For part (b), after some work, \\boxed{3}.", "\\{3, 5\\}", "gold_parts"),
    ("(a) $\\boxed{3}$\n(b) $\\boxed{5}$", "\\boxed{3}, \\boxed{5}", "gold_parts"),
    ("(a) $\\boxed{3}$\n(b) $\\boxed{5}$", "(a) \\boxed{3} (b) \\boxed{5}", "gold_parts"),
    ("$y_1 = \\boxed{2x+1}$ and $y_2 = \\boxed{3}$", "y_1 = 2x+1, y_2 = 3", "gold_parts"),
    ("$y_2 = \\boxed{3}$ and $y_1 = \\boxed{2x+1}$", "y_1 = 2x+1, y_2 = 3", "gold_parts"),  # named: any order
    (f"\\($y_1 = \\boxed{{{Y1}}} \\) and \\( y_2 = \\boxed{{{Y2}}} \\) ", f"${LABELED}$", "gold_parts"),
    (f"\\($y_1 = \\boxed{{{Y1}}} \\) and \\( y_2 = \\boxed{{{Y2}}} \\) ", LABELED, "gold_parts"),
    ("(a) \\boxed{3} (b) \\boxed{5}", "(3, 5)", "gold_parts"),
    ("(i) \\boxed{\\frac{1}{2}} (ii) \\boxed{0.75}", "\\frac12, \\frac34", "gold_parts"),
    ("The answers are \\boxed{3} and \\boxed{5}.", "3, 5", "gold_as_answer"),  # joined boxes: as before
    # a single-part gold keeps the last box
    ("(a) \\boxed{3} (b) \\boxed{5}", "5", "same_string"),
    # a worked solution read by its final answer: percent, decimal, units, thousands, text around
    ("\\boxed{28\\%}", MINERVA, "gold_prose"), ("\\boxed{0.28}", MINERVA, "gold_prose"),
    ("The loss is 28 percent.", MINERVA, "gold_prose"),
    ("\\boxed{10}", "There are 3 red and 7 blue ones. The answer is 10.", "gold_prose"),
    ("\\boxed{15}", "The width is 5 m, so the answer is 15 meters.", "gold_prose"),
    ("\\boxed{72}", GSM8K, "gold_prose"), ("\\boxed{1000}", "So 10 * 100 = 1000.\n#### 1,000", "gold_prose"),
    ("\\boxed{0.75}", "Divide: 3/4. Therefore the final answer is $\\frac{3}{4}$.", "gold_prose"),
    ("The answer is $\\frac{3}{4}$", "Divide: 3/4. Therefore the final answer is $\\frac{3}{4}$.", "gold_prose"),
    # both: a worked solution whose final answer has named parts
    ("$y_1 = \\boxed{2x+1}$ and $y_2 = \\boxed{3}$",
     "Solving, ... Final Answer: The final answer is $y_1 = 2x+1, y_2 = 3$. I hope it is correct.", "gold_parts"),
]
REFUSED = [
    # a wrong part, a missing part, names swapped, a tuple out of order, an extra box that changes the answer
    ("Part (a): \\boxed{3}. Part (b): \\boxed{6}.", "3, 5"),
    ("Part (b): \\boxed{5}.", "3, 5"),
    ("We only found part (a): \\boxed{3}.", "\\{3, 5\\}"),
    ("$y_1 = \\boxed{3}$ and $y_2 = \\boxed{2x+1}$", "y_1 = 2x+1, y_2 = 3"),
    (f"\\($y_1 = \\boxed{{{Y2}}} \\) and \\( y_2 = \\boxed{{{Y1}}} \\) ", LABELED),
    ("$x = \\boxed{2x+1}$ and $z = \\boxed{3}$", "y_1 = 2x+1, y_2 = 3"),
    ("(a) \\boxed{5} (b) \\boxed{3}", "(3, 5)"),
    ("\\boxed{5} and \\boxed{3}", "(3, 5)"),
    ("(a) \\boxed{3} (b) \\boxed{5} (c) \\boxed{7}", "3, 5"),
    ("\\boxed{3}, \\boxed{5} and \\boxed{7}", "3, 5"),
    ("(a) \\boxed{3} (b) \\boxed{5}", "3"),  # a single-part gold: the last box
    # not parts: a self-correction, a hedge
    ("We get \\boxed{5}. Wait, no: \\boxed{6}.", "5, 6"),
    ("(a) \\boxed{3} or maybe (b) \\boxed{5}", "3, 5"),
    # a worked solution: a wrong final answer, a number from the working, a percent off by one
    ("\\boxed{29\\%}", MINERVA), ("\\boxed{72}", MINERVA), ("\\boxed{3}", "There are 3 red and 7 blue ones. The answer is 10."),
    ("\\boxed{150}", "The width is 5 m, so the answer is 15 meters."), ("\\boxed{24}", GSM8K),
    ("\\boxed{\\frac{4}{3}}", "Divide: 3/4. Therefore the final answer is $\\frac{3}{4}$."),
    ("$y_1 = \\boxed{2x+1}$ and $y_2 = \\boxed{4}$",
     "Solving, ... Final Answer: The final answer is $y_1 = 2x+1, y_2 = 3$. I hope it is correct."),
]


@pytest.fixture(scope="module")
def verdicts():
    pairs = [(r, g) for r, g, _ in PAID] + REFUSED
    return dict(zip(pairs, V.verify_batch([r for r, _ in pairs], [g for _, g in pairs], timeout=5.0)))


@pytest.mark.parametrize("response, gold, reason", PAID)
def test_right_answers_are_paid(verdicts, response, gold, reason):
    result = verdicts[(response, gold)]
    assert result.correct and result.status == "ok" and result.reason == reason, result


@pytest.mark.parametrize("response, gold", REFUSED)
def test_wrong_answers_are_not_paid(verdicts, response, gold):
    assert not verdicts[(response, gold)].correct, verdicts[(response, gold)]


def test_several_boxes_keep_their_limits():
    """A box over the length limit, a broken box or a hedge among the boxes that would be parts keeps the
    located answer (the last box): never a longer or broken piece of text."""
    gold = answer_parts("3, 5")
    assert locate_parts("(a) \\boxed{" + "1" * 1001 + "} (b) \\boxed{5}", gold).parts == ("5",)
    assert locate_parts("(a) \\boxed{3 (b) \\boxed{5}", gold).parts == ("5",)
    assert locate_parts("(a) \\boxed{3 or 4} (b) \\boxed{5}", gold).parts == ("5",)
    assert locate_parts("(a) \\boxed{3} or maybe (b) \\boxed{5}", gold).status == "multiple_answers"
