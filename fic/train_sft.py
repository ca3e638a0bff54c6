"""SFT warm start (FiC stage 1): the causal-LM loss on assistant tokens of multi-turn conversations.

    accelerate launch fic/train_sft.py --config recipes/<backbone>/sft.yaml [key=value ...]
    accelerate launch --config_file launch/deepspeed_zero2.yaml fic/train_sft.py --config ...
    fic train sft --config recipes/<backbone>/sft.yaml [key=value ...]      (one process)

One explicit loop on Accelerate. What it does that a generic trainer gets wrong:

- Targets are the assistant-mask positions of `fic.chat.render_chat` (content and end-of-turn
  token of every trained assistant turn), shifted for next-token prediction.
- The LM head runs only at target positions, in chunks upcast to fp32, so the logits of a
  whole batch ([batch, seq, vocab]) never exist; with more than one chunk each chunk's logits
  are recomputed in backward instead of being kept.
- The loss is the summed cross-entropy divided by the number of target tokens of the whole
  accumulation window on all ranks, counted before the window's backward passes: every
  target token weighs the same, however the tokens fall across micro-batches and ranks.
- Checkpoints (`out/checkpoints/step-N`) are written to a temporary folder and renamed, with
  a `complete` marker written last; `resume=true` restores weights, optimizer, scheduler, RNG
  and the data position, so the losses after a resume equal those of an uninterrupted run.

Outputs in `out/`: `config.yaml`, `metrics.jsonl` (one line per optimizer step),
`checkpoints/step-N/`, and the final model in `final/` (a Hugging Face folder; the adapter for
LoRA) plus `final-merged/` for LoRA with `save_merged=true`, each with a model card.
"""

from __future__ import annotations

import argparse
import functools
import hashlib
import json
import logging
import math
import os
import shutil
import signal
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Sequence

import numpy as np
import torch
import torch.nn.functional as F
import torch.utils.checkpoint
import yaml

from fic import __version__
from fic.config import config_to_dict, describe, load_config, setting
from fic.errors import FicError
from fic.files import append_jsonl, read_records, write_json, write_text

IGNORE = -100
DEFAULT_LORA_TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "chat_template.jinja",
                   "chat_template.json", "tokenizer.model", "vocab.json", "merges.txt", "added_tokens.json",
                   "vocab.txt", "spiece.model")
# Settings a resumed run must share with the checkpoint: anything else changes what the
# saved optimizer state, RNG and data position mean.
MUST_MATCH = ("model.path", "model.dtype", "lora", "data.max_seq_len", "data.seed", "data.shuffle",
              "train.micro_batch_size", "train.grad_accum_steps", "train.seed", "train.loss_chunk_tokens")
KILL_ENV = "FIC_DEBUG_KILL_AFTER_STEP"  # tests: SIGKILL this process after the given step


# --------------------------------------------------------------------------- config

@dataclass
class ModelSection:
    path: str = setting("models/smollm2-135m-instruct", "Local Hugging Face folder of the base model "
                        "(`fic prepare-model` makes the bundled SmolLM2-135M-Instruct).")
    dtype: str = setting("float32", "Dtype the weights are loaded and trained in. Keep float32 master weights "
                         "and use train.mixed_precision=bf16 for bf16 compute; auto is bfloat16 on a GPU that "
                         "supports it, else float32.", choices=("auto", "float32", "bfloat16"))
    trust_remote_code: bool = setting(False, "Run model code shipped in the model folder (off unless you trust it).")
    gradient_checkpointing: bool = setting(False, "Recompute activations in backward: less memory, ~30% slower.")


@dataclass
class LoraSection:
    enabled: bool = setting(False, "Train a LoRA adapter (PEFT) instead of all weights.")
    r: int = setting(16, "LoRA rank.", min=1)
    alpha: int = setting(32, "LoRA alpha (the update is scaled by alpha / r).", min=1)
    dropout: float = setting(0.05, "Dropout on the LoRA input.", min=0.0, max=1.0)
    target_modules: list[str] = setting(DEFAULT_LORA_TARGETS, "Module names that get adapters "
                                        "(default: attention and MLP projections of Llama/Qwen/Mistral-style models).")


@dataclass
class DataSection:
    path: str = setting("data/gsm_symbolic.sft.jsonl", "The SFT corpus (JSONL from `fic sft-data`): records with "
                        "`messages`; assistant turns with `train: false` stay in context, out of the loss.")
    max_seq_len: int = setting(2048, "Conversations longer than this many tokens are skipped (and counted): "
                               "cutting one would drop its final answer.", min=8)
    shuffle: bool = setting(True, "Visit records in a seeded random order, a new permutation each epoch.")
    seed: int = setting(0, "Seed of the per-epoch permutations.")


@dataclass
class OptimSection:
    lr: float = setting(2e-5, "Peak learning rate (AdamW).", min=0.0)
    weight_decay: float = setting(0.0, "AdamW weight decay, on matrices only (not biases and norms).", min=0.0)
    betas: list[float] = setting([0.9, 0.999], "AdamW betas.")
    eps: float = setting(1e-8, "AdamW epsilon.", min=0.0)
    warmup_steps: int = setting(0, "Optimizer steps of linear warm-up.", min=0)
    schedule: str = setting("cosine", "Learning-rate decay after warm-up.", choices=("constant", "linear", "cosine"))
    min_lr_ratio: float = setting(0.0, "Final learning rate as a share of lr (linear and cosine).", min=0.0, max=1.0)
    max_grad_norm: float = setting(1.0, "Clip the gradient norm to this (0: no clipping).", min=0.0)


@dataclass
class TrainSection:
    max_steps: int | None = setting(None, "Optimizer steps to run; null: derived from epochs.", min=1)
    epochs: float = setting(1.0, "Passes over the corpus when max_steps is null.", min=0.0)
    micro_batch_size: int = setting(4, "Conversations per forward pass on each process.", min=1)
    grad_accum_steps: int = setting(1, "Micro-batches per optimizer step on each process.", min=1)
    seed: int = setting(0, "Seed of weight init (LoRA), dropout and every other random draw.")
    mixed_precision: str = setting("auto", "auto: what the accelerate launch config says (none without one); "
                                   "no: compute in the weights' dtype; bf16: bfloat16 autocast.",
                                   choices=("auto", "no", "bf16"))
    loss_chunk_tokens: int = setting(1024, "Target tokens per LM-head chunk: bounds the logits held at once to "
                                     "this many rows of the vocabulary.", min=1)


@dataclass
class CheckpointSection:
    every: int = setting(100, "Write a resumable checkpoint every this many optimizer steps (0: none), and "
                         "at the last step.", min=0)
    keep_last: int = setting(2, "Checkpoints kept; older ones are deleted.", min=1)


@dataclass
class LoggingSection:
    wandb: bool = setting(True, "Log to Weights & Biases (files under out/wandb).")
    project: str = setting("fic", "wandb project.")
    run_name: str | None = setting(None, "wandb run name (default: the out folder's name).")
    mode: str = setting("offline", "wandb mode unless the WANDB_MODE environment variable says otherwise; "
                        "offline runs can be uploaded later with `wandb sync`.", choices=("offline", "online"))
    log_every: int = setting(1, "Send metrics to wandb every this many steps (metrics.jsonl gets every step).",
                             min=1)
    progress: bool = setting(True, "Show a progress bar with loss and target tokens/s.")


@dataclass
class SFTConfig:
    """Settings of the SFT recipe (`fic/train_sft.py`, `fic train sft`)."""

    model: ModelSection = setting(ModelSection(), "The base model.")
    lora: LoraSection = setting(LoraSection(), "LoRA adapter instead of full fine-tuning.")
    data: DataSection = setting(DataSection(), "The SFT corpus.")
    optim: OptimSection = setting(OptimSection(), "Optimizer and learning-rate schedule.")
    train: TrainSection = setting(TrainSection(), "Steps, batch sizes, precision.")
    checkpoint: CheckpointSection = setting(CheckpointSection(), "Resumable checkpoints.")
    logging: LoggingSection = setting(LoggingSection(), "wandb, metrics and the progress bar.")
    out: str = setting("runs/sft", "Output folder: config, metrics, checkpoints, final model.")
    resume: bool = setting(False, "Continue from the newest complete checkpoint in out/checkpoints.")
    save_merged: bool = setting(False, "LoRA: also save the base model with the adapter merged in (out/final-merged).")

    def check(self, source: str) -> None:
        if len(self.optim.betas) != 2 or not all(0.0 <= b < 1.0 for b in self.optim.betas):
            raise FicError(f"expected two numbers in [0, 1), got {self.optim.betas}", path=source, field="optim.betas")
        if self.save_merged and not self.lora.enabled:
            raise FicError("save_merged needs lora.enabled=true (full fine-tuning already saves a full model)",
                           path=source, field="save_merged")
        if self.lora.enabled and not self.lora.target_modules:
            raise FicError("expected at least one module name", path=source, field="lora.target_modules")
        if self.train.max_steps is None and self.train.epochs <= 0:
            raise FicError("set train.max_steps or a positive train.epochs", path=source, field="train.epochs")
        if not self.out.strip():
            raise FicError("expected an output folder", path=source, field="out")


# --------------------------------------------------------------------------- data

@dataclass
class Example:
    input_ids: list[int]
    targets: list[int]  # targets[t] is the id at t+1 when that token is trained, else IGNORE

    @property
    def n_targets(self) -> int:
        return sum(t != IGNORE for t in self.targets)


def file_sha256(path: str | os.PathLike) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def shift_targets(input_ids: Sequence[int], mask: Sequence[int]) -> list[int]:
    """Next-token targets: position t predicts token t+1, trained where the mask marks t+1."""
    return [input_ids[t + 1] if mask[t + 1] else IGNORE for t in range(len(input_ids) - 1)] + [IGNORE]


def render_examples(records: Sequence[dict], tokenizer: Any, max_seq_len: int, source: str = "corpus",
                    progress: bool = True) -> tuple[list[Example], int]:
    """Render corpus records to examples; return them and how many were too long to use."""
    from tqdm import tqdm

    from fic.chat import render_chat

    examples, too_long = [], 0
    for number, record in enumerate(tqdm(records, desc="rendering", unit="conv", disable=not progress or None),
                                    start=1):
        messages = record.get("messages")
        if not isinstance(messages, list) or not messages:
            raise FicError("expected a non-empty list of chat messages", path=source, record=number,
                           field="messages")
        try:
            rendered = render_chat(tokenizer, messages)
        except FicError as err:
            raise FicError(err.message, path=source, record=number, field=err.field or "messages") from None
        targets = shift_targets(rendered.input_ids, rendered.assistant_mask)
        if all(t == IGNORE for t in targets):
            raise FicError("no trained assistant tokens (a record needs an assistant turn with train: true)",
                           path=source, record=number, field="messages")
        if len(rendered.input_ids) > max_seq_len:
            too_long += 1
            continue
        examples.append(Example(rendered.input_ids, targets))
    return examples, too_long


def load_corpus(cfg: DataSection, tokenizer: Any, progress: bool = True) -> tuple[list[Example], dict]:
    """Render every record of the corpus file; return the examples and counts for the model card."""
    records = read_records(cfg.path)
    examples, too_long = render_examples(records, tokenizer, cfg.max_seq_len, cfg.path, progress)
    if not examples:
        raise FicError(f"all {len(records)} records are longer than data.max_seq_len={cfg.max_seq_len} tokens",
                       path=cfg.path)
    stats = {"records": len(records), "used": len(examples), "skipped_too_long": too_long,
             "target_tokens": sum(e.n_targets for e in examples), "tokens": sum(len(e.input_ids) for e in examples)}
    return examples, stats


def collate(examples: Sequence[Example], pad_id: int) -> dict[str, torch.Tensor]:
    """Right-pad to the longest conversation of the micro-batch."""
    width = max(len(e.input_ids) for e in examples)
    input_ids = torch.full((len(examples), width), pad_id, dtype=torch.long)
    targets = torch.full((len(examples), width), IGNORE, dtype=torch.long)
    attention_mask = torch.zeros((len(examples), width), dtype=torch.long)
    for row, e in enumerate(examples):
        n = len(e.input_ids)
        input_ids[row, :n] = torch.tensor(e.input_ids)
        targets[row, :n] = torch.tensor(e.targets)
        attention_mask[row, :n] = 1
    return {"input_ids": input_ids, "attention_mask": attention_mask, "targets": targets}


class DataOrder:
    """Which records micro-batch k of a rank holds: a pure function of (seed, k), so the data
    position of a checkpoint is just the number of micro-batches consumed.

    The corpus is read as an endless stream of per-epoch permutations; global micro-step k
    takes the next `micro_batch_size * world` records of the stream, rank r the r-th slice.
    """

    def __init__(self, n: int, micro_batch_size: int, world: int, rank: int, seed: int, shuffle: bool):
        self.n, self.mbs, self.world, self.rank = n, micro_batch_size, world, rank
        self.seed, self.shuffle = seed, shuffle

    @functools.lru_cache(maxsize=4)
    def _permutation(self, epoch: int) -> np.ndarray:
        if not self.shuffle:
            return np.arange(self.n)
        return np.random.default_rng([self.seed, epoch]).permutation(self.n)

    def micro_batch(self, k: int) -> list[int]:
        start = (k * self.world + self.rank) * self.mbs
        return [int(self._permutation(p // self.n)[p % self.n]) for p in range(start, start + self.mbs)]

    def epoch_at(self, k: int) -> float:
        return k * self.world * self.mbs / self.n


# --------------------------------------------------------------------------- loss

def _causal_lm(model: torch.nn.Module) -> torch.nn.Module:
    """The transformers model inside a PEFT wrapper (PEFT injects its layers in place, so
    calling the inner modules still runs the adapters)."""
    get_base = getattr(model, "get_base_model", None)
    return get_base() if callable(get_base) else model


def decoder_and_head(model: torch.nn.Module) -> tuple[torch.nn.Module, torch.nn.Module]:
    """The decoder body (hidden states) and the LM head of a causal LM, PEFT-wrapped or not;
    `get_decoder` exists on transformers 4.57 and 5.x alike."""
    lm = _causal_lm(model)
    head = lm.get_output_embeddings()
    body = lm.get_decoder() if hasattr(lm, "get_decoder") else getattr(lm, "base_model", None)
    if head is None or body is None or body is lm:
        raise FicError(f"cannot find the decoder and LM head of {type(lm).__name__}; FiC needs a causal LM "
                       "with get_decoder() and get_output_embeddings()")
    return body, head


def _head_ce_sum(head: torch.nn.Module, hidden: torch.Tensor, targets: torch.Tensor,
                 softcap: float | None) -> torch.Tensor:
    logits = head(hidden).float()
    if softcap:
        logits = torch.tanh(logits / softcap) * softcap
    return F.cross_entropy(logits, targets, reduction="sum")


class TargetLoss(torch.nn.Module):
    """Wraps a causal LM; `forward` returns the cross-entropy summed over the target positions.

    The wrapper is what `accelerator.prepare` wraps (DDP, DeepSpeed), so the body and head run
    inside the distributed forward, and only `[n_targets, hidden]` rows ever reach the head.
    """

    def __init__(self, model: torch.nn.Module, chunk_tokens: int = 1024):
        super().__init__()
        self.model = model
        self.chunk_tokens = chunk_tokens
        self.softcap = getattr(_causal_lm(model).config, "final_logit_softcapping", None)

    @property
    def config(self) -> Any:  # DeepSpeed fills its "auto" bucket sizes from model.config.hidden_size
        return _causal_lm(self.model).config

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        body, head = decoder_and_head(self.model)
        hidden = body(input_ids=input_ids, attention_mask=attention_mask, use_cache=False).last_hidden_state
        where = targets != IGNORE
        hidden, targets = hidden[where], targets[where]
        if hidden.shape[0] <= self.chunk_tokens:
            return _head_ce_sum(head, hidden, targets, self.softcap)
        total = hidden.new_zeros((), dtype=torch.float32)
        for start in range(0, hidden.shape[0], self.chunk_tokens):
            part = slice(start, start + self.chunk_tokens)
            # Recomputing a chunk's logits in backward costs one head matmul; keeping them all
            # would hold n_targets x vocab floats.
            total = total + torch.utils.checkpoint.checkpoint(
                _head_ce_sum, head, hidden[part], targets[part], self.softcap, use_reentrant=False)
        return total


def check_target_path(model: torch.nn.Module, vocab_size: int) -> None:
    """Refuse architectures whose logits are not `head(decoder(x))` (e.g. extra logit scaling),
    since the target-only loss would silently train a different function."""
    body, head = decoder_and_head(model)
    ids = torch.arange(1, 9).remainder(vocab_size).unsqueeze(0).to(next(model.parameters()).device)
    with torch.no_grad():
        want = model(input_ids=ids, use_cache=False).logits.float()
        got = head(body(input_ids=ids, use_cache=False).last_hidden_state).float()
        softcap = getattr(_causal_lm(model).config, "final_logit_softcapping", None)
        if softcap:
            got = torch.tanh(got / softcap) * softcap
    if not torch.allclose(got, want, atol=1e-3 * max(1.0, want.abs().max().item()), rtol=1e-3):
        raise FicError(f"{type(_causal_lm(model)).__name__} does not compute its logits as "
                       "lm_head(decoder(x)), which the target-only loss relies on; this architecture is not supported")


def window_loss(accelerator: Any, loss_model: torch.nn.Module, batches: list[dict]) -> tuple[float, int, int]:
    """Forward and backward over one accumulation window; return (mean loss, target tokens,
    tokens), each over all ranks.

    Each micro-batch's summed cross-entropy is divided by the window's target count on all
    ranks, known before any backward pass. `accelerator.backward` divides by the accumulation
    steps (DeepSpeed's engine does the same) and DDP/ZeRO average gradients over ranks; the
    factor `steps * world` undoes both, so the gradient is that of sum(CE) / n_targets.
    """
    device = accelerator.device
    local = torch.tensor([sum(int((b["targets"] != IGNORE).sum()) for b in batches),
                          sum(int(b["attention_mask"].sum()) for b in batches)], device=device)
    n_targets, n_tokens = (int(x) for x in accelerator.reduce(local, reduction="sum"))
    scale = accelerator.gradient_accumulation_steps * accelerator.num_processes / n_targets
    ce_sum = torch.zeros((), device=device)
    for index, batch in enumerate(batches):
        with accelerator.accumulate(loss_model):
            ce = loss_model(**{k: v.to(device) for k, v in batch.items()})
            accelerator.backward(ce * scale)
            ce_sum += ce.detach().float()
        if accelerator.sync_gradients != (index == len(batches) - 1):
            raise RuntimeError("accumulation window out of step with accelerate's gradient sync")
    total = float(accelerator.reduce(ce_sum, reduction="sum"))
    return total / n_targets, n_targets, n_tokens


# --------------------------------------------------------------------------- model, optimizer

def build_model(cfg: SFTConfig, device: str) -> torch.nn.Module:
    from fic.model import load_model

    model = load_model(cfg.model.path, dtype=cfg.model.dtype, device=device,
                       trust_remote_code=cfg.model.trust_remote_code)
    model.config.use_cache = False
    if cfg.model.gradient_checkpointing:
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


def total_steps(cfg: SFTConfig, n_examples: int, world: int) -> int:
    if cfg.train.max_steps is not None:
        return cfg.train.max_steps
    per_step = cfg.train.micro_batch_size * cfg.train.grad_accum_steps * world
    return max(1, math.ceil(cfg.train.epochs * n_examples / per_step))


def train_step(accelerator: Any, loss_model: torch.nn.Module, optimizer: Any, scheduler: Any,
               batches: list[dict], max_grad_norm: float) -> dict:
    """One optimizer step over an accumulation window; returns its figures."""
    lr = scheduler.get_last_lr()[0]
    loss, n_targets, n_tokens = window_loss(accelerator, loss_model, batches)
    grad_norm = None
    if max_grad_norm > 0:
        grad_norm = accelerator.clip_grad_norm_(
            [p for p in loss_model.parameters() if p.requires_grad], max_grad_norm)
    optimizer.step()
    scheduler.step()
    optimizer.zero_grad(set_to_none=True)
    return {"loss": loss, "lr": lr, "grad_norm": None if grad_norm is None else float(grad_norm),
            "target_tokens": n_targets, "tokens": n_tokens}


# --------------------------------------------------------------------------- checkpoints

def checkpoint_dir(out: Path) -> Path:
    return out / "checkpoints"


def _step_of(path: Path) -> int | None:
    name = path.name
    if not name.startswith("step-") or not name[5:].isdigit():
        return None
    return int(name[5:])


def complete_checkpoints(out: Path) -> list[Path]:
    """Finished checkpoints, oldest first (folders without the `complete` marker are skipped)."""
    folder = checkpoint_dir(out)
    if not folder.is_dir():
        return []
    found = [p for p in folder.iterdir() if p.is_dir() and _step_of(p) is not None and (p / "complete").is_file()]
    return sorted(found, key=_step_of)


def _lora_state_hooks(accelerator: Any, trainable: set[str]) -> None:
    """With LoRA, checkpoints hold only the trainable (adapter) weights, not the frozen base."""

    def save_hook(models: list, weights: list, output_dir: str) -> None:
        for i, state in enumerate(weights):
            weights[i] = {k: v for k, v in state.items() if k in trainable}

    def load_hook(models: list, input_dir: str) -> None:
        from safetensors.torch import load_file

        for i, model in enumerate(models):
            name = "model.safetensors" if i == 0 else f"model_{i}.safetensors"
            state = load_file(os.path.join(input_dir, name))
            if set(state) != trainable:
                raise FicError(f"holds {len(state)} adapter tensors, the model has {len(trainable)} trainable ones",
                               path=input_dir)
            model.load_state_dict(state, strict=False)
        models.clear()  # loaded here; accelerate would load them strictly

    accelerator.register_save_state_pre_hook(save_hook)
    accelerator.register_load_state_pre_hook(load_hook)


def save_checkpoint(accelerator: Any, out: Path, step: int, state: dict, keep_last: int, lora: bool) -> Path:
    """Write `out/checkpoints/step-N` atomically (temp folder, `complete` marker, rename) and
    delete all but the newest `keep_last` complete checkpoints. Every rank must call it."""
    from accelerate.utils import DistributedType

    final = checkpoint_dir(out) / f"step-{step}"
    tmp = checkpoint_dir(out) / f".step-{step}.tmp"
    if accelerator.is_main_process:
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir(parents=True)
    accelerator.wait_for_everyone()
    kwargs = {}
    if lora and accelerator.distributed_type == DistributedType.DEEPSPEED:
        kwargs["exclude_frozen_parameters"] = True
    accelerator.save_state(str(tmp), safe_serialization=True, **kwargs)
    accelerator.wait_for_everyone()
    if accelerator.is_main_process:
        write_json(tmp / "trainer_state.json", state)
        write_text(tmp / "complete", f"step {step}\n")
        if final.exists():
            shutil.rmtree(final)
        os.replace(tmp, final)
        for old in complete_checkpoints(out)[:-keep_last]:
            shutil.rmtree(old, ignore_errors=True)
    accelerator.wait_for_everyone()
    return final


def find_resume(out: Path) -> tuple[Path, dict]:
    """The newest complete checkpoint and its trainer state, or a FicError saying why not."""
    folder = checkpoint_dir(out)
    found = complete_checkpoints(out)
    if not found:
        partial = sorted(p.name for p in folder.iterdir()) if folder.is_dir() else []
        why = f" (only incomplete ones: {', '.join(partial)})" if partial else ""
        raise FicError(f"resume=true but there is no complete checkpoint in {folder}{why}; "
                       "start without resume=true or point out= at the run to continue", field="resume")
    path = found[-1]
    try:
        state = json.loads((path / "trainer_state.json").read_text(encoding="utf-8"))
        int(state["step"]), dict(state["config"])
    except (OSError, ValueError, KeyError, TypeError) as err:
        raise FicError(f"checkpoint is damaged (trainer_state.json: {err}); delete this folder to resume "
                       "from the one before it", path=str(path)) from None
    return path, state


def check_compatible(saved: dict, cfg: SFTConfig, data_sha: str, world: int, where: Path) -> list[str]:
    """FicError when a setting that must match the checkpoint differs; the names of other changed settings."""
    now = config_to_dict(cfg)

    def get(tree: dict, dotted: str) -> Any:
        for part in dotted.split("."):
            tree = tree.get(part) if isinstance(tree, dict) else None
        return tree

    differs = [key for key in MUST_MATCH if get(saved["config"], key) != get(now, key)]
    if saved.get("data_sha256") != data_sha:
        differs.append(f"data file contents ({cfg.data.path})")
    if saved.get("world_size", world) != world:
        differs.append(f"number of processes ({saved.get('world_size')} -> {world})")
    if differs:
        raise FicError(f"cannot resume: {', '.join(differs)} differ from the checkpoint; resume with the settings "
                       "it was written with, or start a new run in another out folder", path=str(where))
    flat_saved, flat_now = _flatten(saved["config"]), _flatten(now)
    return sorted(k for k in flat_now if flat_saved.get(k) != flat_now[k] and k not in ("resume",))


def _flatten(tree: dict, prefix: str = "") -> dict:
    flat = {}
    for key, value in tree.items():
        if isinstance(value, dict):
            flat.update(_flatten(value, f"{prefix}{key}."))
        else:
            flat[prefix + key] = value
    return flat


def load_checkpoint(accelerator: Any, path: Path, lora: bool) -> None:
    from accelerate.utils import DistributedType

    kwargs = {}
    if lora and accelerator.distributed_type == DistributedType.DEEPSPEED:
        kwargs["load_module_strict"] = False
    try:
        accelerator.load_state(str(path), **kwargs)
    except FicError:
        raise
    except Exception as err:  # truncated or missing files: tell the user which checkpoint, not a traceback
        raise FicError(f"checkpoint is damaged and cannot be loaded ({type(err).__name__}: {err}); delete this "
                       "folder to resume from the one before it", path=str(path)) from None


# --------------------------------------------------------------------------- final model

def _copy_tokenizer(src: str, dst: Path) -> None:
    for name in TOKENIZER_FILES:
        if (Path(src) / name).is_file():
            shutil.copy(Path(src) / name, dst / name)


def model_card(cfg: SFTConfig, corpus: dict, result: dict, kind: str) -> str:
    config_yaml = yaml.safe_dump(config_to_dict(cfg), sort_keys=False)
    method = (f"LoRA r={cfg.lora.r} alpha={cfg.lora.alpha} on {', '.join(cfg.lora.target_modules)}"
              if cfg.lora.enabled else "full fine-tuning")
    library = "peft" if kind == "LoRA adapter" else "transformers"
    return "\n".join([
        "---", f"base_model: {cfg.model.path}", f"library_name: {library}", "tags: [fic, sft, multi-turn]", "---", "",
        f"# FiC SFT warm start ({kind})", "",
        f"Fine-tuned with `fic train sft` (FiC {__version__}): causal-LM loss on the assistant tokens of "
        "multi-turn conversations where the task arrives piece by piece (FiC stage 1).", "",
        f"- Base model: `{cfg.model.path}`",
        f"- Data: `{cfg.data.path}` (sha256 `{corpus['sha256']}`): {corpus['used']} of {corpus['records']} "
        f"conversations used ({corpus['skipped_too_long']} longer than {cfg.data.max_seq_len} tokens skipped), "
        f"{corpus['target_tokens']} target tokens per epoch",
        f"- Training: {result['steps']} optimizer steps, {result['world_size']} process(es), "
        f"{cfg.train.micro_batch_size} x {cfg.train.grad_accum_steps} conversations per process per step; "
        f"final loss {result['final_loss']:.4f}",
        f"- Method: {method}",
        "", "## Config", "", "```yaml", config_yaml.rstrip(), "```", ""])


def _publish(tmp: Path, final: Path) -> None:
    """Rename a finished temp folder onto `final`, replacing an older one."""
    if final.exists():
        shutil.rmtree(final)
    os.replace(tmp, final)


def save_final(accelerator: Any, loss_model: torch.nn.Module, cfg: SFTConfig, out: Path, card_args: tuple) -> Path:
    """Save the trained model as a Hugging Face folder (`out/final`; the adapter for LoRA) and,
    for LoRA with save_merged, the merged model (`out/final-merged`). Every rank must call it
    (ZeRO-3 gathers the weights)."""
    state = accelerator.get_state_dict(loss_model)  # full weights on the main process, also under ZeRO-3
    inner = accelerator.unwrap_model(loss_model).model
    final = out / "final"
    if accelerator.is_main_process:
        state = {k[len("model."):]: v for k, v in state.items() if k.startswith("model.")}
        tmp = out / ".final.tmp"
        shutil.rmtree(tmp, ignore_errors=True)
        inner.save_pretrained(tmp, state_dict=state, safe_serialization=True)
        _copy_tokenizer(cfg.model.path, tmp)
        write_text(tmp / "README.md", model_card(cfg, *card_args, "LoRA adapter" if cfg.lora.enabled else "full model"))
        _publish(tmp, final)
        if cfg.save_merged:
            from peft import PeftModel

            from fic.model import load_model

            base = load_model(cfg.model.path, dtype=cfg.model.dtype, trust_remote_code=cfg.model.trust_remote_code)
            merged = PeftModel.from_pretrained(base, final).merge_and_unload()
            tmp = out / ".final-merged.tmp"
            shutil.rmtree(tmp, ignore_errors=True)
            merged.save_pretrained(tmp, safe_serialization=True)
            _copy_tokenizer(cfg.model.path, tmp)
            write_text(tmp / "README.md", model_card(cfg, *card_args, "LoRA merged into the base model"))
            _publish(tmp, out / "final-merged")
    accelerator.wait_for_everyone()
    return final


# --------------------------------------------------------------------------- the recipe

def _start_wandb(cfg: SFTConfig, out: Path, run_id: str) -> Any:
    os.environ.setdefault("WANDB_MODE", cfg.logging.mode)  # offline unless the user says otherwise
    import wandb

    return wandb.init(project=cfg.logging.project, name=cfg.logging.run_name or out.name, id=run_id,
                      resume="allow", dir=str(out), config=config_to_dict(cfg))


def _check_accumulation(accelerator: Any, wanted: int) -> None:
    """The window size is the recipe's; a launch config (or DeepSpeed config) that sets its own
    gradient_accumulation_steps would silently change where optimizer steps fall."""
    if accelerator.gradient_accumulation_steps != wanted:
        raise FicError(f"the accelerate/DeepSpeed config sets gradient_accumulation_steps="
                       f"{accelerator.gradient_accumulation_steps}, the recipe train.grad_accum_steps={wanted}; "
                       "remove it from the launch config (the recipe sets it)", field="train.grad_accum_steps")


def _rewrite_metrics(path: Path, upto_step: int) -> None:
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


def train(cfg: SFTConfig) -> dict:
    """Run the recipe; return the final model folder (`model_dir`), the trained model as it is
    in memory (`model`, unwrapped; the PEFT model for LoRA), `steps` and `final_loss`."""
    from accelerate import Accelerator
    from accelerate.utils import DistributedType, set_seed
    from tqdm import tqdm

    from fic.model import load_tokenizer

    out = Path(cfg.out)
    # accelerate narrates every checkpoint at INFO and warns that tied embeddings are stored once
    # (expected; they are re-tied on load): keep the console to FiC's own lines.
    logging.getLogger("accelerate.checkpointing").setLevel(logging.WARNING)
    logging.getLogger("accelerate.accelerator").setLevel(logging.WARNING)
    logging.getLogger("accelerate.utils.other").setLevel(logging.ERROR)
    accelerator = Accelerator(
        gradient_accumulation_steps=cfg.train.grad_accum_steps,
        mixed_precision=None if cfg.train.mixed_precision == "auto" else cfg.train.mixed_precision,
        step_scheduler_with_optimizer=False)  # the schedule counts optimizer steps, not steps x processes
    main, world = accelerator.is_main_process, accelerator.num_processes
    say = accelerator.print
    _check_accumulation(accelerator, cfg.train.grad_accum_steps)

    resume_from, saved = find_resume(out) if cfg.resume else (None, None)
    if resume_from is None and (complete_checkpoints(out) or (out / "final").exists()):
        raise FicError("already holds a training run; set resume=true to continue it or choose another out folder",
                       path=str(out), field="out")
    tokenizer = load_tokenizer(cfg.model.path, trust_remote_code=cfg.model.trust_remote_code)
    examples, corpus = load_corpus(cfg.data, tokenizer, progress=main and cfg.logging.progress)
    corpus["sha256"] = file_sha256(cfg.data.path)
    if saved is not None:
        changed = check_compatible(saved, cfg, corpus["sha256"], world, resume_from)
        if changed:
            say(f"resuming with changed settings: {', '.join(changed)}")
    steps = total_steps(cfg, len(examples), world)
    say(f"{corpus['used']} conversations ({corpus['skipped_too_long']} skipped as too long), "
        f"{corpus['target_tokens']} target tokens; {steps} steps of {cfg.train.micro_batch_size} x "
        f"{cfg.train.grad_accum_steps} x {world} conversations")
    order = DataOrder(len(examples), cfg.train.micro_batch_size, world, accelerator.process_index,
                      cfg.data.seed, cfg.data.shuffle)

    set_seed(cfg.train.seed)
    model = build_model(cfg, device=str(accelerator.device))
    zero3 = (accelerator.distributed_type == DistributedType.DEEPSPEED
             and accelerator.state.deepspeed_plugin.zero_stage == 3)
    if not zero3:  # under ZeRO-3 the weights are partitioned already
        check_target_path(model.eval(), len(tokenizer))
        model.train()
    loss_model = TargetLoss(model, cfg.train.loss_chunk_tokens)
    optimizer = make_optimizer(loss_model, cfg.optim)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: lr_factor(s, steps, cfg.optim))
    if accelerator.distributed_type == DistributedType.DEEPSPEED:
        # No dataloader goes through prepare(), so DeepSpeed learns the batch size and clipping here.
        ds = accelerator.state.deepspeed_plugin.deepspeed_config
        ds["train_micro_batch_size_per_gpu"] = cfg.train.micro_batch_size
        if ds.get("gradient_clipping", "auto") == "auto":
            ds["gradient_clipping"] = cfg.optim.max_grad_norm
    loss_model, optimizer, scheduler = accelerator.prepare(loss_model, optimizer, scheduler)
    _check_accumulation(accelerator, cfg.train.grad_accum_steps)
    if cfg.lora.enabled:
        _lora_state_hooks(accelerator, {n for n, p in loss_model.named_parameters() if p.requires_grad})

    metrics_path = out / "metrics.jsonl"
    start = 0
    run_id = hashlib.sha256(f"{out.resolve()}:{time.time()}".encode()).hexdigest()[:12]
    if resume_from is not None:
        load_checkpoint(accelerator, resume_from, cfg.lora.enabled)
        start, run_id = int(saved["step"]), saved.get("wandb_id", run_id)
        if main:
            _rewrite_metrics(metrics_path, start)
        say(f"resumed from {resume_from} at step {start}")
    elif main:
        out.mkdir(parents=True, exist_ok=True)
        write_text(metrics_path, "")
    if main:
        write_text(out / "config.yaml", yaml.safe_dump(config_to_dict(cfg), sort_keys=False))
    tracker = _start_wandb(cfg, out, run_id) if cfg.logging.wandb and main else None

    G = cfg.train.grad_accum_steps
    bar = tqdm(total=steps, initial=start, desc="sft", unit="step",
               disable=not (main and cfg.logging.progress) or None)
    kill_after = int(os.environ.get(KILL_ENV, "0") or 0)
    last = {"loss": float("nan")}
    loss_model.train()
    for step in range(start + 1, steps + 1):
        began = time.perf_counter()
        batches = [collate([examples[i] for i in order.micro_batch(k)], tokenizer.pad_token_id)
                   for k in range((step - 1) * G, step * G)]
        figures = train_step(accelerator, loss_model, optimizer, scheduler, batches, cfg.optim.max_grad_norm)
        seconds = time.perf_counter() - began
        last = {"step": step, **figures, "epoch": round(order.epoch_at(step * G), 4),
                "target_tokens_per_s": figures["target_tokens"] / seconds, "tokens_per_s": figures["tokens"] / seconds}
        if main:
            append_jsonl(metrics_path, last)
            bar.set_postfix(loss=f"{last['loss']:.4f}", tok_s=f"{last['target_tokens_per_s']:.0f}")
            bar.update(1)
            if tracker is not None and (step % cfg.logging.log_every == 0 or step == steps):
                tracker.log({f"train/{k}": v for k, v in last.items() if k != "step" and v is not None}, step=step)
        if cfg.checkpoint.every and (step % cfg.checkpoint.every == 0 or step == steps):
            state = {"step": step, "micro_batches": step * G, "world_size": world, "data_sha256": corpus["sha256"],
                     "config": config_to_dict(cfg), "wandb_id": run_id, "loss": last["loss"],
                     "fic_version": __version__}
            save_checkpoint(accelerator, out, step, state, cfg.checkpoint.keep_last, cfg.lora.enabled)
        if step == kill_after:
            os.kill(os.getpid(), signal.SIGKILL)
    bar.close()

    if start >= steps:
        say(f"the checkpoint is at step {start} of {steps}: nothing left to train, saving the final model")
    if last.get("step") is None and saved is not None:
        last = {"loss": saved.get("loss", float("nan"))}
    result = {"steps": steps, "world_size": world, "final_loss": last["loss"]}
    final = save_final(accelerator, loss_model, cfg, out, (corpus, result))
    if tracker is not None:
        tracker.summary.update({"final_loss": last["loss"], "steps": steps})
        tracker.finish()
    say(f"saved {final}" + (f" and {out / 'final-merged'}" if cfg.save_merged else ""))
    accelerator.end_training()
    return {"model_dir": final, "model": accelerator.unwrap_model(loss_model).model, **result}


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="train_sft.py", description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter,
                                     epilog="settings (key=value):\n" + describe(SFTConfig))
    parser.add_argument("--config", default=None, help="recipe YAML, e.g. recipes/smollm2-135m-instruct/sft.yaml")
    parser.add_argument("overrides", nargs="*", metavar="key=value", help="override recipe settings")
    return parser


def main(argv: list[str] | None = None) -> int:
    # Intermixed: `--config` may come before, between or after the key=value overrides.
    args = build_parser().parse_intermixed_args(sys.argv[1:] if argv is None else argv)
    try:
        cfg = load_config(SFTConfig, args.config, args.overrides)
        train(cfg)
    except FicError as err:  # `accelerate launch` runs this file directly, past the fic CLI's handler
        print(f"fic train sft: error: {err}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
