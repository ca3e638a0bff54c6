"""A training recipe run as it is, with a probe that records where its time and memory go.

    python tools/gpu/shape_run.py sft|vasd FIGURES.json --config RECIPE [key=value ...]
    accelerate launch --config_file launch/deepspeed_zero2.yaml --num_processes 1 \
        tools/gpu/shape_run.py sft FIGURES.json --config RECIPE [key=value ...]

The recipe (`fic/train_sft.py`, `fic/train_vasd.py`) runs unchanged; the probe wraps the calls it
makes for each phase of a step (SFT: the forward and backward of the accumulation window, the
optimizer step; VASD: the rollouts, the teacher pass, the student pass, the optimizer step),
synchronising the GPU around each, and counts the token positions the decoder runs in each phase
(a forward hook on the decoder body: padded positions, what the GPU computes). Per call of each
phase it records seconds, positions, decoder forwards and the peak GPU memory allocated during
the phase; for the rollouts also the decoding steps (forwards of one new token per row) with
their rows and seconds. At the end the process's peak GPU memory (`torch.cuda.max_memory_allocated`)
and peak resident memory go with them into FIGURES.json (main process only).
"""

from __future__ import annotations

import json
import os
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from fic.core.model import peak_memory_mb


def _cuda() -> bool:
    return torch.cuda.is_available() and torch.cuda.is_initialized()


def _sync() -> None:
    if _cuda():
        torch.cuda.synchronize()


class Probe:
    """Per-phase seconds, decoder positions and peak memory of a training run."""

    def __init__(self) -> None:
        self.phase = "other"
        self.calls: dict[str, list[dict]] = {}
        self.current: dict | None = None
        self.decode = {"forwards": 0, "rows": 0, "seconds": 0.0, "context": 0}
        self.prefill = {"forwards": 0, "positions": 0, "seconds": 0.0}
        self.model_info: dict = {}
        self._forward_began: float | None = None
        self._shape: tuple = (0, 0)
        self._context = 0
        self.peak_before_phases = 0  # the peak of everything outside the phases (loading, prepare)

    # ------------------------------------------------------------------ phases
    def phased(self, name: str, fn: Callable) -> Callable:
        def run(*args: Any, **kwargs: Any) -> Any:
            _sync()
            if _cuda():  # each phase's own peak; what came before is kept
                self.peak_before_phases = max(self.peak_before_phases, torch.cuda.max_memory_allocated())
                torch.cuda.reset_peak_memory_stats()
            outer, self.phase = (self.phase, self.current), name
            self.current = {"seconds": 0.0, "positions": 0, "forwards": 0}
            began = time.perf_counter()
            try:
                return fn(*args, **kwargs)
            finally:
                _sync()
                self.current["seconds"] = time.perf_counter() - began
                if _cuda():
                    self.current["peak_allocated_bytes"] = torch.cuda.max_memory_allocated()
                self.calls.setdefault(name, []).append(self.current)
                self.phase, self.current = outer
        return run

    # ------------------------------------------------------------------ the decoder's forwards
    def before_forward(self, module: Any, args: tuple, kwargs: dict) -> None:
        ids = kwargs.get("input_ids", args[0] if args else None)
        embeds = kwargs.get("inputs_embeds")
        shape = tuple(ids.shape) if ids is not None else tuple(embeds.shape[:2]) if embeds is not None else (0, 0)
        positions = shape[0] * shape[1] if len(shape) == 2 else 0
        if self.current is not None:
            self.current["positions"] += positions
            self.current["forwards"] += 1
        if self.phase == "rollouts":
            _sync()
            self._forward_began = time.perf_counter()
            self._shape = shape
            cache = kwargs.get("past_key_values")
            self._context = int(cache.get_seq_length()) if cache is not None and hasattr(cache, "get_seq_length") else 0

    def after_forward(self, module: Any, args: tuple, kwargs: dict, output: Any) -> None:
        if self.phase != "rollouts" or self._forward_began is None:
            return
        _sync()
        seconds = time.perf_counter() - self._forward_began
        self._forward_began = None
        rows, length = self._shape if len(self._shape) == 2 else (0, 0)
        if length == 1:
            self.decode["forwards"] += 1
            self.decode["rows"] += rows
            self.decode["seconds"] += seconds
            self.decode["context"] += rows * self._context
        else:
            self.prefill["forwards"] += 1
            self.prefill["positions"] += rows * length
            self.prefill["seconds"] += seconds

    def watch(self, model: Any) -> Any:
        from fic.training.losses import decoder_and_head

        body, _ = decoder_and_head(model)
        # Plain functions, not bound methods: a deep copy of the model (full fine-tuning's frozen
        # teacher) keeps the same functions, so its forwards are counted here too.
        body.register_forward_pre_hook(lambda m, a, k: self.before_forward(m, a, k), with_kwargs=True)
        body.register_forward_hook(lambda m, a, k, o: self.after_forward(m, a, k, o), with_kwargs=True)
        params = list(model.parameters())
        # Under ZeRO-3 a parameter holds a shard; ds_numel is its whole size.
        self.model_info = {
            "parameters": sum(getattr(p, "ds_numel", p.numel()) for p in params),
            "trainable_parameters": sum(getattr(p, "ds_numel", p.numel()) for p in params if p.requires_grad),
            "layers": getattr(getattr(model, "config", None), "num_hidden_layers", None),
            "dtype": str(params[0].dtype).split(".")[-1] if params else None,
        }
        return model

    # ------------------------------------------------------------------ the record
    def record(self, method: str, rc: int, wall_s: float) -> dict:
        info: dict = {"method": method, "rc": rc, "wall_s": wall_s, "phases": self.calls,
                      "rollout_decode": self.decode, "rollout_prefill": self.prefill, "model": self.model_info,
                      "peak_rss_bytes": int(peak_memory_mb("cpu") * 2**20), "torch": torch.__version__}
        try:
            import transformers

            info["transformers"] = transformers.__version__
        except ImportError:
            pass
        try:
            import deepspeed

            info["deepspeed"] = deepspeed.__version__
        except Exception:
            info["deepspeed"] = None
        if torch.cuda.is_available():
            info.update(device="cuda", gpu=torch.cuda.get_device_name(0), cuda=torch.version.cuda,
                        gpu_memory_bytes=torch.cuda.get_device_properties(0).total_memory,
                        peak_allocated_bytes=torch.cuda.max_memory_allocated() if _cuda() else 0,
                        peak_reserved_bytes=torch.cuda.max_memory_reserved() if _cuda() else 0)
            phase_peaks = [c.get("peak_allocated_bytes", 0) for calls in self.calls.values() for c in calls]
            info["peak_allocated_bytes"] = max([info["peak_allocated_bytes"], self.peak_before_phases, *phase_peaks])
        else:
            info.update(device="cpu", gpu=None, peak_allocated_bytes=None, peak_reserved_bytes=None)
        return info


def install(probe: Probe, method: str) -> Any:
    """Wrap the recipe's phase calls (SFT: module attributes it looks up at call time; VASD: the
    phase methods of `VASDStep`) and the model builder; return the recipe module."""
    from fic.training import loop

    build_model = loop.build_model
    loop.build_model = lambda *a, **k: probe.watch(build_model(*a, **k))
    loop.optimizer_step = probe.phased("update", loop.optimizer_step)
    if method == "sft":
        import fic.train_sft as recipe
        from fic.training import sft

        sft.window_backward = probe.phased("student", sft.window_backward)
    else:
        import fic.train_vasd as recipe
        from fic.training.vasd.step import VASDStep

        VASDStep.rollouts = probe.phased("rollouts", VASDStep.rollouts)
        VASDStep.teacher = probe.phased("teacher", VASDStep.teacher)
        VASDStep.student = probe.phased("student", VASDStep.student)
    return recipe


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if len(argv) < 2 or argv[0] not in ("sft", "vasd"):
        print("usage: python tools/gpu/shape_run.py sft|vasd FIGURES.json --config RECIPE [key=value ...]",
              file=sys.stderr)
        return 2
    method, figures = argv[0], Path(argv[1])
    probe = Probe()
    recipe = install(probe, method)
    began = time.perf_counter()
    rc = 1
    try:
        rc = recipe.main(argv[2:])
    finally:
        if int(os.environ.get("RANK", "0")) == 0:  # the main process writes the figures
            figures.parent.mkdir(parents=True, exist_ok=True)
            figures.write_text(json.dumps(probe.record(method, rc, time.perf_counter() - began)) + "\n",
                               encoding="utf-8")
    return rc


if __name__ == "__main__":
    sys.exit(main())
