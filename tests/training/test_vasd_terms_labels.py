"""On-policy deferral labels (`fic/training/vasd/terms/labels.py`): the student's own context at
its earlier turns, a gold ask or deferral after it, chosen by `terms.labels.select`."""

from __future__ import annotations

from actions_instances import late_optional_instance
from scripted import FunctionBackend
from vasd_played import ara

from fic.conversation.classify import RuleClassifier
from fic.conversation.simulator import make_conversations, play
from fic.conversation.users import VerbatimUser
from fic.core.config import load_config
from fic.core.generation import SamplingParams
from fic.training.data import IGNORE
from fic.training.vasd.config import VASDConfig
from fic.training.vasd.rows import gold_row
from fic.training.vasd.terms.labels import label_rows


def test_deferral_labels_train_only_the_students_earlier_turns_on_a_gold_early_reply(smollm2_tokenizer):
    from fic.core.chat import reply_ids

    backend = FunctionBackend(lambda p: "So 4 * 40 * 21 = 3360.\n#### 3360" if "40 games" in p else "Go on.",
                              smollm2_tokenizer)  # answers (prematurely) from turn 3 on
    (conv,) = make_conversations([ara()], ["sharded"], 1)
    play([conv], backend, VerbatimUser(), RuleClassifier(), SamplingParams(max_new_tokens=64), stop_at_correct=False)
    assert [t.label for t in conv.turns] == ["discussion", "discussion", "answer_attempt", "answer_attempt"]
    cfg = load_config(VASDConfig, None, ["anchor.share=0", "terms.labels.weight=1.0", "terms.labels.max_turns=2",
                                         "train.max_steps=1", "train.micro_batch_size=1"])
    rows = label_rows(cfg, conv, smollm2_tokenizer)
    assert len(rows) == 2 and all(len(r.spans) == 1 for r in rows)
    contexts = [r.ids[:r.spans[0][0]] for r in rows]
    assert len(contexts[-1]) == conv.turns[2].prompt_tokens  # the premature answer's state comes first
    for row, context in zip(rows, contexts):
        assert context == conv.ids[:len(context)]  # the student's own ids, as it saw them
        assert any(context == conv.ids[:t.prompt_tokens] for t in conv.turns[:-1])  # never the last turn
        reply = row.ids[row.spans[0][0]:row.spans[0][1]]
        text = smollm2_tokenizer.decode(reply, skip_special_tokens=True)
        assert reply == reply_ids(smollm2_tokenizer, text) and "####" not in text and "3360" not in text
    label_row = gold_row("labels", rows[0], 0, 1.0)
    trained = [y for y in label_row["targets"]["labels"] if y != IGNORE]
    assert trained == rows[0].ids[rows[0].spans[0][0]:] and set(label_row["targets"]) == {"labels"}
    assert label_rows(load_config(VASDConfig, None, ["anchor.share=0", "train.max_steps=1"]), conv,
                      smollm2_tokenizer) == []  # off by default


def test_labels_at_every_premature_turn_and_else_at_the_last_non_final_turn(smollm2_tokenizer):
    """labels.select=premature: each premature answer gets a label (turns 1 and 2 here), and a
    rollout with none gets one at the turn before its final one."""
    cfg = load_config(VASDConfig, None, ["anchor.share=0", "terms.labels.weight=1.0", "terms.labels.select=premature",
                                         "terms.labels.max_turns=8", "train.max_steps=1"])
    early = FunctionBackend(lambda p: "So it is 4 * 40 = 160.\n#### 160" if "4 years" in p else "Go on.",
                            smollm2_tokenizer)  # answers from turn 2 on (indices 1, 2 premature)
    patient = FunctionBackend(lambda p: "So 4 * 40 * 21 = 3360.\n#### 3360" if "21 points" in p else "Go on.",
                              smollm2_tokenizer)
    for backend, labelled in ((early, [1, 2]), (patient, [2])):
        (conv,) = make_conversations([ara()], ["sharded"], 1)
        play([conv], backend, VerbatimUser(), RuleClassifier(), SamplingParams(max_new_tokens=64),
             stop_at_correct=False)
        rows = label_rows(cfg, conv, smollm2_tokenizer)
        assert [r.spans[0][0] for r in rows] == [conv.turns[k].prompt_tokens for k in labelled]


def test_unanswerable_labels_go_only_to_calls_made_before_every_required_argument(smollm2_tokenizer):
    """terms.labels.select=unanswerable: a student that calls at every turn gets a deferral label at
    each call made while a required argument was missing, none at the call made once the request
    was complete but an optional argument was still to come, and none when nothing was premature."""
    from fic import tasks

    instance, order, required = late_optional_instance()
    complete = max(order.index(p) for p in required) + 1  # the turn index whose shard completes the required ones
    gold = tasks.get("actions").gold_reply(instance)
    cfg = load_config(VASDConfig, None, ["anchor.share=0", "terms.labels.weight=1.0",
                                         "terms.labels.select=unanswerable", "terms.labels.max_turns=8",
                                         "train.max_steps=1"])
    (conv,) = make_conversations([instance], ["sharded"], 1)
    play([conv], FunctionBackend(lambda p: gold, smollm2_tokenizer), VerbatimUser(), RuleClassifier(),
         SamplingParams(max_new_tokens=64), stop_at_correct=False)
    last = len(conv.turns) - 1
    assert all(t.label == "answer_attempt" for t in conv.turns) and complete < last
    rows = label_rows(cfg, conv, smollm2_tokenizer)
    assert [r.spans[0][0] for r in rows] == [conv.turns[k].prompt_tokens for k in range(complete)]

    (patient,) = make_conversations([instance], ["sharded"], 1)
    play([patient], FunctionBackend(lambda p: gold if p.count("<|im_start|>user") > last else "Go on.",
                                    smollm2_tokenizer), VerbatimUser(), RuleClassifier(), SamplingParams(max_new_tokens=64),
         stop_at_correct=False)
    assert patient.turns[-1].label == "answer_attempt" and label_rows(cfg, patient, smollm2_tokenizer) == []
