"""VASD: divergences against naive references, token alignment of student and teacher, the
regulariser's positions, teacher modes, resume after SIGKILL, 2 processes vs 1, and errors."""

from __future__ import annotations

import copy
import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from actions_instances import late_optional_instance
from scripted import FunctionBackend
from templates import LLAMA3, QWEN25

from fic.conversation.classify import RuleClassifier
from fic.conversation.simulator import make_conversations, play
from fic.conversation.users import VerbatimUser
from fic.core.chat import end_of_turn_ids, prompt_ids
from fic.core.config import load_config
from fic.core.errors import FicError
from fic.core.generation import SamplingParams
from fic.core.instance import Instance, Shard
from fic.data.views import system_message
from fic.train_vasd import train
from fic.training.data import IGNORE, render_examples
from fic.training.loop import KILL_ENV
from fic.training.losses import divergence
from fic.training.vasd.config import VASDConfig
from fic.training.vasd.distill import DistillLoss, collate_rows, rollout_from, runs_of, student_rows, teacher_prompts
from fic.training.vasd.step import step_batches
from fic.training.vasd.teacher import EmaTeacher, teacher_parts

ROOT = Path(__file__).resolve().parents[2]
RECIPE = ROOT / "recipes" / "smollm2-135m-instruct" / "vasd.yaml"

# Always opens with its own system block (as Llama 3.1 writes its knowledge-cutoff header),
# whatever system message the conversation brings.
SELF_SYSTEM = "{{- '<|im_start|>system\\nCutting Knowledge Date: 2023<|im_end|>\\n' }}" + QWEN25


pytestmark = pytest.mark.usefixtures("fresh_accelerate_state")


def ara(task_id: str = "ara") -> Instance:
    shards = ["How many points did Ara score in total?", "Ara played for 4 years.", "She played 40 games every year.",
              "She scored 21 points in each game."]
    return Instance(task_id, "math", [Shard(i + 1, s) for i, s in enumerate(shards)],
                    {"question": "Ara played 4 years, 40 games a year, 21 points a game. How many points in total?",
                     "answer": "40*4*21 = 3360\n#### 3360"})


def played(tokenizer, final: str = "So 4 * 40 * 21 = 3360.\n#### 3360", max_new_tokens: int = 64):
    """A sharded conversation played token-in/token-out by a scripted assistant."""
    backend = FunctionBackend(lambda prompt: final if "21 points" in prompt else "Got it, go on.", tokenizer)
    (conv,) = make_conversations([ara()], ["sharded"], 1)
    play([conv], backend, VerbatimUser(), RuleClassifier(), SamplingParams(max_new_tokens=max_new_tokens),
         stop_at_correct=False)
    return conv


def no_autocast():
    return torch.autocast("cpu", enabled=False)


def with_template(tokenizer, template):
    tok = copy.deepcopy(tokenizer)
    if template is not None:
        tok.chat_template = template
    if template is LLAMA3:  # its markup tokens, as a Llama 3 tokenizer has them
        tok.add_tokens(["<|begin_of_text|>", "<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>"],
                       special_tokens=True)
        tok.bos_token, tok.eos_token = "<|begin_of_text|>", "<|eot_id|>"
    return tok


# --------------------------------------------------------------------------- divergences

def naive(kind, s_logits, t_logits, beta=0.5, temperature=1.0):
    """Textbook formulas on full softmaxes, written independently of fic.training.losses."""
    p_s = torch.softmax(s_logits / temperature, -1)
    p_t = torch.softmax(t_logits / temperature, -1)
    if kind == "forward_kl":
        return (p_t * (p_t.log() - p_s.log())).sum(-1)
    if kind == "reverse_kl":
        return (p_s * (p_s.log() - p_t.log())).sum(-1)
    m = beta * p_t + (1 - beta) * p_s
    return beta * (p_t * (p_t / m).log()).sum(-1) + (1 - beta) * (p_s * (p_s / m).log()).sum(-1)


@pytest.mark.parametrize("kind", ["forward_kl", "reverse_kl", "jsd"])
@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_full_divergences_match_naive_values_and_gradients(kind, temperature):
    g = torch.Generator().manual_seed(0)
    s = torch.randn(6, 50, generator=g, dtype=torch.float64, requires_grad=True)
    t = torch.randn(6, 50, generator=g, dtype=torch.float64)
    s2 = s.detach().clone().requires_grad_(True)
    got = divergence(s, torch.log_softmax(t / temperature, -1), kind, beta=0.3, temperature=temperature)
    want = naive(kind, s2, t, beta=0.3, temperature=temperature)
    assert torch.allclose(got.double(), want, atol=1e-6)
    got.sum().backward()
    want.sum().backward()
    assert torch.allclose(s.grad, s2.grad, atol=1e-6)


def test_topk_with_tail_is_exact_when_the_tails_agree_and_close_otherwise():
    g = torch.Generator().manual_seed(1)
    s = torch.randn(4, 40, generator=g)
    same = divergence(s, torch.log_softmax(s, -1), "forward_kl", estimator="topk", top_k=5)
    assert torch.allclose(same, torch.zeros(4), atol=1e-6)
    # A teacher that differs only inside the student's top-k: the k+1 bins hold every difference.
    t = s.clone()
    top = s.topk(5, -1).indices
    t.scatter_(-1, top, s.gather(-1, top) + torch.randn(4, 5, generator=g))
    t_lp = torch.log_softmax(t, -1)
    p_t, p_s = t_lp.exp(), torch.softmax(s, -1)
    bins_t = torch.cat([p_t.gather(-1, top), 1 - p_t.gather(-1, top).sum(-1, keepdim=True)], -1)
    bins_s = torch.cat([p_s.gather(-1, top), 1 - p_s.gather(-1, top).sum(-1, keepdim=True)], -1)
    want = (bins_t * (bins_t / bins_s).log()).sum(-1)
    assert torch.allclose(divergence(s, t_lp, "forward_kl", estimator="topk", top_k=5), want, atol=1e-5)


def test_sampled_estimator_value_is_the_log_ratio_and_gradient_the_score_function():
    g = torch.Generator().manual_seed(2)
    s = torch.randn(5, 30, generator=g, dtype=torch.float64, requires_grad=True)
    t_lp = torch.log_softmax(torch.randn(5, 30, generator=g, dtype=torch.float64), -1)
    x = torch.randint(0, 30, (5,), generator=g)
    got = divergence(s, t_lp, "reverse_kl", estimator="sampled", sampled=x)
    s_lp = torch.log_softmax(s, -1)
    ratio = (s_lp.gather(-1, x[:, None]) - t_lp.gather(-1, x[:, None]))[:, 0]
    assert torch.allclose(got, ratio.detach())
    got.sum().backward()
    s2 = s.detach().clone().requires_grad_(True)
    surrogate = (ratio.detach() * torch.log_softmax(s2, -1).gather(-1, x[:, None])[:, 0]).sum()
    surrogate.backward()
    assert torch.allclose(s.grad, s2.grad)
    # Averaged over samples from the student it estimates KL(student || teacher).
    probs = torch.softmax(s.detach()[0], -1)
    draws = torch.multinomial(probs, 20000, replacement=True, generator=g)
    estimate = divergence(s.detach()[0].expand(20000, -1), t_lp[0].expand(20000, -1), "reverse_kl",
                          estimator="sampled", sampled=draws).mean()
    assert estimate.item() == pytest.approx(naive("reverse_kl", s.detach()[:1], t_lp[:1])[0].item(), abs=0.05)
    with pytest.raises(FicError, match="reverse_kl only"):
        divergence(s, t_lp, "forward_kl", estimator="sampled", sampled=x)


@pytest.mark.slow  # full logits over long sequences
def test_distill_loss_in_chunks_equals_one_full_logits_computation(tiny_model_dir, smollm2_tokenizer):
    """The chunked, head-only-at-answer-rows loss equals the divergence computed from full logits
    of both passes, in value and in every weight's gradient."""
    from fic.core.model import load_model

    model = load_model(tiny_model_dir, dtype="float32").double().train()  # float64: compare formulas, not rounding
    reference = copy.deepcopy(model)
    conv = played(smollm2_tokenizer)
    rollout = rollout_from(conv)
    rollout.teacher_prompts = teacher_prompts(smollm2_tokenizer, conv.instance, ["full"])
    batch = collate_rows(student_rows([final_only(rollout)], [], reference=False, first_tokens=0,
                                      first_weight=1.0), smollm2_tokenizer.pad_token_id)
    teacher_ids = torch.tensor([rollout.teacher_prompts[0] + rollout.answer_ids])
    q, r = len(rollout.teacher_prompts[0]), len(rollout.answer_ids)
    with torch.no_grad():
        body = model.get_decoder()
        teacher_hidden = body(input_ids=teacher_ids).last_hidden_state[0, q - 1:q - 1 + r]
        teacher_logits = reference(input_ids=teacher_ids).logits[0, q - 1:q - 1 + r]
    loss = DistillLoss(model, model.get_output_embeddings(), None, divergence="forward_kl", estimator="full", beta=0.5,
                       temperature=1.0, top_k=8, chunk_tokens=3)
    terms = loss(**batch, teacher_hidden=teacher_hidden[:, None])
    p = rollout.final[0]
    student_logits = reference(input_ids=batch["input_ids"]).logits[0, p - 1:p - 1 + r]
    want = naive("forward_kl", student_logits, teacher_logits).sum()
    assert terms["distill"].item() == pytest.approx(want.item(), rel=1e-9)
    (0.37 * terms["distill"]).backward()  # window_backward scales every term: gradients must follow
    (0.37 * want).backward()
    for (name, a), b in zip(model.named_parameters(), reference.parameters()):
        assert torch.allclose(a.grad, b.grad, atol=1e-12, rtol=1e-7), name


def final_only(rollout):
    """The paper's VASD: only the final reply is distilled, with weight 1."""
    rollout.distilled = [(rollout.final, 1.0)]
    return rollout


# --------------------------------------------------------------------------- token layout

@pytest.mark.parametrize("template", [None, LLAMA3, SELF_SYSTEM], ids=["chatml", "llama3", "adds-own-system"])
def test_student_and_teacher_answer_tokens_line_up(smollm2_tokenizer, template):
    tok = with_template(smollm2_tokenizer, template)
    conv = played(tok)
    rollout = rollout_from(conv)
    (prompt,) = teacher_prompts(tok, conv.instance, ["full"])
    teacher = prompt + rollout.answer_ids
    (row,) = student_rows([final_only(rollout)], [], reference=False, first_tokens=0, first_weight=1.0)
    positions = [t for t, y in enumerate(row["distill_targets"]) if y != IGNORE]
    # Student position t predicts ids[t + 1]; teacher position q - 1 + j predicts its answer token j.
    assert [rollout.ids[t + 1] for t in positions] == rollout.answer_ids == teacher[len(prompt):]
    assert tok.decode(rollout.answer_ids, skip_special_tokens=False).startswith("So 4 * 40 * 21 = 3360.")
    assert rollout.answer_ids[-1] in end_of_turn_ids(tok)
    # The teacher's prompt is the rendering of the single-turn view, ending in the generation prompt.
    assert prompt == prompt_ids(tok, [system_message(conv.instance), {"role": "user", "content": ara().fields["question"]}])


def test_loss_is_zero_when_the_teacher_reads_the_students_own_context(tiny_model_dir, smollm2_tokenizer, monkeypatch):
    """With the teacher's prompt replaced by the student's own conversation, both sides read the
    same positions of the same ids with the same weights: the divergence must vanish. Any
    off-by-one between the two layouts would make it positive."""
    from fic.core.model import load_model
    from fic.training.vasd import step

    model = load_model(tiny_model_dir, dtype="float32").eval()
    conv = played(smollm2_tokenizer)
    rollout = rollout_from(conv)
    monkeypatch.setattr(step, "teacher_prompts", lambda tok, inst, views: [rollout.ids[:rollout.final[0]]])
    cfg = load_config(VASDConfig, None, ["regularizer.kind=none", "teacher.mode=live", "train.max_steps=1",
                                         "train.micro_batch_size=1"])
    parts = teacher_parts(cfg, model)
    (batch,), left_out = step_batches(cfg, [conv], [], smollm2_tokenizer, parts, device="cpu", autocast=no_autocast)
    batch.pop("counts")
    loss = DistillLoss(model, parts.head, None, divergence="forward_kl", estimator="full", beta=0.5,
                       temperature=1.0, top_k=8, chunk_tokens=4)
    terms = loss(**batch)
    assert int((batch["distill_targets"] != IGNORE).sum()) == len(rollout.answer_ids) > 5
    assert abs(terms["distill"].item()) < 1e-5
    monkeypatch.undo()  # the real single-turn view differs from the conversation: a positive divergence
    (batch,), _ = step_batches(cfg, [conv], [], smollm2_tokenizer, parts, device="cpu", autocast=no_autocast)
    batch.pop("counts")
    assert loss(**batch)["distill"].item() > 1e-3
    assert left_out["rollouts"] == 0


def test_truncated_and_unfinished_rollouts_are_counted_not_distilled(tiny_model_dir, smollm2_tokenizer):
    from fic.core.model import load_model

    model = load_model(tiny_model_dir, dtype="float32").eval()
    conv = played(smollm2_tokenizer, final="a long final reply " * 20, max_new_tokens=8)
    assert conv.turns[-1].finish_reason == "length"
    cfg = load_config(VASDConfig, None, ["regularizer.kind=none", "train.max_steps=1", "train.micro_batch_size=1"])
    (batch,), left_out = step_batches(cfg, [conv], [], smollm2_tokenizer, teacher_parts(cfg, model), device="cpu",
                                      autocast=no_autocast)
    assert left_out["truncated_final"] == 1 and int((batch["distill_targets"] != IGNORE).sum()) == 0
    assert left_out["rollouts"] == 1
    assert batch["teacher_hidden"].shape[0] == 0
    cfg.loss.keep_truncated = True
    (batch,), left_out = step_batches(cfg, [conv], [], smollm2_tokenizer, teacher_parts(cfg, model), device="cpu",
                                      autocast=no_autocast)
    assert int((batch["distill_targets"] != IGNORE).sum()) == 8 == batch["teacher_hidden"].shape[0]
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
    cfg = load_config(VASDConfig, None, ["regularizer.kind=reference", "lora.enabled=true", "train.max_steps=1",
                                         "train.micro_batch_size=1", "train.grad_accum_steps=2"])
    parts = teacher_parts(cfg, model)
    batches, left_out = step_batches(cfg, [cut, kept], [], smollm2_tokenizer, parts, device="cpu",
                                     autocast=no_autocast)
    assert len(batches) == 2
    assert left_out["cut_before_last_shard"] == 1 == left_out["rollouts"] == left_out["empty_micro_batches"]
    empty = batches[0]
    assert empty.pop("counts") == {"distill": 0.0, "anchor": 0.0, "labels": 0.0, "corrections": 0.0, "reference": 0.0,
                                   "reward": 0.0, "tokens": 0.0}
    assert empty["input_ids"].shape == (1, 1) and empty["teacher_hidden"].dtype == torch.bfloat16
    loss = DistillLoss(model, parts.head, parts.ref_head, divergence="forward_kl", estimator="full", beta=0.5,
                       temperature=1.0, top_k=8, chunk_tokens=4)
    terms = loss(**empty)
    assert all(float(t.detach()) == 0.0 for t in terms.values())
    sum(terms.values()).backward()
    trained = [p for p in model.parameters() if p.requires_grad]
    assert all(p.grad is not None and not p.grad.any() for p in trained)  # every rank's same backward, adding 0


# --------------------------------------------------------------------------- regulariser

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
    rows = student_rows([final_only(rollout)], [anchor], reference=True, first_tokens=2, first_weight=5.0)
    roll_row, anchor_row = rows
    trained = [y for y in anchor_row["anchor_targets"] if y != IGNORE]
    assert tok.decode(trained, skip_special_tokens=False) == "Got it. What else?<|im_end|>Noted. How many points a game?<|im_end|>"
    assert len(runs_of(anchor.targets)) == 2
    weights = [w for w in anchor_row["anchor_weights"] if w]
    assert weights.count(5.0) == 4 and set(weights) == {1.0, 5.0}  # the first 2 tokens of each of the 2 turns
    assert all(y == IGNORE for y in anchor_row["distill_targets"] + anchor_row["reference_targets"])
    # Rollout rows: the reference term covers the three earlier replies, distillation the final one.
    earlier = [y for y in roll_row["reference_targets"] if y != IGNORE]
    assert tok.decode(earlier, skip_special_tokens=False) == "Got it, go on.<|im_end|>" * 3
    assert all(y == IGNORE for y in roll_row["anchor_targets"])
    final = [y for y in roll_row["distill_targets"] if y != IGNORE]
    assert final == rollout.answer_ids and not {i for i, y in enumerate(roll_row["distill_targets"]) if y != IGNORE} \
        & {i for i, y in enumerate(roll_row["reference_targets"]) if y != IGNORE}


def test_default_anchor_keeps_the_final_answers_too(smollm2_tokenizer):
    """An anchor of deferrals alone taught the demo's model to defer on complete single-turn
    requests (P(full) 77% -> 4% in 12 steps); by default the anchor trains every assistant turn."""
    tok = smollm2_tokenizer
    assert VASDConfig().regularizer.anchor_targets == "assistant"
    record = {"messages": [
        {"role": "user", "content": "Book a table."},
        {"role": "assistant", "content": "Which restaurant?", "train": True},
        {"role": "user", "content": "At Nopa."},
        {"role": "assistant", "content": "[book(place=\"Nopa\")]", "train": True}]}
    (anchor,), _ = render_examples([record], tok, max_seq_len=4096, progress=False,
                                   targets=VASDConfig().regularizer.anchor_targets)
    rows = student_rows([], [anchor], reference=False, first_tokens=1, first_weight=3.0)
    trained = [y for y in rows[0]["anchor_targets"] if y != IGNORE]
    assert tok.decode(trained, skip_special_tokens=False) == 'Which restaurant?<|im_end|>[book(place="Nopa")]<|im_end|>'
    weights = [w for w in rows[0]["anchor_weights"] if w]
    assert weights.count(3.0) == 2  # the first token of the deferral and of the answer: both decisions
    with pytest.raises(FicError, match="anchor_targets"):
        load_config(VASDConfig, None, ["regularizer.anchor_targets=final"])


# --------------------------------------------------------------------------- teacher modes

def test_frozen_lora_teacher_runs_with_adapters_off_and_gets_no_gradient(tiny_model_dir, smollm2_tokenizer):
    from peft import LoraConfig, get_peft_model

    from fic.core.model import load_model
    from fic.training.vasd.distill import hidden_at

    base = load_model(tiny_model_dir, dtype="float32").eval()
    model = get_peft_model(copy.deepcopy(base), LoraConfig(r=4, target_modules=["q_proj", "v_proj"], lora_dropout=0.0))
    with torch.no_grad():  # trained adapters: the adapted model now differs from the base
        for name, p in model.named_parameters():
            if "lora_B" in name:
                p.normal_(0, 0.5)
    cfg = load_config(VASDConfig, None, ["lora.enabled=true", "teacher.mode=frozen", "regularizer.kind=reference",
                                         "train.max_steps=1"])
    parts = teacher_parts(cfg, model)
    assert parts.copy is None  # no second copy of the weights
    ids = [smollm2_tokenizer.encode("Ara played for 4 years and scored a lot.")]
    pos = [range(3, 8)]
    with parts.context():
        frozen = hidden_at(parts.net, ids, pos, 0, "cpu")
    adapted = hidden_at(model, ids, pos, 0, "cpu")
    plain = hidden_at(base, ids, pos, 0, "cpu")
    assert torch.allclose(frozen, plain, atol=1e-6) and not torch.allclose(adapted, plain, atol=1e-3)
    assert not frozen.requires_grad
    with parts.ref_context():
        assert torch.allclose(hidden_at(parts.ref_net, ids, pos, 0, "cpu"), plain, atol=1e-6)
    assert torch.allclose(hidden_at(model, ids, pos, 0, "cpu"), adapted)  # adapters are back on


@pytest.mark.parametrize("mode", ["live", "ema"])
def test_live_and_ema_teachers_get_no_gradient(tiny_model_dir, smollm2_tokenizer, mode):
    from fic.core.model import load_model

    model = load_model(tiny_model_dir, dtype="float32").train()
    cfg = load_config(VASDConfig, None, [f"teacher.mode={mode}", "regularizer.kind=none", "train.max_steps=1",
                                         "train.micro_batch_size=1"])
    parts = teacher_parts(cfg, model)
    conv = played(smollm2_tokenizer)
    (batch,), _ = step_batches(cfg, [conv], [], smollm2_tokenizer, parts, device="cpu", autocast=no_autocast)
    batch.pop("counts")
    assert not batch["teacher_hidden"].requires_grad
    loss = DistillLoss(model, parts.head, None, divergence="forward_kl", estimator="full", beta=0.5,
                       temperature=1.0, top_k=8, chunk_tokens=4)
    loss(**batch)["distill"].backward()
    if mode == "ema":
        assert all(p.grad is None for p in parts.copy.parameters())
        assert all(not p.requires_grad for p in parts.copy.parameters())
    # Same gradient as with the teacher's log-probs fed in as constants.
    grads = {n: p.grad.clone() for n, p in model.named_parameters()}
    model.zero_grad()
    with torch.no_grad():
        constant = parts.head(batch["teacher_hidden"][:, 0]).detach()
    loss_const = DistillLoss(model, lambda h, c=constant: c[:h.shape[0]] if h.shape[0] == c.shape[0] else c, None,
                             divergence="forward_kl", estimator="full", beta=0.5, temperature=1.0, top_k=8,
                             chunk_tokens=10_000)
    loss_const(**batch)["distill"].backward()
    for n, p in model.named_parameters():
        assert torch.allclose(p.grad, grads[n], atol=1e-6, rtol=1e-4), n


@pytest.mark.parametrize("mode, regularizer", [("frozen", "reference"), ("live", "reference"), ("ema", "anchor")])
def test_teacher_and_reference_heads_stay_out_of_the_state_dict_and_optimizer(tiny_model_dir, mode, regularizer):
    """A frozen or EMA copy's head handed to DistillLoss as a module was registered as a submodule:
    it went into every checkpoint and into the DDP/DeepSpeed module."""
    from fic.core.model import load_model
    from fic.training.loop import make_optimizer

    model = load_model(tiny_model_dir, dtype="float32").train()
    cfg = load_config(VASDConfig, None, [f"teacher.mode={mode}", f"regularizer.kind={regularizer}",
                                         "regularizer.anchor_path=sft.jsonl", "train.max_steps=1"])
    parts = teacher_parts(cfg, model)
    loss = DistillLoss(model, parts.head, parts.ref_head, divergence="forward_kl", estimator="full", beta=0.5,
                       temperature=1.0, top_k=8, chunk_tokens=4)
    assert loss.teacher_head is parts.head and loss.reference_head is parts.ref_head
    assert all(key.startswith("model.") for key in loss.state_dict())
    assert [id(p) for p in loss.parameters()] == [id(p) for p in model.parameters()]
    optimizer = make_optimizer(loss, cfg.optim)
    optimized = {id(p) for group in optimizer.param_groups for p in group["params"]}
    assert optimized == {id(p) for p in model.parameters() if p.requires_grad}
    if parts.copy is not None:
        assert not {id(p) for p in parts.copy.parameters()} & {id(p) for p in loss.parameters()}


def test_ema_moves_the_copy_towards_the_model(tiny_model_dir):
    from fic.core.model import load_model
    model = load_model(tiny_model_dir, dtype="float32")
    shadow = copy.deepcopy(model)
    ema = EmaTeacher(shadow, model)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(1.0)
    before = [p.clone() for p in shadow.parameters()]
    ema.update(model, rate=0.75)
    for old, new, cur in zip(before, shadow.parameters(), model.parameters()):
        assert torch.allclose(new, 0.75 * old + 0.25 * cur)


def test_ema_of_bf16_weights_accumulates_in_float32(tiny_model_dir):
    """In bf16, rate * avg + (1 - rate) * x rounds most of each step away (here 90% of the entries
    ended more than one rounding off the exact average). The float32 average, cast once, is
    within one bf16 rounding of it; its state is float32 and a resume restores it bit for bit."""
    from fic.core.model import load_model

    model = load_model(tiny_model_dir, dtype="bfloat16")
    shadow = copy.deepcopy(model)
    start = {n: p.detach().float().clone() for n, p in shadow.named_parameters()}
    ema = EmaTeacher(shadow, model)
    g = torch.Generator().manual_seed(0)
    with torch.no_grad():  # the trained model moved by about a tenth of a weight's size
        for p in model.parameters():
            p.add_(0.1 * p.abs().mean() * torch.randn(p.shape, generator=g).to(p.dtype))
    for _ in range(50):
        ema.update(model, rate=0.99)
    kept, current = 0.99 ** 50, dict(model.named_parameters())
    moved, total = 0, 0
    with torch.no_grad():
        for name, p in shadow.named_parameters():
            x = current[name].float()
            exact = kept * start[name] + (1 - kept) * x
            # one bf16 rounding of the exact average (plus float32 noise where it nearly cancels)
            tolerance = exact.abs() * 2 ** -8 + 2 ** -20 * (start[name].abs() + x.abs())
            assert p.dtype == torch.bfloat16
            assert torch.all((p.float() - exact).abs() <= tolerance), name
            moved, total = moved + int((p.float() != start[name]).sum()), total + p.numel()
    assert moved / total > 0.8  # the bf16 update moved 30% of them here, 90% more than one rounding off
    state = ema.state()
    assert all(t.dtype == torch.float32 for t in state.values())
    fresh_copy = copy.deepcopy(model)
    EmaTeacher(fresh_copy, model).load(state)
    for a, b in zip(fresh_copy.parameters(), shadow.parameters()):
        assert torch.equal(a, b)


def test_ema_teacher_with_a_reference_term_in_full_fine_tuning_is_refused(tiny_model_dir):
    """The reference term reads the starting weights; in full fine-tuning with an EMA teacher the
    only copy is the moving average, so it read that. A third copy is refused, in one line."""
    for kind in ("reference", "both"):
        with pytest.raises(FicError, match="third copy") as err:
            load_config(VASDConfig, None, ["teacher.mode=ema", f"regularizer.kind={kind}", "train.max_steps=1",
                                           "regularizer.anchor_path=sft.jsonl"])
        assert "\n" not in str(err.value) and err.value.field == "teacher.mode"
    # With LoRA the reference is the adapter-free model, whatever the EMA copy has become.
    from peft import LoraConfig, get_peft_model

    from fic.core.model import load_model
    from fic.training.vasd.distill import hidden_at

    base = load_model(tiny_model_dir, dtype="float32").eval()
    model = get_peft_model(copy.deepcopy(base), LoraConfig(r=4, target_modules=["q_proj", "v_proj"], lora_dropout=0.0))
    cfg = load_config(VASDConfig, None, ["lora.enabled=true", "teacher.mode=ema", "regularizer.kind=reference",
                                         "train.max_steps=1"])
    parts = teacher_parts(cfg, model)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "lora_B" in name:
                p.normal_(0, 0.5)
    parts.ema.update(model, rate=0.5)
    ids, pos = [list(range(5, 17))], [range(2, 9)]
    with parts.ref_context():
        reference = hidden_at(parts.ref_net, ids, pos, 0, "cpu")
    assert torch.allclose(reference, hidden_at(base, ids, pos, 0, "cpu"), atol=1e-6)
    assert not torch.allclose(hidden_at(parts.net, ids, pos, 0, "cpu"), reference, atol=1e-3)  # the EMA moved


# --------------------------------------------------------------------------- the recipe end to end

@pytest.fixture(scope="module")
def anchor_corpus(tmp_path_factory) -> Path:
    from fic.corpus.build import SFTDataConfig, build_corpus

    out = tmp_path_factory.mktemp("anchor") / "anchor.sft.jsonl"
    build_corpus(load_config(SFTDataConfig, None, ["data.source=reasoning-gym:gsm_symbolic", "data.limit=24", "seed=5",
                                                   f"out={out}"]), progress=False)
    return out


def settings(model_dir, anchor, out, *extra) -> list[str]:
    return [f"model.path={model_dir}", "data.source=reasoning-gym:gsm_symbolic", "data.limit=16", "data.seed=9",
            f"regularizer.anchor_path={anchor}", f"out={out}", "train.micro_batch_size=2", "train.grad_accum_steps=2",
            "rollout.max_new_tokens=6", "loss.keep_truncated=true", "optim.lr=1e-3", "logging.wandb=false",
            "logging.progress=false", "logging.samples_every=0", *extra]


def metrics(out: Path) -> list[dict]:
    return [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]


@pytest.mark.slow  # end to end: a run killed, then resumed
def test_kill_then_resume_gives_the_uninterrupted_losses(tiny_model_dir, anchor_corpus, tmp_path):
    common = ("train.max_steps=4", "checkpoint.every=2", "teacher.mode=ema", "regularizer.kind=anchor")
    whole = tmp_path / "whole"
    result = train(load_config(VASDConfig, None, settings(tiny_model_dir, anchor_corpus, whole, *common)))
    expected = metrics(whole)
    assert [m["step"] for m in expected] == [1, 2, 3, 4] and result["steps"] == 4
    assert all(m["answer_tokens"] > 0 and m["anchor_ce"] is not None for m in expected)

    killed = tmp_path / "killed"
    proc = subprocess.run([sys.executable, str(ROOT / "fic" / "train_vasd.py"),
                           *settings(tiny_model_dir, anchor_corpus, killed, *common)],
                          env={**os.environ, KILL_ENV: "3"}, capture_output=True, text=True, timeout=600)
    assert proc.returncode == -9, proc.stderr[-2000:]
    assert [m["step"] for m in metrics(killed)] == [1, 2, 3]
    train(load_config(VASDConfig, None, settings(tiny_model_dir, anchor_corpus, killed, *common, "resume=true")))
    got = metrics(killed)
    assert [m["step"] for m in got] == [1, 2, 3, 4]
    for a, b in zip(got, expected):
        assert a["loss"] == pytest.approx(b["loss"], abs=1e-6) and a["rollout_tokens"] == b["rollout_tokens"]
    from safetensors.torch import load_file

    saved = load_file(str(killed / "checkpoints" / "step-4" / "model.safetensors"))
    assert saved and all(key.startswith("model.") for key in saved)  # no teacher head: the student only
    card = (killed / "final" / "README.md").read_text()
    assert "FiC VASD" in card and f"Started from: `{tiny_model_dir}`" in card


@pytest.mark.slow  # end to end: the recipe
def test_a_step_with_an_over_long_rollout_trains_on(tiny_model_dir, anchor_corpus, tmp_path):
    """The issue's reproduction: micro_batch_size=1, grad_accum_steps=4, a conversation cap that
    cuts one rollout of step 3 (no anchor: regulariser none) ended the run there, on resume too."""
    out = tmp_path / "run"
    result = train(load_config(VASDConfig, None, settings(
        tiny_model_dir, anchor_corpus, out, "train.micro_batch_size=1", "train.grad_accum_steps=4",
        "rollout.max_conversation_tokens=260", "regularizer.kind=none", "train.max_steps=3", "checkpoint.every=0")))
    assert result["steps"] == 3
    got = metrics(out)
    assert [m["step"] for m in got] == [1, 2, 3]
    assert got[2]["left_out_cut_before_last_shard"] >= 1 and got[2]["empty_micro_batches"] >= 1
    assert all(m["left_out_rollouts"] == m["left_out_cut_before_last_shard"] + m["left_out_teacher_prompt_too_long"]
               + m["left_out_truncated_final"] for m in got)
    assert got[2]["answer_tokens"] > 0 and got[2]["loss"] == got[2]["loss"]  # trained, not NaN


@pytest.mark.slow  # several whole VASD steps compared
def test_smaller_micro_batches_and_padded_widths_give_the_same_step(tiny_model_dir, anchor_corpus, tmp_path,
                                                                    monkeypatch):
    """The memory knobs: 4 rollouts a step as 1 x 4, 2 x 2 or 4 x 1 (micro-batch x accumulation),
    with every width padded to a multiple of 64 (`train.pad_to_multiple`), or with label and
    correction rows apart from their rollouts' and teacher rows apart from one another
    (`train.share_prefixes=false`), play the same rollouts and make the same update (losses,
    gradient norm), with anchors, deferral labels, corrections and per-turn distillation split
    across the micro-batches; only the passes' shapes change."""
    common = ("train.max_steps=2", "checkpoint.every=0", "regularizer.kind=anchor", "labels.weight=1.0",
              "labels.select=premature", "labels.max_turns=8", "corrections.weight=1.0", "loss.turns=all")
    import fic.training.vasd.step as step_module

    widths = []  # the student batches' widths, to see that the padded run really pads
    branched = []  # whether a batch had rows with branches, to see that the shared runs really share

    def recording_collate(rows, pad_id, multiple=0):
        batch = collate_rows(rows, pad_id, multiple)
        widths.append((multiple, batch["input_ids"].shape[1], max(len(r["input_ids"]) for r in rows)))
        branched.append("segments" in batch and bool((batch["segments"] > 0).any()))
        return batch

    monkeypatch.setattr(step_module, "collate_rows", recording_collate)
    runs = {}
    for name, mbs, accum, multiple in (("4x1", 4, 1, 0), ("2x2", 2, 2, 0), ("1x4", 1, 4, 0), ("padded", 4, 1, 64),
                                       ("unshared", 4, 1, 0)):
        out = tmp_path / name
        branched.clear()
        train(load_config(VASDConfig, None, settings(tiny_model_dir, anchor_corpus, out, *common,
                                                     f"train.micro_batch_size={mbs}",
                                                     f"train.grad_accum_steps={accum}",
                                                     f"train.pad_to_multiple={multiple}",
                                                     f"train.share_prefixes={name != 'unshared'}")))
        assert any(branched) == (name != "unshared")
        runs[name] = metrics(out)
    whole = runs["4x1"]
    assert all(m["labels_ce"] is not None and m["anchor_ce"] is not None for m in whole)
    padded = [(width, longest) for multiple, width, longest in widths if multiple == 64]
    assert padded and all(width % 64 == 0 for width, _ in padded) and any(width > longest for width, longest in padded)
    for name in ("2x2", "1x4", "padded", "unshared"):
        for a, b in zip(runs[name], whole):
            assert a["rollout_tokens"] == b["rollout_tokens"] and a["answer_tokens"] == b["answer_tokens"]
            assert a["loss"] == pytest.approx(b["loss"], rel=1e-4, abs=1e-6)
            assert a["grad_norm"] == pytest.approx(b["grad_norm"], rel=1e-3)


@pytest.mark.slow  # end to end: two processes
def test_two_processes_train_like_one_with_the_same_global_batch(tiny_model_dir, anchor_corpus, tmp_path):
    """Greedy rollouts (the same replies however they are batched), DDP over 2 CPU processes
    with half the rollouts and anchors each: the same losses as 1 process with all of them."""
    common = ("train.max_steps=2", "checkpoint.every=0", "rollout.temperature=0", "train.grad_accum_steps=1",
              "regularizer.kind=both", "logging.progress=false")
    one = tmp_path / "one"
    train(load_config(VASDConfig, None, settings(tiny_model_dir, anchor_corpus, one, *common,
                                                  "train.micro_batch_size=4")))
    two = tmp_path / "two"
    env = {**os.environ, "ACCELERATE_USE_CPU": "true", "OMP_NUM_THREADS": "1"}
    proc = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2",
                           str(ROOT / "fic" / "train_vasd.py"),
                           *settings(tiny_model_dir, anchor_corpus, two, *common, "train.micro_batch_size=2")],
                          env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "x 2 process(es)" in proc.stdout
    for a, b in zip(metrics(two), metrics(one)):
        assert a["answer_tokens"] == b["answer_tokens"]
        assert a["loss"] == pytest.approx(b["loss"], rel=1e-4, abs=1e-6)
        assert a["grad_norm"] == pytest.approx(b["grad_norm"], rel=1e-3)


@pytest.mark.slow  # end to end: the recipe
def test_fic_train_vasd_runs_the_shipped_recipe(tiny_model_dir, anchor_corpus, tmp_path, capsys):
    from fic.cli.main import main

    out = tmp_path / "run"
    assert main(["train", "vasd", "--config", str(RECIPE), f"model.path={tiny_model_dir}",
                 f"regularizer.anchor_path={anchor_corpus}", f"out={out}", "train.max_steps=1", "train.micro_batch_size=2",
                 "train.grad_accum_steps=1", "rollout.max_new_tokens=6", "logging.wandb=false",
                 "data.limit=8", "dev.every=1", "dev.data.source=reasoning-gym:gsm_symbolic", "dev.data.limit=2",
                 "dev.views=[]", "loss.keep_truncated=true"]) == 0
    assert (out / "final" / "config.json").exists()
    before, figures = metrics(out)  # step 0: the held-out figures training is compared with
    assert before["step"] == 0 and before["dev_divergence_per_token"] > 0
    assert figures["step"] == 1 and figures["dev_divergence_per_token"] > 0
    for key in ("divergence_per_token", "premature_answer_rate", "final_not_answer_rate", "rollout_accuracy",
                "truncated_final_rate", "rollouts_s", "teacher_s", "student_s", "update_s"):
        assert key in figures, key


@pytest.mark.parametrize("override, message", [
    ("loss.divergence=hellinger", "loss.divergence"),
    ("loss.estimator=sampled", "reverse_kl only"),
    ("teacher.view=snowball", "teacher.view"),
    ("regularizer.kind=anchor regularizer.anchor_path=", "regularizer.anchor_path"),
    ("model.path=/nonexistent/sft/final", "not found"),
    ("lora.enabled=false teacher.mode=ema regularizer.kind=both", "third copy"),
    ("dev.views=[fulll,sharded]", "dev.views[0]"),
])
def test_bad_settings_exit_2_with_one_line_before_any_model_loads(override, message, capsys, monkeypatch):
    from fic.train_vasd import main
    from fic.training import loop
    monkeypatch.setattr(loop, "build_model", lambda *a, **k: pytest.fail("a model was loaded"))
    assert main(["--config", str(RECIPE), *override.split()]) == 2
    err = capsys.readouterr().err.strip()
    assert message in err and "\n" not in err and "Traceback" not in err


def test_top_k_above_the_vocabulary_and_adapter_folders_are_refused_early(tiny_model_dir, anchor_corpus, tmp_path,
                                                                          monkeypatch):
    from fic.training import loop
    monkeypatch.setattr(loop, "build_model", lambda *a, **k: pytest.fail("a model was loaded"))
    with pytest.raises(FicError, match="top_k 99999999 is not below the vocabulary"):
        train(load_config(VASDConfig, None, settings(tiny_model_dir, anchor_corpus, tmp_path / "a", "train.max_steps=1",
                                                      "loss.estimator=topk", "loss.top_k=99999999")))
    adapter = tmp_path / "adapter"
    adapter.mkdir()
    (adapter / "adapter_config.json").write_text("{}")
    with pytest.raises(FicError, match="final-merged"):
        train(load_config(VASDConfig, None, settings(adapter, anchor_corpus, tmp_path / "b", "train.max_steps=1")))


def test_rollout_keys_and_values_are_forgotten_after_a_fused_optimizer_step(tiny_model_dir, smollm2_tokenizer):
    """Fused AdamW changes weights without bumping version counters, so the backend's own check
    cannot see the step: VASD calls weights_changed(), and the next rollout then matches a fresh
    backend's, where stale keys and values would not."""
    from fic.backends.hf import HFBackend
    from fic.core.model import load_model

    model = load_model(tiny_model_dir, dtype="float32")
    backend = HFBackend(model, smollm2_tokenizer, kv_reuse_mb=64)
    prompt = [prompt_ids(smollm2_tokenizer, [{"role": "user", "content": "Ara played for 4 years."}])]
    greedy = SamplingParams(max_new_tokens=4)
    backend.generate(prompt, greedy)
    assert backend.kv_store.entries
    optimizer = torch.optim.AdamW(model.parameters(), lr=0.5, fused=True)
    for p in model.parameters():
        p.grad = torch.ones_like(p)
    versions = [p._version for p in model.parameters()]
    optimizer.step()
    assert [p._version for p in model.parameters()] == versions  # invisible to the version check
    backend.weights_changed()
    assert not backend.kv_store.entries
    again = backend.generate(prompt, greedy)[0]
    fresh = HFBackend(model, smollm2_tokenizer).generate(prompt, greedy)[0]
    assert again.token_ids == fresh.token_ids and again.logprobs == pytest.approx(fresh.logprobs, abs=1e-5)


def test_weight_sync_hands_the_engine_merged_lora_weights_under_its_own_names(tiny_model_dir):
    """vLLM is GPU-only; a stand-in engine with vLLM's attribute path and `load_weights` checks
    the part FiC owns: names without PEFT's prefixes, adapters merged into what the engine gets
    (not into the trainer's weights), the prefix cache reset."""
    from peft import LoraConfig, get_peft_model

    from fic.backends.vllm import sync_weights
    from fic.core.model import load_model

    policy = get_peft_model(load_model(tiny_model_dir, dtype="float32"),
                            LoraConfig(r=4, target_modules=["q_proj", "v_proj"], lora_dropout=0.0))
    with torch.no_grad():
        for name, p in policy.named_parameters():
            if "lora_B" in name:
                p.normal_(0, 0.5)
    engine_model = load_model(tiny_model_dir, dtype="float32")

    def load_weights(weights):
        state = dict(weights)
        assert set(state) == set(engine_model.state_dict())
        engine_model.load_state_dict(state, strict=False)

    resets = []
    backend = stand_in_engine(load_weights, lambda: resets.append(1))
    ids = torch.tensor([[5, 9, 200, 31, 7]])
    with torch.no_grad():
        adapted = policy(input_ids=ids).logits
    sync_weights(backend, policy, [], 0.0, print)
    with torch.no_grad():
        assert torch.allclose(engine_model(input_ids=ids).logits, adapted, atol=1e-5)
        assert torch.allclose(policy(input_ids=ids).logits, adapted, atol=1e-6)  # the trainer's model as it was
    assert resets == [1]


def stand_in_engine(load_weights, reset=lambda: None):
    """An object with vLLM's attribute path down to the engine's model (`load_weights`)."""
    from types import SimpleNamespace

    model = SimpleNamespace(load_weights=load_weights)
    return SimpleNamespace(llm=SimpleNamespace(reset_prefix_cache=reset, llm_engine=SimpleNamespace(
        model_executor=SimpleNamespace(driver_worker=SimpleNamespace(worker=SimpleNamespace(
            model_runner=SimpleNamespace(model=model)))))))


def test_weight_sync_never_moves_the_trainers_bf16_base(tiny_model_dir):
    """merge_adapter() then unmerge_adapter() on a bf16 base is W + d - d, not exact: the frozen
    teacher (adapters off), the student's base and final-merged drifted a little at every sync.
    The synced weights are merged out of place: after 100 syncs the base is bit-identical, and
    each synced weight is base + scale * B @ A in float32 cast once, i.e. merge_and_unload's
    within one bf16 rounding."""
    from peft import LoraConfig, get_peft_model

    from fic.backends.vllm import sync_weights
    from fic.core.model import load_model

    policy = get_peft_model(load_model(tiny_model_dir, dtype="bfloat16"),
                            LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj", "down_proj"],
                                       lora_dropout=0.0))
    g = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for name, p in policy.named_parameters():
            if "lora_B" in name:
                p.copy_(0.05 * torch.randn(p.shape, generator=g))
    base = {n: p.detach().clone() for n, p in policy.named_parameters() if "lora_" not in n}
    received = []
    backend = stand_in_engine(lambda weights: received.append(dict(weights)))
    for _ in range(100):
        sync_weights(backend, policy, [], 0.0, print)
    synced = received[-1]
    for name, p in policy.named_parameters():
        if "lora_" not in name:
            assert torch.equal(p, base[name]), name
    merged = copy.deepcopy(policy).merge_and_unload().state_dict()
    assert set(synced) == set(merged)
    lora_weights = 0
    for module_name, module in policy.named_modules():
        if hasattr(module, "base_layer") and hasattr(module, "lora_A"):
            key = f"{module_name}.base_layer.weight".removeprefix("base_model.model.").replace(".base_layer", "")
            w = module.base_layer.weight
            exact = w.float() + module.get_delta_weight("default").float()
            assert synced[key].dtype == torch.bfloat16 and torch.equal(synced[key], exact.to(torch.bfloat16)), key
            ulp = torch.finfo(torch.bfloat16).eps * merged[key].float().abs()
            assert torch.all((synced[key].float() - merged[key].float()).abs() <= ulp), key
            assert not torch.equal(synced[key], w)  # the adapter is in it
            lora_weights += 1
    assert lora_weights == 3 * 2  # q_proj, v_proj and down_proj of both layers
    for key in set(synced) - {k for k in synced if any(t in k for t in ("q_proj.w", "v_proj.w", "down_proj.w"))}:
        assert torch.equal(synced[key], merged[key]), key


def test_rollout_tasks_never_include_the_evaluation_instances(tmp_path):
    from fic.training.vasd.inputs import load_rollout_tasks as load_instances

    held_out = tmp_path / "eval.jsonl"
    settings = ["data.source=reasoning-gym:gsm_symbolic", "data.limit=12", "data.seed=9", "regularizer.kind=none",
                "train.max_steps=1"]
    everything, _, none_dropped = load_instances(load_config(VASDConfig, None, settings))
    assert none_dropped["dropped"] == 0
    picked = everything[3:7]
    held_out.write_text("".join(json.dumps(i.to_dict()) + "\n" for i in picked))
    cfg = load_config(VASDConfig, None, [*settings, f"exclude.sources=[jsonl:{held_out}]"])
    instances, _, overlap = load_instances(cfg)
    assert overlap["dropped"] == 4 and not {i.task_id for i in instances} & {i.task_id for i in picked}
    cfg.exclude.on_overlap = "refuse"
    with pytest.raises(FicError, match="overlap|evaluation"):
        load_instances(cfg)


def test_held_out_tasks_are_drawn_with_the_evals_own_seed_and_an_overlap_is_refused():
    """The in-training held-out set used to be drawn with the training seed: from a generated
    source, every held-out instance was a rollout task. dev.data has its own seed; an overlap
    with the rollout tasks is refused in one line, before any model loads."""
    from fic.training.vasd.inputs import load_held_out, load_rollout_tasks

    common = ["data.source=reasoning-gym:gsm_symbolic", "data.limit=16", "data.seed=9", "regularizer.kind=none",
              "train.max_steps=1", "dev.every=1", "dev.data.source=reasoning-gym:gsm_symbolic", "dev.data.limit=8"]
    cfg = load_config(VASDConfig, None, [*common, "dev.data.seed=3"])
    rollout_tasks, _, _ = load_rollout_tasks(cfg)
    held_out = load_held_out(cfg, rollout_tasks)
    assert len(held_out) == 8
    assert not {i.task_id for i in held_out} & {i.task_id for i in rollout_tasks}
    assert not {i.fields["question"] for i in held_out} & {i.fields["question"] for i in rollout_tasks}
    same_seed = load_config(VASDConfig, None, [*common, "dev.data.seed=9"])
    with pytest.raises(FicError, match=r"(\d+) of \1 held-out instances are rollout tasks too") as err:
        load_held_out(same_seed, load_rollout_tasks(same_seed)[0])
    assert "\n" not in str(err.value) and err.value.field == "dev.data"


@pytest.mark.slow  # the benchmark, in a child process
def test_bench_memory_figure_is_the_childs_own_peak_even_under_a_large_parent():
    """Linux carries ru_maxrss across exec: a child of a process that had grown past the
    computation's peak (the bench after its timed step) reported 0 MB for both ways."""
    from fic.bench.vasd import memory_figures

    ballast = bytearray(b"\x01") * (600 << 20)  # the parent's peak, well above the child's
    figures = memory_figures(tokens=512, vocab=8192, hidden=32, chunk=64)
    assert ballast[-1] == 1
    assert 0 < figures["chunked_peak_mb"] < figures["naive_peak_mb"]
    assert figures["memory_ratio"] < 0.6 and figures["max_abs_diff"] < 1e-4


# --------------------------------------------------------------------------- per-turn views and labels

def test_per_turn_teacher_prompts_hold_exactly_the_shards_revealed_by_each_turn(smollm2_tokenizer):
    from fic.core.chat import prompt_ids
    from fic.data.views import system_message
    from fic.training.vasd.distill import partial_prompts

    conv = played(smollm2_tokenizer)
    prompts = partial_prompts(smollm2_tokenizer, conv)
    shards = [s.shard for s in conv.instance.shards]
    assert len(prompts) == len(conv.turns) - 1 == 3
    for k, prompt in enumerate(prompts):  # turn k has revealed shards 1..k+1, as one concat request
        concat = "\n".join(f"- {s}" for s in shards[:k + 1])
        text = smollm2_tokenizer.decode(prompt)
        assert all(s in text for s in shards[:k + 1]) and not any(s in text for s in shards[k + 1:])
        assert prompt == prompt_ids(smollm2_tokenizer, [system_message(conv.instance),
                                                        {"role": "user", "content": text.split("user\n", 1)[1]
                                                         .split("<|im_end|>")[0]}])
        assert concat.split("\n")[-1][2:] in text
    rollout = rollout_from(conv)
    rollout.teacher_prompts, rollout.partial_prompts = teacher_prompts(smollm2_tokenizer, conv.instance, ["full"]), \
        prompts
    rollout.distilled = [(span, 0.5) for span in rollout.earlier] + [(rollout.final, 1.0)]
    (row,) = student_rows([rollout], [], reference=False, first_tokens=0, first_weight=1.0)
    student = [rollout.ids[t + 1] for t, y in enumerate(row["distill_targets"]) if y != IGNORE]
    teacher = [token for prompt, reply in rollout.teacher_rows(0) for token in reply]
    assert student == teacher  # the student's own reply ids, turn by turn, never re-tokenised
    for (prompt, reply), (start, end) in zip(rollout.teacher_rows(0), rollout.earlier + [rollout.final]):
        assert reply == rollout.ids[start:end]
    weights = [w for w in row["distill_weights"] if w]
    assert weights == [0.5] * sum(e - s for s, e in rollout.earlier) + [1.0] * len(rollout.answer_ids)


def test_at_the_last_turn_the_per_turn_loss_is_todays_final_turn_loss(tiny_model_dir, smollm2_tokenizer):
    """turns=all adds the earlier replies' terms; the final reply's term is exactly turns=final's."""
    from fic.core.model import load_model

    model = load_model(tiny_model_dir, dtype="float32").eval()
    conv = played(smollm2_tokenizer)
    terms = {}
    for turns, weight in (("final", 1.0), ("all", 0.0), ("all", 1.0)):
        cfg = load_config(VASDConfig, None, ["regularizer.kind=none", f"loss.turns={turns}",
                                             f"loss.nonfinal_weight={weight}", "teacher.mode=live",
                                             "train.max_steps=1", "train.micro_batch_size=1"])
        parts = teacher_parts(cfg, model)
        (batch,), _ = step_batches(cfg, [conv], [], smollm2_tokenizer, parts, device="cpu", autocast=no_autocast)
        counts = batch.pop("counts")
        loss = DistillLoss(model, parts.head, None, divergence="forward_kl", estimator="full", beta=0.5,
                           temperature=1.0, top_k=8, chunk_tokens=4)
        with torch.no_grad():
            terms[(turns, weight)] = (loss(**batch)["distill"].item(), counts["distill"])
    final, zero_weight, every = terms[("final", 1.0)], terms[("all", 0.0)], terms[("all", 1.0)]
    # Equal but for float32 rounding: the teacher's forward batches the earlier turns' rows beside it.
    assert zero_weight[0] == pytest.approx(final[0], rel=1e-4) and zero_weight[1] == final[1]
    assert every[0] > final[0] and every[1] > final[1]  # the earlier turns add their own terms


def test_deferral_labels_train_only_the_students_earlier_turns_on_a_gold_early_reply(smollm2_tokenizer):
    from fic.core.chat import reply_ids
    from fic.training.vasd.step import label_rows

    backend = FunctionBackend(lambda p: "So 4 * 40 * 21 = 3360.\n#### 3360" if "40 games" in p else "Go on.",
                              smollm2_tokenizer)  # answers (prematurely) from turn 3 on
    (conv,) = make_conversations([ara()], ["sharded"], 1)
    play([conv], backend, VerbatimUser(), RuleClassifier(), SamplingParams(max_new_tokens=64), stop_at_correct=False)
    assert [t.label for t in conv.turns] == ["discussion", "discussion", "answer_attempt", "answer_attempt"]
    cfg = load_config(VASDConfig, None, ["regularizer.kind=none", "labels.weight=1.0", "labels.max_turns=2",
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
    (label_row,) = student_rows([], [], rows[:1], reference=False, first_tokens=0, first_weight=1.0)
    trained = [y for y in label_row["labels_targets"] if y != IGNORE]
    assert trained == rows[0].ids[rows[0].spans[0][0]:] and all(y == IGNORE for y in label_row["distill_targets"])
    assert label_rows(load_config(VASDConfig, None, ["regularizer.kind=none", "train.max_steps=1"]), conv,
                      smollm2_tokenizer) == []  # off by default


def test_labels_at_every_premature_turn_and_else_at_the_last_non_final_turn(smollm2_tokenizer):
    """labels.select=premature: each premature answer gets a label (turns 1 and 2 here), and a
    rollout with none gets one at the turn before its final one."""
    from fic.training.vasd.step import label_rows

    cfg = load_config(VASDConfig, None, ["regularizer.kind=none", "labels.weight=1.0", "labels.select=premature",
                                         "labels.max_turns=8", "train.max_steps=1"])
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


def test_a_correction_continues_the_students_own_context_with_the_gold_replies(smollm2_tokenizer):
    """corrections.weight: a rollout that answered at turn 2 of 4 keeps its own ids up to that
    turn's prompt; from there the gold early reply, the user's next turn, and the gold answer,
    each gold reply trained, nothing of the student's premature answer left. A rollout that waited
    but ended wrong gets the gold answer in its own context."""
    from fic import tasks
    from fic.core.chat import prompt_ids, reply_ids
    from fic.training.vasd.step import correction_rows

    cfg = load_config(VASDConfig, None, ["regularizer.kind=none", "corrections.weight=1.0", "train.max_steps=1"])
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
    (trained,) = student_rows([], [], [], [row], reference=False, first_tokens=0, first_weight=1.0)
    targets = [y for y in trained["corrections_targets"] if y != IGNORE]
    assert targets == row.ids[row.spans[0][0]:row.spans[0][1]] + final

    wrong = FunctionBackend(lambda p: "So the total is 7.\n#### 7" if "21 points" in p else "Go on.", smollm2_tokenizer)
    (conv,) = make_conversations([ara()], ["sharded"], 1)
    play([conv], wrong, VerbatimUser(), RuleClassifier(), SamplingParams(max_new_tokens=64), stop_at_correct=False)
    (row,) = correction_rows(cfg, conv, smollm2_tokenizer)
    assert row.ids == conv.ids[:conv.turns[-1].prompt_tokens] + final and len(row.spans) == 1
    assert correction_rows(cfg, played(smollm2_tokenizer), smollm2_tokenizer) == []  # right, and on time


def test_per_turn_distillation_of_the_first_k_tokens_of_each_earlier_reply(smollm2_tokenizer):
    """loss.turns=all with loss.nonfinal_tokens=2: the divergence is taken at exactly the first two
    tokens of each earlier reply and at every token of the final one; the teacher reads those
    same two tokens after each partial request."""
    from fic.training.vasd.step import distilled_spans

    cfg = load_config(VASDConfig, None, ["regularizer.kind=none", "loss.turns=all", "loss.nonfinal_tokens=2",
                                         "train.max_steps=1"])
    conv = played(smollm2_tokenizer)
    rollout = rollout_from(conv)
    rollout.distilled, reason = distilled_spans(cfg, rollout, conv, smollm2_tokenizer)
    assert reason is None
    (row,) = student_rows([rollout], [], reference=False, first_tokens=0, first_weight=1.0)
    trained = {t + 1 for t, y in enumerate(row["distill_targets"]) if y != IGNORE}  # token positions
    expected = {t for s, e in rollout.earlier for t in range(s, s + 2)} | set(range(*rollout.final))
    assert trained == expected and all(e - s > 2 for s, e in rollout.earlier)
    pairs = rollout.teacher_rows(0)
    assert [len(reply) for _, reply in pairs] == [2] * len(rollout.earlier) + [rollout.final[1] - rollout.final[0]]
    assert pairs[0][1] == conv.ids[rollout.earlier[0][0]:rollout.earlier[0][0] + 2]


def test_the_hinted_teacher_reads_the_full_request_and_the_reference_answer_and_nothing_else(smollm2_tokenizer):
    from fic.training.vasd.distill import HINT

    (full, hinted) = teacher_prompts(smollm2_tokenizer, ara(), ["full", "hinted"])
    full_text, hinted_text = smollm2_tokenizer.decode(full), smollm2_tokenizer.decode(hinted)
    cut = full_text.rindex("<|im_end|>")  # the end of the user turn
    assert hinted_text == full_text[:cut] + HINT.format(answer="3360") + full_text[cut:]


def test_the_trust_region_bounds_each_tokens_pull_and_is_exact_when_wide():
    from fic.training.losses import trust_region

    g = torch.Generator().manual_seed(0)
    student = torch.log_softmax(torch.randn(6, 50, generator=g), -1)
    teacher = torch.log_softmax(3 * torch.randn(6, 50, generator=g), -1)
    assert torch.allclose(trust_region(teacher, student, 1e3), teacher, atol=1e-6)
    bounded = trust_region(teacher, student, 0.5)
    ratio = bounded - student
    assert torch.allclose(bounded.exp().sum(-1), torch.ones(6))
    assert float((ratio.max(-1).values - ratio.min(-1).values).max()) <= 1.0 + 1e-5  # a shift of a [-c, c] clip
    assert divergence(student, bounded, "forward_kl").sum() < divergence(student, teacher, "forward_kl").sum()


def test_length_groups_cut_the_sorted_rows_with_the_least_padding():
    from itertools import combinations

    from fic.training.vasd.step import length_groups

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
    from fic.training.vasd.step import length_groups

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


@pytest.mark.slow  # end to end: the recipe
def test_the_recipe_trains_with_per_turn_views_and_deferral_labels(tiny_model_dir, anchor_corpus, tmp_path):
    from fic.cli.main import main

    out = tmp_path / "run"
    assert main(["train", "vasd", "--config", str(RECIPE), f"model.path={tiny_model_dir}",
                 f"regularizer.anchor_path={anchor_corpus}", f"out={out}", "train.max_steps=2",
                 "train.micro_batch_size=2", "rollout.max_new_tokens=6", "logging.wandb=false", "data.limit=8",
                 "loss.keep_truncated=true", "loss.turns=all", "loss.decision_tokens=2", "loss.decision_weight=3",
                 "labels.weight=1.0", "logging.progress=false"]) == 0
    _, last = metrics(out)
    assert last["labels_ce"] > 0 and math.isfinite(last["loss"]) and last["divergence_per_token"] > 0


@pytest.mark.slow  # the benchmark
def test_bench_vasd_times_the_recipes_own_step(tiny_model_dir, anchor_corpus, tmp_path):
    """`fic bench vasd --config` builds the step the recipe takes (`VASDStep`, deferral labels and
    anchors included): its first step's answer tokens are the recipe's, and its phases add up."""
    import argparse

    import yaml

    from fic.bench import vasd as bench_vasd
    from fic.core.config import config_to_dict

    common = ("train.max_steps=1", "checkpoint.every=0", "labels.weight=1.0", "regularizer.kind=anchor")
    cfg = load_config(VASDConfig, None, settings(tiny_model_dir, anchor_corpus, tmp_path / "recipe", *common))
    train(cfg)
    (recipe,) = metrics(tmp_path / "recipe")
    config = tmp_path / "vasd.yaml"
    config.write_text(yaml.safe_dump(config_to_dict(cfg)))
    parser = argparse.ArgumentParser()
    bench_vasd.add_arguments(parser)
    args = parser.parse_args(["--config", str(config), "--set", f"out={tmp_path / 'ignored'}", "--repeats", "1",
                              "--memory-tokens", "0", "--sft-micro-batch-size", "2", "--profile"])
    figures = bench_vasd.measure(args)
    shares = {k: v for k, v in figures.items() if k.startswith("profile_share_")}
    assert sum(shares.values()) == pytest.approx(1.0, abs=1e-3) and shares["profile_share_LM_head"] > 0
    assert 0 <= figures["student_padding_share"] < 1
    assert figures["answer_tokens"] == recipe["answer_tokens"] > 0
    assert figures["rollouts"] == 4 and figures["student_rows"] > 4  # anchors and label rows beside the rollouts
    assert figures["step_s"] == pytest.approx(figures["rollouts_s"] + figures["teacher_s"] + figures["student_s"]
                                              + figures["update_s"])
    assert figures["matmul_peak_tflops"] > 0 and figures["passes_roofline_share"] > 0
    assert figures["sft_step_cpu_s"] > 0 and figures["vasd_over_sft"] == pytest.approx(
        figures["step_cpu_s"] / figures["sft_step_cpu_s"])


def test_bf16_rollouts_run_on_a_decoding_copy_refreshed_after_every_step(tiny_model_dir, smollm2_tokenizer):
    from fic.core.model import load_model
    from fic.training.vasd.step import make_rollout_backend, sync_rollout_backend

    cfg = load_config(VASDConfig, None, ["regularizer.kind=none", "train.max_steps=1"])
    policy = load_model(tiny_model_dir, dtype="float32")
    same, none = make_rollout_backend(cfg, policy, smollm2_tokenizer, torch.float32)
    assert same.model is policy and none is None  # float32 compute: the policy itself plays
    backend, masters = make_rollout_backend(cfg, policy, smollm2_tokenizer, torch.bfloat16)
    copy_model = backend.model
    assert copy_model is not policy and {p.dtype for p in copy_model.parameters()} == {torch.bfloat16}
    q_proj = copy_model.model.layers[0].self_attn.q_proj.weight
    assert q_proj.stride(0) == 1  # column-major: the fast small-batch product path
    with torch.no_grad():  # an optimizer step moves the float32 masters
        for p in policy.parameters():
            p.add_(0.01)
    sync_rollout_backend(backend, policy, cfg, [], print, masters=masters)
    for name, param in copy_model.named_parameters():
        assert torch.equal(param, masters[name].detach().to(torch.bfloat16)), name
    assert copy_model.model.layers[0].self_attn.q_proj.weight.stride(0) == 1


@pytest.mark.slow  # end to end: the recipe
@pytest.mark.parametrize("precision, said", [("auto", "bfloat16 autocast"), ("bf16_copy", "bfloat16 copy")])
def test_the_recipe_trains_in_bf16_with_bf16_rollouts(tiny_model_dir, anchor_corpus, tmp_path, monkeypatch, capsys,
                                                      precision, said):
    """On a CPU with fast bf16 the recipe computes under autocast (auto) or on a bf16 copy of the
    float32 masters (bf16_copy); either way the rollouts play on a bf16 decoding copy, and the
    saved model holds the float32 masters."""
    from fic.cli.main import main

    monkeypatch.setenv("FIC_CPU_FLAGS", "avx512_bf16")
    out = tmp_path / "run"
    assert main(["train", "vasd", "--config", str(RECIPE), f"model.path={tiny_model_dir}",
                 f"regularizer.anchor_path={anchor_corpus}", f"out={out}", "train.max_steps=2",
                 "train.micro_batch_size=2", "rollout.max_new_tokens=6", "logging.wandb=false", "data.limit=8",
                 "loss.keep_truncated=true", "logging.progress=false", "labels.weight=1.0",
                 f"train.mixed_precision={precision}"]) == 0
    assert said in capsys.readouterr().out
    _, last = metrics(out)
    assert math.isfinite(last["loss"]) and last["divergence_per_token"] > 0 and last["labels_ce"] > 0
    from safetensors.torch import load_file

    assert {t.dtype for t in load_file(str(out / "final" / "model.safetensors")).values()} == {torch.float32}


def test_label_and_correction_rows_on_their_rollouts_row_train_exactly_as_separate_rows(smollm2_tokenizer):
    """train.share_prefixes: a rollout that answered at turns 1 and 2 of 4, distilled on its final
    reply, with deferral labels at both premature turns and a correction from the first, becomes
    one row: the rollout's ids, then each gold row's tokens after the prefix it shares with them,
    at the positions they have in their own rows. On a random model every term's loss and every
    gradient is that of the separate rows, and the shared context is computed once."""
    from transformers import LlamaConfig, LlamaForCausalLM

    from fic.training.vasd.distill import body_inputs, shared_prefix_rows
    from fic.training.vasd.step import correction_rows, label_rows

    cfg = load_config(VASDConfig, None, ["regularizer.kind=none", "labels.weight=1.0", "labels.select=premature",
                                         "labels.max_turns=8", "corrections.weight=1.0", "train.max_steps=1"])
    early = FunctionBackend(lambda p: "So it is 4 * 40 = 160.\n#### 160" if "4 years" in p else "Go on.",
                            smollm2_tokenizer)
    (conv,) = make_conversations([ara()], ["sharded"], 1)
    play([conv], early, VerbatimUser(), RuleClassifier(), SamplingParams(max_new_tokens=64), stop_at_correct=False)
    rollout = rollout_from(conv)
    rollout.distilled = [(rollout.final, 1.0)]
    labels, corrections = label_rows(cfg, conv, smollm2_tokenizer), correction_rows(cfg, conv, smollm2_tokenizer)
    assert len(labels) == 2 and len(corrections) == 1
    separate = student_rows([rollout], [], labels, corrections, reference=False, first_tokens=2, first_weight=3.0)
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
    other = {name: value[:40] for name, value in separate[1].items()}  # a row without branches beside one with

    def terms(rows):
        batch = collate_rows(rows, smollm2_tokenizer.pad_token_id, 64)
        model.zero_grad()
        hidden = model.model(input_ids=batch["input_ids"], **body_inputs(batch)).last_hidden_state
        logp = torch.log_softmax(model.lm_head(hidden).float(), -1)
        out = {}
        for term in ("labels", "corrections"):
            t, w = batch[f"{term}_targets"], batch[f"{term}_weights"]
            where = t != IGNORE
            out[term] = -(logp[where].gather(1, t[where][:, None])[:, 0] * w[where]).sum()
        where = batch["distill_targets"] != IGNORE
        out["distill_hidden"] = hidden[where]
        sum(out[term] for term in ("labels", "corrections")).backward()
        out["grads"] = [p.grad.clone() for p in model.parameters()]
        return {**out, "labels": out["labels"].item(), "corrections": out["corrections"].item()}

    a, b = terms(separate + [other]), terms([shared, other])
    for term in ("labels", "corrections"):
        assert a[term] > 0 and b[term] == pytest.approx(a[term], rel=1e-5)
    assert torch.allclose(a["distill_hidden"], b["distill_hidden"], atol=1e-5)
    assert all(torch.allclose(x, y, atol=1e-6, rtol=1e-4) for x, y in zip(a["grads"], b["grads"]))


def test_teacher_rows_that_share_a_prompt_are_read_once_with_the_same_hidden_states():
    """hidden_at(share_prefixes=True): sequences that share at least half their ids with the row
    before them ride on it as branches (`packed_sequences`), one that does not starts a row; the
    hidden states at every asked position are those of the separate rows."""
    from transformers import LlamaConfig, LlamaForCausalLM

    from fic.training.vasd.distill import hidden_at, packed_sequences

    system = list(range(10, 40))
    sequences = [system + [50, 51, 52, 53], system + [50, 60, 61], system[:5] + [70, 71, 72, 73, 74, 75],
                 system[:5] + [70, 71, 80]]
    rows, where = packed_sequences(sequences)
    assert [len(r["input_ids"]) for r in rows] == [34 + 2, 11 + 1]
    assert where == [(0, 34, 0), (0, 31, 34), (1, 11, 0), (1, 7, 11)]
    assert rows[0]["position_ids"][34:] == [31, 32] and rows[0]["limits"][34:] == [31, 31]
    assert rows[1]["segments"] == [0] * 11 + [1]
    torch.manual_seed(0)
    net = LlamaForCausalLM(LlamaConfig(vocab_size=100, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                       num_attention_heads=4, num_key_value_heads=2)).eval()
    positions = [range(29, 34), [30, 31, 32], [0, 4, 9, 10], [3, 6, 7]]
    apart = hidden_at(net, sequences, positions, 0, "cpu", 64)
    shared = hidden_at(net, sequences, positions, 0, "cpu", 64, share_prefixes=True)
    assert apart.shape == (15, 32) and torch.allclose(apart, shared, atol=1e-5)


def test_unanswerable_labels_go_only_to_calls_made_before_every_required_argument(smollm2_tokenizer):
    """labels.select=unanswerable: a student that calls at every turn gets a deferral label at
    each call made while a required argument was missing, none at the call made once the request
    was complete but an optional argument was still to come, and none when nothing was premature."""
    from fic import tasks
    from fic.training.vasd.step import label_rows

    instance, order, required = late_optional_instance()
    complete = max(order.index(p) for p in required) + 1  # the turn index whose shard completes the required ones
    gold = tasks.get("actions").gold_reply(instance)
    cfg = load_config(VASDConfig, None, ["regularizer.kind=none", "labels.weight=1.0", "labels.select=unanswerable",
                                         "labels.max_turns=8", "train.max_steps=1"])
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
