"""`fic bench zero`: SFT and VASD under DeepSpeed ZeRO-2 or ZeRO-3 on one process, a checkpoint
saved, resumed, and the losses after the resume checked against the uninterrupted run's.

For `--stage 2` or `3` it builds a small random-weight model of SmolLM2-135M-Instruct's shape
(`fic.bench.random_weights`, `--layers` 4 of its 30 by default, bf16: the weights' dtype the
DeepSpeed recipes load) with SmolLM2's tokenizer, an SFT corpus from `actions-gen`, and then, for
SFT and for VASD in turn:

1. the uninterrupted run: `accelerate launch --config_file launch/deepspeed_zero{2,3}.yaml
   --num_processes 1 fic/train_{sft,vasd}.py` (the installed recipe scripts) with the bundled
   model's recipes (`--recipes`), for `--steps` steps (4) with a checkpoint every
   `--steps`/2 (so at steps 2 and 4), after `fic launch-check` has passed the launch;
2. a copy of that run's folder without the checkpoints after the middle one and without its final
   model: what a job killed after the middle checkpoint leaves;
3. the same command with `resume=true` on the copy, which continues from the middle checkpoint.

A check passes when every loss is finite, both runs saved their final model, and each loss after
the resume equals the uninterrupted run's (within `--tolerance`, relative; `identical` says whether
they are bit for bit). VASD runs as the backbone recipes set it up under that stage: ZeRO-2 full
fine-tuning with the frozen teacher copy (Llama-3.2-3B's recipe), ZeRO-3 a LoRA adapter whose frozen
teacher is the model with its adapters switched off (ZeRO-3 refuses a second copy of the model). Its
rollouts play on the trainer's weights (`rollout.backend=hf`), `--rollout-tokens` (16) a reply: random
weights never stop early.

`--launcher plain` runs the same steps as one plain process (`python fic/train_*.py`) for machines
without DeepSpeed (the tests' CPU run). The launch files and recipes are read where this command
runs (a FiC checkout's `launch/` and `recipes/`, or `--recipes` and `--launch-dir`); the commands run
there too, with the fic this process imports.

`--processes N` (N > 1) is the multi-process mode, `fic.bench.processes`: SFT and VASD (`--methods`)
on N gloo processes on this CPU under DDP, ZeRO-2, ZeRO-3 and FSDP2, each against one process at N x
the micro-batch, with a checkpoint and a resume.
"""

from __future__ import annotations

import argparse
import json
import math
import shlex
import shutil
import sys
import time
from importlib.util import find_spec
from pathlib import Path
from typing import Any

from fic.bench import processes
from fic.bench.random_weights import parse_sets, tokenizer_dir
from fic.bench.runner import Runner, check_inputs, free_port
from fic.core.errors import FicError
from fic.core.files import check_writable


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--stage", type=int, choices=(2, 3), default=None, help="the ZeRO stage (one process)")
    parser.add_argument("--methods", default="sft,vasd", help="sft, vasd or both (default: sft,vasd)")
    parser.add_argument("--launcher", choices=("deepspeed", "plain"), default="deepspeed",
                        help="deepspeed: accelerate launch with launch/deepspeed_zero{stage}.yaml; plain: one "
                             "ordinary process (no DeepSpeed: the resume logic only)")
    parser.add_argument("--tokenizer", default=None, help="a folder with SmolLM2's tokenizer files (default: the "
                        "prepared bundled model's)")
    parser.add_argument("--recipes", default="recipes/smollm2-135m-instruct",
                        help="the recipes folder whose sft.yaml and vasd.yaml run (default: the bundled model's)")
    parser.add_argument("--launch-dir", default="launch", help="the folder of deepspeed_zero{2,3}.yaml (default: "
                        "launch)")
    parser.add_argument("--work", default=None, help="models, runs and logs (default: runs/zero{stage})")
    parser.add_argument("--layers", type=int, default=4, help="decoder layers of the SmolLM2-shaped model (4)")
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="shape overrides")
    parser.add_argument("--steps", type=int, default=4, help="optimizer steps; a checkpoint every steps/2 (4)")
    parser.add_argument("--rollout-tokens", type=int, default=16, help="rollout.max_new_tokens of VASD (16)")
    parser.add_argument("--tolerance", type=float, default=1e-3, help="relative loss difference allowed (1e-3)")
    parser.add_argument("--device", default="auto", help="where the random weights are drawn (auto)")
    parser.add_argument("--override", action="append", default=[], metavar="KEY=VALUE",
                        help="a recipe setting changed after the bench's own, e.g. model.dtype=float32 on a CPU")
    parser.add_argument("--timeout", type=float, default=600, help="seconds per command (600)")
    parser.add_argument("--budget-s", type=float, default=None, help="seconds for the whole bench")
    parser.add_argument("--dry-run", action="store_true", help="print the commands; run nothing")
    processes.add_arguments(parser)


def make_plan(args: argparse.Namespace) -> dict:
    if args.stage is None:
        raise FicError("expected --stage 2 or 3 (or --processes N for the multi-process mode)", field="--stage")
    methods = processes.methods_of(args)
    if args.steps < 2 or args.steps % 2:
        raise FicError(f"expected an even number of steps, at least 2, got {args.steps}", field="--steps")
    import torch

    device = args.device if args.device != "auto" else ("cuda" if torch.cuda.is_available() else "cpu")
    tokenizer = (args.tokenizer or "<tokenizer>") if args.dry_run else tokenizer_dir(args.tokenizer)
    work = Path(args.work or f"runs/zero{args.stage}")
    python = sys.executable
    model, corpus = work / "model", work / "corpus.jsonl"
    launch = str(Path(args.launch_dir) / f"deepspeed_zero{args.stage}.yaml")
    plan: dict = {"stage": args.stage, "launcher": args.launcher, "work": str(work), "model": str(model),
                  "corpus": str(corpus), "launch_file": launch if args.launcher == "deepspeed" else None,
                  "overrides": list(args.override), "methods": {}}
    plan["setup_commands"] = [
        [python, "-m", "fic", "sft-data", "data.source=[actions-gen:train]", "data.task=actions", "data.limit=64",
         "data.seed=0", "seed=0", f"out={corpus}"],
        [python, "-m", "fic.bench.random_weights", "--out", str(model), "--tokenizer", tokenizer, "--layers",
         str(args.layers), "--device", device,
         *[f"--set={k}={json.dumps(v)}" for k, v in parse_sets(args.set).items()]],
    ]
    half = args.steps // 2
    for method in methods:
        run, resumed = work / f"{method}-run", work / f"{method}-resumed"
        common = [f"model.path={model}", "model.dtype=bfloat16", f"train.max_steps={args.steps}",
                  "optim.warmup_steps=0", f"checkpoint.every={half}", "checkpoint.keep_last=2", "logging.wandb=false"]
        if method == "sft":
            overrides = [*common, f"data.path={corpus}", "train.micro_batch_size=4", "train.grad_accum_steps=1"]
        else:
            overrides = [*common, "data.source=actions-gen:train", "data.task=actions", "data.limit=32",
                         "exclude.sources=[]", f"anchor.path={corpus}", "rollout.backend=hf",
                         f"rollout.max_new_tokens={args.rollout_tokens}", "loss.keep_truncated=true",
                         "train.micro_batch_size=2", "train.grad_accum_steps=2", "logging.samples_every=0",
                         "dev.every=0"]
            if args.stage == 3:
                overrides += ["lora.enabled=true", "teacher.mode=frozen"]
        overrides += list(args.override)
        recipe = str(Path(args.recipes) / f"{method}.yaml")
        script = find_spec(f"fic.train_{method}").origin  # the recipe script of the fic that runs this
        if args.launcher == "deepspeed":
            prefix = [python, "-m", "accelerate.commands.launch", "--config_file", launch, "--num_processes", "1",
                      "--main_process_port", str(free_port(args.dry_run)), script]
        else:
            prefix = [python, script]
        check = None
        if args.launcher == "deepspeed":
            check = [python, "-m", "fic", "launch-check", "--config_file", launch, "--recipe", recipe, "--script",
                     script, "--num_processes", "1", *overrides]
        plan["methods"][method] = {
            "recipe": recipe, "run": str(run), "resumed": str(resumed), "half": half, "check_command": check,
            "command": [*prefix, "--config", recipe, *overrides, f"out={run}"],
            "resume_command": [*prefix, "--config", recipe, *overrides, f"out={resumed}", "resume=true"],
            "log": str(work / f"{method}.log")}
    return plan


def measure(args: argparse.Namespace) -> dict:
    if args.processes > 1:
        return processes.measure(args)
    if not args.dry_run:  # the output first, before anything is read or written
        check_writable(args.work or f"runs/zero{args.stage}", folder=True, field="--work")
    plan = make_plan(args)
    if not args.dry_run:
        needed = [(info["recipe"], "--recipes") for info in plan["methods"].values()]
        check_inputs(needed + ([(plan["launch_file"], "--launch-dir")] if plan["launch_file"] else []))
    if args.dry_run:
        commands = list(plan["setup_commands"])
        for info in plan["methods"].values():
            commands += [c for c in (info["check_command"], info["command"]) if c]
            commands.append(["#", "copy", info["run"], "->", info["resumed"],
                             f"without checkpoints after step {info['half']} and final/"])
            commands.append(info["resume_command"])
        for command in commands:
            print(shlex.join(command), file=sys.stderr)
        return {"stage": args.stage, "dry_run": True, "plan": plan, "ratio": None}
    runner = Runner(args.timeout, args.budget_s)
    work = Path(plan["work"])
    for path in (work / "model", *(Path(i[k]) for i in plan["methods"].values() for k in ("run", "resumed"))):
        shutil.rmtree(path, ignore_errors=True)
    for info in plan["methods"].values():
        Path(info["log"]).unlink(missing_ok=True)
    figures: dict = {"stage": args.stage, "launcher": args.launcher, "launch_file": plan["launch_file"],
                     "random_weights": True, "model": "SmolLM2-135M-Instruct's shape, "
                     f"{args.layers} layers, random weights", "overrides": plan["overrides"], "methods": {}}
    for command in plan["setup_commands"]:
        rc, _, why = runner.run(command, work / "setup.log")
        if rc != 0:
            figures.update(ok=False, error=f"setup: {why} (log {work / 'setup.log'})", ratio=None)
            return figures
    for method, info in plan["methods"].items():
        figures["methods"][method] = run_method(info, runner, args.tolerance)
    shutil.rmtree(work / "model", ignore_errors=True)
    results = figures["methods"].values()
    figures["ok"] = all(r.get("ok") for r in results)
    diffs = [r["max_rel_diff"] for r in results if r.get("max_rel_diff") is not None]
    figures["ratio"] = max(diffs) if diffs else None
    return figures


def _losses(run: Path) -> list[float]:
    path = run / "metrics.jsonl"
    if not path.is_file():
        return []
    rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    return [r["loss"] for r in rows if r.get("step", 0) >= 1]


def _checkpoint_files(folder: Path) -> list[str]:
    return sorted(str(p.relative_to(folder)) for p in folder.rglob("*") if p.is_file())


def run_method(info: dict, runner: Runner, tolerance: float) -> dict:
    log, run, resumed, half = Path(info["log"]), Path(info["run"]), Path(info["resumed"]), info["half"]
    out: dict = {"ok": False, "recipe": info["recipe"], "log": str(log), "command": shlex.join(info["command"])}
    if info["check_command"]:
        rc, _, why = runner.run(info["check_command"], log)
        if rc != 0:
            out["error"] = f"launch check: {why}"
            return out
    began = time.monotonic()
    rc, seconds, why = runner.run(info["command"], log)
    out["seconds"] = seconds
    out["losses"] = _losses(run)
    if rc != 0:
        out["error"] = f"run: {why}"
        return out
    middle = run / "checkpoints" / f"step-{half}"
    if not (middle / "complete").is_file():
        out["error"] = f"no complete checkpoint {middle}"
        return out
    out["checkpoint"] = {"path": str(middle), "files": _checkpoint_files(middle),
                         "deepspeed_format": any("optim_states" in f for f in _checkpoint_files(middle))}
    out["final"] = sorted(p.name for p in (run / "final").iterdir()) if (run / "final").is_dir() else []
    processes.killed_after(run, resumed, half)
    rc, seconds, why = runner.run(info["resume_command"], log)
    out["resume_seconds"] = seconds
    after = _losses(resumed)
    out["resumed_losses"] = after[half:]
    if rc != 0:
        out["error"] = f"resume: {why}"
        return out
    before = out["losses"][half:]
    if len(after) != len(out["losses"]) or not before:
        out["error"] = f"the resumed run logged {len(after)} steps, the uninterrupted {len(out['losses'])}"
        return out
    finite = all(isinstance(x, (int, float)) and math.isfinite(x) for x in out["losses"] + after)
    diffs = [abs(a - b) / max(1.0, abs(a)) for a, b in zip(before, after[half:])]
    out.update(max_rel_diff=max(diffs), identical=before == after[half:], finite=finite,
               resumed_final=(resumed / "final").is_dir(), wall_s=time.monotonic() - began)
    out["ok"] = finite and out["resumed_final"] and bool(out["final"]) and out["max_rel_diff"] <= tolerance
    if not out["ok"]:
        out["error"] = ("a loss that is not finite" if not finite else "no final model" if not out["final"] or
                        not out["resumed_final"] else f"losses after the resume differ by {out['max_rel_diff']:.3g} "
                        f"(relative) > --tolerance {tolerance}")
    return out


def summary(figures: dict) -> dict[str, Any]:
    """One line per method (per method and path with --processes) for the session's PASS/FAIL lines."""
    if figures.get("processes", 1) > 1:
        return processes.summary(figures)
    lines = {}
    for method, r in figures.get("methods", {}).items():
        if r.get("ok"):
            lines[method] = ("PASS", f"{len(r['losses'])} steps, loss {r['losses'][0]:.4f} -> {r['losses'][-1]:.4f}; "
                             f"resumed from step {len(r['losses']) // 2}: "
                             + ("identical losses" if r["identical"] else f"max relative diff {r['max_rel_diff']:.2g}"))
        else:
            lines[method] = ("FAIL", r.get("error", "failed"))
    return lines
