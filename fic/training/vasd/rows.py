"""The student's rows: token spans of a played conversation turned into per-term targets and
weights. Pure functions of ids (no model, no torch).

Token layout (nothing is ever re-tokenised). A rollout is a `fic.conversation.simulator.Conversation`
played on-policy: `conv.ids` are the exact ids the student saw and wrote, and turn k's reply
occupies `[turn.prompt_tokens, turn.prompt_tokens + turn.reply_tokens)` of them. For a distilled
reply the teacher reads

    teacher ids = prompt_ids(system + a single-turn view) + the student's own reply ids

so reply token j sits at student position p + j and teacher position q + j (p and q the two
prompt lengths): the loss at position t predicts token t + 1, and both sides are read at the same
reply tokens, one for one.

A row is `{"input_ids": [...], "targets": {term: [...]}, "weights": {term: [...]}}`, one list per
position, holding the terms it trains (a term it does not hold trains nothing there); rows with
branches (`shared_prefix_rows`) add `position_ids`, `segments` and `limits`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Sequence

from fic import tasks
from fic.training.data import IGNORE, Example

Tables = dict[str, tuple[list[int], list[float]]]  # term -> (targets, weights) of one row


@dataclass
class Reply:
    """A reply the divergence is taken on: its token `span` in the rollout's ids, the teacher's
    prompt for each teacher view (an earlier reply's one partial request fills every slot), its
    `weight`, and the weight of its first `first_tokens` tokens (times `weight`)."""

    span: tuple[int, int]
    prompts: list[list[int]]
    weight: float = 1.0
    first_tokens: int = 0
    first_weight: float = 1.0


@dataclass
class Rollout:
    """One played conversation, reduced to what the losses need."""

    ids: list[int]
    final: tuple[int, int]                  # [start, end) of the final reply in `ids`
    earlier: list[tuple[int, int]]          # spans of the non-final replies
    finished: bool                          # the final reply ended with its end-of-turn token
    replies: list[Reply] = field(default_factory=list)     # the replies distilled, earlier ones first
    values: dict[str, float] = field(default_factory=dict)  # a plug-in's value for it this step (reward: advantage)

    @property
    def answer_ids(self) -> list[int]:
        return self.ids[self.final[0]:self.final[1]]


def rollout_from(conv: Any) -> Rollout:
    """The token spans of a played conversation (`fic.conversation.simulator.Conversation`)."""
    spans = [(t.prompt_tokens, t.prompt_tokens + t.reply_tokens) for t in conv.turns]
    if not spans or conv.ids[spans[-1][0]:spans[-1][1]] == [] or spans[-1][1] != len(conv.ids):
        raise ValueError("the conversation has no final reply at the end of its ids")
    return Rollout(ids=list(conv.ids), final=spans[-1], earlier=spans[:-1],
                   finished=conv.turns[-1].finish_reason == "stop")


def teacher_pairs(rollout: Rollout, view: int) -> list[tuple[list[int], list[int]]]:
    """(teacher prompt, reply ids) of each distilled reply, in order, for teacher view slot `view`."""
    return [(reply.prompts[view], rollout.ids[reply.span[0]:reply.span[1]]) for reply in rollout.replies]


def revealed_values(conv: Any, k: int) -> set:
    """The values the user had given by turn k of a played conversation."""
    task = tasks.of(conv.instance)
    return {v for turn in conv.turns[:k + 1] for v in task.values_in(turn.user, conv.instance)}


@dataclass
class GoldRow:
    """The student's own ids up to one of its turns, continued with gold replies (labels: one
    reply at an earlier turn; corrections: every reply from there to the final one, with the user
    turns between): `ids`, and the `spans` of the gold replies in them, trained with
    cross-entropy (imitation on the states the policy visits)."""

    ids: list[int]
    spans: list[tuple[int, int]]

    @classmethod
    def single(cls, context: list[int], reply: list[int]) -> GoldRow:
        return cls(context + reply, [(len(context), len(context) + len(reply))])


def weighted_spans(length: int, spans: Sequence[tuple[int, int]], ids: Sequence[int], first_tokens: int,
                   first_weight: float) -> tuple[list[int], list[float]]:
    """Targets and weights of `length` positions that train the tokens in `spans`: position t
    predicts ids[t + 1]; the first `first_tokens` tokens of each span weigh `first_weight`."""
    targets, weights = [IGNORE] * length, [0.0] * length
    for start, end in spans:
        for k, token in enumerate(range(start, end)):
            targets[token - 1] = ids[token]
            weights[token - 1] = first_weight if k < first_tokens else 1.0
    return targets, weights


def runs_of(targets: Sequence[int]) -> list[tuple[int, int]]:
    """Token spans (as token positions, i.e. target position + 1) of the runs of consecutive
    trained targets: one per assistant reply in an SFT example."""
    spans, start = [], None
    for t, y in enumerate(list(targets) + [IGNORE]):
        if y != IGNORE and start is None:
            start = t
        elif y == IGNORE and start is not None:
            spans.append((start + 1, t + 1))
            start = None
    return spans


def reply_targets(rollout: Rollout) -> tuple[list[int], list[float]]:
    """The divergence's targets and weights on a rollout's row: each distilled reply's tokens
    weigh its weight, its first `first_tokens` that times its `first_weight`."""
    length = len(rollout.ids)
    targets, weights = [IGNORE] * length, [0.0] * length
    for reply in rollout.replies:
        (start, end) = reply.span
        span_t, span_w = weighted_spans(length, [reply.span], rollout.ids, reply.first_tokens, reply.first_weight)
        for t in range(start - 1, end - 1):
            targets[t], weights[t] = span_t[t], reply.weight * span_w[t]
    return targets, weights


def trains(targets: Sequence[int]) -> bool:
    return any(y != IGNORE for y in targets)


def student_row(ids: Sequence[int], tables: Tables) -> dict:
    """A student row over `ids` training each term of `tables` at its (targets, weights)."""
    return {"input_ids": list(ids), "targets": {name: list(t) for name, (t, _) in tables.items()},
            "weights": {name: list(w) for name, (_, w) in tables.items()}}


def anchor_row(example: Example, first_tokens: int, first_weight: float) -> dict:
    """An SFT-corpus conversation's row: the `anchor` term on its trained turns."""
    ids = example.input_ids
    return student_row(ids, {"anchor": weighted_spans(len(ids), runs_of(example.targets), ids, first_tokens,
                                                      first_weight)})


def gold_row(term: str, gold: GoldRow, first_tokens: int, first_weight: float) -> dict:
    """A plug-in's gold row: `term` on its gold replies."""
    return student_row(gold.ids, {term: weighted_spans(len(gold.ids), gold.spans, gold.ids, first_tokens, first_weight)})


def empty_row(pad_id: int) -> dict:
    """A one-token student row that trains nothing (the stand-in for an empty micro-batch); the
    token is attended, so no attention row is fully masked."""
    return student_row([pad_id], {})


def table(row: dict, name: str) -> tuple[list[int], list[float]]:
    """A row's (targets, weights) of term `name`, untrained positions where it holds none."""
    if name in row["targets"]:
        return row["targets"][name], row["weights"][name]
    n = len(row["input_ids"])
    return [IGNORE] * n, [0.0] * n


def common_prefix(a: Sequence[int], b: Sequence[int]) -> int:
    """How many leading ids `a` and `b` share."""
    return next((t for t, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))


def add_branch(row: dict, ids: Sequence[int], shared: int) -> None:
    """Append ids[shared:] to a row with branches (`input_ids`, `position_ids`, `segments`,
    `limits`) as a new branch at `shared`: its tokens keep their positions in `ids`."""
    tail = len(ids) - shared
    row["input_ids"] += list(ids[shared:])
    row["position_ids"] += list(range(shared, len(ids)))
    row["segments"] += [max(row["segments"]) + 1] * tail
    row["limits"] += [shared] * tail


def shared_prefix_rows(rows: Sequence[dict]) -> list[dict]:
    """Student rows of one rollout as few rows: the first row's ids are the trunk, and each other
    row whose ids start like the trunk's adds only the tokens after their longest common prefix,
    as a branch. A branch token keeps the position it has in its own row and attends to the trunk
    before the branch point and to its branch up to itself (`segments`: 0 trunk, b branch b;
    `limits`: a branch token's branch point; `fic.training.vasd.batches.branch_mask`), so every
    token sees what it saw in its own row and the losses and gradients are those of the separate
    rows, while the shared context (a label row is the rollout's own ids up to an earlier turn) is
    computed once. A row sharing nothing, or whose targets would fall where the trunk already
    trains the same term, stays a row of its own."""
    names = list(dict.fromkeys(name for row in rows for name in row["targets"]))
    first = rows[0]
    n = len(first["input_ids"])
    trunk = {"input_ids": list(first["input_ids"]), "targets": {}, "weights": {}, "position_ids": list(range(n)),
             "segments": [0] * n, "limits": [0] * n}
    for name in names:
        targets, weights = table(first, name)
        trunk["targets"][name], trunk["weights"][name] = list(targets), list(weights)
    alone = []
    for row in rows[1:]:
        ids = row["input_ids"]
        shared = common_prefix(ids, trunk["input_ids"][:n])
        on_trunk = [(name, t) for name in row["targets"] for t in range(shared) if row["targets"][name][t] != IGNORE]
        if not shared or any(trunk["targets"][name][t] != IGNORE for name, t in on_trunk):
            alone.append(row)
            continue
        for name, t in on_trunk:
            trunk["targets"][name][t], trunk["weights"][name][t] = row["targets"][name][t], row["weights"][name][t]
        for name in names:
            targets, weights = table(row, name)
            trunk["targets"][name] += targets[shared:]
            trunk["weights"][name] += weights[shared:]
        add_branch(trunk, ids, shared)
    return [trunk, *alone]
