"""`fic bench zero --processes N`: SFT on N gloo processes on this CPU under each multi-process path
(DDP, DeepSpeed ZeRO-2 and ZeRO-3, FSDP2), against one process, with a checkpoint and a resume.

It builds a tiny random-weight Llama (`--layers` of hidden size 32) with SmolLM2's tokenizer and an SFT
corpus from `actions-gen`, then runs `fic/train_sft.py` for `--steps` steps (4), float32 throughout,
with the dev curve scored at every step on `--dev-instances` (5) dev instances (so that ranks hold
uneven shares of them):

1. one plain process at micro-batch N x m (`--micro-batch` m, 1): the reference;
2. for each path, `accelerate launch --num_processes N` with its launch file at micro-batch m, a
   checkpoint every `--steps`/2 steps, after `fic launch-check` has passed the launch;
3. a copy of that run's folder without the checkpoints after the middle one and without its final
   model (what a job killed after the middle checkpoint leaves), resumed with `resume=true`.

N processes at micro-batch m read the records one process reads at N x m (`fic.training.data.DataOrder`)
and the loss is normalised by the target tokens of all ranks, so a path passes when its losses and
dev figures equal the reference's and its final weights (the Hugging Face folder `final/`) differ
from the reference's by at most `--tolerance` (relative for losses, absolute for weights: float32
sums in another order), when every dev step logged all dev conversations (the ranks' shares
gathered), and when the resumed run's losses and final weights equal the uninterrupted run's.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import shlex
import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path

from fic.core.errors import FicError
from fic.core.files import check_writable

REPO = Path(__file__).resolve().parents[2]
RECIPE = "recipes/smollm2-135m-instruct/sft.yaml"
SCRIPT = "fic/train_sft.py"
PATHS = {"ddp": "launch/accelerate_multi_gpu.yaml", "zero2": "launch/deepspeed_zero2.yaml",
         "zero3": "launch/deepspeed_zero3.yaml", "fsdp2": "launch/fsdp2.yaml"}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The options of the multi-process mode (`fic bench zero --processes N ...`)."""
    parser.add_argument("--processes", type=int, default=1, help="N > 1: SFT on N gloo processes on this CPU under "
                        "DDP, ZeRO-2, ZeRO-3 and FSDP2, against one process at N x the micro-batch (--paths)")
    parser.add_argument("--paths", default=",".join(PATHS), help=f"with --processes: which of {', '.join(PATHS)}")
    parser.add_argument("--micro-batch", type=int, default=1, help="with --processes: each process's micro-batch (1)")
    parser.add_argument("--dev-instances", type=int, default=5, help="with --processes: dev instances scored every "
                        "step (5)")
    parser.add_argument("--dev-batch", type=int, default=16, help="with --processes: dev.batch_size, conversations "
                        "per generation call (16; smaller than a rank's share: ranks make uneven calls)")
    parser.add_argument("--collective-timeout", type=float, default=120, help="with --processes: the runs' "
                        "train.collective_timeout_s, the watchdog's bound on one collective (120)")


def _paths(args: argparse.Namespace) -> list[str]:
    paths = [p.strip() for p in args.paths.split(",") if p.strip()]
    if not paths or any(p not in PATHS for p in paths):
        raise FicError(f"expected some of {', '.join(PATHS)}, got {args.paths!r}", field="--paths")
    return paths


def make_plan(args: argparse.Namespace) -> dict:
    if args.processes < 2:
        raise FicError(f"expected at least 2 processes, got {args.processes}", field="--processes")
    if args.steps < 2 or args.steps % 2:
        raise FicError(f"expected an even number of steps, at least 2, got {args.steps}", field="--steps")
    work = Path(args.work or f"runs/processes{args.processes}")
    model, corpus = work / "model", work / "corpus.jsonl"
    n, m, half = args.processes, args.micro_batch, args.steps // 2
    python = sys.executable
    common = [f"model.path={model}", "model.dtype=float32", "train.mixed_precision=no", f"data.path={corpus}",
              f"train.max_steps={args.steps}", "optim.warmup_steps=0", "optim.lr=1e-3", f"checkpoint.every={half}",
              "checkpoint.keep_last=2", "train.grad_accum_steps=1", "logging.wandb=false", "logging.progress=false",
              "dev.every=1", "dev.data.source=[actions-gen:dev]", "dev.data.task=actions",
              f"dev.data.limit={args.dev_instances}", "dev.max_new_tokens=4", f"dev.batch_size={args.dev_batch}",
              "dev.patience=100",
              f"train.collective_timeout_s={args.collective_timeout}", *args.override]
    reference = work / "one-process"
    plan: dict = {"processes": n, "micro_batch": m, "half": half, "work": str(work), "model": str(model),
                  "corpus": str(corpus), "reference": str(reference), "paths": {},
                  "setup_commands": [[python, "-m", "fic", "sft-data", "data.source=[actions-gen:train]",
                                      "data.task=actions", "data.limit=64", "data.seed=0", "seed=0",
                                      f"out={corpus}"],
                                     [python, "-m", "fic.bench.processes", str(model),
                                      str(args.tokenizer or "<tokenizer>") if args.dry_run else
                                      str(tokenizer_folder(args.tokenizer)), str(args.layers)]],
                  "reference_command": [python, SCRIPT, "--config", RECIPE, *common,
                                        f"train.micro_batch_size={n * m}", f"out={reference}"]}
    for path in _paths(args):
        launch, run, resumed = PATHS[path], work / path, work / f"{path}-resumed"
        prefix = [python, "-m", "accelerate.commands.launch", "--config_file", launch, "--num_processes", str(n),
                  "--mixed_precision", "no", "--main_process_port", str(_free_port(args.dry_run)), SCRIPT]
        overrides = [*common, f"train.micro_batch_size={m}"]
        plan["paths"][path] = {
            "launch_file": launch, "run": str(run), "resumed": str(resumed), "log": str(work / f"{path}.log"),
            "check_command": [python, "-m", "fic", "launch-check", "--config_file", launch, "--recipe", RECIPE,
                              "--script", SCRIPT, "--num_processes", str(n), *overrides],
            "command": [*prefix, "--config", RECIPE, *overrides, f"out={run}"],
            "resume_command": [*prefix, "--config", RECIPE, *overrides, f"out={resumed}", "resume=true"]}
    return plan


def measure(args: argparse.Namespace) -> dict:
    if not args.dry_run:
        check_writable(args.work or f"runs/processes{args.processes}", folder=True, field="--work")
    plan = make_plan(args)
    if args.dry_run:
        commands = [*plan["setup_commands"], plan["reference_command"]]
        for info in plan["paths"].values():
            commands += [info["check_command"], info["command"],
                         ["#", "copy", info["run"], "->", info["resumed"],
                          f"without checkpoints after step {plan['half']} and final/"], info["resume_command"]]
        for command in commands:
            print(shlex.join(command), file=sys.stderr)
        return {"processes": args.processes, "dry_run": True, "plan": plan, "ratio": None}
    work = Path(plan["work"])
    for name in ("model", "one-process", *plan["paths"], *(f"{p}-resumed" for p in plan["paths"])):
        shutil.rmtree(work / name, ignore_errors=True)
    deadline = time.monotonic() + args.budget_s if args.budget_s else None
    figures: dict = {"processes": args.processes, "micro_batch": args.micro_batch, "steps": args.steps,
                     "dev_instances": args.dev_instances, "tolerance": args.tolerance, "random_weights": True,
                     "model": f"a Llama of {args.layers} layers, hidden 32, SmolLM2's tokenizer, random weights", "paths": {}}
    setup_log = work / "setup.log"
    for command in plan["setup_commands"]:
        rc, _, why = _run(command, setup_log, args.timeout, deadline)
        if rc != 0:
            return {**figures, "ok": False, "error": f"setup: {why} (log {setup_log})", "ratio": None}
    rc, seconds, why = _run(plan["reference_command"], work / "one-process.log", args.timeout, deadline)
    figures["reference"] = {"seconds": round(seconds, 1), "log": str(work / "one-process.log")}
    if rc != 0:
        return {**figures, "ok": False, "error": f"one process: {why}", "ratio": None}
    reference = read_run(Path(plan["reference"]))
    figures["reference"]["losses"] = reference["losses"]
    for path, info in plan["paths"].items():
        figures["paths"][path] = run_path(info, plan["half"], reference, args, deadline)
    results = figures["paths"].values()
    figures["ok"] = all(r.get("ok") for r in results)
    diffs = [r["max_rel_loss_diff"] for r in results if r.get("max_rel_loss_diff") is not None]
    figures["ratio"] = max(diffs) if diffs else None
    shutil.rmtree(work / "model", ignore_errors=True)
    return figures


def run_path(info: dict, half: int, reference: dict, args: argparse.Namespace, deadline: float | None) -> dict:
    log, run, resumed = Path(info["log"]), Path(info["run"]), Path(info["resumed"])
    out: dict = {"ok": False, "launch_file": info["launch_file"], "log": str(log),
                 "command": shlex.join(info["command"])}
    log.unlink(missing_ok=True)
    rc, _, why = _run(info["check_command"], log, args.timeout, deadline)
    if rc != 0:
        return {**out, "error": f"launch check: {why}"}
    rc, seconds, why = _run(info["command"], log, args.timeout, deadline)
    out["seconds"] = round(seconds, 1)
    if rc != 0:
        return {**out, "error": f"run: {why}"}
    got = read_run(run)
    killed_after(run, resumed, half)
    rc, seconds, why = _run(info["resume_command"], log, args.timeout, deadline)
    out["resume_seconds"] = round(seconds, 1)
    if rc != 0:
        return {**out, "losses": got["losses"], "error": f"resume: {why}"}
    again = read_run(resumed)
    out.update(compare(reference, got, again, half, args.dev_instances))
    tol = args.tolerance
    problems = [why for bad, why in (
        (len(got["losses"]) != len(reference["losses"]), f"{len(got['losses'])} steps logged, one process "
                                                         f"{len(reference['losses'])}"),
        (not out["finite"], "a loss that is not finite"),
        (out["max_rel_loss_diff"] > tol, f"losses differ from one process's by {out['max_rel_loss_diff']:.3g}"),
        (out["max_weight_diff"] > tol, f"final weights differ from one process's by {out['max_weight_diff']:.3g}"),
        (out["max_dev_diff"] > tol, f"dev figures differ from one process's by {out['max_dev_diff']:.3g}"),
        (not out["dev_all_logged"], "a dev step logged fewer conversations than there are dev instances"),
        (out["resume_max_rel_loss_diff"] > tol, f"losses after the resume differ by {out['resume_max_rel_loss_diff']:.3g}"),
        (out["resume_max_weight_diff"] > tol, f"the resumed final weights differ by {out['resume_max_weight_diff']:.3g}"),
    ) if bad]
    out["ok"] = not problems
    if problems:
        out["error"] = f"{'; '.join(problems)} (--tolerance {tol})"
    return out


def killed_after(run: Path, copy: Path, step: int) -> None:
    """Copy `run` to `copy` as a job killed just after its checkpoint at `step` left it: no later
    checkpoint, no final model, no dev folder of a later step (`fic bench zero` resumes from it)."""
    shutil.copytree(run, copy, symlinks=True)
    for kind in ("checkpoints", "dev"):
        for folder in (copy / kind).glob("step-*") if (copy / kind).is_dir() else []:
            if int(folder.name.split("-")[1]) > step:
                shutil.rmtree(folder)
    for name in ("final", "final-merged"):
        shutil.rmtree(copy / name, ignore_errors=True)


def compare(reference: dict, got: dict, again: dict, half: int, dev_instances: int) -> dict:
    """The differences a path is judged by: with one process, and between resumed and uninterrupted."""
    def rel(a: list[float], b: list[float]) -> float:
        return max((abs(x - y) / max(1.0, abs(x)) for x, y in zip(a, b)), default=math.inf)

    dev = [abs(reference["dev"][s][k] - got["dev"][s][k]) for s in reference["dev"] for k in reference["dev"][s]
           if s in got["dev"] and k in got["dev"][s]]
    return {"losses": got["losses"], "resumed_losses": again["losses"][half:],
            "finite": all(math.isfinite(x) for x in got["losses"] + again["losses"]),
            "max_rel_loss_diff": rel(reference["losses"], got["losses"]),
            "max_weight_diff": weight_diff(reference["final"], got["final"]),
            "max_dev_diff": max(dev) if dev and len(got["dev"]) == len(reference["dev"]) else math.inf,
            "dev_steps": sorted(got["dev"]), "dev_all_logged": all(n == dev_instances for n in got["dev_logged"]),
            "resume_max_rel_loss_diff": rel(got["losses"][half:], again["losses"][half:]),
            "resume_identical": got["losses"][half:] == again["losses"][half:],
            "resume_max_weight_diff": weight_diff(got["final"], again["final"]),
            "checkpoint_files": sorted(p.name for p in (Path(got["run"]) / "checkpoints" / f"step-{half}").iterdir())}


def read_run(run: Path) -> dict:
    """A finished run's losses, dev figures by step, dev conversations logged per step, final folder."""
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines() if line.strip()]
    dev = {r["step"]: {k: v for k, v in r.items() if k.startswith("dev_")} for r in rows
           if any(k.startswith("dev_") for k in r)}
    logged = [len((folder / "conversations.jsonl").read_text().splitlines())
              for folder in sorted((run / "dev").glob("step-*"))]
    return {"run": str(run), "losses": [r["loss"] for r in rows if r.get("step", 0) >= 1 and "loss" in r],
            "dev": dev, "dev_logged": logged, "final": run / "final"}


def weight_diff(a: Path, b: Path) -> float:
    """The largest absolute difference between two Hugging Face folders' weights; inf when their
    tensors differ in name or shape. A tensor only one folder holds counts when it is a tied copy
    of another of its tensors (ZeRO-2 and FSDP2 write the LM head tied to the embeddings out twice)."""
    from safetensors.torch import load_file

    left, right = load_file(str(a / "model.safetensors")), load_file(str(b / "model.safetensors"))
    for one, other in ((left, right), (right, left)):
        for name in set(one) - set(other):
            if not any(k != name and one[k].shape == one[name].shape and bool((one[k] == one[name]).all())
                       for k in one):
                return math.inf
    shared = set(left) & set(right)
    if any(left[k].shape != right[k].shape for k in shared):
        return math.inf
    return max(float((left[k].float() - right[k].float()).abs().max()) for k in shared)


def tokenizer_folder(given: str | None) -> Path:
    folder = Path(given or REPO / "models" / "smollm2-135m-instruct")
    if not (folder / "tokenizer_config.json").is_file():
        raise FicError("expected a folder with SmolLM2's tokenizer (`fic prepare-model` makes one)", path=str(folder),
                       field="--tokenizer")
    return folder


def build_model(out: Path, tokenizer: Path, layers: int) -> None:
    """A tiny random Llama with `tokenizer`'s vocabulary and chat template, saved with its files."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    from fic.core.model import load_tokenizer
    from fic.training.checkpoints import copy_tokenizer

    tok = load_tokenizer(str(tokenizer))
    config = LlamaConfig(vocab_size=len(tok), hidden_size=32, num_hidden_layers=layers, num_attention_heads=2,
                         num_key_value_heads=1, intermediate_size=64, max_position_embeddings=2048,
                         tie_word_embeddings=True, bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id,
                         pad_token_id=tok.pad_token_id)
    with torch.random.fork_rng():
        torch.manual_seed(0)
        LlamaForCausalLM(config).save_pretrained(out)
    copy_tokenizer(str(tokenizer), out)


def _free_port(dry_run: bool) -> int:
    if dry_run:
        return 29500
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _run(command: list[str], log: Path, timeout: float, deadline: float | None) -> tuple[int, float, str]:
    """(exit status, seconds, why it failed) of `command`, its output appended to `log`; the whole
    process group is killed past `timeout` seconds (or the bench's budget)."""
    limit = timeout if deadline is None else min(timeout, deadline - time.monotonic())
    if limit <= 5:
        return 124, 0.0, "no time left in --budget-s"
    log.parent.mkdir(parents=True, exist_ok=True)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), *filter(None, [os.environ.get("PYTHONPATH")])]),
           "TOKENIZERS_PARALLELISM": "false"}
    began = time.monotonic()
    with open(log, "a", encoding="utf-8") as out:
        out.write(f"$ {shlex.join(command)}\n")
        out.flush()
        proc = subprocess.Popen(command, cwd=REPO, env=env, stdout=out, stderr=subprocess.STDOUT,
                                start_new_session=True)
        try:
            rc = proc.wait(timeout=limit)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, 9)
            proc.wait()
            return 124, time.monotonic() - began, f"timed out after {limit:.0f} s (log {log})"
    if rc == 0:
        return 0, time.monotonic() - began, ""
    lines = log.read_text(encoding="utf-8", errors="replace").splitlines()
    said = [line for line in lines if ": error: " in line] or [line for line in lines if "Error" in line] or ["?"]
    return rc, time.monotonic() - began, f"exit {rc}: {said[-1][-300:]} (log {log})"


if __name__ == "__main__":  # the bench's set-up step: python -m fic.bench.processes OUT TOKENIZER LAYERS
    build_model(Path(sys.argv[1]), Path(sys.argv[2]), int(sys.argv[3]))
