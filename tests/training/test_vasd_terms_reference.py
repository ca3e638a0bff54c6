"""The reference term (`fic/training/vasd/terms/reference.py`): it reads the starting weights,
with LoRA the adapter-free model whatever the moving-average teacher became, and in full
fine-tuning a moving-average teacher beside it (a third copy) is refused in one line. Its
targets and their first-token weights: `test_vasd_rows.py`."""

from __future__ import annotations

import copy

import pytest
import torch

from fic.core.config import load_config
from fic.core.errors import FicError
from fic.training.vasd.batches import hidden_at
from fic.training.vasd.config import VASDConfig
from fic.training.vasd.teacher import teacher_parts


def test_ema_teacher_with_a_reference_term_in_full_fine_tuning_is_refused(tiny_model_dir):
    """The reference term reads the starting weights; in full fine-tuning with an EMA teacher the
    only copy is the moving average, so it read that. A third copy is refused, in one line."""
    for share in ("0", "0.5"):  # the reference term alone, and beside the anchor
        with pytest.raises(FicError, match="third copy") as err:
            load_config(VASDConfig, None, ["teacher.mode=ema", "terms.reference.weight=1", f"anchor.share={share}",
                                           "train.max_steps=1", "anchor.path=sft.jsonl"])
        assert "\n" not in str(err.value) and err.value.field == "teacher.mode"
    # With LoRA the reference is the adapter-free model, whatever the EMA copy has become.
    from peft import LoraConfig, get_peft_model

    from fic.core.model import load_model

    base = load_model(tiny_model_dir, dtype="float32").eval()
    model = get_peft_model(copy.deepcopy(base), LoraConfig(r=4, target_modules=["q_proj", "v_proj"], lora_dropout=0.0))
    cfg = load_config(VASDConfig, None, ["lora.enabled=true", "teacher.mode=ema", "terms.reference.weight=1",
                                         "anchor.share=0", "train.max_steps=1"])
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


def test_the_reference_term_is_a_divergence_to_the_starting_weights_read_on_the_students_own_ids():
    from fic.training.vasd.terms import run_terms

    cfg = load_config(VASDConfig, None, ["anchor.share=0", "terms.reference.weight=0.5", "loss.temperature=0.7",
                                         "train.max_steps=1"])
    (distill, reference) = run_terms(cfg, anchors=False)
    assert distill.name == "distill"
    assert (reference.name, reference.kind, reference.reads, reference.weight, reference.temperature) == (
        "reference", "divergence", "reference", 0.5, 0.7)
    assert [t.name for t in run_terms(load_config(VASDConfig, None, ["anchor.share=0", "train.max_steps=1"]),
                                      anchors=False)] == ["distill"]  # off by default
