"""A small real task, the worked example of docs/adding-a-task.md: add up the numbers the user gives.

A record: `{"task_id": "s1", "task": "sum", "numbers": [3, 4, 5]}`; its rule sharder makes shard 1
the request and one shard per number after it (positive integers: a total said early is too small). The task writes the required hooks (`REQUIRED` in
`fic.tasks.base`), its own key check, a rule sharder and premature replies; every other hook keeps
Task's default, which fits a task whose details are numbers.
"""

from __future__ import annotations

import dataclasses
import random
from typing import Any

from fic.core.instance import Instance, Shard
from fic.core.parsing import as_fraction, last_number
from fic.tasks import Task
from fic.tasks.base import ErrorFactory


class SumTask(Task):
    # records
    name = "sum"
    required_fields = ("numbers",)

    def validate_fields(self, fields: dict[str, Any], error: ErrorFactory) -> None:
        numbers = fields.get("numbers")
        if not isinstance(numbers, list) or len(numbers) < 2 or not all(type(n) is int and n > 0 for n in numbers):
            raise error(f"expected a list of at least two positive integers, got {numbers!r:.60}", "numbers")

    # prompts: the full view in one sentence; the sharded and concat views keep Task's defaults
    system_prompt = "You add numbers. End your reply with `#### <total>`."

    def full_prompt(self, instance: Instance, prompts: str = "fic") -> str:
        *first, last = (str(n) for n in instance.fields["numbers"])
        return f"What is the total of {', '.join(first)} and {last}?"

    # scoring: `scored` is the primitive; `score` comes from Task
    def extract_answer(self, text: str) -> str | None:
        return last_number(text.rpartition("####")[2] or text)

    def scored(self, text: str, instance: Instance, judge: Any = None) -> tuple[float, str | None]:
        answer = self.extract_answer(text or "")
        if answer is None:
            return 0.0, "no number in the reply"
        return float(as_fraction(answer) == sum(instance.fields["numbers"])), None

    def reference_answer(self, instance: Instance) -> str:
        return str(sum(instance.fields["numbers"]))

    # sharding: offline rules, so `fic shard --sharder rule` needs no model
    rule_sharder = True

    def rule_shard(self, instance: Instance, seed: int = 0) -> Instance:
        numbers = instance.fields["numbers"]
        texts = ["I need the total of some numbers.", *(f"The list includes {n}." for n in numbers)]
        return dataclasses.replace(instance, shards=[Shard(k, text) for k, text in enumerate(texts, start=1)])

    # replies: the gold reply the SFT corpus trains on, and a wrong early total for recovery conversations
    def gold_reply(self, instance: Instance) -> str:
        numbers = instance.fields["numbers"]
        return f"{' + '.join(map(str, numbers))} = {sum(numbers)}\n#### {sum(numbers)}"

    def premature_reply(self, revealed_texts: list[str], instance: Instance, rng: random.Random) -> str:
        # Said before the last shard, at least one positive number is missing: never the right total.
        total = sum(as_fraction(n) for text in revealed_texts if (n := last_number(text)) is not None)
        return f"The total is {total}.\n#### {total}"
