"""Run settings every training recipe shares; each recipe's config extends `RunConfig`.

    @dataclass
    class SFTConfig(RunConfig):
        data: DataSection = setting(DataSection(), "The SFT corpus.")

Every field is declared with `fic.core.config.setting` (type, default, help), so `--help` of a
recipe lists every key and a YAML with an unknown key is an error.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

from fic.core.bounds import MAX_ACCUMULATION, MAX_BATCH, MAX_EPOCHS, MAX_RANK, MAX_REPEATS, MAX_STEPS, MAX_TOKENS
from fic.core.config import flatten, setting
from fic.core.errors import FicError, one_line
from fic.core.optional import installed, missing
from fic.core.push import HubSection
from fic.data.sources import InstancesSection
from fic.data.views import VIEWS

DEFAULT_LORA_TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]


@dataclass
class ModelSection:
    path: str = setting("models/smollm2-135m-instruct", "Local Hugging Face folder of the model to train "
                        "(`fic prepare-model` makes the bundled SmolLM2-135M-Instruct).")
    dtype: str = setting("auto", "Dtype the weights are loaded and trained in. auto: float32 master weights, "
                         "computed in bfloat16 (autocast) where that is fast (a bf16 GPU, a CPU with AMX or "
                         "AVX-512 BF16), else float32 throughout; the run's first lines say which. bfloat16 "
                         "weights train measurably worse on small models (updates below bf16's resolution are "
                         "lost); GPU recipes keep a frozen LoRA base in bfloat16.",
                         choices=("auto", "float32", "bfloat16"))
    trust_remote_code: bool = setting(False, "Run model code shipped in the model folder (off unless you trust it).")
    gradient_checkpointing: bool = setting(False, "Recompute activations in backward: less memory, ~30% slower.")

    @property
    def weights_dtype(self) -> str:
        """The dtype the weights are held in: auto keeps float32 master weights."""
        return "float32" if self.dtype == "auto" else self.dtype


@dataclass
class LoraSection:
    enabled: bool = setting(False, "Train a LoRA adapter (PEFT) instead of all weights.")
    r: int = setting(16, "LoRA rank.", min=1, max=MAX_RANK)
    alpha: int = setting(32, "LoRA alpha (the update is scaled by alpha / r).", min=1, unbounded="LoRA's scale (alpha / r): it scales the update, not work")
    dropout: float = setting(0.05, "Dropout on the LoRA input.", min=0.0, max=1.0)
    target_modules: list[str] = setting(DEFAULT_LORA_TARGETS, "Module names that get adapters "
                                        "(default: attention and MLP projections of Llama/Qwen/Mistral-style models).")


@dataclass
class OptimSection:
    lr: float = setting(2e-5, "Peak learning rate (AdamW).", min=0.0, unbounded="a learning rate")
    weight_decay: float = setting(0.0, "AdamW weight decay, on matrices only (not biases and norms).", min=0.0, unbounded="a decay rate")
    betas: list[float] = setting([0.9, 0.999], "AdamW betas.", min=0.0, max=1.0)
    eps: float = setting(1e-8, "AdamW epsilon.", min=0.0, unbounded="AdamW's epsilon")
    warmup_steps: int = setting(0, "Optimizer steps of linear warm-up.", min=0, max=MAX_STEPS)
    schedule: str = setting("cosine", "Learning-rate decay after warm-up.", choices=("constant", "linear", "cosine"))
    min_lr_ratio: float = setting(0.0, "Final learning rate as a share of lr (linear and cosine).", min=0.0, max=1.0)
    max_grad_norm: float = setting(1.0, "Clip the gradient norm to this (0: no clipping).", min=0.0, unbounded="a clipping threshold")


@dataclass
class TrainSection:
    max_steps: int | None = setting(None, "Optimizer steps to run; null: derived from epochs (SFT only).", min=1,
                                     max=MAX_STEPS)
    epochs: float = setting(1.0, "Passes over the data when max_steps is null (SFT only).", min=0.0,
                           max=MAX_EPOCHS)
    micro_batch_size: int = setting(4, "Conversations per forward pass on each process.", min=1,
                                   max=MAX_BATCH)
    grad_accum_steps: int = setting(1, "Micro-batches per optimizer step on each process.", min=1,
                                   max=MAX_ACCUMULATION)
    seed: int = setting(0, "Seed of weight init (LoRA), dropout and every other random draw.")
    mixed_precision: str = setting("auto", "auto: what the accelerate launch config says, else bf16 autocast when "
                                   "model.dtype is auto and bf16 is fast here, else none. no: compute in the "
                                   "weights' dtype; bf16: bfloat16 autocast over float32 weights; bf16_copy: "
                                   "forward and backward on a bfloat16 copy of the float32 weights cast once per "
                                   "optimizer step, gradients added into float32 (one process; measured 0.95x "
                                   "autocast's speed here: fic.training.precision).",
                                   choices=("auto", "no", "bf16", "bf16_copy"))
    loss_chunk_tokens: int = setting(1024, "Loss positions per LM-head chunk: bounds the logits held at once to "
                                     "this many rows of the vocabulary.", min=1)
    pad_to_multiple: int = setting(0, "Right-pad each micro-batch's width up to a multiple of this many tokens "
                                   "(0: to its longest row). bf16 on a CPU (oneDNN) keeps kernels and buffers for "
                                   "every new matrix shape, so unpadded widths make memory grow step after step: "
                                   "the bundled model's SFT grew 55 MB a step, and 8 with 64 at the same step time "
                                   "(docs/performance.md). The padding is masked and trains nothing.", min=0,
                                   max=MAX_ACCUMULATION)
    collective_timeout_s: float = setting(1800.0, "The watchdog of a multi-process run: a collective (all-reduce, "
                                          "a ZeRO-3 weight gather) that waits longer than this for the other ranks "
                                          "ends the run with one line naming the rank and the phase it was in, "
                                          "instead of hanging (the process group's timeout). It bounds one wait, "
                                          "not a phase: set it above the longest a rank may work alone (a "
                                          "checkpoint write on a slow disk).", min=1.0)


@dataclass
class CheckpointSection:
    every: int = setting(100, "Write a resumable checkpoint every this many optimizer steps (0: none), and "
                         "at the last step.", min=0, max=MAX_STEPS)
    keep_last: int = setting(2, "Checkpoints kept; older ones are deleted.", min=1, max=MAX_REPEATS)
    model_folder: bool = setting(True, "Also write step-N/model/, the model as a Hugging Face folder (config, "
                                 "weights or the LoRA adapter, tokenizer): AutoModelForCausalLM.from_pretrained and "
                                 "`fic eval model.model=OUT/checkpoints/step-N` load it. It holds the weights a "
                                 "second time (the resumable state keeps its own copy): false saves that disk.")
    save_only_model: bool = setting(False, "Checkpoints hold only step-N/model/ (the weights or the LoRA adapter as a "
                                    "Hugging Face folder), not the resumable state (optimizer, scheduler, RNG; "
                                    "TRL's save_only_model): for full fine-tuning with AdamW about a quarter of "
                                    "the disk, but resume=true cannot continue from them. The start line states "
                                    "each checkpoint's size either way.")

    def check(self, source: str) -> None:
        if self.save_only_model and not self.model_folder:
            raise FicError("save_only_model keeps step-N/model/ only: it needs checkpoint.model_folder=true",
                           path=source, field="save_only_model")


@dataclass
class LoggingSection:
    wandb: bool = setting(True, "Log to Weights & Biases (files under out/wandb; needs pip install \"fic[wandb]\").")
    project: str = setting("fic", "wandb project.")
    run_name: str | None = setting(None, "wandb run name (default: the out folder's name).")
    mode: str = setting("offline", "wandb mode unless the WANDB_MODE environment variable says otherwise; "
                        "offline runs can be uploaded later with `wandb sync`.", choices=("offline", "online"))
    log_every: int = setting(1, "Send metrics to wandb every this many steps (metrics.jsonl gets every step).",
                             min=1, max=MAX_STEPS)
    progress: bool = setting(True, "Show a progress bar on a terminal; elsewhere (a log file, a batch job) "
                             "print a progress line every logging.print_every_s seconds.")
    print_every_s: float = setting(60.0, "Seconds between progress lines when the output is not a terminal.",
                                   min=1.0)
    tensorboard: bool = setting(False, "Also write TensorBoard event files to out/tensorboard: the scalars, the "
                                "curves, the config and the data card (`tensorboard --logdir out`; needs "
                                "pip install \"fic[tensorboard]\").")
    curves_every_s: float = setting(300.0, "Redraw out/curves.png (and send it to wandb and TensorBoard) at most "
                                    "this often, and at the end; `fic report out` redraws it at any time.", min=0.0)

    def check(self, source: str) -> None:
        if self.wandb and not installed("wandb"):
            raise missing("wandb", "logging.wandb=true", field="wandb", path=source)
        if self.tensorboard:
            _check_tensorboard(source)


def _check_tensorboard(source: str) -> None:
    """Import what the run log will (torch's SummaryWriter, which imports tensorboard) now, at load
    time: a package that is installed but broken fails here in one line, not after the model load."""
    try:
        from torch.utils.tensorboard import SummaryWriter  # noqa: F401
    except Exception as err:  # not installed, or whatever a broken install raises on import
        if isinstance(err, ModuleNotFoundError) and (err.name or "").split(".")[0] == "tensorboard":
            raise missing("tensorboard", "logging.tensorboard=true", field="tensorboard", path=source) from None
        raise FicError(f"logging.tensorboard=true: tensorboard is installed but does not import "
                       f"({type(err).__name__}: {one_line(err)[:200]}); reinstall it: pip install --force-reinstall "
                       "tensorboard", path=source, field="tensorboard") from None


@dataclass
class DevSection:
    """The live model scored on dev instances as it trains (`fic.evaluation.live`): SFT's dev curve
    and VASD's held-out evaluation, one section, the same keys."""

    every: int = setting(0, "Score the live model on the dev instances every this many steps and at the end (0: "
                         "never). SFT stops at its plateau rule (dev.metric); VASD also scores before the first "
                         "step, and logs the divergence per answer token on the dev tasks' greedy rollouts.", min=0,
                         max=MAX_STEPS)
    data: InstancesSection = setting(InstancesSection(limit=32), "Dev instances, drawn with their own seed; never "
                                     "evaluation data (name the evaluation's recipes in exclude.sources) nor, in "
                                     "VASD, a rollout task (checked).")
    views: list[str] = setting(["sharded"], f"Views the dev probe plays, from: {', '.join(VIEWS)} (VASD: empty, "
                               "the divergence only).")
    max_new_tokens: int = setting(256, "Most tokens of one dev reply.", min=1, max=MAX_TOKENS)
    batch_size: int = setting(16, "Most dev conversations per generation forward pass.", min=1, max=MAX_BATCH)


@dataclass
class RunConfig:
    """What every training run has; recipes add their data and loss sections."""

    model: ModelSection = setting(ModelSection(), "The model to train.")
    lora: LoraSection = setting(LoraSection(), "LoRA adapter instead of full fine-tuning.")
    optim: OptimSection = setting(OptimSection(), "Optimizer and learning-rate schedule.")
    train: TrainSection = setting(TrainSection(), "Steps, batch sizes, precision.")
    checkpoint: CheckpointSection = setting(CheckpointSection(), "Resumable checkpoints.")
    logging: LoggingSection = setting(LoggingSection(), "wandb, TensorBoard, curves and progress.")
    hub: HubSection = setting(HubSection(), "Pushing the final model to the Hugging Face hub.")
    out: str = setting("runs/train", "Output folder: config, metrics, checkpoints, final model.")
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
        if not self.out.strip():
            raise FicError("expected an output folder", path=source, field="out")


def moved_key(renamed: dict[str, str], data: dict, unknown: Sequence[str]) -> tuple[str, str] | None:
    """A config class's `moved` hook (`fic.core.config`): for the first unknown key that `renamed`
    (an old dotted key, or a whole old section, -> where it went) names, the longest old name
    first, (that key, "renamed: now ..."), so an old config fails in one line that says what to
    write instead; None for a key never known."""
    for leaf in (leaf for key in unknown for leaf in flatten({key: data[key]})):
        parts = leaf.split(".")
        old = next((name for name in (".".join(parts[:n]) for n in range(len(parts), 0, -1)) if name in renamed), None)
        if old:
            return old, f"renamed: now {renamed[old]}"
    return None
