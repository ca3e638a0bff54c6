"""A backbone recipe's own shapes on one GPU, with random weights (the GPU session's `shapes` phase).

    python tools/gpu/shapes.py --backbone B [--json] [--dry-run] [...]     # from the repository root

For one backbone (`--backbone`, a shape file in `tools/gpu/shapes/`) it builds a model folder of the
backbone's architecture with random weights and SmolLM2's tokenizer (`tools/gpu/random_models.py`:
no hub, no GGUF), writes an SFT corpus with FiC's own generator (`fic sft-data` on `actions-gen`,
~320-token conversations, as the recipes' ~300-token GSM8K ones), then runs a few steps of the
backbone's SFT recipe and of its VASD recipe as they are: their micro-batch and accumulation,
sequence caps, precision, LoRA rank and targets, gradient checkpointing and loss chunking, under
the recipe's launch (one-process DeepSpeed ZeRO-2 for the full fine-tuning recipes when deepspeed
imports; plain bf16 otherwise, and for LoRA, whose recipes run plain DDP). What the shape run
changes, and why:

- model.path: the random folder; data: the generated corpus (SFT, VASD's anchor) and `actions-gen`
  instances (VASD's rollouts); `exclude.sources=[]` (the recipes' evaluation files need the network).
- VASD's rollouts play on the trainer's weights (`rollout.backend=hf`: no vLLM there). Random
  weights never write an end-of-turn token, so every reply runs to `rollout.max_new_tokens`:
  `--rollout-tokens` (112) keeps a conversation at the recipes' typical ~700 tokens, and
  `loss.keep_truncated=true` keeps those final replies in the loss.
- `train.max_steps` (`--sft-steps`, `--vasd-steps`), no checkpoints, no wandb, no merged save, no
  warm-up of the learning rate. The first step of each stage is a warm-up, left out of the figures,
  and SFT's second too when it has at least 4 (`warmup_steps`): on one H200 a 3B's second SFT step
  still ran at a fifth of the third's speed.
- Layers: the backbone's own number where the trainer fits the GPU by the recipes' memory arithmetic
  (`memory_estimate`), else the most that fit (the full fine-tuning recipes of the 7-8B models, which
  shard over 8 GPUs, not 1). The figures say how many ran.

Figures per stage (`tools/gpu/shape_run.py` times each phase of a step with the GPU synchronised):
tokens/s, MFU, peak GPU memory, and the recipe's hours recomputed from the measured MFU. MFU counts
FLOPs as the recipes do, c·N per token position the GPU runs, padding included (c = 6 full
fine-tuning, 4 LoRA, +2 under gradient checkpointing; 2 for the teacher's and the rollouts'
forwards), against the GPU's dense bf16 peak. The recipes' hours assume 8 x A100 at 25% MFU (3% for
vLLM's rollouts); recomputed, each phase runs at its MFU measured here, on the assumption that MFU
carries over from this GPU to an A100 (the rollouts keep the recipes' vLLM assumption; the hours
with the HF backend's measured rollout MFU are given beside). On a CPU the run is the same (tests
use tiny shapes) and MFU needs `--peak-tflops`.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import shutil
import statistics
import sys
from importlib.util import find_spec
from pathlib import Path
from typing import Any

import torch
from random_models import layer_parameters, load_shape, parameter_count

from fic.bench.random_weights import make_config, parse_sets, tokenizer_dir
from fic.bench.runner import Runner, free_port
from fic.cli.bench import print_figures
from fic.core.config import load_config
from fic.core.errors import FicError, exit_status
from fic.core.files import check_writable
from fic.training.sft import SFTConfig
from fic.training.vasd.config import VASDConfig

REPO = Path(__file__).resolve().parents[2]  # the commands run there: recipes/, launch/, tools/gpu/
RECIPES_DIR = REPO / "recipes"
BACKBONES = ("llama-3.2-3b-instruct", "llama-3.1-8b-instruct", "qwen2.5-7b-instruct", "olmo-2-1124-7b-instruct",
             "phi-4")
TOKENIZER_DIRS = ("models/smollm2-135m-instruct", "runs/gpu-carry/tokenizer")
STAGES = ("sft", "vasd")
CONFIGS = {"sft": SFTConfig, "vasd": VASDConfig}
# The bench never logs to wandb, and the backbone recipes turn it on: read without this, a recipe
# fails its check on a machine without wandb (the lent GPU machines have none).
NO_WANDB = ["logging.wandb=false"]
OOM_MARKERS = ("CUDA out of memory", "OutOfMemoryError", "CUBLAS_STATUS_ALLOC_FAILED")

# Dense bf16 tensor-core FLOP/s and memory bandwidth, from NVIDIA's datasheets (their bf16 figures
# are "with sparsity": half of them is the dense peak). H200 SXM 1,979 -> 989 TFLOP/s, H200 NVL
# 1,671 -> 835, 4.8 TB/s both (nvidia.com/en-us/data-center/h200); H100 SXM 989 and 3.35 TB/s, H100
# NVL 835 and 3.9 TB/s, H100 PCIe 756 and 2.0 TB/s (nvidia.com/en-us/data-center/h100); A100 312 and
# 2.0 TB/s for the 80 GB SXM (nvidia.com/en-us/data-center/a100). Matched in this order against
# torch.cuda.get_device_name(); another GPU needs --peak-tflops (and --bandwidth-tbs).
GPU_PEAKS = (("H200 NVL", 835e12, 4.8e12), ("H200", 989e12, 4.8e12), ("H100 NVL", 835e12, 3.9e12),
             ("H100 PCIe", 756e12, 2.0e12), ("H100", 989e12, 3.35e12), ("A100", 312e12, 2.0e12))

# The recipes' own sizing inputs (their headers; docs/launching.md): 8 x A100 80GB at 312 TFLOP/s;
# SFT 5.8M token positions (7.4k conversations x ~300 tokens x 2 epochs x 1.3 padding) at an assumed
# 25% MFU; VASD 100 steps x 128 rollouts: rollouts 2·N·9.0M at 3% (vLLM), the teacher 2·N·6.7M and the
# student c·N·14M at 25%. c = None: the stage's training coefficient (`flops_coefficient`).
RECIPE_GPUS, RECIPE_PEAK = 8, 312e12
RECIPE_PHASES = {
    "sft": {"student": (None, 5.8e6, 0.25)},
    "vasd": {"rollouts": (2, 9.0e6, 0.03), "teacher": (2, 6.7e6, 0.25), "student": (None, 1.4e7, 0.25)},
}
GIB = 2**30


# --------------------------------------------------------------------------- the recipes' sizing

def recipe_config(backbone: str, stage: str, overrides: list[str]) -> Any:
    """A backbone's stage recipe as the bench reads it (wandb off, then `overrides`)."""
    return load_config(CONFIGS[stage], RECIPES_DIR / backbone / f"{stage}.yaml", [*NO_WANDB, *overrides])


def flops_coefficient(lora: bool, gradient_checkpointing: bool) -> int:
    """FLOPs per parameter and token of a training pass, as the recipes count them."""
    return (4 if lora else 6) + (2 if gradient_checkpointing else 0)


def recipe_phases(stage: str, cfg: Any, parameters: int) -> dict:
    """Each phase of a stage as its recipe sizes it: FLOPs coefficient, token positions, assumed
    MFU, FLOPs and hours of compute on the recipe's 8 x A100."""
    phases = {}
    for phase, (coefficient, tokens, mfu) in RECIPE_PHASES[stage].items():
        c = coefficient or flops_coefficient(cfg.lora.enabled, cfg.model.gradient_checkpointing)
        flops = c * parameters * tokens
        phases[phase] = {"c": c, "tokens": tokens, "assumed_mfu": mfu, "flops": flops,
                         "hours": flops / (mfu * RECIPE_GPUS * RECIPE_PEAK) / 3600}
    return phases


def hours_at(phases: dict, measured_mfu: dict) -> float:
    """The recipe's hours of compute with each phase at its measured MFU (the recipe's own
    assumption for a phase without one)."""
    return sum(sizing["flops"] / ((measured_mfu.get(phase) or sizing["assumed_mfu"]) * RECIPE_GPUS * RECIPE_PEAK)
               for phase, sizing in phases.items()) / 3600


def gpu_peaks(name: str | None) -> tuple[float | None, float | None]:
    """(dense bf16 FLOP/s, memory bytes/s) of a GPU by its name, or (None, None)."""
    for key, flops, bandwidth in GPU_PEAKS:
        if name and key.lower() in name.lower():
            return flops, bandwidth
    return None, None


# --------------------------------------------------------------------------- what fits one GPU

def memory_estimate(config: Any, stage: str, cfg: Any, layers: int, engine: str) -> float:
    """Bytes a stage's trainer needs on one GPU at `layers` layers, by the recipes' arithmetic:
    per parameter 20 bytes under one-process ZeRO-2 (bf16 weights and gradients, fp32 master copy,
    Adam moments, the fp32 gradient partition), 8 under plain bf16 AdamW, 2 for LoRA's frozen base
    (+2 for full fine-tuning VASD's frozen teacher copy); activations ~34 x hidden bytes per token
    and layer (Korthikanti et al. 2022; under gradient checkpointing 2 x hidden per layer plus one
    layer's 34) for the recipe's longest micro-batch; the logits of one loss chunk; for VASD the
    rollouts' KV cache at their longest and the key/value store; 3 GB of CUDA context and workspace."""
    outside, per_layer = layer_parameters(config)
    params = outside + layers * per_layer
    hidden = config.hidden_size
    if cfg.lora.enabled:
        per_param = 2
    else:
        per_param = 20 if engine == "deepspeed" else 8
        if stage == "vasd" and cfg.teacher.mode == "frozen":
            per_param += 2
    if stage == "sft":
        tokens = cfg.train.micro_batch_size * cfg.data.max_seq_len
    else:
        anchors = 1 if cfg.anchor.share > 0 else 0
        tokens = (cfg.train.micro_batch_size + anchors) * cfg.rollout.max_conversation_tokens
    if cfg.model.gradient_checkpointing:
        activations = tokens * hidden * (2 * layers + 34)
    else:
        activations = tokens * 34 * hidden * layers
    chunk = 3 * cfg.train.loss_chunk_tokens * config.vocab_size * 4
    extra = 0.0
    if stage == "vasd":
        kv_heads = getattr(config, "num_key_value_heads", None) or config.num_attention_heads
        head_dim = getattr(config, "head_dim", None) or hidden // config.num_attention_heads
        rollouts = cfg.train.micro_batch_size * cfg.train.grad_accum_steps
        extra = (rollouts * cfg.rollout.max_conversation_tokens * layers * kv_heads * head_dim * 4
                 + cfg.rollout.kv_reuse_mb * 2**20)
    return per_param * params + activations + chunk + extra + 3e9


def layers_that_fit(config: Any, stage: str, cfg: Any, gpu_bytes: float, engine: str, share: float = 0.85) -> int:
    """The most decoder layers (at most the config's) whose estimate fits `share` of the GPU."""
    for layers in range(config.num_hidden_layers, 0, -1):
        if memory_estimate(config, stage, cfg, layers, engine) <= share * gpu_bytes:
            return layers
    return 1


# --------------------------------------------------------------------------- the plan

def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--backbone", required=True, help=f"a shape in tools/gpu/shapes/: {', '.join(BACKBONES)}")
    parser.add_argument("--stages", default="sft,vasd", help="sft, vasd or both (default: sft,vasd)")
    parser.add_argument("--tokenizer", default=None, help="a folder with SmolLM2's tokenizer files (default: the "
                        f"first of {', '.join(TOKENIZER_DIRS)} that has them)")
    parser.add_argument("--work", default=None, help="logs, runs and figures (default: runs/shapes/BACKBONE)")
    parser.add_argument("--models", default=None, help="where the random model folder is written and deleted "
                        "afterwards (default: --work)")
    parser.add_argument("--layers", type=int, default=None, help="decoder layers of every stage (default: the "
                        "backbone's, or the most that fit the GPU)")
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                        help="shape overrides (tests: tiny shapes), e.g. --set hidden_size=64")
    parser.add_argument("--sft-steps", type=int, default=6,
                        help="SFT steps, the first two warm-ups (the first only, under 4 steps) (default: 6)")
    parser.add_argument("--vasd-steps", type=int, default=2, help="VASD steps, the first a warm-up (default: 2)")
    parser.add_argument("--rollout-tokens", type=int, default=112,
                        help="rollout.max_new_tokens: every reply of random weights runs to it (default: 112)")
    parser.add_argument("--corpus-size", type=int, default=128, help="conversations of the SFT corpus")
    parser.add_argument("--override", action="append", default=[], metavar="KEY=VALUE",
                        help="a recipe setting changed after the bench's own (tests: smaller batches, float32 on a "
                             "CPU); the figures list them")
    parser.add_argument("--launcher", choices=("auto", "plain", "deepspeed"), default="auto",
                        help="full fine-tuning stages: ZeRO-2 (the recipes' launch) when deepspeed imports (auto), "
                             "always, or plain bf16; LoRA stages always run plain, as their DDP recipes")
    parser.add_argument("--device", default="auto", help="auto (cuda if there is one), cuda or cpu")
    parser.add_argument("--gpu-memory-gib", type=float, default=None,
                        help="memory the layer fit assumes (default: the GPU's; 139 without one)")
    parser.add_argument("--peak-tflops", type=float, default=None, help="dense bf16 peak (default: by GPU name)")
    parser.add_argument("--bandwidth-tbs", type=float, default=None, help="memory bandwidth (default: by GPU name)")
    parser.add_argument("--timeout", type=float, default=600, help="seconds per command (default: 600)")
    parser.add_argument("--budget-s", type=float, default=None, help="seconds for the whole bench; a command gets "
                        "what is left (default: no limit)")
    parser.add_argument("--keep-model", action="store_true", help="keep the random model folder")
    parser.add_argument("--dry-run", action="store_true", help="print the plan and the commands; run nothing")


def _device(name: str) -> str:
    if name == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    return name


def make_plan(args: argparse.Namespace) -> dict:
    """Everything the bench will do: per stage the recipe, engine, layers and command."""
    shape = load_shape(args.backbone)
    backbone = shape["backbone"]
    stages = [s.strip() for s in args.stages.split(",") if s.strip()]
    if not stages or any(s not in STAGES for s in stages):
        raise FicError(f"expected sft, vasd or sft,vasd, got {args.stages!r}", field="--stages")
    for name in ("sft_steps", "vasd_steps", "rollout_tokens", "corpus_size"):
        if getattr(args, name) < 1:
            raise FicError("expected at least 1", field="--" + name.replace("_", "-"))
    device = _device(args.device)
    tokenizer = (args.tokenizer or "<tokenizer>") if args.dry_run else tokenizer_dir(args.tokenizer, TOKENIZER_DIRS)
    work = Path(args.work or f"runs/shapes/{backbone}")
    models = Path(args.models or work)
    sets = parse_sets(args.set)
    full = make_config(shape, sets=sets)
    if device == "cuda" and torch.cuda.is_available() and args.gpu_memory_gib is None:
        gpu_bytes = torch.cuda.get_device_properties(0).total_memory
    else:
        gpu_bytes = (args.gpu_memory_gib or 139) * GIB
    deepspeed = args.launcher == "deepspeed" or (args.launcher == "auto" and find_spec("deepspeed") is not None)
    python = sys.executable
    plan: dict = {"backbone": backbone, "hub_id": shape.get("hub_id"), "config_source": shape.get("source"),
                  "device": device, "work": str(work), "tokenizer": tokenizer, "sets": sets,
                  "full_layers": full.num_hidden_layers, "full_parameters": parameter_count(full),
                  "gpu_memory_bytes": gpu_bytes, "overrides": list(args.override), "stages": {}}
    corpus = work / "corpus.jsonl"
    plan["corpus_command"] = [python, "-m", "fic", "sft-data", "data.source=[actions-gen:train]", "data.task=actions",
                              f"data.limit={args.corpus_size}", "data.seed=0", "seed=0", f"out={corpus}"]
    model = models / f"{backbone}-random"
    for stage in stages:
        recipe = RECIPES_DIR / backbone / f"{stage}.yaml"
        cfg = recipe_config(backbone, stage, args.override)
        engine = "plain" if cfg.lora.enabled or not deepspeed else "deepspeed"
        layers = args.layers or layers_that_fit(full, stage, cfg, gpu_bytes, engine)
        layers = min(layers, full.num_hidden_layers)
        plan["stages"][stage] = {"recipe": str(recipe.relative_to(REPO)), "engine": engine, "layers": layers,
                                 "estimated_bytes": memory_estimate(full, stage, cfg, layers, engine),
                                 "lora": cfg.lora.enabled, "lora_r": cfg.lora.r if cfg.lora.enabled else None,
                                 "gradient_checkpointing": cfg.model.gradient_checkpointing,
                                 "micro_batch_size": cfg.train.micro_batch_size,
                                 "grad_accum_steps": cfg.train.grad_accum_steps, "dtype": cfg.model.dtype}
    built = max(s["layers"] for s in plan["stages"].values())
    plan["model"] = str(model)
    plan["built_layers"] = built
    plan["build_command"] = [python, "tools/gpu/random_models.py", "build", "--backbone", backbone, "--out",
                             str(model), "--tokenizer", tokenizer, "--layers", str(built), "--device", device,
                             *[f"--set={k}={json.dumps(v)}" for k, v in sets.items()]]
    for stage, info in plan["stages"].items():
        info.update(stage_commands(args, plan, stage, info["layers"], corpus))
    return plan


def stage_model(plan: dict, layers: int) -> str:
    return plan["model"] if layers == plan["built_layers"] else f"{plan['model']}-{layers}-layers"


def stage_commands(args: argparse.Namespace, plan: dict, stage: str, layers: int, corpus: Path) -> dict:
    """The commands of one stage at `layers` layers: an optional layer view, then the recipe."""
    python = sys.executable
    info = plan["stages"][stage]
    work = Path(plan["work"])
    model = stage_model(plan, layers)
    run = work / f"{stage}-run"
    figures = work / f"{stage}-probe.json"
    overrides = [f"model.path={model}", "optim.warmup_steps=0", "checkpoint.every=0", *NO_WANDB, f"out={run}"]
    if stage == "sft":
        overrides += [f"data.path={corpus}", f"train.max_steps={args.sft_steps}"]
    else:
        rollouts = info["micro_batch_size"] * info["grad_accum_steps"]
        overrides += ["data.source=actions-gen:train", "data.task=actions", f"data.limit={rollouts * args.vasd_steps + 16}",
                      "exclude.sources=[]", f"anchor.path={corpus}", "rollout.backend=hf",
                      f"rollout.max_new_tokens={args.rollout_tokens}", "loss.keep_truncated=true",
                      f"train.max_steps={args.vasd_steps}", "logging.samples_every=0", "dev.every=0"]
    if info["lora"]:
        overrides.append("save_merged=false")
    if info["engine"] == "plain":
        overrides.append("train.mixed_precision=bf16")  # what the recipes' launch files set
        prefix = [python]
    else:
        prefix = [python, "-m", "accelerate.commands.launch", "--config_file", "launch/deepspeed_zero2.yaml",
                  "--num_processes", "1", "--main_process_port", str(free_port(args.dry_run))]
    overrides += list(args.override)
    command = [*prefix, "tools/gpu/shape_run.py", stage, str(figures), "--config", info["recipe"], *overrides]
    view = None
    if layers != plan["built_layers"]:
        view = [python, "tools/gpu/random_models.py", "view", plan["model"], model, "--layers", str(layers)]
    return {"layers": layers, "model": model, "run": str(run), "figures": str(figures), "view_command": view,
            "command": command, "log": str(work / f"{stage}.log")}


def _oom(log: Path) -> bool:
    try:
        text = log.read_text(errors="replace")
    except OSError:
        return False
    return any(marker in text for marker in OOM_MARKERS)


def measure(args: argparse.Namespace) -> dict:
    if not args.dry_run:  # outputs first, before anything is read or written
        check_writable(args.work or f"runs/shapes/{Path(args.backbone).stem}", folder=True, field="--work")
        if args.models:
            check_writable(args.models, folder=True, field="--models")
    plan = make_plan(args)
    if args.dry_run:
        commands = [plan["corpus_command"], plan["build_command"]]
        for info in plan["stages"].values():
            commands += [c for c in (info["view_command"], info["command"]) if c]
        for command in commands:
            print(shlex.join(command), file=sys.stderr)
        return {"backbone": plan["backbone"], "dry_run": True, "plan": plan, "ratio": None}
    pythonpath = os.pathsep.join([str(REPO), *([os.environ["PYTHONPATH"]] if os.environ.get("PYTHONPATH") else [])])
    runner = Runner(args.timeout, args.budget_s, cwd=REPO, env={"PYTHONPATH": pythonpath})  # this checkout's fic
    work = Path(plan["work"])
    for stage in plan["stages"]:
        shutil.rmtree(work / f"{stage}-run", ignore_errors=True)
        (work / f"{stage}-probe.json").unlink(missing_ok=True)
        (work / f"{stage}.log").unlink(missing_ok=True)
    figures: dict = {"backbone": plan["backbone"], "hub_id": plan["hub_id"], "config_source": plan["config_source"],
                     "random_weights": True, "tokenizer": "SmolLM2-135M-Instruct (the real vocabulary size kept)",
                     "full_layers": plan["full_layers"], "full_parameters": plan["full_parameters"],
                     "device": plan["device"], "overrides": plan["overrides"], "seconds": {}, "stages": {}}
    rc, seconds, why = runner.run(plan["corpus_command"], work / "setup.log")
    figures["seconds"]["corpus"] = seconds
    if rc == 0:
        rc, seconds, why = runner.run(plan["build_command"], work / "setup.log")
        figures["seconds"]["build"] = seconds
    if rc != 0:
        figures["error"] = f"setup: {why} (log {work / 'setup.log'})"
        figures["ratio"] = None
        return figures
    try:
        for stage, info in plan["stages"].items():
            figures["stages"][stage] = run_stage(args, plan, stage, info, runner, work / "corpus.jsonl")
    finally:
        if not args.keep_model:
            for path in Path(plan["model"]).parent.glob(Path(plan["model"]).name + "*"):
                shutil.rmtree(path, ignore_errors=True)
    peak, bandwidth = peaks_for(args, figures)
    figures.update(peak_flops=peak, bandwidth_bytes_per_s=bandwidth)
    for stage, stage_figures in figures["stages"].items():
        if stage_figures.get("ok"):
            stage_figures.update(stage_results(stage, stage_figures, plan, peak, bandwidth))
    figures["ratio"] = _headline(figures)
    return figures


def run_stage(args: argparse.Namespace, plan: dict, stage: str, info: dict, runner: Runner, corpus: Path) -> dict:
    """Run one stage (once more with fewer layers after an out-of-memory failure)."""
    layers, out = info["layers"], {}
    for attempt in range(2):
        cmds = info if attempt == 0 else stage_commands(args, plan, stage, layers, corpus)
        log = Path(cmds["log"])
        if cmds["view_command"]:
            rc, _, why = runner.run(cmds["view_command"], log)
            if rc != 0:
                return {"ok": False, "error": f"layer view: {why}", "log": str(log)}
        rc, seconds, why = runner.run(cmds["command"], log)
        out = {"ok": rc == 0, "seconds": seconds, "layers": layers, "engine": info["engine"], "log": str(log),
               "command": shlex.join(cmds["command"]), "run": cmds["run"], "figures_file": cmds["figures"]}
        if rc == 0:
            return out
        out["error"] = why
        if not _oom(log) or layers <= 1:
            return out
        out["oom_at_layers"] = layers
        layers = max(1, layers * 3 // 4)
        shutil.rmtree(cmds["run"], ignore_errors=True)
    return out


def peaks_for(args: argparse.Namespace, figures: dict) -> tuple[float | None, float | None]:
    gpu = next((s.get("gpu") for s in _probes(figures) if s.get("gpu")), None)
    figures["gpu"] = gpu
    peak, bandwidth = gpu_peaks(gpu)
    if args.peak_tflops:
        peak = args.peak_tflops * 1e12
    if args.bandwidth_tbs:
        bandwidth = args.bandwidth_tbs * 1e12
    return peak, bandwidth


def _probes(figures: dict) -> list[dict]:
    found = []
    for stage in figures["stages"].values():
        path = Path(stage.get("figures_file", ""))
        if path.is_file():
            found.append(json.loads(path.read_text(encoding="utf-8")))
    return found


def _metrics(run: str) -> list[dict]:
    path = Path(run) / "metrics.jsonl"
    if not path.is_file():
        return []
    return [r for r in (json.loads(line) for line in path.read_text().splitlines() if line.strip()) if r["step"] >= 1]


def warmup_steps(stage: str, steps: int) -> int:
    """Steps left out of a stage's figures: the first (kernels, allocator, DeepSpeed's buffers), and
    SFT's second once there are at least 4 (on one H200 it still ran at a fifth of the third's speed)."""
    if steps < 2:
        return 0
    return 2 if stage == "sft" and steps >= 4 else 1


def stage_results(stage: str, info: dict, plan: dict, peak: float | None, bandwidth: float | None) -> dict:
    """Tokens/s, MFU per phase, peak memory and the recipe's hours from one stage's probe and metrics."""
    probe = json.loads(Path(info["figures_file"]).read_text(encoding="utf-8"))
    rows = _metrics(info["run"])
    cfg = recipe_config(plan["backbone"], stage, plan["overrides"])
    calls = probe["phases"]
    steps = len(rows)
    timed = list(range(warmup_steps(stage, steps), steps))
    model = probe["model"]
    base = model["parameters"] - (model["trainable_parameters"] if cfg.lora.enabled else 0)
    c_train = flops_coefficient(cfg.lora.enabled, cfg.model.gradient_checkpointing)
    coefficients = {"student": c_train, "teacher": 2, "rollouts": 2}
    out: dict = {"steps": steps, "timed_steps": len(timed), "layers": model["layers"], "parameters": base,
                 "trainable_parameters": model["trainable_parameters"], "dtype": model["dtype"],
                 "micro_batch_size": cfg.train.micro_batch_size, "grad_accum_steps": cfg.train.grad_accum_steps,
                 "lora_r": cfg.lora.r if cfg.lora.enabled else None,
                 "gradient_checkpointing": cfg.model.gradient_checkpointing,
                 "peak_memory_gib": probe["peak_allocated_bytes"] / GIB if probe.get("peak_allocated_bytes") else None,
                 "peak_reserved_gib": probe["peak_reserved_bytes"] / GIB if probe.get("peak_reserved_bytes") else None,
                 "peak_rss_gib": probe["peak_rss_bytes"] / GIB, "gpu": probe.get("gpu"),
                 "versions": {k: probe.get(k) for k in ("torch", "cuda", "transformers", "deepspeed")}, "phases": {}}
    mfu: dict = {}
    for phase in ("rollouts", "teacher", "student", "update"):
        phase_calls = calls.get(phase, [])
        chosen = [phase_calls[i] for i in timed if i < len(phase_calls)]
        if not chosen:
            continue
        seconds = sum(c["seconds"] for c in chosen)
        positions = sum(c["positions"] for c in chosen)
        figures = {"seconds_per_step": seconds / len(chosen), "positions_per_step": positions / len(chosen),
                   "positions_per_s": positions / seconds if seconds else None,
                   "peak_memory_gib": max(c.get("peak_allocated_bytes", 0) for c in chosen) / GIB or None}
        if phase in coefficients and peak and seconds and positions:
            figures["mfu"] = coefficients[phase] * base * positions / seconds / peak
            mfu[phase] = figures["mfu"]
        out["phases"][phase] = figures
    step_s = [sum(calls[p][i]["seconds"] for p in calls if i < len(calls[p])) for i in timed]
    out["step_s"] = statistics.mean(step_s) if step_s else None
    if stage == "sft":
        tokens = sum(rows[i]["tokens"] for i in timed)
        positions = out["phases"].get("student", {}).get("positions_per_step", 0) * len(timed)
        out["tokens_per_s"] = tokens / sum(step_s) if step_s and sum(step_s) else None
        out["padding_share"] = 1 - tokens / positions if positions else None
        out["mean_sequence_tokens"] = tokens / (len(timed) * cfg.train.micro_batch_size * cfg.train.grad_accum_steps)
        if peak and step_s:  # the whole step (the optimizer's too), as the recipe's hours count it
            out["mfu"] = c_train * base * positions / sum(step_s) / peak
            mfu = {"student": out["mfu"]}
    else:
        rollouts = cfg.train.micro_batch_size * cfg.train.grad_accum_steps
        generated = sum(rows[i].get("rollout_tokens", 0) * rollouts for i in timed)
        rollout_s = sum(calls["rollouts"][i]["seconds"] for i in timed if i < len(calls.get("rollouts", [])))
        decode = probe["rollout_decode"]
        out["rollout_tokens_per_s"] = generated / rollout_s if rollout_s else None
        out["generated_tokens_per_rollout"] = statistics.mean(rows[i].get("rollout_tokens", 0) for i in timed) if timed else None
        if decode["forwards"] and decode["seconds"]:
            batch = decode["rows"] / decode["forwards"]
            out["decode"] = {"mean_rows": batch, "forward_tokens_per_s": decode["rows"] / decode["seconds"],
                             "ms_per_step": 1000 * decode["seconds"] / decode["forwards"]}
            if bandwidth:  # every decoding step reads every weight once (bf16): the bound on tokens/s
                roofline = batch * bandwidth / (2 * base)
                out["decode"].update(roofline_tokens_per_s=roofline,
                                     forward_share_of_roofline=out["decode"]["forward_tokens_per_s"] / roofline,
                                     rollout_share_of_roofline=(out["rollout_tokens_per_s"] or 0) / roofline)
        out["mfu"] = mfu.get("student")
    phases = recipe_phases(stage, cfg, plan["full_parameters"])
    out["recipe"] = {"phases": phases, "compute_hours": sum(p["hours"] for p in phases.values())}
    if mfu:
        kept = {k: v for k, v in mfu.items() if k != "rollouts"}  # the recipes' rollouts run on vLLM
        out["recomputed_compute_hours"] = hours_at(phases, kept)
        out["recomputed_vs_recipe"] = out["recomputed_compute_hours"] / out["recipe"]["compute_hours"]
        if stage == "vasd" and "rollouts" in mfu:
            out["recomputed_compute_hours_hf_rollouts"] = hours_at(phases, mfu)
    return out


def _headline(figures: dict) -> float | None:
    """Recomputed over the recipe's hours of compute, both stages together."""
    recipe = recomputed = 0.0
    for stage in figures["stages"].values():
        if stage.get("recomputed_compute_hours") is None:
            return None
        recipe += stage["recipe"]["compute_hours"]
        recomputed += stage["recomputed_compute_hours"]
    return recomputed / recipe if recipe else None


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python tools/gpu/shapes.py", description=__doc__.split("\n\n")[0])
    add_arguments(parser)
    parser.add_argument("--json", action="store_true", help="print the figures as one JSON object")
    args = parser.parse_args(argv)
    return exit_status("tools/gpu/shapes.py", lambda: print_figures(measure(args), args.json))


if __name__ == "__main__":
    sys.exit(main())
