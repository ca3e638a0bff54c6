"""The worked example of docs/adding-a-task.md (`tests/tasks/sum_task.py`): registered, loaded,
rendered in every view, scored, sharded by rules, and its concat view answered as its full view."""

from __future__ import annotations

import random
import re

import pytest

from fic import tasks
from fic.core.errors import FicError
from fic.data.sources import read_instance
from fic.data.views import VIEWS, user_turns
from fic.evaluation.shard_validation import validate_shards
from tests.scripted import FunctionBackend
from tests.tasks.sum_task import SumTask

if "sum" not in tasks.names():
    tasks.register(SumTask())
TASK = tasks.get("sum")
RECORDS = [{"task_id": f"s{k}", "task": "sum", "numbers": numbers}
           for k, numbers in enumerate([[3, 4, 5], [12, 30], [7, 7, 7, 1]])]


def sharded(record: dict):
    return TASK.rule_shard(read_instance(record, require_shards=False))


def test_a_record_is_checked_and_carries_its_task_from_the_loader():
    instance = read_instance(RECORDS[0], require_shards=False)
    assert tasks.of(instance) is TASK and instance.resolved_task is TASK
    with pytest.raises(FicError, match="numbers.*at least two positive integers"):
        read_instance({**RECORDS[0], "numbers": [3, "4"]}, require_shards=False)


def test_every_view_renders_and_the_gold_reply_scores_one():
    instance = sharded(RECORDS[0])
    assert user_turns(instance, "full") == ["What is the total of 3, 4 and 5?"]
    assert user_turns(instance, "sharded") == ["I need the total of some numbers.", "The list includes 3.",
                                               "The list includes 4.", "The list includes 5."]
    for view in VIEWS:
        assert all(turn.strip() for turn in user_turns(instance, view, seed=1)), view
    assert TASK.score(TASK.gold_reply(instance), instance) == 1.0
    assert TASK.scored("The total is 11.\n#### 11", instance) == (0.0, None)
    assert TASK.scored("I cannot tell yet.", instance) == (0.0, "no number in the reply")


def test_premature_replies_never_hold_the_total():
    instance = sharded(RECORDS[2])
    for said in range(1, len(instance.shards)):
        reply = TASK.premature_reply(instance.shard_texts[:said], instance, random.Random(said))
        assert TASK.score(reply, instance) == 0.0, reply


def solve(prompt: str) -> str:
    """A perfect solver that reads every number in the prompt (the system prompt has none)."""
    total = sum(int(n) for n in re.findall(r"\d+", prompt))
    return f"#### {total}"


@pytest.mark.slow
def test_the_rule_sharders_concat_view_is_answered_as_its_full_view(smollm2_tokenizer):
    instances = [sharded(record) for record in RECORDS]
    for instance in instances:  # the concat view states exactly the values of the full view
        assert TASK.values_in(user_turns(instance, "concat")[0]) == TASK.values_in(user_turns(instance, "full")[0])
    verdicts = validate_shards(instances, FunctionBackend(solve, smollm2_tokenizer), runs=1, progress=False)
    assert [v.scores for v in verdicts] == [{"full": 1.0, "concat": 1.0, "shuffle-concat": 1.0}] * len(RECORDS)
    assert all(v.keep for v in verdicts)
