"""What a recipe's explicit training loop calls: set-up, one optimizer step, bookkeeping.

A recipe reads top to bottom:

    accelerator = make_accelerator(cfg)
    resume_from, saved = resume_point(cfg, accelerator.print)
    model = build_model(cfg, device)               # LoRA or full weights
    loss_module, optimizer, scheduler = prepare(accelerator, SomeLoss(model), cfg, steps)
    start, run_id = restore(accelerator, cfg, resume_from, saved)
    log = RunLog(cfg, accelerator, steps, start, run_id, desc="sft")
    for step in range(start + 1, steps + 1):
        figures = window_backward(...)             # fic.training.losses
        figures |= optimizer_step(accelerator, loss_module, optimizer, scheduler, cfg.optim.max_grad_norm)
        log.step(step, figures)
        maybe_checkpoint(...)
    log.close()

so that each recipe owns what differs (its data, its loss terms, rollouts) and nothing else.
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import json
import logging
import math
import os
import signal
import sys
import time
from datetime import timedelta
from pathlib import Path
from typing import Any, Callable, Iterator

import torch

from fic.core import ranks
from fic.core.config import (
    add_config_arguments,
    config_to_dict,
    describe,
    load_config,
    print_keys,
    resolved_yaml,
)
from fic.core.errors import FicError, exit_status, sigterm_note
from fic.core.files import append_jsonl, lock_folder, removed_if_failed, write_text
from fic.core.model import load_model, peak_memory_mb
from fic.core.plots import save_png
from fic.core.progress import Progress
from fic.training.checkpoints import (
    checkpoint_dir,
    complete_checkpoints,
    find_resume,
    load_checkpoint,
    lora_state_hooks,
    save_checkpoint,
)
from fic.training.config import OptimSection, RunConfig
from fic.training.curves import curves_figure, read_metrics, run_kind
from fic.training.precision import COPY, Bf16Copy, training_precision

KILL_ENV = "FIC_DEBUG_KILL_AFTER_STEP"  # tests: SIGKILL this process after the given step


def make_accelerator(cfg: RunConfig) -> Any:
    from accelerate import Accelerator
    from accelerate.utils import DistributedType, InitProcessGroupKwargs

    # accelerate narrates every checkpoint at INFO and warns that tied embeddings are stored once
    # (expected; they are re-tied on load): keep the console to FiC's own lines.
    logging.getLogger("accelerate.checkpointing").setLevel(logging.WARNING)
    logging.getLogger("accelerate.accelerator").setLevel(logging.WARNING)
    logging.getLogger("accelerate.utils.other").setLevel(logging.ERROR)
    mixed, copy, said = training_precision(cfg)
    cpu, group = process_group_options(cfg)
    accelerator = Accelerator(
        gradient_accumulation_steps=cfg.train.grad_accum_steps, mixed_precision=mixed, cpu=cpu,
        kwargs_handlers=[InitProcessGroupKwargs(**group)],
        step_scheduler_with_optimizer=False)  # the schedule counts optimizer steps, not steps x processes
    ranks.watch(cfg.train.collective_timeout_s)
    launched = int(os.environ.get("WORLD_SIZE", "1"))
    if accelerator.num_processes != launched:  # each rank would train alone and write the same folder
        raise FicError(f"the launcher started {launched} processes but Accelerate sees {accelerator.num_processes} "
                       f"({accelerator.distributed_type}); start them with accelerate launch or torchrun")
    check_accumulation(accelerator, cfg.train.grad_accum_steps)
    if copy and (accelerator.num_processes > 1 or accelerator.distributed_type != DistributedType.NO):
        raise FicError(f"train.mixed_precision={COPY} runs on one process (DDP and DeepSpeed keep gradient buckets "
                       "of the weights' dtype); use bf16 (autocast) under a multi-process launch",
                       field="train.mixed_precision")
    if accelerator.is_main_process:  # a second run into `out` fails now; released when the final model is saved
        lock_folder(cfg.out)
    accelerator.print(said)
    return accelerator


def process_group_options(cfg: RunConfig) -> tuple[bool, dict]:
    """(cpu, process-group settings) for the Accelerator: the watchdog's bound on one collective
    (`train.collective_timeout_s`), and on a machine without GPUs the gloo backend.

    Accelerate picks a backend only for a device it finds: with ranks started by `accelerate launch`
    or torchrun on a CPU, it leaves the backend unset, DeepSpeed starts gloo on its own, and every
    rank then reports process 0 of 1 (each takes the out folder's lock; the second dies). Naming
    gloo makes Accelerate count the real ranks under DeepSpeed. Accelerate takes FSDP only over a
    GPU backend: on a CPU the gloo ranks are declared data-parallel first, and FSDP2 then shards
    over them. Without either, `cpu=True` is Accelerate's multi-CPU mode (DDP over gloo), what
    `accelerate launch --cpu` or `ACCELERATE_USE_CPU=true` under torchrun asks for."""
    from accelerate import PartialState
    from accelerate.utils import DistributedType

    options: dict = {"timeout": timedelta(seconds=cfg.train.collective_timeout_s)}
    several = int(os.environ.get("WORLD_SIZE", "1")) > 1
    accelerator = getattr(torch, "accelerator", None)
    has_device = torch.cuda.is_available() or bool(accelerator is not None and accelerator.is_available())
    if not several or has_device:
        return False, options
    if _flag("ACCELERATE_USE_DEEPSPEED"):
        return False, {**options, "backend": "gloo"}
    if _flag("ACCELERATE_USE_FSDP"):
        state = PartialState(backend="gloo", **options)
        if state.distributed_type == DistributedType.NO:
            state.distributed_type = DistributedType.MULTI_GPU  # FSDP's precondition; the device stays the CPU
        return False, {**options, "backend": "gloo"}
    return True, options


def _flag(name: str) -> bool:
    return os.environ.get(name, "false").lower() in ("1", "true", "yes")


def computes_on_copy(cfg: RunConfig, accelerator: Any) -> bool:
    """Whether the run's passes run on a bfloat16 copy of the weights (`train.mixed_precision=bf16_copy`)."""
    return training_precision(cfg)[1]


def compute_copy(cfg: RunConfig, accelerator: Any, model: torch.nn.Module) -> Bf16Copy:
    """The bfloat16 compute copy of `model` where the run computes on one, else a no-op one."""
    return Bf16Copy(model, enabled=computes_on_copy(cfg, accelerator))


def compute_dtype(accelerator: Any, copy: Bf16Copy, model: torch.nn.Module) -> torch.dtype:
    """The dtype forward passes compute in: bfloat16 under autocast or on the copy, else the weights'."""
    if accelerator.mixed_precision == "bf16" or copy.params:
        return torch.bfloat16
    return next(model.parameters()).dtype


def check_accumulation(accelerator: Any, wanted: int) -> None:
    """The window size is the recipe's; a launch config (or DeepSpeed config) that sets its own
    gradient_accumulation_steps would silently change where optimizer steps fall."""
    if accelerator.gradient_accumulation_steps != wanted:
        raise FicError(f"the accelerate/DeepSpeed config sets gradient_accumulation_steps="
                       f"{accelerator.gradient_accumulation_steps}, the recipe train.grad_accum_steps={wanted}; "
                       "remove it from the launch config (the recipe sets it)", field="train.grad_accum_steps")


@contextlib.contextmanager
def root_gathered(loss_module: Any) -> Iterator[None]:
    """FSDP2 gathers each unit's weights in that unit's own forward; the root unit's (the weights no
    decoder layer holds: embeddings, final norm, LM head) are gathered by the root's forward, which
    generation skips (it calls the inner model, step by step). They stay gathered for the block;
    the decoder layers still gather and free theirs in every forward, on every rank."""
    from torch.distributed.fsdp import FSDPModule

    if not isinstance(loss_module, FSDPModule):
        yield
        return
    loss_module.unshard()
    try:
        yield
    finally:
        loss_module.reshard()


def is_zero3(accelerator: Any) -> bool:
    from accelerate.utils import DistributedType

    return (accelerator.distributed_type == DistributedType.DEEPSPEED
            and accelerator.state.deepspeed_plugin.zero_stage == 3)


def shards_weights(accelerator: Any) -> bool:
    """Whether each rank holds only a part of the weights (DeepSpeed ZeRO-3, FSDP): every forward
    gathers them with the other ranks, and a copy of the model would be a whole one per rank."""
    from accelerate.utils import DistributedType

    return is_zero3(accelerator) or accelerator.distributed_type == DistributedType.FSDP


def resume_point(cfg: RunConfig, say: Callable[[str], None]) -> tuple[Path | None, dict | None]:
    """The checkpoint to resume from (with its trainer state), or (None, None) for a new run;
    refuses to start a new run over an existing one."""
    out = Path(cfg.out)
    if not cfg.resume:
        if complete_checkpoints(out) or (out / "final").exists():
            raise FicError("already holds a training run; set resume=true to continue it or choose another out "
                           "folder", path=str(out), field="out")
        return None, None
    path, state, skipped = find_resume(out)
    if skipped:
        say(f"passing over {', '.join(skipped)} (incomplete: no `complete` marker); resuming from {path.name}")
    return path, state


def build_model(cfg: RunConfig, device: str) -> torch.nn.Module:

    # The compute precision is the Accelerator's (training_precision).
    model = load_model(cfg.model.path, dtype=cfg.model.weights_dtype, device=device,
                       trust_remote_code=cfg.model.trust_remote_code)
    model.config.use_cache = False
    if cfg.model.gradient_checkpointing:
        # transformers 5.2x renamed it (the old name warns and goes in v6); 4.57, which vLLM pins, has only the old one
        if hasattr(model, "activation_checkpointing_enable"):
            model.activation_checkpointing_enable(activation_checkpointing_kwargs={"use_reentrant": False})
        else:
            model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    if cfg.lora.enabled:
        from peft import LoraConfig, get_peft_model

        lora = LoraConfig(r=cfg.lora.r, lora_alpha=cfg.lora.alpha, lora_dropout=cfg.lora.dropout,
                          target_modules=list(cfg.lora.target_modules), bias="none", task_type="CAUSAL_LM")
        try:
            model = get_peft_model(model, lora)
        except ValueError as err:
            raise FicError(f"cannot add LoRA adapters: {err}", field="lora.target_modules") from None
    return model.train()


def make_optimizer(model: torch.nn.Module, cfg: OptimSection) -> torch.optim.Optimizer:
    params = [p for p in model.parameters() if p.requires_grad]
    decay = [p for p in params if p.ndim >= 2]
    no_decay = [p for p in params if p.ndim < 2]
    groups = [{"params": decay, "weight_decay": cfg.weight_decay}, {"params": no_decay, "weight_decay": 0.0}]
    # The fused kernel (CPU and CUDA) is what TRL/transformers use by default, and is faster.
    fused = all(p.device.type in ("cpu", "cuda") for p in params)
    return torch.optim.AdamW([g for g in groups if g["params"]], lr=cfg.lr, betas=tuple(cfg.betas), eps=cfg.eps,
                             fused=fused)


def lr_factor(step: int, total: int, cfg: OptimSection) -> float:
    """Learning-rate multiplier for 0-based optimizer step `step` of `total`."""
    if step < cfg.warmup_steps:
        return (step + 1) / (cfg.warmup_steps + 1)
    if cfg.schedule == "constant":
        return 1.0
    progress = min(1.0, (step - cfg.warmup_steps) / max(1, total - cfg.warmup_steps))
    shape = 1.0 - progress if cfg.schedule == "linear" else 0.5 * (1.0 + math.cos(math.pi * progress))
    return cfg.min_lr_ratio + (1.0 - cfg.min_lr_ratio) * shape


def prepare(accelerator: Any, loss_module: torch.nn.Module, cfg: RunConfig, steps: int) -> tuple[Any, Any, Any]:
    """The optimizer and schedule for `loss_module`'s trainable weights, all three through
    `accelerator.prepare` (DDP, DeepSpeed), with LoRA checkpoints holding only the adapter."""
    from accelerate.utils import DistributedType

    optimizer = make_optimizer(loss_module, cfg.optim)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: lr_factor(s, steps, cfg.optim))
    if accelerator.distributed_type == DistributedType.DEEPSPEED:
        # No dataloader goes through prepare(), so DeepSpeed learns the batch size and clipping here.
        ds = accelerator.state.deepspeed_plugin.deepspeed_config
        ds["train_micro_batch_size_per_gpu"] = cfg.train.micro_batch_size
        if ds.get("gradient_clipping", "auto") == "auto":
            ds["gradient_clipping"] = cfg.optim.max_grad_norm
    loss_module, optimizer, scheduler = accelerator.prepare(loss_module, optimizer, scheduler)
    check_accumulation(accelerator, cfg.train.grad_accum_steps)
    if cfg.lora.enabled:
        unwrapped = accelerator.unwrap_model(loss_module)
        lora_state_hooks(accelerator, {n for n, p in unwrapped.named_parameters() if p.requires_grad})
    return loss_module, optimizer, scheduler


def optimizer_step(accelerator: Any, loss_module: torch.nn.Module, optimizer: Any, scheduler: Any,
                   max_grad_norm: float) -> dict:
    """Clip, step, schedule, zero: the end of one accumulation window."""
    from accelerate.utils import DistributedType

    lr = scheduler.get_last_lr()[0]
    grad_norm = None
    if max_grad_norm > 0:
        trained = [p for p in loss_module.parameters() if p.requires_grad]
        if accelerator.distributed_type in (DistributedType.NO, DistributedType.MULTI_CPU, DistributedType.MULTI_GPU):
            grad_norm = clip_gradients(trained, max_grad_norm)  # DDP's gradients are the global ones already
        else:  # DeepSpeed and FSDP hold partitions: their own clipping
            grad_norm = accelerator.clip_grad_norm_(trained, max_grad_norm)
        if grad_norm is not None and not math.isfinite(float(grad_norm)):  # the same on every rank
            raise FicError(f"the gradient norm is {float(grad_norm)}: training diverged (try a lower optim.lr, "
                           f"now {lr:g}); stopped before this update, without saving a model", field="optim.lr")
    optimizer.step()
    scheduler.step()
    optimizer.zero_grad(set_to_none=True)
    # The process's peak so far: the step where it jumps is the batch that sets the run's memory.
    return {"lr": lr, "grad_norm": None if grad_norm is None else float(grad_norm),
            "peak_memory_mb": round(peak_memory_mb(accelerator.device))}


def clip_gradients(params: list[torch.nn.Parameter], max_norm: float) -> float:
    """Scale the gradients to a total 2-norm of at most `max_norm`; return the norm before.

    `torch.nn.utils.clip_grad_norm_` multiplies every gradient by the clipping factor even when it
    is 1, through foreach kernels that run slowly on a CPU: on the bundled model 1.6-1.8 s a step
    (a fifth of an SFT step), against 0.07 s for the norm itself. Here the gradients are scaled
    only when the norm is over the bound, one tensor at a time."""
    grads = [p.grad for p in params if p.grad is not None]
    if not grads:
        return 0.0
    total = float(torch.linalg.vector_norm(torch.stack([n.float() for n in torch._foreach_norm(grads, 2.0)])))
    if math.isfinite(total) and total > max_norm:
        scale = max_norm / (total + 1e-6)
        for grad in grads:
            grad.mul_(scale)
    return total


def restore(accelerator: Any, cfg: RunConfig, resume_from: Path | None, saved: dict | None) -> tuple[int, str]:
    """Load the checkpoint (if resuming) and start the run's files; return (first step done, run id)."""
    out = Path(cfg.out)
    metrics_path = out / "metrics.jsonl"
    run_id = hashlib.sha256(f"{out.resolve()}:{time.time()}".encode()).hexdigest()[:12]
    start = 0
    if resume_from is not None:
        load_checkpoint(accelerator, resume_from, cfg.lora.enabled)
        start, run_id = int(saved["step"]), saved.get("wandb_id", run_id)
        if accelerator.is_main_process:
            _drop_metrics_after(metrics_path, start)
        accelerator.print(f"resumed from {resume_from} at step {start}")
    elif accelerator.is_main_process:
        out.mkdir(parents=True, exist_ok=True)
        write_text(metrics_path, "")
    if accelerator.is_main_process:
        import yaml

        write_text(out / "config.yaml", yaml.safe_dump(config_to_dict(cfg), sort_keys=False))
    return start, run_id


def _drop_metrics_after(path: Path, upto_step: int) -> None:
    """Drop metric lines of steps after the checkpoint a run resumes from (they are redone)."""
    if not path.exists():
        return
    kept = []
    for line in path.read_text(encoding="utf-8").splitlines():
        try:
            if json.loads(line)["step"] <= upto_step:
                kept.append(line)
        except (ValueError, KeyError, TypeError):
            continue  # a line cut by a kill
    write_text(path, "".join(line + "\n" for line in kept))


def maybe_checkpoint(accelerator: Any, cfg: RunConfig, step: int, steps: int, state: dict,
                     extra: Callable[[Path], None] | None = None) -> None:
    """A checkpoint every `checkpoint.every` steps and at the last one; then the test hook that
    kills the process after a chosen step (to check that a resume repeats nothing)."""
    if cfg.checkpoint.every and (step % cfg.checkpoint.every == 0 or step == steps):
        save_checkpoint(accelerator, Path(cfg.out), step, {"step": step, **state},
                        keep_last=cfg.checkpoint.keep_last, lora=cfg.lora.enabled, extra=extra, cfg=cfg)
    if step == int(os.environ.get(KILL_ENV, "0") or 0):
        os.kill(os.getpid(), signal.SIGKILL)


def check_finite_loss(step: int, figures: dict) -> None:
    """A NaN or infinite loss means the weights are broken: stop before a checkpoint or final
    model saves them (the figures are reduced over ranks, so every rank stops)."""
    loss = figures.get("loss")
    if isinstance(loss, (int, float)) and not math.isfinite(loss):
        lr = figures.get("lr")
        raise FicError(f"the loss is {loss} at step {step}: training diverged"
                       + (f" (try a lower optim.lr, now {lr:g})" if isinstance(lr, (int, float)) else "")
                       + "; stopped without saving a model", field="optim.lr")


class RunLog:
    """Per-step figures: `metrics.jsonl` (every step, main process), `curves.png` beside it
    (`fic.training.curves`, redrawn every `logging.curves_every_s` seconds and at the end), wandb
    and TensorBoard (every `logging.log_every` steps: the scalars, the curves as an image, the
    config and the data card), and progress (`fic.core.progress`): a bar on a terminal, else a plain
    line every `logging.print_every_s` seconds with steps done, rate and time left (a log file or
    batch job would otherwise show nothing for an hour)."""

    def __init__(self, cfg: RunConfig, accelerator: Any, steps: int, start: int, run_id: str, *, desc: str,
                 postfix: Callable[[dict], dict] | None = None, data_card: dict | None = None):

        self.cfg, self.steps = cfg, steps
        self.main = accelerator.is_main_process
        self.path = Path(cfg.out) / "metrics.jsonl"
        self.postfix = postfix or (lambda figures: {"loss": f"{figures['loss']:.4f}"})
        self.progress = Progress(steps, desc, "step", initial=start, enabled=self.main and cfg.logging.progress,
                                 every_s=cfg.logging.print_every_s)
        self.data_card = data_card or {}
        self.tracker = self._start_wandb(run_id) if cfg.logging.wandb and self.main else None
        self.board = self._start_tensorboard() if cfg.logging.tensorboard and self.main else None
        self.drawn_at = time.monotonic()

    def _start_wandb(self, run_id: str) -> Any:
        os.environ.setdefault("WANDB_MODE", self.cfg.logging.mode)  # offline unless the user says otherwise
        import wandb

        out = Path(self.cfg.out)
        return wandb.init(project=self.cfg.logging.project, name=self.cfg.logging.run_name or out.name, id=run_id,
                          resume="allow", dir=str(out),
                          config={**config_to_dict(self.cfg), **({"data_card": self.data_card} if self.data_card else {})})

    def _start_tensorboard(self) -> Any:
        import yaml
        from torch.utils.tensorboard import SummaryWriter  # needs the tensorboard package (checked at config load)

        board = SummaryWriter(log_dir=str(Path(self.cfg.out) / "tensorboard"))
        # Markdown text: four spaces make a code block, so the YAML and JSON keep their layout.
        def block(text: str) -> str:
            return "".join(f"    {line}\n" for line in text.splitlines())

        board.add_text("config", block(yaml.safe_dump(config_to_dict(self.cfg), sort_keys=False)))
        if self.data_card:
            board.add_text("data_card", block(json.dumps(self.data_card, indent=2, default=str)))
        return board

    def step(self, step: int, figures: dict, tables: dict | None = None) -> None:
        check_finite_loss(step, figures)  # on every rank: the loss is reduced over ranks
        if not self.main:
            return
        append_jsonl(self.path, {"step": step, **figures})
        self.progress.update(1, **self.postfix(figures))
        if step % self.cfg.logging.log_every == 0 or step == self.steps:
            scalars = {f"train/{k}": v for k, v in figures.items()
                       if isinstance(v, (int, float)) and not isinstance(v, bool)}
            if self.tracker is not None:
                self.tracker.log(scalars, step=step)
                for name, table in (tables or {}).items():
                    import wandb

                    self.tracker.log({name: wandb.Table(columns=table["columns"], data=table["rows"])}, step=step)
            if self.board is not None:
                for name, value in scalars.items():
                    self.board.add_scalar(name, value, step)
        if time.monotonic() - self.drawn_at >= self.cfg.logging.curves_every_s:
            self.draw(step)

    def draw(self, step: int | None = None) -> None:
        """Redraw `curves.png` and hand the picture to wandb and TensorBoard."""
        self.drawn_at = time.monotonic()
        records = read_metrics(self.path) if self.path.exists() else []
        if not records:
            return
        step = records[-1]["step"] if step is None else step
        fig = curves_figure(records, title=f"{run_kind(records).upper()} run {Path(self.cfg.out).name}")
        if self.board is not None:
            self.board.add_figure("curves", fig, step, close=False)
        save_png(fig, Path(self.cfg.out) / "curves.png")
        if self.tracker is not None:
            import wandb

            self.tracker.log({"curves": wandb.Image(str(Path(self.cfg.out) / "curves.png"))}, step=step)

    def close(self, summary: dict | None = None) -> None:
        self.progress.close()
        if self.main:
            self.draw()
        if self.board is not None:
            self.board.close()
        if self.tracker is not None:
            self.tracker.summary.update(summary or {})
            self.tracker.finish()


def recipe_main(config_class: type, train: Callable[[Any], Any], method: str, doc: str,
                argv: list[str] | None, plan: Callable[[Any], str] | None = None) -> int:
    """The command line of a recipe script (`accelerate launch fic/train_<method>.py --config ...`):
    `--config` anywhere among the key=value overrides, `--help` listing every key, `--keys` (with
    the values of this run), `--dry-run` (the resolved config and `plan(cfg)`, the start line,
    without loading a model), and bad input or an operating-system refusal as one line with exit 2
    (`accelerate launch` runs the script directly, past the fic CLI's handler)."""
    # `fic train METHOD` passes its arguments; `accelerate launch fic/train_METHOD.py` runs the script
    parser = argparse.ArgumentParser(prog=f"train_{method}.py" if argv is None else f"fic train {method}",
                                     description=doc.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter,
                                     epilog="settings (key=value):\n" + describe(config_class))
    add_config_arguments(parser, example=f"recipes/smollm2-135m-instruct/{method}.yaml",
                         overrides_help="override recipe settings")
    args = parser.parse_intermixed_args(sys.argv[1:] if argv is None else argv)

    def run() -> Any:
        if print_keys(args, config_class):
            return 0
        cfg = load_config(config_class, args.config, args.overrides)
        if args.dry_run:
            resume_point(cfg, lambda line: None)  # as the run's start: refuses to start over an existing run
            print(resolved_yaml(cfg) + (plan(cfg) if plan is not None else ""))
            return 0
        # A run that fails before it has trained anything leaves no new output folder behind.
        with removed_if_failed(cfg.out, ["config.yaml", "data_overlap.json"]), \
                sigterm_note(lambda: _kept(Path(cfg.out))):
            return train(cfg)

    return exit_status(f"fic train {method}", run)


def _kept(out: Path) -> str:
    """What a SIGTERM leaves of a training run: its complete checkpoints, or none (and then no folder)."""
    saved = complete_checkpoints(out)
    if saved:
        return f"the checkpoints saved before are kept in {checkpoint_dir(out)}; resume=true continues from {saved[-1].name}"
    return "no checkpoint had been saved, so none is kept"
