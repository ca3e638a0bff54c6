"""VASD's rows (`fic.training.vasd.rows`): the student's and the teacher's answer tokens line up
token for token, each term's targets sit exactly where they should (anchor, reference,
divergence), and gold rows riding on their rollout's row as branches train exactly as separate rows."""

from __future__ import annotations

import pytest
import torch
from scripted import FunctionBackend
from templates import LLAMA3, QWEN25
from vasd_played import ara, final_only, played, with_template

from fic.conversation.classify import RuleClassifier
from fic.conversation.simulator import make_conversations, play
from fic.conversation.users import VerbatimUser
from fic.core.chat import end_of_turn_ids, prompt_ids
from fic.core.config import load_config
from fic.core.errors import FicError
from fic.core.generation import SamplingParams
from fic.data.views import system_message
from fic.training.data import IGNORE, render_examples
from fic.training.vasd.batches import body_inputs, collate_rows
from fic.training.vasd.config import VASDConfig
from fic.training.vasd.prompts import teacher_prompts
from fic.training.vasd.rows import (
    anchor_row,
    gold_row,
    reply_targets,
    rollout_from,
    runs_of,
    shared_prefix_rows,
    student_row,
    teacher_pairs,
)
from fic.training.vasd.terms import run_terms
from fic.training.vasd.terms.corrections import correction_rows
from fic.training.vasd.terms.labels import label_rows
from fic.training.vasd.window import own_tables

# Always opens with its own system block (as Llama 3.1 writes its knowledge-cutoff header),
# whatever system message the conversation brings.
SELF_SYSTEM = "{{- '<|im_start|>system\\nCutting Knowledge Date: 2023<|im_end|>\\n' }}" + QWEN25


@pytest.mark.parametrize("template", [None, LLAMA3, SELF_SYSTEM], ids=["chatml", "llama3", "adds-own-system"])
def test_student_and_teacher_answer_tokens_line_up(smollm2_tokenizer, template):
    tok = with_template(smollm2_tokenizer, template)
    conv = played(tok)
    rollout = rollout_from(conv)
    (prompt,) = teacher_prompts(tok, conv.instance, ["full"])
    final_only(rollout, [prompt])
    ((_, reply),) = teacher_pairs(rollout, 0)
    teacher = prompt + reply
    targets, weights = reply_targets(rollout)
    positions = [t for t, y in enumerate(targets) if y != IGNORE]
    assert {weights[t] for t in positions} == {1.0} and sum(weights) == len(positions)
    # Student position t predicts ids[t + 1]; teacher position q - 1 + j predicts its answer token j.
    assert [rollout.ids[t + 1] for t in positions] == rollout.answer_ids == teacher[len(prompt):]
    assert tok.decode(rollout.answer_ids, skip_special_tokens=False).startswith("So 4 * 40 * 21 = 3360.")
    assert rollout.answer_ids[-1] in end_of_turn_ids(tok)
    # The teacher's prompt is the rendering of the single-turn view, ending in the generation prompt.
    assert prompt == prompt_ids(tok, [system_message(conv.instance), {"role": "user", "content": ara().fields["question"]}])


def test_regulariser_covers_exactly_the_non_final_assistant_tokens(smollm2_tokenizer):
    tok = smollm2_tokenizer
    record = {"messages": [
        {"role": "system", "content": "Be brief.", "train": False},
        {"role": "user", "content": "Ara played for 4 years."},
        {"role": "assistant", "content": "Got it. What else?", "train": True},
        {"role": "user", "content": "She played 40 games every year."},
        {"role": "assistant", "content": "Noted. How many points a game?", "train": True},
        {"role": "user", "content": "21 points a game. Total?"},
        {"role": "assistant", "content": "#### 3360", "train": True}]}
    (anchor,), _ = render_examples([record], tok, max_seq_len=4096, progress=False, targets="non_final")
    conv = played(tok)
    rollout = rollout_from(conv)
    cfg = load_config(VASDConfig, None, ["terms.reference.weight=1", "terms.reference.first_tokens=2",
                                         "terms.reference.first_token_weight=5", "anchor.path=sft.jsonl",
                                         "train.max_steps=1"])
    roll_row = student_row(rollout.ids, own_tables(cfg, final_only(rollout), run_terms(cfg, anchors=True)))
    kept = anchor_row(anchor, 2, 5.0)
    trained = [y for y in kept["targets"]["anchor"] if y != IGNORE]
    assert tok.decode(trained, skip_special_tokens=False) == "Got it. What else?<|im_end|>Noted. How many points a game?<|im_end|>"
    assert len(runs_of(anchor.targets)) == 2
    weights = [w for w in kept["weights"]["anchor"] if w]
    assert weights.count(5.0) == 4 and set(weights) == {1.0, 5.0}  # the first 2 tokens of each of the 2 turns
    assert set(kept["targets"]) == {"anchor"}  # no divergence and no reference on an anchor row
    # Rollout rows: the reference term covers the three earlier replies, distillation the final one.
    earlier = [y for y in roll_row["targets"]["reference"] if y != IGNORE]
    assert tok.decode(earlier, skip_special_tokens=False) == "Got it, go on.<|im_end|>" * 3
    reference_weights = [w for w in roll_row["weights"]["reference"] if w]
    assert reference_weights.count(5.0) == 2 * 3 and set(reference_weights) == {1.0, 5.0}
    assert set(roll_row["targets"]) == {"distill", "reference"}  # no anchor on a rollout row
    final = [y for y in roll_row["targets"]["distill"] if y != IGNORE]
    assert final == rollout.answer_ids and not {i for i, y in enumerate(roll_row["targets"]["distill"]) if y != IGNORE} \
        & {i for i, y in enumerate(roll_row["targets"]["reference"]) if y != IGNORE}


def test_default_anchor_keeps_the_final_answers_too(smollm2_tokenizer):
    """An anchor of deferrals alone taught the demo's model to defer on complete single-turn
    requests (P(full) 77% -> 4% in 12 steps); by default the anchor trains every assistant turn."""
    tok = smollm2_tokenizer
    assert VASDConfig().anchor.targets == "assistant"
    record = {"messages": [
        {"role": "user", "content": "Book a table."},
        {"role": "assistant", "content": "Which restaurant?", "train": True},
        {"role": "user", "content": "At Nopa."},
        {"role": "assistant", "content": "[book(place=\"Nopa\")]", "train": True}]}
    (anchor,), _ = render_examples([record], tok, max_seq_len=4096, progress=False,
                                   targets=VASDConfig().anchor.targets)
    row = anchor_row(anchor, 1, 3.0)
    trained = [y for y in row["targets"]["anchor"] if y != IGNORE]
    assert tok.decode(trained, skip_special_tokens=False) == 'Which restaurant?<|im_end|>[book(place="Nopa")]<|im_end|>'
    weights = [w for w in row["weights"]["anchor"] if w]
    assert weights.count(3.0) == 2  # the first token of the deferral and of the answer: both decisions
    with pytest.raises(FicError, match="anchor.targets"):
        load_config(VASDConfig, None, ["anchor.targets=final"])


def test_label_and_correction_rows_on_their_rollouts_row_train_exactly_as_separate_rows(smollm2_tokenizer):
    """train.share_prefixes: a rollout that answered at turns 1 and 2 of 4, distilled on its final
    reply, with deferral labels at both premature turns and a correction from the first, becomes
    one row: the rollout's ids, then each gold row's tokens after the prefix it shares with them,
    at the positions they have in their own rows. On a random model every term's loss and every
    gradient is that of the separate rows, and the shared context is computed once."""
    from transformers import LlamaConfig, LlamaForCausalLM

    cfg = load_config(VASDConfig, None, ["anchor.share=0", "terms.labels.weight=1.0", "terms.labels.select=premature",
                                         "terms.labels.max_turns=8", "terms.corrections.weight=1.0", "train.max_steps=1"])
    early = FunctionBackend(lambda p: "So it is 4 * 40 = 160.\n#### 160" if "4 years" in p else "Go on.",
                            smollm2_tokenizer)
    (conv,) = make_conversations([ara()], ["sharded"], 1)
    play([conv], early, VerbatimUser(), RuleClassifier(), SamplingParams(max_new_tokens=64), stop_at_correct=False)
    rollout = rollout_from(conv)
    final_only(rollout)
    labels, corrections = label_rows(cfg, conv, smollm2_tokenizer), correction_rows(cfg, conv, smollm2_tokenizer)
    assert len(labels) == 2 and len(corrections) == 1
    separate = [student_row(rollout.ids, {"distill": reply_targets(rollout)}),
                *(gold_row("labels", g, 2, 3.0) for g in labels), *(gold_row("corrections", g, 2, 3.0) for g in corrections)]
    (shared,) = shared_prefix_rows(separate)
    branch_points = [conv.turns[1].prompt_tokens, conv.turns[2].prompt_tokens, conv.turns[1].prompt_tokens]
    tails = [len(g.ids) - point for g, point in zip(labels + corrections, branch_points)]
    assert all(g.ids[:p] == conv.ids[:p] and g.ids[p] != conv.ids[p] for g, p in zip(labels + corrections,
                                                                                        branch_points))
    n = len(conv.ids)
    assert len(shared["input_ids"]) == n + sum(tails) < sum(len(r["input_ids"]) for r in separate)
    assert shared["segments"] == [0] * n + [1] * tails[0] + [2] * tails[1] + [3] * tails[2]
    start = n
    for g, point, tail in zip(labels + corrections, branch_points, tails):
        assert shared["input_ids"][start:start + tail] == g.ids[point:]
        assert shared["position_ids"][start:start + tail] == list(range(point, len(g.ids)))
        assert shared["limits"][start:start + tail] == [point] * tail
        start += tail

    torch.manual_seed(0)
    model = LlamaForCausalLM(LlamaConfig(vocab_size=len(smollm2_tokenizer), hidden_size=32, intermediate_size=64,
                                         num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2))
    other = {"input_ids": separate[1]["input_ids"][:40],  # a row without branches beside one with
             "targets": {"labels": separate[1]["targets"]["labels"][:40]},
             "weights": {"labels": separate[1]["weights"]["labels"][:40]}}

    def terms(rows):
        batch = collate_rows(rows, smollm2_tokenizer.pad_token_id, 64, ["distill", "labels", "corrections"])
        model.zero_grad()
        hidden = model.model(input_ids=batch["input_ids"], **body_inputs(batch)).last_hidden_state
        logp = torch.log_softmax(model.lm_head(hidden).float(), -1)
        out = {}
        for term in ("labels", "corrections"):
            t, w = batch["targets"][term], batch["weights"][term]
            where = t != IGNORE
            out[term] = -(logp[where].gather(1, t[where][:, None])[:, 0] * w[where]).sum()
        where = batch["targets"]["distill"] != IGNORE
        out["distill_hidden"] = hidden[where]
        sum(out[term] for term in ("labels", "corrections")).backward()
        out["grads"] = [p.grad.clone() for p in model.parameters()]
        return {**out, "labels": out["labels"].item(), "corrections": out["corrections"].item()}

    a, b = terms(separate + [other]), terms([shared, other])
    for term in ("labels", "corrections"):
        assert a[term] > 0 and b[term] == pytest.approx(a[term], rel=1e-5)
    assert torch.allclose(a["distill_hidden"], b["distill_hidden"], atol=1e-5)
    assert all(torch.allclose(x, y, atol=1e-6, rtol=1e-4) for x, y in zip(a["grads"], b["grads"]))
