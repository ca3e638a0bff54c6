"""What a training run computes in, and the bfloat16 compute copy.

`train.mixed_precision` picks one of three ways:

- `no`: forward and backward in the weights' dtype (float32 unless `model.dtype` says otherwise);
- `bf16`: float32 master weights under bfloat16 autocast, which casts every float32 weight to
  bfloat16 again in every forward and backward op that uses it;
- `bf16_copy`: float32 master weights and optimizer state, and a bfloat16 copy of every weight,
  cast once per optimizer step, that the forward and backward passes run on (`Bf16Copy`). Each
  micro-batch's bfloat16 gradients are added into float32 gradients of the masters, so the
  window's sum, the clipping and the AdamW update are float32, as under autocast; what differs is
  that activations between ops stay bfloat16 (no per-op float32 residual stream) and that the LM
  head's backward runs in bfloat16 too (under autocast it ran in float32). One process only: DDP
  and DeepSpeed hold gradient buckets of the weights' dtype.

`auto` is bf16 autocast where bfloat16 is fast (AMX or AVX-512 BF16, a bf16 GPU), else none.
Measured on the reference machine (2026-12-02, `fic bench sft --precision bf16_copy --also bf16`,
the bundled model, one micro-batch of 4 a step, interleaved): the copy ran at 0.95x autocast's
target tokens per second. Autocast caches each weight's bf16 cast for the forward and backward of
a micro-batch, so with one micro-batch a step the two cast as often, and the copy's bf16 residual
stream gains nothing on this CPU; the copy saves a cast per extra micro-batch of a window, which
is small beside the passes. It stays a choice (`train.mixed_precision=bf16_copy`), not the default.
"""

from __future__ import annotations

import os

import torch

from fic.core.model import default_device, fast_bf16
from fic.training.config import RunConfig

COPY = "bf16_copy"


def training_precision(cfg: RunConfig) -> tuple[str | None, bool, str]:
    """The Accelerator's mixed precision for `cfg` (None: what a launch config says, or none),
    whether forward and backward run on a bfloat16 copy (`Bf16Copy`), and a line saying what the
    run computes in and why."""
    wanted = cfg.train.mixed_precision
    launched = os.environ.get("ACCELERATE_MIXED_PRECISION")
    if wanted == COPY:
        return "no", True, (f"precision: float32 master weights, forward and backward on a bfloat16 copy cast once "
                            f"per optimizer step (train.mixed_precision={COPY}, set by the recipe)")
    if wanted != "auto":
        return wanted, False, (f"precision: {cfg.model.weights_dtype} weights, mixed_precision={wanted} (set by the "
                               "recipe)")
    if launched:
        return None, False, (f"precision: {cfg.model.weights_dtype} weights, mixed_precision={launched} (from the "
                             "launch config)")
    if cfg.model.dtype != "auto":
        return None, False, f"precision: {cfg.model.dtype} weights and compute (model.dtype={cfg.model.dtype})"
    reason = fast_bf16(default_device())
    if reason:
        return "bf16", False, f"precision: float32 master weights, bfloat16 autocast ({reason}: bf16 is fast here)"
    return None, False, "precision: float32 (no fast bfloat16 on this machine)"


class Bf16Copy:
    """Forward and backward of the trained model on a bfloat16 copy of its float32 weights.

        copy = Bf16Copy(model)
        with copy:                      # the weights are the bfloat16 copy inside
            for batch in window:
                loss(batch).backward()
                copy.accumulate()       # bf16 gradients into the float32 masters' gradients
        optimizer.step()                # on the float32 masters, outside
        copy.refresh()                  # the next block casts the new masters: once a step

    Inside the block every float32 parameter's `.data` is its bfloat16 copy (a tied weight is one
    parameter, so ties hold); on leaving, the float32 masters are back, holding the accumulated
    float32 gradients. Checkpoints, clipping and the optimizer see only the masters. The copy is
    cast from the masters when the block is entered after `refresh` (and the first time), so a
    checkpoint loaded into the masters in between is what the next pass reads. Weights already
    below float32 (a LoRA run's frozen bf16 base) are used as they are. `enabled=False` makes
    every call a no-op, so callers need no branch."""

    def __init__(self, model: torch.nn.Module, enabled: bool = True):
        self.params = [p for p in model.parameters() if p.dtype == torch.float32] if enabled else []
        self.copies = [torch.empty_like(p, dtype=torch.bfloat16) for p in self.params]
        # Gradient buffers kept from step to step, bf16 for the backward passes and float32 for the
        # window: a fresh tensor of the model's size each micro-batch costs its page faults again
        # (0.15-0.2 s per 540 MB here, against 0.05 to write into one already mapped).
        self.bf16_grads: list[torch.Tensor | None] = [None] * len(self.params)
        self.sums: list[torch.Tensor | None] = [None] * len(self.params)
        self.masters: list[torch.Tensor] = []
        self.summed: list[bool] = []
        self.stale = True
        self.inside = False

    def __enter__(self) -> None:
        if not self.params or self.inside:
            return
        self.masters = [p.data for p in self.params]
        self.summed = [False] * len(self.params)
        with torch.no_grad():
            for k, (param, copy, master) in enumerate(zip(self.params, self.copies, self.masters)):
                if self.stale:
                    copy.copy_(master)
                if param.grad is not None:  # float32 gradients already there are added to
                    self.sums[k] = param.grad
                    self.summed[k] = True
                param.grad = None
                param.data = copy
                if self.bf16_grads[k] is not None:  # zeroed when its sum was taken
                    param.grad = self.bf16_grads[k]
        self.stale, self.inside = False, True

    def accumulate(self) -> None:
        """Add the gradients of the last backward pass into the float32 sums."""
        if not self.inside:
            return
        with torch.no_grad():
            for k, param in enumerate(self.params):
                grad = param.grad
                if grad is None:
                    continue
                if self.sums[k] is None:
                    self.sums[k] = torch.empty_like(grad, dtype=torch.float32)
                if self.summed[k]:
                    self.sums[k].add_(grad)
                else:
                    self.sums[k].copy_(grad)
                    self.summed[k] = True
                self.bf16_grads[k] = grad
                grad.zero_()

    def __exit__(self, *exc: object) -> None:
        if not self.inside:
            return
        self.accumulate()
        for k, (param, master) in enumerate(zip(self.params, self.masters)):
            param.grad = None
            param.data = master
            param.grad = self.sums[k] if self.summed[k] else None
        self.masters, self.summed, self.inside = [], [], False

    def refresh(self) -> None:
        """The masters changed (an optimizer step, a checkpoint load): cast them again next time."""
        self.stale = True
