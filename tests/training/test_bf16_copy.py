"""`train.mixed_precision=bf16_copy`: forward and backward on a bfloat16 copy of the float32
master weights, cast once per optimizer step (`fic.training.precision.Bf16Copy`)."""

from __future__ import annotations

import json
import shutil

import pytest
import torch

from fic.core.config import load_config
from fic.core.model import load_model
from fic.training.losses import TargetLoss
from fic.training.precision import Bf16Copy


def batch(vocab: int, rows: int = 2, length: int = 24, seed: int = 0) -> dict:
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(5, vocab, (rows, length), generator=g)
    targets = torch.full_like(ids, -100)
    targets[:, length // 2:-1] = ids[:, length // 2 + 1:]
    return {"input_ids": ids, "attention_mask": torch.ones_like(ids), "targets": targets}


def grads_of(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    return {n: p.grad.detach().clone() for n, p in model.named_parameters() if p.grad is not None}


def relative_error(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a - b).norm() / b.norm().clamp_min(1e-12))


@pytest.fixture
def model(tiny_model_dir):
    return load_model(tiny_model_dir, dtype="float32").train()


def test_gradients_on_the_copy_equal_autocasts_within_bf16_tolerance(model):
    """The same micro-batch's gradients three ways: float32 (the reference), bf16 autocast over
    float32 weights, and the bf16 copy; both bf16 ways sit within bf16 tolerance of float32 and
    of each other, and the copy's gradients come back float32 on the float32 masters."""
    loss = TargetLoss(model, chunk_tokens=8)  # several head chunks: the fused head's accumulation
    data = batch(model.config.vocab_size)
    loss(**data)["ce"].backward()
    exact = grads_of(model)
    model.zero_grad(set_to_none=True)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        loss(**data)["ce"].backward()
    autocast = grads_of(model)
    model.zero_grad(set_to_none=True)
    copy = Bf16Copy(model)
    with copy:
        assert {p.dtype for p in model.parameters()} == {torch.bfloat16}
        loss(**data)["ce"].backward()
        copy.accumulate()
    assert {p.dtype for p in model.parameters()} == {torch.float32}
    copied = grads_of(model)
    assert set(copied) == set(exact) and all(g.dtype == torch.float32 for g in copied.values())
    for name in exact:
        assert relative_error(copied[name], exact[name]) < 0.05, name
        assert relative_error(autocast[name], exact[name]) < 0.05, name
        assert relative_error(copied[name], autocast[name]) < 0.05, name


def test_micro_batches_accumulate_into_float32_and_ties_hold(model):
    """Two micro-batches in one window: the float32 gradient is the sum of each one's; inside the
    block the tied embedding and LM head are still one bfloat16 weight."""
    loss = TargetLoss(model, chunk_tokens=1024)
    first, second = batch(model.config.vocab_size, seed=1), batch(model.config.vocab_size, seed=2)
    copy = Bf16Copy(model)
    separate = []
    for data in (first, second):
        with copy:
            loss(**data)["ce"].backward()
        separate.append(grads_of(model))
        model.zero_grad(set_to_none=True)
    with copy:
        head, embed = model.get_output_embeddings().weight, model.get_input_embeddings().weight
        assert head is embed and head.dtype == torch.bfloat16
        for data in (first, second):
            loss(**data)["ce"].backward()
            copy.accumulate()
            # moved out of the bf16 gradients, which are kept (zeroed) for the next backward pass
            assert all(p.grad.dtype == torch.bfloat16 and not p.grad.any() for p in model.parameters())
    together = grads_of(model)
    for name, grad in together.items():
        torch.testing.assert_close(grad, separate[0][name] + separate[1][name], rtol=0, atol=0)


def test_the_masters_move_by_the_optimizers_update_and_the_copy_follows_them(model):
    """AdamW steps the float32 masters with float32 gradients (an update far below bf16's
    resolution still moves them); the copy is cast from the new masters at the next window."""
    loss = TargetLoss(model, chunk_tokens=1024)
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-6)
    copy = Bf16Copy(model)
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    with copy:
        loss(**batch(model.config.vocab_size))["ce"].backward()
    grads = grads_of(model)
    optimizer.step()
    moved = lost_in_bf16 = 0
    for name, param in model.named_parameters():
        assert param.dtype == torch.float32
        torch.testing.assert_close(param.detach(), before[name] - 1e-6 * grads[name], rtol=0, atol=1e-12)
        changed = param.detach() != before[name]
        moved += int(changed.sum())
        # the same update applied to bf16 weights would round away
        lost_in_bf16 += int((changed & (param.detach().to(torch.bfloat16) == before[name].to(torch.bfloat16))).sum())
    assert moved > 0 and lost_in_bf16 > 0.9 * moved
    copy.refresh()
    with copy:
        for name, param in model.named_parameters():
            torch.testing.assert_close(param.detach(), (before[name] - 1e-6 * grads[name]).to(torch.bfloat16),
                                       rtol=0, atol=0)


@pytest.mark.slow  # end to end: two runs and a resume
def test_sft_trains_resumes_and_logs_under_the_copy(tiny_model_dir, tmp_path):
    """The SFT recipe with train.mixed_precision=bf16_copy: it says so, trains (finite, falling
    loss), and a resumed run repeats the uninterrupted losses (the copy is cast from the restored
    masters)."""
    from fic.corpus.build import SFTDataConfig, build_corpus
    from fic.train_sft import train
    from fic.training.sft import SFTConfig

    corpus = tmp_path / "c.sft.jsonl"
    build_corpus(load_config(SFTDataConfig, None, ["data.source=reasoning-gym:gsm_symbolic", "data.limit=12",
                                                   f"out={corpus}"]), progress=False)

    def run(out, *extra):
        return train(load_config(SFTConfig, None, [
            f"model.path={tiny_model_dir}", f"data.path={corpus}", f"out={out}", "train.max_steps=6",
            "train.micro_batch_size=2", "train.grad_accum_steps=2", "optim.lr=3e-3", "train.mixed_precision=bf16_copy",
            "checkpoint.every=3", "logging.wandb=false", "logging.progress=false", *extra]))

    run(tmp_path / "whole")
    whole = [json.loads(line) for line in (tmp_path / "whole" / "metrics.jsonl").read_text().splitlines()]
    assert all(torch.isfinite(torch.tensor(m["loss"])) for m in whole) and whole[-1]["loss"] < whole[0]["loss"]
    from safetensors.torch import load_file

    saved = load_file(str(tmp_path / "whole" / "final" / "model.safetensors"))
    assert {t.dtype for t in saved.values()} == {torch.float32}  # the masters, not the copy
    run(tmp_path / "part")
    shutil.rmtree(tmp_path / "part" / "final")
    shutil.rmtree(tmp_path / "part" / "checkpoints" / "step-6")
    run(tmp_path / "part", "resume=true")
    part = [json.loads(line) for line in (tmp_path / "part" / "metrics.jsonl").read_text().splitlines()]
    assert [m["step"] for m in part] == [1, 2, 3, 4, 5, 6]
    for a, b in zip(part, whole):
        assert a["loss"] == pytest.approx(b["loss"], rel=1e-6, abs=1e-7)


def test_the_fused_head_sums_a_bf16_weights_gradient_over_chunks_in_float32():
    """VASD's head path (`weighted_ce_rows`, chunk by chunk in forward) on a bf16 head: its weight
    gradient is the float32 sum of the chunks' bf16 products, and handed back in the weight's
    dtype. Over 512 chunks it is within 0.3% of float32's (a bf16 running sum: 1.9%)."""
    from fic.training.losses import weighted_ce_rows

    g = torch.Generator().manual_seed(0)
    weight = torch.randn(512, 32, generator=g) * 0.2
    hidden = torch.randn(1024, 32, generator=g)
    targets, weights = torch.randint(0, 512, (1024,), generator=g), torch.rand(1024, generator=g)
    grads = {}
    for dtype in (torch.float32, torch.bfloat16):
        head = torch.nn.Linear(32, 512, bias=False).to(dtype)
        with torch.no_grad():
            head.weight.copy_(weight)
        h = hidden.to(dtype).requires_grad_(True)
        weighted_ce_rows(head, h, targets, weights, 2, None).backward()
        assert head.weight.grad.dtype == dtype
        grads[dtype] = head.weight.grad.float()
    assert relative_error(grads[torch.bfloat16], grads[torch.float32]) < 0.006


def test_clipping_scales_only_over_the_bound_and_matches_torchs():
    from fic.training.loop import clip_gradients

    g = torch.Generator().manual_seed(0)
    for scale, max_norm in ((1.0, 0.5), (1e-3, 1.0)):  # over the bound, then under it
        ours = [torch.nn.Parameter(torch.zeros(n)) for n in (7, 300, 4096)]
        theirs = [torch.nn.Parameter(torch.zeros(n)) for n in (7, 300, 4096)]
        for a, b in zip(ours, theirs):
            a.grad = torch.randn(a.shape, generator=g) * scale
            b.grad = a.grad.clone()
        before = [a.grad.clone() for a in ours]
        total = clip_gradients(ours, max_norm)
        expected = torch.nn.utils.clip_grad_norm_(theirs, max_norm)
        assert total == pytest.approx(float(expected), rel=1e-6)
        for a, b, old in zip(ours, theirs, before):
            torch.testing.assert_close(a.grad, b.grad, rtol=1e-6, atol=1e-9)
            if total <= max_norm:
                assert torch.equal(a.grad, old)  # under the bound nothing is touched
