"""FiC stage 1's settings (`SFTConfig`, `fic train sft --keys`) and its step (`SFTStep`), taken by
the recipe (`fic/train_sft.py`), the control of `fic demo` and `fic bench sft`: the summed
cross-entropy on the window's target tokens, normalised by their count on all ranks, then one
optimizer step."""

from __future__ import annotations

import math
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Sequence

import torch

from fic import tasks
from fic.core.bounds import MAX_ACCUMULATION, MAX_REPEATS
from fic.core.config import setting
from fic.core.errors import FicError, cut_short_on_sigterm
from fic.core.files import check_writable
from fic.core.model import check_model_folder
from fic.core.stats import CURVE_FIGURES
from fic.data.views import check_views
from fic.training import loop
from fic.training.config import DevSection, RunConfig
from fic.training.data import DataOrder, Example, collate
from fic.training.losses import TargetLoss, target_counts, window_backward

# Settings a resumed run must share with the checkpoint: anything else changes what the
# saved optimizer state, RNG and data position mean.
MUST_MATCH = ("model.path", "model.dtype", "lora", "data.max_seq_len", "data.seed", "data.shuffle", "data.bucket",
              "train.micro_batch_size", "train.grad_accum_steps", "train.seed", "train.loss_chunk_tokens")


@dataclass
class DataSection:
    path: str = setting("data/gsm_symbolic.sft.jsonl", "The SFT corpus (JSONL from `fic sft-data`): records with "
                        "`messages`; assistant turns with `train: false` stay in context, out of the loss.")
    max_seq_len: int = setting(2048, "Conversations longer than this many tokens are skipped (and counted): "
                               "cutting one would drop its final answer.", min=8)
    shuffle: bool = setting(True, "Visit records in a seeded random order, a new permutation each epoch.")
    seed: int = setting(0, "Seed of the per-epoch permutations.")
    bucket: int = setting(16, "Group conversations of similar length into micro-batches, within windows of this "
                          "many optimizer steps' worth of data (less padding, fewer wasted FLOPs; 0: off).", min=0,
                          max=MAX_ACCUMULATION)


@dataclass
class DevCurveSection(DevSection):
    """`DevSection` with the plateau rule that ends an SFT run."""

    metric: str = setting("sharded_P", "The figure the plateau rule reads: <view>_P, <view>_first_answer_accuracy "
                          "(0-100) or <view>_premature_answer_rate (lower is better).")
    patience: int = setting(2, "Stop after this many dev scores in a row without a gain of min_delta over the best "
                            "so far.", min=1, max=MAX_REPEATS)
    min_delta: float = setting(2.0, "The smallest gain that counts, in the metric's units (points of P).", min=0.0, unbounded="a threshold in the metric's units")


@dataclass
class SFTConfig(RunConfig):
    """Settings of the SFT recipe (`fic/train_sft.py`, `fic train sft`)."""

    data: DataSection = setting(DataSection(), "The SFT corpus.")
    dev: DevCurveSection = setting(DevCurveSection(), "The dev curve and the plateau rule that ends the run.")
    out: str = setting("runs/sft", "Output folder: config, metrics, checkpoints, final model.")

    def check(self, source: str) -> None:
        super().check(source)
        if self.train.max_steps is None and self.train.epochs <= 0:
            raise FicError("set train.max_steps or a positive train.epochs", path=source, field="train.epochs")
        if self.dev.every:
            if not self.dev.data.source:
                raise FicError("dev.every is set but dev.data.source is empty", path=source, field="dev.data.source")
            check_views(self.dev.views, source, "dev.views")
            view, _, figure = self.dev.metric.partition("_")
            if view not in self.dev.views or figure not in CURVE_FIGURES:
                raise FicError(f"expected <view>_<figure> with a view of dev.views ({', '.join(self.dev.views)}) "
                               f"and a figure of {', '.join(CURVE_FIGURES)}, got {self.dev.metric!r}", path=source,
                               field="dev.metric")


def plateau(scores: Sequence[float], patience: int, min_delta: float, higher_is_better: bool = True) -> bool:
    """Whether a dev curve has stopped rising: its last `patience` scores all fall short of the
    best score before them by a gain of at least `min_delta`."""
    if len(scores) <= patience:
        return False
    sign = 1.0 if higher_is_better else -1.0
    best = max(sign * s for s in scores[:-patience])
    return all(sign * s < best + min_delta for s in scores[-patience:])


def total_steps(cfg: SFTConfig, n_examples: int, world: int) -> int:
    if cfg.train.max_steps is not None:
        return cfg.train.max_steps
    per_step = cfg.train.micro_batch_size * cfg.train.grad_accum_steps * world
    return max(1, math.ceil(cfg.train.epochs * n_examples / per_step))


def check_inputs(cfg: SFTConfig) -> None:
    """Missing files and an output folder that cannot be written fail here, in a second, before
    the model loads."""

    check_writable(cfg.out, folder=True, field="out")
    check_model_folder(cfg.model.path)
    if not Path(cfg.data.path).is_file():
        raise FicError("SFT corpus not found (make one with `fic sft-data`)", path=cfg.data.path, field="data.path")
    if cfg.dev.every:  # the dev curve scores; its data loads only at the first dev step, after the model
        named = [cfg.dev.data.task] if isinstance(cfg.dev.data.task, str) else cfg.dev.data.task
        tasks.check_scoring([name for name in named if name != "all"], field="dev.data.task")


class SFTStep:
    """One SFT optimizer step over `examples`, and what it holds between steps: the trained model
    behind `accelerator.prepare` (`loss_model`, `optimizer`, `scheduler`), its bfloat16 compute
    copy where the run uses one (`fic.training.precision`), and the data order (seeded,
    length-bucketed; a pure function of the step, so a resume is exact)."""

    def __init__(self, cfg: SFTConfig, accelerator: Any, model: torch.nn.Module, examples: Sequence[Example],
                 pad_id: int, steps: int):
        self.cfg, self.accelerator, self.examples, self.pad_id = cfg, accelerator, examples, pad_id
        G = cfg.train.grad_accum_steps
        self.order = DataOrder(len(examples), cfg.train.micro_batch_size, accelerator.num_processes,
                               accelerator.process_index, cfg.data.seed, cfg.data.shuffle,
                               lengths=[len(e.input_ids) for e in examples], bucket=cfg.data.bucket * G)
        self.loss_model, self.optimizer, self.scheduler = loop.prepare(
            accelerator, TargetLoss(model, cfg.train.loss_chunk_tokens), cfg, steps)
        self.copy = loop.compute_copy(cfg, accelerator, self.model)  # bf16_copy: the passes' weights

    @property
    def model(self) -> torch.nn.Module:
        return self.accelerator.unwrap_model(self.loss_model).model

    def micro_batches(self, step: int) -> list[list[Example]]:
        G = self.cfg.train.grad_accum_steps
        return [[self.examples[i] for i in self.order.micro_batch(k)] for k in range((step - 1) * G, step * G)]

    def step(self, step: int) -> dict:
        """Optimizer step `step` (1-based) on its micro-batches: loss, learning rate, gradient norm,
        peak memory, target and total tokens, the epoch reached and tokens per second."""
        figures = self.train_on(self.micro_batches(step))
        figures["epoch"] = round(self.order.epoch_at(step * self.cfg.train.grad_accum_steps), 4)
        return figures

    def train_on(self, micro_batches: list[list[Example]]) -> dict:
        """Forward and backward over these micro-batches (one accumulation window), then the update."""
        began = time.perf_counter()
        batches = [collate(examples, self.pad_id, self.cfg.train.pad_to_multiple) for examples in micro_batches]
        with cut_short_on_sigterm():  # nothing of a step is kept until it is over
            with self.copy:
                window = window_backward(self.accelerator, self.loss_model, batches,
                                         [target_counts(b) for b in batches], {"ce": 1.0}, self.copy.accumulate)
            figures = loop.optimizer_step(self.accelerator, self.loss_model, self.optimizer, self.scheduler,
                                          self.cfg.optim.max_grad_norm)
        self.copy.refresh()
        seconds = time.perf_counter() - began
        return {"loss": window["loss"], **figures, "target_tokens": int(window["n_ce"]),
                "tokens": int(window["n_tokens"]), "target_tokens_per_s": window["n_ce"] / seconds,
                "tokens_per_s": window["n_tokens"] / seconds}
