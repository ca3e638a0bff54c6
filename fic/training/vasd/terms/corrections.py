"""On-policy corrections (`terms.corrections.*`), DAgger-style with the corpus builder as the
expert: a rollout that answered before the last shard keeps its own ids up to its first
premature turn and continues with the gold replies from there; one whose final answer is wrong
gets the gold answer in its own context. Cross-entropy on the gold replies (`corrections_ce`);
with `loss.weight: 0`, a stage-2 mode with no teacher pass at all."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from fic import tasks
from fic.core.chat import continue_ids, reply_ids
from fic.core.config import setting
from fic.core.seeding import seeded_rng
from fic.training.vasd.rows import GoldRow, revealed_values
from fic.training.vasd.term import CROSS_ENTROPY, PlugIn, Term, moved


@dataclass
class CorrectionsSection:
    weight: float = setting(0.0, "Weight of on-policy corrections (0: off), DAgger-style with the corpus builder as "
                            "the expert: a rollout that answered before the last shard is continued from its first "
                            "premature turn with the gold asks and deferrals and the gold answer at the end (the "
                            "student's own earlier ids kept, out of the loss); one whose final answer scored 0 gets "
                            "the gold answer in its own context. Cross-entropy on the gold replies, their first "
                            "tokens weighted as the anchor's (anchor.first_tokens).", min=0.0, unbounded="a loss term's weight: it scales a number, not work")
    ask_share: float = setting(0.5, "Share of gold early replies that ask for the next detail rather than defer.",
                               min=0.0, max=1.0)


def correction_rows(cfg: Any, conv: Any, tokenizer: Any) -> list[GoldRow]:
    """A rollout that answered before the last shard: its own ids up to its first premature turn,
    then the gold replies from there on (asks or deferrals while details are missing, the gold
    answer at the end) with the user turns it was sent between them. Otherwise, a rollout whose
    final reply is not a correct answer: the gold answer in its own context, its earlier replies
    kept. The student's own replies are context only; the gold replies are trained."""
    if not cfg.terms.corrections.weight or not conv.turns or conv.stop_reason != "last_turn":
        return []
    task = tasks.of(conv.instance)
    last = len(conv.turns) - 1
    premature = [k for k in range(last) if conv.turns[k].label == "answer_attempt"]
    if premature:
        start = premature[0]
    elif (conv.turns[last].score or 0.0) < 1.0:
        start = last
    else:
        return []
    ids = list(conv.ids[:conv.turns[start].prompt_tokens])
    messages = list(conv.messages[:2 + 2 * start])  # the system message, then (user, assistant) pairs to user `start`
    spans, used = [], set()
    for k in range(start, last + 1):
        if k < last:
            rng = seeded_rng(cfg.train.seed, "corrections", conv.instance.task_id, conv.run, k)
            text, _ = task.early_reply(conv.turns[k + 1].user, revealed_values(conv, k), rng, conv.instance,
                                       ask=rng.random() < cfg.terms.corrections.ask_share, used=used)
            used.add(text)
        else:
            text = task.gold_reply(conv.instance)
        reply = reply_ids(tokenizer, text)
        spans.append((len(ids), len(ids) + len(reply)))
        ids += reply
        messages.append({"role": "assistant", "content": text})
        if k < last:
            user = {"role": "user", "content": conv.turns[k + 1].user}
            ids = continue_ids(tokenizer, messages, ids, [user])
            messages.append(user)
    return [GoldRow(ids, spans)]


PLUGIN = PlugIn(
    name="corrections", section=CorrectionsSection, help="On-policy corrections: gold continuations from the "
    "student's own premature or wrong turns.",
    term=lambda cfg: Term("corrections", CROSS_ENTROPY, "corrections_ce", cfg.terms.corrections.weight),
    gold=correction_rows, renamed=moved("corrections", "terms.corrections", ("weight", "ask_share")))
