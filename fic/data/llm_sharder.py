"""Sharding with a model.

LLM sharder (`fic shard --sharder llm --sharder-config BACKEND.yaml`): a model (any backend)
is asked to split each question following the Lost-in-Conversation properties: shard 1 is
the high-level intent, every later shard adds one piece of information, order of shards 2..N
does not matter, and together they carry exactly the information of the question. Its
output must be a JSON object `{"shards": [{"shard_id": 1, "shard": "..."}, ...]}` (a bare
list of strings or objects is accepted too). Checks, each failure a logged reason:

- a JSON object or list is found, with 2..`max_shards` non-empty, distinct shards;
- the values of the full prompt (the task's `values_in`: numbers for math, digits or number
  words) all appear in the shards, the shards add no value the prompt does not have, and
  shard 1 does not already hold every value (then it is the whole question, not an intent).

Instances whose output fails are asked again (up to `retries` times, sampling at
temperature >= 0.7 with a new seed each round, all failures of a round in one batched call);
those that never pass are dropped with their last reason.

Checking shards by what a model does with them is an evaluation: `fic.evaluation.shard_validation`.
"""

from __future__ import annotations

import dataclasses
from typing import Sequence

from fic import tasks
from fic.core.generation import Backend, SamplingParams
from fic.core.instance import Instance, Shard
from fic.core.parsing import find_json
from fic.core.progress import Progress
from fic.core.seeding import derive_seed

SHARDER_PROMPT = """\
You prepare tasks for testing chat assistants in conversations where the user gives \
information bit by bit. Split the user's task below into "shards":
1. Shard 1 says what the user wants in one short sentence (the goal), without the details \
needed to solve it.
2. Every later shard adds exactly one piece of information from the task (one fact, number \
or condition), as a short, casual sentence a user might type.
3. Together the shards carry exactly the information of the task: leave nothing out, add \
nothing, give no hints or solution steps. Keep every number exactly as written.
4. Shards 2 and later must make sense in any order.
Reply with only a JSON object: {"shards": [{"shard_id": 1, "shard": "..."}, {"shard_id": 2, \
"shard": "..."}, ...]}

Example task: "A baker makes 12 muffins every hour and works 5 hours a day. She sells each \
muffin for $2. How much money does she make in a day?"
Example reply: {"shards": [{"shard_id": 1, "shard": "how much money does the baker make in a \
day?"}, {"shard_id": 2, "shard": "she makes 12 muffins every hour"}, {"shard_id": 3, "shard": \
"she works 5 hours a day"}, {"shard_id": 4, "shard": "each muffin sells for $2"}]}"""

def _show(values: set) -> str:
    return ", ".join(str(v) for v in sorted(values, key=str))


def parse_shards(text: str, instance: Instance, *, max_shards: int = 12) -> list[Shard]:
    """Shards from a sharder model's reply, checked; ValueError with the reason when unusable."""
    value = find_json(text, lists=True)
    if value is None:
        raise ValueError("no JSON object in the sharder's reply")
    items = value.get("shards") if isinstance(value, dict) else value
    if not isinstance(items, list):
        raise ValueError("the JSON has no 'shards' list")
    texts = []
    for index, item in enumerate(items):
        shard = item.get("shard", item.get("text")) if isinstance(item, dict) else item
        if not isinstance(shard, str) or not shard.strip():
            raise ValueError(f"shard {index + 1} is not a non-empty string")
        texts.append(" ".join(shard.split()))
    if len(texts) < 2:
        raise ValueError(f"{len(texts)} shard(s); a conversation needs at least 2")
    if len(texts) > max_shards:
        raise ValueError(f"{len(texts)} shards; at most {max_shards} allowed")
    if len({t.lower() for t in texts}) != len(texts):
        raise ValueError("two shards are the same")
    _check_values(texts, instance)
    return [Shard(i, t) for i, t in enumerate(texts, start=1)]


def _check_values(texts: list[str], instance: Instance) -> None:
    """The shards carry exactly the values (numbers for math) of the full prompt, and shard 1
    is not the whole task."""

    task = tasks.of(instance)

    def values_of(text: str) -> set:
        return set(task.values_in(text, instance))

    wanted = values_of(task.full_prompt(instance))
    found = set().union(*(values_of(t) for t in texts))
    if wanted - found:
        raise ValueError(f"the shards leave out value(s) of the question: {_show(wanted - found)}")
    if found - wanted:
        raise ValueError(f"the shards add value(s) not in the question: {_show(found - wanted)}")
    if len(wanted) >= 2 and wanted <= values_of(texts[0]):
        raise ValueError("shard 1 holds every value of the question: it is not just the intent")


def sharder_prompt(instance: Instance) -> list[dict]:

    question = tasks.of(instance).full_prompt(instance)
    return [{"role": "system", "content": SHARDER_PROMPT},
            {"role": "user", "content": f"Task:\n{question}\n\nReply with the JSON object only."}]


def shard_with_llm(instances: Sequence[Instance], backend: Backend, *, retries: int = 2, temperature: float = 0.0,
                   max_new_tokens: int = 768, max_shards: int = 12, seed: int = 0, progress: bool = True
                   ) -> tuple[list[Instance], list[tuple[Instance, str]]]:
    """Shard every instance with the model; return (sharded, [(instance, reason), ...] dropped)."""
    pending = list(range(len(instances)))
    results: dict[int, Instance] = {}
    reasons: dict[int, str] = {}
    bar = Progress(len(instances), "llm sharding", "inst", enabled=progress)
    for attempt in range(retries + 1):
        if not pending:
            break
        # A retry at temperature 0 would repeat the same output: sample instead.
        temp = temperature if attempt == 0 else max(temperature, 0.7)
        params = SamplingParams(max_new_tokens=max_new_tokens, temperature=temp,
                                seed=derive_seed(seed, "sharder", attempt))
        outputs = backend.chat([sharder_prompt(instances[i]) for i in pending], params)
        failed = []
        for i, out in zip(pending, outputs):
            try:
                shards = parse_shards(out.text, instances[i], max_shards=max_shards)
            except ValueError as err:
                reasons[i] = f"{err} (after {attempt + 1} attempt{'s' if attempt else ''})"
                failed.append(i)
                continue
            source = instances[i]
            results[i] = dataclasses.replace(source, shards=shards, fields=dict(source.fields))
            bar.update(1)
        pending = failed
    bar.close()
    kept = [results[i] for i in range(len(instances)) if i in results]
    dropped = [(instances[i], reasons[i]) for i in pending]
    return kept, dropped
