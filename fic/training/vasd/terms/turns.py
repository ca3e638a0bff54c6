"""Per-turn view asymmetry (`terms.turns.*`, beyond the paper): the divergence on every reply,
reply k against the single-turn request of what the user had revealed by turn k (the concat view
of those shards, `fic.data.views.partial_instance`): a teacher that reads an incomplete request in
one turn, where it is easier to see that something is missing. Earlier replies may be cut to
their first tokens (the ask-or-answer decision), and every distilled reply's first tokens may
weigh more. No term of its own: it reshapes the divergence's replies."""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

from fic.core.chat import prompt_ids
from fic.core.config import setting
from fic.data.views import partial_instance, system_message, user_turns
from fic.training.vasd.rows import Reply, Rollout
from fic.training.vasd.term import PlugIn

OLD = {"loss.turns": "terms.turns.replies", "loss.nonfinal_weight": "terms.turns.nonfinal_weight",
       "loss.nonfinal_tokens": "terms.turns.nonfinal_tokens", "loss.decision_tokens": "terms.turns.decision_tokens",
       "loss.decision_weight": "terms.turns.decision_weight"}


@dataclass
class TurnsSection:
    replies: str = setting("final", "final: the divergence on the final reply, against the whole request (the "
                           "paper's VASD); all: on every reply, reply k against the single-turn request of what the "
                           "user had revealed by turn k (per-turn view asymmetry: the teacher sees an incomplete "
                           "request as one, where asking is easier to get right).", choices=("final", "all"))
    nonfinal_weight: float = setting(1.0, "replies=all: weight of an earlier reply's tokens next to the final "
                                     "reply's.", min=0.0, unbounded="a token weight")
    nonfinal_tokens: int = setting(0, "replies=all: distill only the first this many tokens of each earlier reply, "
                                   "where it asks or answers (0: the whole reply); the final reply is distilled "
                                   "whole.", min=0)
    decision_tokens: int = setting(0, "The first this many tokens of each distilled reply weigh decision_weight: "
                                   "the ask-or-answer decision is made there.", min=0)
    decision_weight: float = setting(1.0, "Weight of those first tokens.", min=0.0, unbounded="a token weight")


def revealed_by_turn(conv: Any) -> list[list[int]]:
    """The shard ids the user had revealed by each turn of a played conversation (cumulative)."""
    seen: list[int] = []
    out = []
    for turn in conv.turns:
        seen += [i for i in turn.shard_ids if i not in seen]
        out.append(list(seen))
    return out


def partial_prompts(tokenizer: Any, conv: Any) -> list[list[int]]:
    """The teacher's prompt ids for each earlier reply of `conv`: the task's system prompt and, as
    one user turn, the concat view of the shards revealed by that turn."""
    return [prompt_ids(tokenizer, [system_message(conv.instance), {
        "role": "user", "content": user_turns(partial_instance(conv.instance, shown), "concat")[0]}])
        for shown in revealed_by_turn(conv)[:-1]]


def per_turn_replies(cfg: Any, conv: Any, rollout: Rollout, tokenizer: Any, replies: list[Reply]) -> list[Reply]:
    """With replies=all, every earlier reply (its first nonfinal_tokens) before the given ones,
    each reading its partial request in every view slot; every reply's first decision_tokens
    weighted decision_weight."""
    turns = cfg.terms.turns
    earlier = []
    if turns.replies == "all":
        slots = len(replies[-1].prompts)
        for (start, end), prompt in zip(rollout.earlier, partial_prompts(tokenizer, conv)):
            end = min(end, start + turns.nonfinal_tokens) if turns.nonfinal_tokens else end
            earlier.append(Reply((start, end), [prompt] * slots, turns.nonfinal_weight))
    return [replace(reply, first_tokens=turns.decision_tokens, first_weight=turns.decision_weight)
            for reply in earlier + replies]


PLUGIN = PlugIn(name="turns", section=TurnsSection, help="The divergence on earlier replies too, each against "
                "the request revealed by then (per-turn view asymmetry).", replies=per_turn_replies, renamed=OLD)
