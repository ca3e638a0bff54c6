"""A VASD step's window before any model runs (`fic.training.vasd.window`): what is left out of
the divergence and counted, a micro-batch with nothing to train still run, and the length groups
that cut the rows into micro-batches with the least padding."""

from __future__ import annotations

import pytest
import torch
from scripted import FunctionBackend
from vasd_played import ara, played, window

from fic.conversation.classify import RuleClassifier
from fic.conversation.simulator import make_conversations, play
from fic.conversation.users import VerbatimUser
from fic.core.config import load_config
from fic.core.generation import SamplingParams
from fic.training.data import IGNORE
from fic.training.vasd.config import VASDConfig
from fic.training.vasd.loss import DistillLoss
from fic.training.vasd.teacher import teacher_parts
from fic.training.vasd.terms import run_terms
from fic.training.vasd.window import length_groups


def test_truncated_and_unfinished_rollouts_are_counted_not_distilled(tiny_model_dir, smollm2_tokenizer):
    from fic.core.model import load_model

    model = load_model(tiny_model_dir, dtype="float32").eval()
    conv = played(smollm2_tokenizer, final="a long final reply " * 20, max_new_tokens=8)
    assert conv.turns[-1].finish_reason == "length"
    cfg = load_config(VASDConfig, None, ["anchor.share=0", "train.max_steps=1", "train.micro_batch_size=1"])
    (batch,), left_out = window(cfg, [conv], smollm2_tokenizer, teacher_parts(cfg, model))
    assert left_out["truncated_final"] == 1 and int((batch["targets"]["distill"] != IGNORE).sum()) == 0
    assert left_out["rollouts"] == 1
    assert batch["hidden"]["teacher"].shape[0] == 0
    cfg.loss.keep_truncated = True
    (batch,), left_out = window(cfg, [conv], smollm2_tokenizer, teacher_parts(cfg, model))
    assert int((batch["targets"]["distill"] != IGNORE).sum()) == 8 == batch["hidden"]["teacher"].shape[0]
    assert left_out["truncated_final"] == 0 == left_out["rollouts"]  # distilled, so not left out


@pytest.mark.filterwarnings("ignore:Model has `tie_word_embeddings=True`")
def test_a_micro_batch_with_no_usable_rollout_still_runs_and_contributes_zero(tiny_model_dir, smollm2_tokenizer):
    """A rollout cut by rollout.max_conversation_tokens in a micro-batch without an anchor used to
    drop that micro-batch, so the window had fewer than grad_accum_steps passes and the run died
    (and died again on resume, rollouts being seeded by step). Now the micro-batch runs as one
    untrained token: G batches always, its terms zero, with gradients (bf16, LoRA on the head:
    the chunked path, whose empty teacher rows must share the weights' dtype)."""
    from peft import LoraConfig, get_peft_model

    from fic.core.model import load_model

    model = get_peft_model(load_model(tiny_model_dir, dtype="bfloat16"),
                           LoraConfig(r=4, target_modules=["q_proj", "lm_head"], lora_dropout=0.0))
    backend = FunctionBackend(lambda prompt: "Got it, go on.", smollm2_tokenizer)
    (cut,) = make_conversations([ara("cut")], ["sharded"], 1)
    play([cut], backend, VerbatimUser(), RuleClassifier(), SamplingParams(max_new_tokens=8), stop_at_correct=False,
         max_context=len(played(smollm2_tokenizer).ids) - 20)
    assert cut.stop_reason == "context_full"
    kept = played(smollm2_tokenizer)
    cfg = load_config(VASDConfig, None, ["anchor.share=0", "terms.reference.weight=1.0", "lora.enabled=true",
                                         "train.max_steps=1", "train.micro_batch_size=1", "train.grad_accum_steps=2"])
    parts = teacher_parts(cfg, model)
    batches, left_out = window(cfg, [cut, kept], smollm2_tokenizer, parts)
    assert len(batches) == 2
    assert left_out["cut_before_last_shard"] == 1 == left_out["rollouts"] == left_out["empty_micro_batches"]
    empty = batches[0]
    assert empty.pop("counts") == {"distill": 0.0, "reference": 0.0, "tokens": 0.0}
    assert empty["input_ids"].shape == (1, 1) and empty["hidden"]["teacher"].dtype == torch.bfloat16
    assert empty["hidden"]["reference"].shape[0] == 0
    loss = DistillLoss(model, run_terms(cfg, anchors=False), parts.heads, chunk_tokens=4, top_k=8)
    terms = loss(**empty)
    assert all(float(t.detach()) == 0.0 for t in terms.values())
    sum(terms.values()).backward()
    trained = [p for p in model.parameters() if p.requires_grad]
    assert all(p.grad is not None and not p.grad.any() for p in trained)  # every rank's same backward, adding 0


def test_length_groups_cut_the_sorted_rows_with_the_least_padding():
    from itertools import combinations


    lengths = [700, 120, 90, 640, 110, 95, 680, 100]
    groups = length_groups(lengths, 2)
    assert sorted(i for g in groups for i in g) == list(range(len(lengths)))
    def padded(gs):
        return sum(len(g) * max(lengths[i] for i in g) for g in gs if g)
    order = sorted(range(len(lengths)), key=lambda i: lengths[i])
    best = min(padded([order[:c], order[c:]]) for c in range(len(order) + 1))
    assert padded(groups) == best == 3 * 700 + 5 * 120
    assert all(len(g) == 0 for g in length_groups([], 3)) and len(length_groups([], 3)) == 3
    for count in (1, 3, 4):  # every cut of the sorted order is no better
        got = length_groups(lengths, count)
        cuts = [padded([order[a:b] for a, b in zip((0,) + c, c + (len(order),))])
                for c in combinations(range(len(order) + 1), count - 1) if list(c) == sorted(c)]
        assert padded(got) == min(cuts)


def test_length_groups_count_the_width_the_rows_are_collated_at():
    from itertools import combinations

    from fic.training.data import padded_width

    # one step's student rows, measured (2026-12-04): cut by raw lengths, 333 and 329 set the
    # shorter run's width to 384 when padded to 64; cut by collated widths, it stays at 320
    lengths = [298, 259, 313, 231, 333, 329, 289, 318, 382, 442, 349, 362]

    def collated(gs):
        return sum(len(g) * padded_width([lengths[i] for i in g], 64) for g in gs if g)
    assert collated(length_groups(lengths, 2)) == 8 * 384 + 4 * 448
    got = length_groups(lengths, 2, multiple=64)
    assert sorted(i for g in got for i in g) == list(range(len(lengths)))
    assert collated(got) == 6 * 320 + 6 * 448
    order = sorted(range(len(lengths)), key=lambda i: lengths[i])
    for count in (1, 2, 3):  # every cut of the sorted order is no better at the collated widths
        cuts = [collated([order[a:b] for a, b in zip((0,) + c, c + (len(order),))])
                for c in combinations(range(len(order) + 1), count - 1)]
        assert collated(length_groups(lengths, count, multiple=64)) == min(cuts)
