"""Where a training step's CPU time goes, by kind of work: `fic bench sft --profile` and
`fic bench vasd --profile` run one step (SFT) or one student pass (VASD) under torch's profiler
and add up each operator's own time (no double counting of nested calls) into:

- `attention projections`, `MLP`, `LM head`: matrix products, told apart by their shapes (the
  MLP's intermediate size, the vocabulary, else the attention's q/k/v/o projections);
- `attention core`: scaled dot-product attention and its backward;
- `norms and activations`, `loss (softmax, cross-entropy)`, `optimizer`, `casts and copies`,
  `embedding`, `other`.

The profiler adds a few percent of overhead spread over every operator; the shares, not the
seconds, are the figures to read.
"""

from __future__ import annotations

from collections import defaultdict
from typing import Any, Callable

CATEGORIES = ("attention projections", "MLP", "LM head", "attention core", "norms and activations",
              "loss (softmax, cross-entropy)", "optimizer", "casts and copies", "embedding", "other")
MATMULS = ("aten::mm", "aten::addmm", "aten::bmm", "aten::matmul", "aten::linear", "aten::baddbmm")
ELEMENTWISE = ("mul", "add", "silu", "pow", "rsqrt", "mean", "sigmoid", "neg", "cat", "div", "sub", "sum", "where",
               "tanh", "exp", "masked_fill", "cos", "sin", "clamp", "gelu")


def category(name: str, shapes: list, dims: dict[str, int]) -> str:
    """The kind of work one operator call does (see the module docstring)."""
    short = name.split("::")[-1].lower()
    if "adam" in short or "_foreach" in short:
        return "optimizer"
    if "scaled_dot_product" in short or "flash_attention" in short or "_efficient_attention" in short:
        return "attention core"
    if name in MATMULS or short in ("mmbackward0", "addmmbackward0"):
        sizes = {d for shape in shapes if isinstance(shape, (list, tuple)) for d in shape}
        if dims["vocab"] in sizes:
            return "LM head"
        if dims["intermediate"] in sizes:
            return "MLP"
        return "attention projections"
    if any(k in short for k in ("softmax", "nll", "cross_entropy", "logsumexp")):
        return "loss (softmax, cross-entropy)"
    if short in ("copy_", "_to_copy", "to", "clone", "contiguous", "empty_like", "zeros_like", "zero_", "fill_"):
        return "casts and copies"
    if "embedding" in short:
        return "embedding"
    if any(short.startswith(k) for k in ELEMENTWISE):
        return "norms and activations"
    return "other"


def profile(fn: Callable[[], Any], model: Any) -> dict:
    """Run `fn` once under torch's profiler; seconds and share per category of the ops it ran."""
    import torch
    from torch.profiler import ProfilerActivity

    config = getattr(model, "config", None)
    dims = {"vocab": getattr(config, "vocab_size", -1), "intermediate": getattr(config, "intermediate_size", -2)}
    with torch.profiler.profile(activities=[ProfilerActivity.CPU], record_shapes=True) as prof:
        fn()
    seconds: dict[str, float] = defaultdict(float)
    for event in prof.key_averages(group_by_input_shape=True):
        seconds[category(event.key, list(event.input_shapes or []), dims)] += event.self_cpu_time_total / 1e6
    total = sum(seconds.values()) or 1.0
    return {"profile_seconds": round(total, 3),
            **{f"profile_share_{name.split(' (')[0].replace(' ', '_')}": round(seconds[name] / total, 4)
               for name in CATEGORIES}}
