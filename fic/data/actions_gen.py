"""`actions-gen:SPLIT`: function-calling instances generated from templates, in LiC's actions schema.

Each instance asks for one call of a template's function (`fic.data.action_templates`) with
2 to 5 arguments: every required parameter and each optional one with probability 1/2. The
tools listed are the target function plus one or two distractors, in random order, each as one
Python-style signature line (`tool_format: signature`; LiC's own data lists JSON schemas). The full
request is one of several phrasings (one sentence with a clause per argument, or an intent
followed by one sentence per argument); shard 1 states the intent only, and each later shard
states one argument, in random order. Values are written as a correct call writes them.

Splits: `train`, `dev` and `test` draw from the same templates but never share a reference
call: a call belongs to the split its hash picks (8 of 10 buckets train, 1 dev, 1 test), so
the splits are disjoint by construction whatever the seed or size. `test-unseen` uses held-out
templates (`UNSEEN`) that no other split lists, even as a distractor: it measures whether a
model waits for every argument of a function it has never seen, rather than of these templates.

Generation is deterministic in (split, seed, index); within a split no reference call repeats, and
the first n instances of a split are the same whatever count is asked for (instance i depends
only on those before it). So `SPLIT[START:STOP]` (`parse_split`, e.g. `test-unseen[256:768]`) names
instances START to STOP-1 of the split, and slices that do not overlap share no reference call:
a fixed test, dev and train set of one split, disjoint by construction.
Draws are refused until every argument shard names its own parameter's value and no other's
(a date holding a 3 and a 3-night stay would blur which shard carries what).
"""

from __future__ import annotations

import re

from fic.core.errors import FicError
from fic.core.instance import Instance
from fic.core.seeding import derive_seed, seeded_rng
from fic.data.action_templates import SEEN, UNSEEN, Template
from fic.tasks.actions import ActionsTask
from fic.tasks.calls import Call, format_calls

SPLITS = ("train", "dev", "test", "test-unseen")
BUCKETS = {"train": range(8), "dev": range(8, 9), "test": range(9, 10)}  # of 10
INTENT_FRAMES = ("I want to {action}.", "I need to {action}.", "Can you {action} for me?", "Please {action}.",
                 "Help me {action}.", "I'd like to {action}.")
REQUEST_FRAMES = ("{Action} {clauses}.", "Please {action} {clauses}.", "Can you {action} {clauses}?",
                  "I'd like to {action} {clauses}.", "I need to {action} {clauses}.")
ATTEMPTS = 400  # draws per instance before a template counts as exhausted for this split
TASK = ActionsTask()


def parse_split(spec: str) -> tuple[str, int, int | None]:
    """`SPLIT` or `SPLIT[START:STOP]` -> (split, start, stop); stop None: as many as asked for."""
    match = re.fullmatch(r"([a-z-]+)(?:\[(\d*):(\d*)\])?", spec)
    if match is None or match.group(1) not in SPLITS:
        raise FicError(f"unknown split {spec!r}; expected one of {', '.join(SPLITS)}, optionally sliced as "
                       "SPLIT[START:STOP] (e.g. test-unseen[256:768])", field="source")
    split, start, stop = match.group(1), int(match.group(2) or 0), match.group(3)
    if match.group(2) is None:
        return split, 0, None
    stop = int(stop) if stop else None
    if stop is not None and stop <= start:
        raise FicError(f"empty slice {spec!r}: STOP must be above START", field="source")
    return split, start, stop


def generate_slice(spec: str, limit: int | None, seed: int = 0) -> list[dict]:
    """The instances `SPLIT[START:STOP]` names (at most `limit` of them; an open slice or a bare
    split makes `limit`, 100 when it is None)."""
    split, start, stop = parse_split(spec)
    if stop is None:
        stop = start + (limit or 100)
    elif limit is not None:
        stop = min(stop, start + limit)
    return generate(split, stop, seed)[start:]


def split_of(reference_call: str) -> str:
    """The one seen split a reference call (`format_calls` text) may appear in."""
    bucket = derive_seed("actions-gen split", reference_call) % 10
    return next(split for split, buckets in BUCKETS.items() if bucket in buckets)


def templates_for(split: str) -> tuple[Template, ...]:
    return UNSEEN if split == "test-unseen" else SEEN


def generate(split: str, count: int, seed: int = 0) -> list[dict]:
    """`count` instances (LiC-schema records) of `split`; a FicError when the split has fewer."""
    if split not in SPLITS:
        raise FicError(f"unknown split {split!r}; expected one of {', '.join(SPLITS)}", field="source")
    pool = list(templates_for(split))
    order = list(pool)
    seeded_rng("actions-gen", seed, split, "order").shuffle(order)
    records, seen, exhausted = [], set(), set()
    for index in range(count):
        record = None
        for offset in range(len(order)):  # the template whose turn it is, else the next with room
            template = order[(index + offset) % len(order)]
            if template.name in exhausted:
                continue
            record = _instance(template, pool, split, seed, index, seen)
            if record is not None:
                break
            exhausted.add(template.name)
        if record is None:
            raise FicError(f"actions-gen:{split} ran out of distinct instances after {len(records)}; "
                           f"asked for {count} (lower --limit)", field="limit")
        records.append(record)
    return records


def _instance(template: Template, pool: list[Template], split: str, seed: int, index: int,
              seen: set[str]) -> dict | None:
    for attempt in range(ATTEMPTS):
        rng = seeded_rng("actions-gen", seed, split, index, template.name, attempt)
        args = {p.name: rng.choice(p.values) for p in template.params if p.required or rng.random() < 0.5}
        call = format_calls([Call(template.name, args)])
        if call in seen or (split in BUCKETS and split_of(call) != split):
            continue
        others = [t for t in pool if t is not template]
        tools = [template, *rng.sample(others, min(rng.choice((1, 2)), len(others)))]
        rng.shuffle(tools)
        action = template.action
        intent = rng.choice(INTENT_FRAMES).format(action=action)
        params = [p for p in template.params if p.name in args]
        says = {p.name: rng.choice(p.says).format(v=_show(args[p.name])) for p in params}
        order = list(params)
        rng.shuffle(order)
        if rng.random() < 0.25:
            full = " ".join([intent, *(says[p.name] for p in order)])
        else:
            clauses = " ".join(p.clause.format(v=_show(args[p.name])) for p in params)
            full = rng.choice(REQUEST_FRAMES).format(action=action, Action=action[0].upper() + action[1:],
                                                     clauses=clauses)
        texts = [intent, *(says[p.name] for p in order)]
        record = {
            "task_id": f"actions-gen/{split}/{seed}/{index}", "task": "actions",
            "shards": [{"shard_id": i, "shard": text} for i, text in enumerate(texts, start=1)],
            "function": [t.schema() for t in tools],
            "fully_specified_question": [[{"role": "user", "content": full}]],
            "reference_answer": [{template.name: {p.name: [args[p.name]] if p.name in args else [""]
                                                  for p in template.params}}],
            "language": "Python", "test_category": "multiple",
            "tool_format": "signature",  # one line a tool: a 135M model on a CPU reads every turn's prompt
        }
        if _clean(record, [p.name for p in order]):
            seen.add(call)
            return record
    return None


def _clean(record: dict, shard_params: list[str]) -> bool:
    """Shard 1 names no argument; shard k names its own parameter's value and no other's."""
    instance = Instance.from_dict(record)
    texts = instance.shard_texts
    if TASK.values_in(texts[0], instance) or TASK.params_named(texts[0], set(), instance):
        return False
    return all(TASK.params_named(text, set(), instance) == [param] for text, param in zip(texts[1:], shard_params))


def _show(value: object) -> str:
    """A value as the text states it: 21.0 as "21" (a call may write 21 for a float), 5.25 as is."""
    if isinstance(value, float) and value.is_integer():
        return str(int(value))
    return str(value)
