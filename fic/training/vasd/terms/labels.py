"""On-policy deferral labels (`terms.labels.*`, DAgger-style imitation): at the student's own
earlier turns, its own ids up to that turn's generation prompt followed by the reply the corpus
builder writes for that state (an ask for the next detail or a deferral, `Task.early_reply`),
trained with cross-entropy (`labels_ce`)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from fic import tasks
from fic.conversation.simulator import answerable_by
from fic.core.bounds import MAX_REPEATS
from fic.core.chat import reply_ids
from fic.core.config import setting
from fic.core.seeding import seeded_rng
from fic.training.vasd.rows import GoldRow, revealed_values
from fic.training.vasd.term import CROSS_ENTROPY, PlugIn, Term, moved


@dataclass
class LabelsSection:
    weight: float = setting(0.0, "Weight of on-policy deferral labels (0: off): at the student's own earlier turns "
                            "(its own replies, premature answers included, in the context), cross-entropy on the "
                            "reply the corpus builder writes for that state (an ask for the next detail or a "
                            "deferral): imitation on the states the policy visits, as in DAgger. Its gold replies "
                            "weigh their first tokens as the anchor's (anchor.first_tokens).", min=0.0, unbounded="a loss term's weight: it scales a number, not work")
    select: str = setting("earliest", "Which earlier turns get a label. earliest: up to max_turns, its premature "
                          "answers first, then its earliest other turns; premature: every premature answer (up to "
                          "max_turns), or the last turn before the final one when nothing was premature; "
                          "unanswerable: every premature answer given before the request was answerable "
                          "(`Task.answerable`: in actions, a required argument missing; every premature answer "
                          "where the task cannot tell), and nothing else: no deferral is taught where the "
                          "request was complete but more was still to come.",
                          choices=("earliest", "premature", "unanswerable"))
    max_turns: int = setting(1, "Labelled turns per rollout, at most.", min=1, max=MAX_REPEATS)
    ask_share: float = setting(0.5, "Share of labels that ask for the next detail rather than defer.", min=0.0,
                               max=1.0)


def label_rows(cfg: Any, conv: Any, tokenizer: Any) -> list[GoldRow]:
    """At earlier turns of the student's rollout (`terms.labels.select`), its own ids up to that
    turn's generation prompt and the gold reply for that state, an ask for the next shard's detail
    or a deferral (`Task.early_reply`, no value not given yet)."""
    labels = cfg.terms.labels
    if not labels.weight or len(conv.turns) < 2 or conv.stop_reason != "last_turn":
        return []
    task = tasks.of(conv.instance)
    earlier = list(range(len(conv.turns) - 1))
    premature = [k for k in earlier if conv.turns[k].label == "answer_attempt"]
    if labels.select == "premature":
        chosen = premature[:labels.max_turns] or [earlier[-1]]
    elif labels.select == "unanswerable":
        chosen = [k for k in premature
                  if answerable_by(conv.instance, conv.view, conv.turns, k) is not True][:labels.max_turns]
    else:
        chosen = sorted(earlier, key=lambda k: (k not in premature, k))[:labels.max_turns]
    rows = []
    for k in sorted(chosen):
        rng = seeded_rng(cfg.train.seed, "labels", conv.instance.task_id, conv.run, k)
        text, _ = task.early_reply(conv.turns[k + 1].user, revealed_values(conv, k), rng, conv.instance,
                                   ask=rng.random() < labels.ask_share, used=set())
        rows.append(GoldRow.single(list(conv.ids[:conv.turns[k].prompt_tokens]), reply_ids(tokenizer, text)))
    return rows


PLUGIN = PlugIn(
    name="labels", section=LabelsSection, help="On-policy deferral labels at the student's earlier turns.",
    term=lambda cfg: Term("labels", CROSS_ENTROPY, "labels_ce", cfg.terms.labels.weight),
    gold=label_rows, renamed=moved("labels", "terms.labels", ("weight", "select", "max_turns", "ask_share")))
