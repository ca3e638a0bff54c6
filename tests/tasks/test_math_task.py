"""The math scorer: the LiC rule plus numerically equal forms, on a table of answer formats."""

import pytest

from fic import tasks
from fic.core.instance import Instance

MATH = tasks.get("math")


def math(task_id, answer, question="q"):
    return Instance(task_id, "math", [], {"question": question, "answer": answer})


ARA = math("ara", "40*4 = <<40*4=160>>160 games\n160*21 = <<21*160=3360>>3360 points\n#### 3360", "How many points?")
HALF, NEGATIVE, TWO = math("half", "#### 0.5"), math("neg", "#### -12"), math("two", "#### 2")
EIGHTEEN, SEVEN = math("eighteen", "#### 18"), math("seven", "#### 7")

CASES = [
    # (reply, instance, expected score)
    ("#### 3360", ARA, 1.0),
    ("She scored 3360 points.", ARA, 1.0),
    ("The answer is 3,360", ARA, 1.0),
    ("$3,360.00", ARA, 1.0),
    ("$3360", ARA, 1.0),
    ("3360.0", ARA, 1.0),
    ("3360.", ARA, 1.0),
    ("\\boxed{3360}", ARA, 1.0),
    ("So the total is $\\boxed{3,360}$ points.", ARA, 1.0),
    ("\\boxed{\\frac{6720}{2}}", ARA, 1.0),
    ("\\frac{6720}{2}", ARA, 1.0),
    ("6720/2", ARA, 1.0),
    ("Step: 40*4=160, 160*21=3360\n#### 3360", ARA, 1.0),
    ("#### 3360 points", ARA, 1.0),
    ("#### 3,360", ARA, 1.0),
    ("I computed 999 first, then #### 3360", ARA, 1.0),
    ("1/2", HALF, 1.0),
    ("0.50", HALF, 1.0),
    ("\\frac{1}{2}", HALF, 1.0),
    ("#### .5", HALF, 1.0),
    ("#### -12", NEGATIVE, 1.0),
    ("The change is -12 dollars", NEGATIVE, 1.0),
    # wrong answers
    ("#### 3361", ARA, 0.0),
    ("3360 points, plus 5 more games", ARA, 0.0),   # LiC: the *last* number counts
    ("#### 33600", ARA, 0.0),
    ("#### 336", ARA, 0.0),
    ("I need more information before I can answer.", ARA, 0.0),
    ("", ARA, 0.0),
    ("#### ", ARA, 0.0),
    ("\\boxed{3361}", ARA, 0.0),
    ("3360 #### 160", ARA, 0.0),                     # the text after #### is the answer
    ("2/1", HALF, 0.0),
    ("#### 12", NEGATIVE, 0.0),
    ("1/0", HALF, 0.0),
    # After a final-answer marker the answer is read there, not at the reply's last number.
    ("#### 18\n\nNote: apples cost $2 each", EIGHTEEN, 1.0),
    ("#### 18 (apples cost $2 each)", EIGHTEEN, 1.0),
    ("#### 18. Apples cost $2 each.", EIGHTEEN, 1.0),
    ("The final answer is 18. Note: apples cost $2 each.", EIGHTEEN, 1.0),
    ("**Final Answer:** 18\n\n(2 boxes were left over)", EIGHTEEN, 1.0),
    ("#### 6 * 3 = 18", EIGHTEEN, 1.0),
    ("Final answer: \\boxed{18 \\text{ apples}}", EIGHTEEN, 1.0),
    ("Before I give the final answer: is it 3 bags? Then 18.", EIGHTEEN, 1.0),  # no answer after the marker
    # LaTeX that is not a plain number is read as a whole by math-verify.
    ("\\boxed{\\frac{1}{2}}", TWO, 0.0),
    ("So x = \\frac{1}{2}", TWO, 0.0),
    ("#### \\frac{4}{2}", TWO, 1.0),
    # A hyphen between two numbers is not a minus sign.
    ("She reads pages 5-7", SEVEN, 1.0),
    ("#### 5-7", SEVEN, 0.0),                        # after the marker the first number counts: 5
]


@pytest.mark.parametrize("reply,instance,expected", CASES)
def test_score_table(reply, instance, expected):
    assert MATH.score(reply, instance) == expected


def test_table_is_large_and_balanced():
    assert len(CASES) >= 30
    assert sum(c[2] == 1.0 for c in CASES) >= 10 and sum(c[2] == 0.0 for c in CASES) >= 10


def test_extract_answer_prefers_hashes_then_boxed_then_last_number():
    assert MATH.extract_answer("blah 12 #### 7") == "7"
    assert MATH.extract_answer("we get \\boxed{\\frac{1}{2}} and 9") == "\\frac{1}{2}"
    assert MATH.extract_answer("first 3, then 4.") == "4"
    assert MATH.extract_answer("no numbers here") is None
    assert MATH.extract_answer("#### 18\n\nNote: apples cost $2 each") == "18"
    assert MATH.extract_answer("The final answer is 18. Note: apples cost $2.") == "18"


def test_gold_reply_strips_calculator_annotations_and_scores_full_marks():
    reply = MATH.gold_reply(ARA)
    assert "<<" not in reply and reply.endswith("#### 3360")
    assert MATH.score(reply, ARA) == 1.0
    assert MATH.reference_answer(ARA) == "3360"


def test_prompts():
    assert MATH.full_prompt(ARA) == "How many points?"
    assert MATH.concat_prompt(["a", "b"]) == "- a\n- b"
    assert "####" in MATH.system_prompt
