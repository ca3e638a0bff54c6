"""The views of one instance (Lost in Conversation, section 3 of the paper).

- `full`: the original instruction in one turn.
- `concat`: all shards in one turn as a bullet list.
- `shuffle-concat`: like concat with shards 2..N shuffled (shard 1, the intent, stays first);
  used to check that the order of shards does not matter.
- `sharded`: one shard per user turn, in order.
- `recap`: sharded, plus one last user turn restating every shard.
- `snowball`: sharded, but each turn also restates the shards revealed before it.

A view is rendered as the system prompt plus the list of user turns; the assistant turns
between them are produced at simulation time (or written by the SFT corpus builder).
"""

from __future__ import annotations

import dataclasses

from fic import tasks
from fic.core.errors import FicError
from fic.core.instance import Instance
from fic.core.seeding import seeded_rng

VIEWS = ("full", "concat", "shuffle-concat", "sharded", "recap", "snowball")
SINGLE_TURN_VIEWS = ("full", "concat", "shuffle-concat")
RECAP_HEADER = "Just to recap, here is everything I told you:"
SNOWBALL_HEADER = "To restate what I said so far:"


def shuffled_shards(instance: Instance, seed: int) -> list[str]:
    first, *rest = tasks.get(instance.task).shard_contents(instance)
    seeded_rng(seed, instance.task_id).shuffle(rest)
    return [first, *rest]


def shard_turn(instance: Instance, shard_id: int) -> str:
    """What the user says to reveal one shard verbatim (its sharded-view turn)."""
    index = [s.shard_id for s in instance.shards].index(shard_id)
    return tasks.get(instance.task).sharded_turns(instance)[index]


def user_turns(instance: Instance, view: str, *, seed: int = 0) -> list[str]:
    """The user turns of `instance` in `view`, in the order they are sent."""
    task = tasks.get(instance.task)
    if view not in VIEWS:
        raise FicError(f"unknown view {view!r}; expected one of {', '.join(VIEWS)}", field="view")
    if view == "full":
        return [task.full_prompt(instance)]
    if not instance.is_sharded:
        raise FicError(f"view {view!r} needs shards; shard the data first with `fic shard`",
                       record=instance.task_id, field="shards")
    # What each shard tells (restated in one turn) and how the sharded view sends it (some
    # tasks frame each chunk): the same for plain-sentence shards.
    shards, sent = task.shard_contents(instance), task.sharded_turns(instance)
    if view == "concat":
        return [task.concat_turn(instance, shards)]
    if view == "shuffle-concat":
        return [task.concat_turn(instance, shuffled_shards(instance, seed))]
    if view == "sharded":
        return list(sent)
    if view == "recap":
        return [*sent, f"{RECAP_HEADER}\n{task.concat_prompt(shards)}"]
    # snowball
    turns = [sent[0]]
    for k in range(1, len(shards)):
        turns.append(f"{SNOWBALL_HEADER}\n{task.concat_prompt(shards[:k])}\n\n{sent[k]}")
    return turns


def partial_instance(instance: Instance, shard_ids: list[int]) -> Instance:
    """`instance` reduced to the shards named (in the instance's order): what the user has said by
    some turn, as a request of its own. Its concat view is that partial request in one turn (the
    SFT corpus's partial examples and VASD's per-turn teacher read it)."""
    keep = set(shard_ids)
    return dataclasses.replace(instance, shards=[s for s in instance.shards if s.shard_id in keep])


def system_message(instance: Instance) -> dict:
    return {"role": "system", "content": tasks.get(instance.task).system_prompt_for(instance)}


def render_view(instance: Instance, view: str, *, seed: int = 0) -> dict:
    """One JSON-ready record: the system prompt, the user turns, and the chat messages.

    In `messages` the assistant turns between user turns are placeholders (`content: null`):
    they are produced at simulation time.
    """
    turns = user_turns(instance, view, seed=seed)
    messages = [system_message(instance)]
    for number, turn in enumerate(turns):
        if number:
            messages.append({"role": "assistant", "content": None})
        messages.append({"role": "user", "content": turn})
    return {"task_id": instance.task_id, "task": instance.task, "view": view,
            "system": messages[0]["content"], "user_turns": turns, "messages": messages}


def format_view(record: dict) -> str:
    """A readable print of a rendered view (`fic views --show N`)."""
    lines = [f"== {record['task_id']}  view={record['view']}  turns={len(record['user_turns'])}",
             f"[system] {record['system']}"]
    for number, turn in enumerate(record["user_turns"], start=1):
        lines.append(f"[user {number}] {turn}")
        if number < len(record["user_turns"]):
            lines.append("[assistant] ...")
    return "\n".join(lines)
