"""On-policy corrections (`fic/training/vasd/terms/corrections.py`): the student's own context up
to its first premature (or wrong) turn, continued with the gold replies."""

from __future__ import annotations

from scripted import FunctionBackend
from vasd_played import ara, played

from fic.conversation.classify import RuleClassifier
from fic.conversation.simulator import make_conversations, play
from fic.conversation.users import VerbatimUser
from fic.core.config import load_config
from fic.core.generation import SamplingParams
from fic.training.data import IGNORE
from fic.training.vasd.config import VASDConfig
from fic.training.vasd.rows import gold_row
from fic.training.vasd.terms.corrections import correction_rows


def test_a_correction_continues_the_students_own_context_with_the_gold_replies(smollm2_tokenizer):
    """terms.corrections.weight: a rollout that answered at turn 2 of 4 keeps its own ids up to that
    turn's prompt; from there the gold early reply, the user's next turn, and the gold answer,
    each gold reply trained, nothing of the student's premature answer left. A rollout that waited
    but ended wrong gets the gold answer in its own context."""
    from fic import tasks
    from fic.core.chat import prompt_ids, reply_ids

    cfg = load_config(VASDConfig, None, ["anchor.share=0", "terms.corrections.weight=1.0", "train.max_steps=1"])
    task = tasks.get("math")
    backend = FunctionBackend(lambda p: "So 4 * 40 * 21 = 3360.\n#### 3360" if "40 games" in p else "Go on.",
                              smollm2_tokenizer)  # premature at turn index 2
    (conv,) = make_conversations([ara()], ["sharded"], 1)
    play([conv], backend, VerbatimUser(), RuleClassifier(), SamplingParams(max_new_tokens=64), stop_at_correct=False)
    (row,) = correction_rows(cfg, conv, smollm2_tokenizer)
    start = conv.turns[2].prompt_tokens
    assert row.ids[:start] == conv.ids[:start] and len(row.spans) == 2 and row.spans[0][0] == start
    ask = smollm2_tokenizer.decode(row.ids[row.spans[0][0]:row.spans[0][1]], skip_special_tokens=True)
    final = row.ids[row.spans[1][0]:row.spans[1][1]]
    assert "3360" not in ask and "####" not in ask
    assert final == reply_ids(smollm2_tokenizer, task.gold_reply(ara()))
    between = smollm2_tokenizer.decode(row.ids[row.spans[0][1]:row.spans[1][0]])
    assert conv.turns[3].user in between and "3360" not in between  # the user's turn, not the student's answer
    # With text-faithful ids the row is exactly the rendered gold conversation.
    gold = conv.messages[:6] + [{"role": "assistant", "content": ask}, {"role": "user", "content": conv.turns[3].user}]
    assert row.ids[:row.spans[1][0]] == prompt_ids(smollm2_tokenizer, gold)
    trained = gold_row("corrections", row, 0, 1.0)
    targets = [y for y in trained["targets"]["corrections"] if y != IGNORE]
    assert targets == row.ids[row.spans[0][0]:row.spans[0][1]] + final

    wrong = FunctionBackend(lambda p: "So the total is 7.\n#### 7" if "21 points" in p else "Go on.", smollm2_tokenizer)
    (conv,) = make_conversations([ara()], ["sharded"], 1)
    play([conv], wrong, VerbatimUser(), RuleClassifier(), SamplingParams(max_new_tokens=64), stop_at_correct=False)
    (row,) = correction_rows(cfg, conv, smollm2_tokenizer)
    assert row.ids == conv.ids[:conv.turns[-1].prompt_tokens] + final and len(row.spans) == 1
    assert correction_rows(cfg, played(smollm2_tokenizer), smollm2_tokenizer) == []  # right, and on time
