"""VASD's loss module (`fic.training.vasd.loss.DistillLoss`): the chunked divergence at the
distilled tokens against one full-logits computation, zero when both sides read the same
context, and the teacher's and reference's heads kept out of the trained module."""

from __future__ import annotations

import copy

import pytest
import torch
from test_losses import naive
from vasd_played import final_only, played, window

from fic.core.config import load_config
from fic.training.data import IGNORE
from fic.training.vasd.batches import collate_rows
from fic.training.vasd.config import VASDConfig
from fic.training.vasd.loss import DistillLoss
from fic.training.vasd.prompts import teacher_prompts
from fic.training.vasd.rows import reply_targets, rollout_from, student_row
from fic.training.vasd.teacher import teacher_parts
from fic.training.vasd.term import DIVERGENCE, Term
from fic.training.vasd.terms import run_terms

DISTILL = Term("distill", DIVERGENCE, "divergence_per_token", 1.0, reads="teacher")

pytestmark = pytest.mark.usefixtures("fresh_accelerate_state")


@pytest.mark.slow  # full logits over long sequences
def test_distill_loss_in_chunks_equals_one_full_logits_computation(tiny_model_dir, smollm2_tokenizer):
    """The chunked, head-only-at-answer-rows loss equals the divergence computed from full logits
    of both passes, in value and in every weight's gradient."""
    from fic.core.model import load_model

    model = load_model(tiny_model_dir, dtype="float32").double().train()  # float64: compare formulas, not rounding
    reference = copy.deepcopy(model)
    conv = played(smollm2_tokenizer)
    rollout = rollout_from(conv)
    (prompt,) = teacher_prompts(smollm2_tokenizer, conv.instance, ["full"])
    final_only(rollout, [prompt])
    batch = collate_rows([student_row(rollout.ids, {"distill": reply_targets(rollout)})],
                         smollm2_tokenizer.pad_token_id, names=["distill"])
    teacher_ids = torch.tensor([prompt + rollout.answer_ids])
    q, r = len(prompt), len(rollout.answer_ids)
    with torch.no_grad():
        body = model.get_decoder()
        teacher_hidden = body(input_ids=teacher_ids).last_hidden_state[0, q - 1:q - 1 + r]
        teacher_logits = reference(input_ids=teacher_ids).logits[0, q - 1:q - 1 + r]
    loss = DistillLoss(model, [DISTILL], {"teacher": model.get_output_embeddings()}, chunk_tokens=3, top_k=8)
    terms = loss(**batch, hidden={"teacher": teacher_hidden[:, None]})
    p = rollout.final[0]
    student_logits = reference(input_ids=batch["input_ids"]).logits[0, p - 1:p - 1 + r]
    want = naive("forward_kl", student_logits, teacher_logits).sum()
    assert terms["distill"].item() == pytest.approx(want.item(), rel=1e-9)
    (0.37 * terms["distill"]).backward()  # window_backward scales every term: gradients must follow
    (0.37 * want).backward()
    for (name, a), b in zip(model.named_parameters(), reference.parameters()):
        assert torch.allclose(a.grad, b.grad, atol=1e-12, rtol=1e-7), name


def test_loss_is_zero_when_the_teacher_reads_the_students_own_context(tiny_model_dir, smollm2_tokenizer, monkeypatch):
    """With the teacher's prompt replaced by the student's own conversation, both sides read the
    same positions of the same ids with the same weights: the divergence must vanish. Any
    off-by-one between the two layouts would make it positive."""
    from fic.core.model import load_model
    from fic.training.vasd import window as window_module

    model = load_model(tiny_model_dir, dtype="float32").eval()
    conv = played(smollm2_tokenizer)
    rollout = rollout_from(conv)
    monkeypatch.setattr(window_module, "teacher_prompts", lambda tok, inst, views: [rollout.ids[:rollout.final[0]]])
    cfg = load_config(VASDConfig, None, ["anchor.share=0", "teacher.mode=live", "train.max_steps=1",
                                         "train.micro_batch_size=1"])
    parts = teacher_parts(cfg, model)
    (batch,), left_out = window(cfg, [conv], smollm2_tokenizer, parts)
    batch.pop("counts")
    loss = DistillLoss(model, run_terms(cfg, anchors=False), parts.heads, chunk_tokens=4, top_k=8)
    terms = loss(**batch)
    assert int((batch["targets"]["distill"] != IGNORE).sum()) == len(rollout.answer_ids) > 5
    assert abs(terms["distill"].item()) < 1e-5
    monkeypatch.undo()  # the real single-turn view differs from the conversation: a positive divergence
    (batch,), _ = window(cfg, [conv], smollm2_tokenizer, parts)
    batch.pop("counts")
    assert loss(**batch)["distill"].item() > 1e-3
    assert left_out["rollouts"] == 0


@pytest.mark.parametrize("mode, reference", [("frozen", True), ("live", True), ("ema", False)])
def test_teacher_and_reference_heads_stay_out_of_the_state_dict_and_optimizer(tiny_model_dir, mode, reference):
    """A frozen or EMA copy's head handed to DistillLoss as a module was registered as a submodule:
    it went into every checkpoint and into the DDP/DeepSpeed module."""
    from fic.core.model import load_model
    from fic.training.loop import make_optimizer

    model = load_model(tiny_model_dir, dtype="float32").train()
    cfg = load_config(VASDConfig, None, [f"teacher.mode={mode}", f"terms.reference.weight={float(reference)}",
                                         "anchor.path=sft.jsonl", "train.max_steps=1"])
    parts = teacher_parts(cfg, model)
    loss = DistillLoss.for_run(cfg, model, parts.heads, anchors=True)
    assert loss.heads["teacher"] is parts.head and loss.heads.get("reference") is parts.ref_head
    assert [t.name for t in loss.terms] == ["distill", "anchor", *(["reference"] if reference else [])]
    assert all(key.startswith("model.") for key in loss.state_dict())
    assert [id(p) for p in loss.parameters()] == [id(p) for p in model.parameters()]
    optimizer = make_optimizer(loss, cfg.optim)
    optimized = {id(p) for group in optimizer.param_groups for p in group["params"]}
    assert optimized == {id(p) for p in model.parameters() if p.requires_grad}
    if parts.copy is not None:
        assert not {id(p) for p in parts.copy.parameters()} & {id(p) for p in loss.parameters()}
