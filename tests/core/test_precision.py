"""`dtype: auto` picks the fastest precision that trains correctly on the machine at hand."""

from __future__ import annotations

import pytest
import torch

from fic.core.config import load_config
from fic.core.model import fast_bf16, resolve_dtype
from fic.training.precision import training_precision
from fic.training.sft import SFTConfig


def test_a_cpu_without_bf16_instructions_gets_float32(monkeypatch):
    monkeypatch.setenv("FIC_CPU_FLAGS", "sse4_2 avx2 avx512f")
    assert fast_bf16("cpu") is None and resolve_dtype("auto", "cpu") == torch.float32
    mixed, copy, said = training_precision(load_config(SFTConfig))
    assert mixed is None and not copy and "float32" in said


@pytest.mark.parametrize("flag", ["avx512_bf16", "amx_bf16"])
def test_a_cpu_with_bf16_instructions_computes_in_bf16_over_float32_master_weights(monkeypatch, flag):
    monkeypatch.setenv("FIC_CPU_FLAGS", f"avx2 {flag}")
    assert flag in fast_bf16("cpu") and resolve_dtype("auto", "cpu") == torch.bfloat16  # inference: bf16 weights
    cfg = load_config(SFTConfig)
    mixed, copy, said = training_precision(cfg)
    assert mixed == "bf16" and not copy and cfg.model.weights_dtype == "float32" and flag in said


def test_an_explicit_setting_always_wins(monkeypatch):
    monkeypatch.setenv("FIC_CPU_FLAGS", "avx512_bf16")
    assert training_precision(load_config(SFTConfig, None, ["model.dtype=float32"]))[:2] == (None, False)
    cfg = load_config(SFTConfig, None, ["model.dtype=bfloat16"])
    assert training_precision(cfg)[:2] == (None, False) and cfg.model.weights_dtype == "bfloat16"
    assert training_precision(load_config(SFTConfig, None, ["train.mixed_precision=no"]))[:2] == ("no", False)
    assert resolve_dtype("float32", "cpu") == torch.float32
    monkeypatch.setenv("FIC_CPU_FLAGS", "")
    assert training_precision(load_config(SFTConfig, None, ["train.mixed_precision=bf16"]))[:2] == ("bf16", False)
    assert training_precision(load_config(SFTConfig, None, ["train.mixed_precision=bf16_copy"]))[:2] == ("no", True)


def test_a_launch_config_decides_when_the_recipe_says_auto(monkeypatch):
    monkeypatch.setenv("FIC_CPU_FLAGS", "avx512_bf16")
    monkeypatch.setenv("ACCELERATE_MIXED_PRECISION", "no")
    mixed, copy, said = training_precision(load_config(SFTConfig))
    assert mixed is None and not copy and "launch config" in said
