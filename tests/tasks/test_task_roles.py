"""The task interface by role: every hook in one role, the required ones written by every task,
`score` derived from `scored`, and an instance's task resolved once and carried."""

from __future__ import annotations

import dataclasses

import pytest

from fic import tasks
from fic.core.errors import FicError
from fic.core.instance import Instance, Shard
from fic.data.views import render_view
from fic.tasks.base import REQUIRED, ROLES, Task
from tests.tasks.sum_task import SumTask


def test_every_hook_of_task_is_in_exactly_one_role():
    hooks = [hook for role in ROLES.values() for hook in role]
    assert len(hooks) == len(set(hooks)), "a hook is listed in two roles"
    public = {name for name in dir(Task) if not name.startswith("_")}
    assert set(hooks) == public
    assert set(REQUIRED) <= public


@pytest.mark.parametrize("name", tasks.names())
def test_every_registered_task_writes_the_required_hooks_and_scores_through_scored(name):
    task = tasks.get(name)
    inherited = [hook for hook in REQUIRED if getattr(type(task), hook) is getattr(Task, hook)]
    assert task.name == name and not inherited, inherited
    assert type(task).score is Task.score, "score is derived once, in Task"


def test_score_is_scored_without_its_note():
    class Half(SumTask):
        def scored(self, text, instance, judge=None):
            return 0.5, "half marks"

    instance = Instance("h", "sum", [], {"numbers": [1, 2]})
    assert Half().score("#### 3", instance) == 0.5


def test_an_instance_carries_its_task_and_is_rendered_and_scored_with_it():
    unregistered = SumTask()  # never registered: only the instance knows it
    instance = unregistered.rule_shard(Instance("u", "sum", [], {"numbers": [2, 9]}, resolved_task=unregistered))
    assert tasks.of(instance) is unregistered
    assert render_view(instance, "full")["user_turns"] == ["What is the total of 2 and 9?"]
    assert tasks.of(dataclasses.replace(instance, shards=instance.shards[:1])) is unregistered
    assert tasks.of(instance).score("#### 11", instance) == 1.0


def test_an_instance_made_by_hand_is_resolved_by_name_once():
    instance = Instance("m", "math", [Shard(1, "What is 2 + 2?")], {"question": "What is 2 + 2?", "answer": "#### 4"})
    assert tasks.of(instance) is tasks.get("math") is instance.resolved_task
    with pytest.raises(FicError, match="unknown task 'nope'"):
        tasks.of(Instance("n", "nope", [], {}))
