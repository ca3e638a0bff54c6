"""How far a step is from the hardware: the machine's own bf16 matmul rate, measured in the
same run, against the FLOP/s a training step achieves (and, for decoding, its memory bandwidth
against the bytes a step must read).

FLOPs of a decoder step are counted the usual way (Kaplan et al. 2020; Korthikanti et al. 2022):
a forward pass costs 2 x (non-embedding parameters) per token plus the causal attention scores
and values, 2 x layers x hidden x T^2 per sequence of length T; the LM head, 2 x hidden x vocab
per row it runs on (FiC runs it on target rows only); a backward pass costs twice its forward.
Padding is not counted: it is work the hardware does but the step does not need.
"""

from __future__ import annotations

import time
from typing import Any, Sequence

import torch

from fic.core.model import fast_bf16


def matmul_rate(dtype: torch.dtype = torch.bfloat16, n: int = 2048, repeats: int = 5, budget_s: float = 0.25) -> float:
    """FLOP/s of an n x n matrix product in `dtype` on this machine, now (the best of `repeats`).

    The product is made smaller where one of n x n would take over `budget_s`, as judged from a
    256 x 256 product first: a CPU without bfloat16 instructions emulates them (48x slower than
    float32 on an AVX2 EPYC, 2026-12-02), and 2048 x 2048 then takes minutes. Where bf16 is fast,
    n stays as asked."""
    generator = torch.Generator().manual_seed(0)

    def best_of(size: int, times: int) -> float:
        a = torch.randn(size, size, generator=generator).to(dtype)
        b = torch.randn(size, size, generator=generator).to(dtype)
        a @ b  # warm-up: kernel selection and page faults
        best = float("inf")
        for _ in range(times):
            began = time.perf_counter()
            a @ b
            best = min(best, time.perf_counter() - began)
        return best

    probe = min(n, 256)
    n = product_size(2 * probe ** 3 / best_of(probe, 1), n, budget_s, probe)
    return 2 * n ** 3 / best_of(n, repeats)


def peak_rate() -> tuple[float, str]:
    """The machine's matmul ceiling for a training step, now, and its dtype: bfloat16 where it is
    fast (what `dtype: auto` computes in there), else float32 (what auto computes in: emulated
    bfloat16 was 48x slower than float32 on an AVX2 CPU, measured 2026-12-02)."""
    if fast_bf16("cpu"):
        return matmul_rate(torch.bfloat16), "bfloat16"
    return matmul_rate(torch.float32), "float32"


def copy_bandwidth(device: torch.device | str = "cpu", megabytes: int = 256, repeats: int = 5) -> float:
    """Bytes a second this device's memory moves, now: a `megabytes` copy reads and writes each
    byte once (the best of `repeats`). The ceiling of a decoding step, which reads every weight
    and cached key and value once and computes little with them."""
    device = torch.device(device)
    source = torch.empty(megabytes * 2**20, dtype=torch.uint8, device=device)
    target = torch.empty_like(source)
    target.copy_(source)  # warm-up: page faults
    best = float("inf")
    for _ in range(repeats):
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        began = time.perf_counter()
        target.copy_(source)
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        best = min(best, time.perf_counter() - began)
    return 2 * source.numel() / best


def product_size(rate: float, n: int, budget_s: float, smallest: int = 256) -> int:
    """The side of the square product to time: `n`, or the multiple of 64 whose product takes
    `budget_s` at `rate` FLOP/s where that is smaller (never under `smallest`)."""
    fits = int((budget_s * rate / 2) ** (1 / 3)) // 64 * 64
    return max(smallest, min(n, fits))


def shape(model: Any) -> dict:
    """Non-embedding parameters, layers, hidden size and vocabulary of a causal LM."""
    config = model.config
    embedding = model.get_input_embeddings().weight.numel()
    head = model.get_output_embeddings()
    tied = head is None or head.weight.data_ptr() == model.get_input_embeddings().weight.data_ptr()
    total = sum(p.numel() for p in model.parameters())
    body = total - embedding - (0 if tied else head.weight.numel())
    return {"body_params": body, "layers": config.num_hidden_layers, "hidden": config.hidden_size,
            "vocab": model.get_input_embeddings().weight.shape[0]}


def forward_flops(dims: dict, lengths: Sequence[int], head_rows: int) -> float:
    """FLOPs of one forward pass over sequences of `lengths`, the LM head on `head_rows` rows."""
    tokens = sum(lengths)
    attention = 2 * dims["layers"] * dims["hidden"] * sum(t * t for t in lengths)
    return 2 * dims["body_params"] * tokens + attention + 2 * dims["hidden"] * dims["vocab"] * head_rows


def train_flops(dims: dict, lengths: Sequence[int], head_rows: int) -> float:
    """FLOPs of a forward and backward pass (backward: twice the forward)."""
    return 3 * forward_flops(dims, lengths, head_rows)
