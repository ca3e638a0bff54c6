"""The views of one instance (Lost in Conversation, section 3 of the paper).

- `full`: the original instruction in one turn.
- `concat`: all shards in one turn as a bullet list.
- `shuffle-concat`: like concat with the shards shuffled; used to check that the order of
  shards does not matter. FiC's prompts keep shard 1 (the intent) first and shuffle shards
  2..N; LiC's (`prompts: lic`) shuffle every shard, as LiC does.
- `sharded`: one shard per user turn, in order.
- `recap`: sharded, plus one last user turn restating every shard.
- `snowball`: sharded, but each turn also restates the shards revealed before it.

A view is rendered as the system prompt plus the list of user turns; the assistant turns
between them are produced at simulation time (or written by the SFT corpus builder).
`prompts` picks the wording (`fic.tasks.base.PROMPT_STYLES`): `fic`, FiC's own, or `lic`,
Lost in Conversation's verbatim (`fic.tasks.lic_prompts`: system prompts, the full and concat
frames; the recap and snowball turns below, from LiC's simulator_recap.py and
simulator_snowball.py under the MIT License reproduced there).
"""

from __future__ import annotations

import dataclasses

from fic import tasks
from fic.core.errors import FicError
from fic.core.instance import Instance
from fic.core.seeding import seeded_rng
from fic.tasks import lic_prompts
from fic.tasks.base import PROMPT_STYLES

VIEWS = ("full", "concat", "shuffle-concat", "sharded", "recap", "snowball")
SINGLE_TURN_VIEWS = ("full", "concat", "shuffle-concat")
RECAP_HEADER = "Just to recap, here is everything I told you:"
SNOWBALL_HEADER = "To restate what I said so far:"
LIC_RECAP = ("Just to recapitulate, the entire task is:\n\n[[SAMPLE_TEXT]]\n\nNow please complete the task "
             "correctly taking all the information into account.")
LIC_SNOWBALL = "Just to reiterate,\n[[HINTS_SO_FAR]]\n\nAlso,\n\n[[LAST_HINT]]\n"


def check_views(views: list[str], source: str, field: str = "views", allow_empty: bool = False) -> None:
    """Every name a view, none twice (and at least one unless `allow_empty`)."""
    if not views and not allow_empty:
        raise FicError("expected at least one view", path=source, field=field)
    for index, view in enumerate(views):
        if view not in VIEWS:
            raise FicError(f"expected one of {', '.join(VIEWS)}, got {view!r}", path=source, field=f"{field}[{index}]")
    if len(set(views)) != len(views):
        raise FicError("a view is listed twice", path=source, field=field)


def check_prompts(prompts: str, field: str = "prompts") -> None:
    if prompts not in PROMPT_STYLES:
        raise FicError(f"expected one of {', '.join(PROMPT_STYLES)}, got {prompts!r}", field=field)


def shuffled_shards(instance: Instance, seed: int, prompts: str = "fic") -> list[str]:
    """The shard contents in a seeded random order: 2..N under FiC's prompts (the intent stays
    first), all of them under LiC's."""
    contents = tasks.of(instance).shard_contents(instance)
    rng = seeded_rng(seed, instance.task_id)
    if prompts == "lic":
        rng.shuffle(contents)
        return contents
    first, *rest = contents
    rng.shuffle(rest)
    return [first, *rest]


def shard_turn(instance: Instance, shard_id: int, prompts: str = "fic") -> str:
    """What the user says to reveal one shard verbatim (its sharded-view turn)."""
    index = [s.shard_id for s in instance.shards].index(shard_id)
    return tasks.of(instance).sharded_turns(instance, prompts)[index]


def recap_turn(instance: Instance, prompts: str = "fic") -> str:
    """The recap view's last user turn: every shard restated (LiC: its concat prompt, framed)."""
    task = tasks.of(instance)
    shards = task.shard_contents(instance)
    if prompts == "lic":
        return lic_prompts.fill(LIC_RECAP, SAMPLE_TEXT=task.concat_turn(instance, shards, prompts))
    return f"{RECAP_HEADER}\n{task.concat_prompt(shards)}"


def snowball_turn(instance: Instance, earlier: list[str], new: str, prompts: str = "fic") -> str:
    """A snowball turn after the first: what was revealed before (`earlier`, shard contents in
    the order revealed; LiC: the user's earlier messages), then the new message."""
    if prompts == "lic":
        return lic_prompts.fill(LIC_SNOWBALL, HINTS_SO_FAR="\n".join(f"- {hint}" for hint in earlier),
                                LAST_HINT=new)
    return f"{SNOWBALL_HEADER}\n{tasks.of(instance).concat_prompt(earlier)}\n\n{new}"


def user_turns(instance: Instance, view: str, *, seed: int = 0, prompts: str = "fic") -> list[str]:
    """The user turns of `instance` in `view`, in the order they are sent."""
    task = tasks.of(instance)
    check_prompts(prompts)
    if view not in VIEWS:
        raise FicError(f"unknown view {view!r}; expected one of {', '.join(VIEWS)}", field="view")
    if view == "full":
        return [task.full_prompt(instance, prompts)]
    if not instance.is_sharded:
        raise FicError(f"view {view!r} needs shards; shard the data first with `fic shard`",
                       record=instance.task_id, field="shards")
    # What each shard tells (restated in one turn) and how the sharded view sends it (some
    # tasks frame each chunk): the same for plain-sentence shards.
    shards, sent = task.shard_contents(instance), task.sharded_turns(instance, prompts)
    if view == "concat":
        return [task.concat_turn(instance, shards, prompts)]
    if view == "shuffle-concat":
        return [task.concat_turn(instance, shuffled_shards(instance, seed, prompts), prompts)]
    if view == "sharded":
        return list(sent)
    if view == "recap":
        return [*sent, recap_turn(instance, prompts)]
    # snowball: LiC restates the user's earlier messages (here the sharded turns), FiC the shards
    earlier = sent if prompts == "lic" else shards
    return [sent[0], *(snowball_turn(instance, earlier[:k], sent[k], prompts) for k in range(1, len(shards)))]


def partial_instance(instance: Instance, shard_ids: list[int]) -> Instance:
    """`instance` reduced to the shards named (in the instance's order): what the user has said by
    some turn, as a request of its own. Its concat view is that partial request in one turn (the
    SFT corpus's partial examples and VASD's per-turn teacher read it)."""
    keep = set(shard_ids)
    return dataclasses.replace(instance, shards=[s for s in instance.shards if s.shard_id in keep])


def system_message(instance: Instance, prompts: str = "fic") -> dict:
    return {"role": "system", "content": tasks.of(instance).system_prompt_for(instance, prompts)}


def render_view(instance: Instance, view: str, *, seed: int = 0, prompts: str = "fic") -> dict:
    """One JSON-ready record: the system prompt, the user turns, and the chat messages.

    In `messages` the assistant turns between user turns are placeholders (`content: null`):
    they are produced at simulation time.
    """
    turns = user_turns(instance, view, seed=seed, prompts=prompts)
    messages = [system_message(instance, prompts)]
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
