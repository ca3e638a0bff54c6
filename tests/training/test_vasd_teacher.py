"""Who plays teacher and reference (`fic.training.vasd.teacher`): the frozen LoRA teacher with
its adapters off, no gradient into any teacher, the moving average in float32, the reference's
starting weights, and the teacher pass running the same forwards on every rank."""

from __future__ import annotations

import copy

import pytest
import torch
from scripted import FunctionBackend
from vasd_played import ara, played, window

from fic.conversation.classify import RuleClassifier
from fic.conversation.simulator import make_conversations, play
from fic.conversation.users import VerbatimUser
from fic.core.config import load_config
from fic.core.errors import FicError
from fic.core.generation import SamplingParams
from fic.training.vasd.batches import hidden_at
from fic.training.vasd.config import VASDConfig
from fic.training.vasd.loss import DistillLoss
from fic.training.vasd.teacher import EmaTeacher, teacher_parts
from fic.training.vasd.terms import run_terms


def test_frozen_lora_teacher_runs_with_adapters_off_and_gets_no_gradient(tiny_model_dir, smollm2_tokenizer):
    from peft import LoraConfig, get_peft_model

    from fic.core.model import load_model

    base = load_model(tiny_model_dir, dtype="float32").eval()
    model = get_peft_model(copy.deepcopy(base), LoraConfig(r=4, target_modules=["q_proj", "v_proj"], lora_dropout=0.0))
    with torch.no_grad():  # trained adapters: the adapted model now differs from the base
        for name, p in model.named_parameters():
            if "lora_B" in name:
                p.normal_(0, 0.5)
    cfg = load_config(VASDConfig, None, ["lora.enabled=true", "teacher.mode=frozen", "terms.reference.weight=1",
                                         "anchor.share=0", "train.max_steps=1"])
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
    cfg = load_config(VASDConfig, None, [f"teacher.mode={mode}", "anchor.share=0", "train.max_steps=1",
                                         "train.micro_batch_size=1"])
    parts = teacher_parts(cfg, model)
    conv = played(smollm2_tokenizer)
    (batch,), _ = window(cfg, [conv], smollm2_tokenizer, parts)
    batch.pop("counts")
    assert not batch["hidden"]["teacher"].requires_grad
    terms = run_terms(cfg, anchors=False)
    loss = DistillLoss(model, terms, parts.heads, chunk_tokens=4, top_k=8)
    loss(**batch)["distill"].backward()
    if mode == "ema":
        assert all(p.grad is None for p in parts.copy.parameters())
        assert all(not p.requires_grad for p in parts.copy.parameters())
    # Same gradient as with the teacher's log-probs fed in as constants.
    grads = {n: p.grad.clone() for n, p in model.named_parameters()}
    model.zero_grad()
    with torch.no_grad():
        constant = parts.head(batch["hidden"]["teacher"][:, 0]).detach()
    loss_const = DistillLoss(model, terms, {"teacher": lambda h, c=constant: c[:h.shape[0]] if h.shape[0] == c.shape[0]
                                            else c}, chunk_tokens=10_000, top_k=8)
    loss_const(**batch)["distill"].backward()
    for n, p in model.named_parameters():
        assert torch.allclose(p.grad, grads[n], atol=1e-6, rtol=1e-4), n


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


@pytest.mark.parametrize("view", ["full", "both"])
def test_the_teacher_and_reference_passes_run_the_same_forwards_with_and_without_rollout_rows(
        tiny_model_dir, smollm2_tokenizer, view):
    """Under ZeRO-3 every forward gathers each layer's weights with every rank, so a rank whose
    micro-batch has no rollout rows must still run the teacher's (every view) and the
    reference's passes: the same count of forwards, on a stand-in token, and empty hidden
    states for the loss."""
    from fic.core.model import load_model

    model = load_model(tiny_model_dir, dtype="float32").eval()
    cfg = load_config(VASDConfig, None, [f"teacher.view={view}", "terms.reference.weight=1", "anchor.share=0",
                                         "train.max_steps=1", "train.micro_batch_size=1", "train.grad_accum_steps=2"])
    parts = teacher_parts(cfg, model)
    assert parts.net is parts.ref_net is parts.copy  # full fine-tuning: one frozen copy plays both
    forwards = []
    hook = parts.net.get_decoder().register_forward_hook(lambda module, args, out: forwards.append(1))
    backend = FunctionBackend(lambda prompt: "Got it, go on.", smollm2_tokenizer)
    cut = []
    for task_id in ("cut-a", "cut-b"):  # conversations that never reach the last shard: no rollout rows
        (conv,) = make_conversations([ara(task_id)], ["sharded"], 1)
        play([conv], backend, VerbatimUser(), RuleClassifier(), SamplingParams(max_new_tokens=8),
             stop_at_correct=False, max_context=len(played(smollm2_tokenizer).ids) - 20)
        cut.append(conv)
    try:
        with_rows, _ = window(cfg, [played(smollm2_tokenizer), played(smollm2_tokenizer)], smollm2_tokenizer, parts)
        counted = len(forwards)
        without, left_out = window(cfg, cut, smollm2_tokenizer, parts)
    finally:
        hook.remove()
    slots = 2 if view == "both" else 1
    assert counted == len(forwards) - counted == 2 * (slots + 1)  # per micro-batch: each view and the reference
    assert left_out["empty_micro_batches"] == 2 == left_out["cut_before_last_shard"]
    assert all(b["hidden"]["teacher"].shape[0] > 0 for b in with_rows)
    for batch in without:
        assert batch["hidden"]["teacher"].shape[:2] == (0, slots) and batch["hidden"]["reference"].shape[:2] == (0, 1)


@pytest.mark.parametrize("settings, copies", [
    (["lora.enabled=true", "teacher.mode=frozen", "terms.reference.weight=1"], False),
    (["teacher.mode=live"], False),
    (["teacher.mode=live", "terms.reference.weight=1"], True),
    (["teacher.mode=frozen"], True),
    (["lora.enabled=true", "teacher.mode=ema"], True),
])
def test_partitioned_weights_refuse_a_second_copy_of_the_model(settings, copies, monkeypatch):
    """Under ZeRO-3 or FSDP a copy of the model (a frozen or moving-average teacher, the reference in
    full fine-tuning) would be whole on every rank, and an EMA could not read the sharded weights:
    refused with one line, before anything is built."""
    from fic.training import loop
    from fic.training.vasd.step import VASDStep
    from fic.training.vasd.teacher import copies_model

    cfg = load_config(VASDConfig, None, [*settings, "anchor.share=0", "train.max_steps=1"])
    assert copies_model(cfg) == copies
    monkeypatch.setattr(loop, "shards_weights", lambda accelerator: True)
    if copies:
        with pytest.raises(FicError, match="partitioned over the ranks .ZeRO-3, FSDP."):
            VASDStep(cfg, None, None, None, [], [], 1)


def test_partitioned_weights_refuse_each_terms_gradient_norm(monkeypatch):
    """Each term's own gradient needs the whole weights on a rank: under ZeRO-3 or FSDP the setting
    is refused in one line naming it, before anything is built."""
    from fic.training import loop
    from fic.training.vasd.step import VASDStep

    cfg = load_config(VASDConfig, None, ["teacher.mode=live", "anchor.share=0", "train.max_steps=1",
                                         "logging.term_grad_norms_every=4"])
    monkeypatch.setattr(loop, "shards_weights", lambda accelerator: True)
    with pytest.raises(FicError, match="logging.term_grad_norms_every"):
        VASDStep(cfg, None, None, None, [], [], 1)

