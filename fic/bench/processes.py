"""`fic bench zero --processes N`: SFT and VASD (`--methods`) on N gloo processes on this CPU under each
multi-process path (DDP, DeepSpeed ZeRO-2 and ZeRO-3, FSDP2), against one process, with a checkpoint and
a resume.

It builds a tiny random-weight Llama (`--layers` of hidden size 32) with SmolLM2's tokenizer, whose
end-of-turn token is made likely enough that sampled replies end after 1 to 16 tokens (uneven lengths),
and an SFT corpus from `actions-gen`; then, for each method, it runs `fic/train_sft.py` or
`fic/train_vasd.py` for `--steps` steps (4), float32 throughout, with the dev curve (SFT) or the held-out
evaluation (VASD: the divergence and a `fic eval` of the sharded view) scored at every step on
`--dev-instances` (5) dev instances (so that ranks hold uneven shares of them):

1. one plain process at micro-batch N x m (`--micro-batch` m, 1): the reference;
2. for each path, `accelerate launch --num_processes N` with its launch file at micro-batch m, a
   checkpoint every `--steps`/2 steps, after `fic launch-check` has passed the launch;
3. a copy of that run's folder without the checkpoints after the middle one and without its final
   model (what a job killed after the middle checkpoint leaves), resumed with `resume=true`.

VASD runs full fine-tuning with the live teacher (ZeRO-3 and FSDP refuse a second copy of the model),
an anchor share of 0.5, sampled rollouts (`--rollout-tokens` a reply) of `actions-gen` tasks, whose
shard counts differ, so ranks play different numbers of turns, prompts of other lengths (keys and
values reused) and replies that end at different lengths; replies cut by the token cap are left out
of the divergence, so a rank's micro-batch can have no usable row.

N processes at micro-batch m read the records one process reads at N x m (`fic.training.data.DataOrder`),
a rollout's samples depend on its task and step, not on the rank that plays it, and each loss is
normalised by its count over all ranks, so a path passes when its losses and dev figures equal the
reference's and its final weights (the Hugging Face folder `final/`) differ from the reference's by at
most `--tolerance` (relative for losses, absolute for weights and dev figures: float32 sums in another
order), when every dev step logged all dev conversations (the ranks' shares gathered), and when the
resumed run's losses and final weights equal the uninterrupted run's.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import shlex
import shutil
import subprocess
import sys
import time
from importlib.util import find_spec
from pathlib import Path

from fic.bench.runner import check_inputs, free_port
from fic.core.errors import FicError
from fic.core.files import check_writable
from fic.core.model import BUNDLED_MODEL_DIR

# Each path's launch file in `--launch-dir`; the recipe is `--recipes`' sft.yaml, both read where this runs.
PATHS = {"ddp": "accelerate_multi_gpu.yaml", "zero2": "deepspeed_zero2.yaml", "zero3": "deepspeed_zero3.yaml",
         "fsdp2": "fsdp2.yaml"}
METHODS = ("sft", "vasd")
# The end-of-turn token's logit over the hidden state of a prompt: at temperature 1 a reply of the tiny
# model then ends after 1 to 16 tokens (other tokens' logits are near 0 over a 49k vocabulary).
STOP_LOGIT = 10.0


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The options of the multi-process mode (`fic bench zero --processes N ...`)."""
    parser.add_argument("--processes", type=int, default=1, help="N > 1: SFT and VASD (--methods) on N gloo processes "
                        "on this CPU under DDP, ZeRO-2, ZeRO-3 and FSDP2, against one process at N x the micro-batch "
                        "(--paths)")
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


def methods_of(args: argparse.Namespace) -> list[str]:
    """The methods `--methods` names (sft, vasd or both)."""
    methods = [m.strip() for m in args.methods.split(",") if m.strip()]
    if not methods or any(m not in METHODS for m in methods):
        raise FicError(f"expected sft, vasd or sft,vasd, got {args.methods!r}", field="--methods")
    return methods


def method_overrides(method: str, args: argparse.Namespace, model: Path, corpus: Path) -> list[str]:
    """The settings every run of `method` shares (all but the micro-batch and the out folder)."""
    half = args.steps // 2
    common = [f"model.path={model}", "model.dtype=float32", "train.mixed_precision=no",
              f"train.max_steps={args.steps}", "optim.warmup_steps=0", "optim.lr=1e-3", f"checkpoint.every={half}",
              "checkpoint.keep_last=2", "logging.wandb=false", "logging.progress=false", "dev.every=1",
              "dev.data.source=[actions-gen:dev]", "dev.data.task=actions", f"dev.data.limit={args.dev_instances}",
              "dev.max_new_tokens=4", f"dev.batch_size={args.dev_batch}",
              f"train.collective_timeout_s={args.collective_timeout}"]
    if method == "sft":
        return [*common, f"data.path={corpus}", "train.grad_accum_steps=1", "dev.patience=100", *args.override]
    # data.seed 0: with 2 processes at micro-batch 1, step 1 gives one rank tasks of 3 shards, the other of 4
    return [*common, "data.source=actions-gen:train", "data.task=actions", "data.limit=16", "data.seed=0",
            "exclude.sources=[]", "teacher.mode=live", f"anchor.path={corpus}", "anchor.share=0.5", "rollout.backend=hf",
            "rollout.temperature=1.0", f"rollout.max_new_tokens={args.rollout_tokens}", "rollout.batch_size=2",
            "train.grad_accum_steps=2", "logging.samples_every=0", "dev.views=[sharded]", *args.override]


def make_plan(args: argparse.Namespace) -> dict:
    if args.processes < 2:
        raise FicError(f"expected at least 2 processes, got {args.processes}", field="--processes")
    if args.steps < 2 or args.steps % 2:
        raise FicError(f"expected an even number of steps, at least 2, got {args.steps}", field="--steps")
    methods, paths = methods_of(args), _paths(args)
    work = Path(args.work or f"runs/processes{args.processes}")
    model, corpus = work / "model", work / "corpus.jsonl"
    n, m, half = args.processes, args.micro_batch, args.steps // 2
    python = sys.executable
    plan: dict = {"processes": n, "micro_batch": m, "half": half, "work": str(work), "model": str(model),
                  "corpus": str(corpus), "methods": {},
                  "setup_commands": [[python, "-m", "fic", "sft-data", "data.source=[actions-gen:train]",
                                      "data.task=actions", "data.limit=64", "data.seed=0", "seed=0",
                                      f"out={corpus}"],
                                     [python, "-m", "fic.bench.processes", str(model),
                                      str(args.tokenizer or "<tokenizer>") if args.dry_run else
                                      str(tokenizer_folder(args.tokenizer)), str(args.layers)]]}
    for method in methods:
        recipe = str(Path(args.recipes) / f"{method}.yaml")
        script = find_spec(f"fic.train_{method}").origin  # the recipe script of the fic that runs this
        common = method_overrides(method, args, model, corpus)
        reference = work / f"{method}-one-process"
        runs: dict = {"recipe": recipe, "reference": str(reference), "log": str(work / f"{method}-one-process.log"),
                      "reference_command": [python, script, "--config", recipe, *common,
                                            f"train.micro_batch_size={n * m}", f"out={reference}"], "paths": {}}
        for path in paths:
            launch, run = str(Path(args.launch_dir) / PATHS[path]), work / f"{method}-{path}"
            prefix = [python, "-m", "accelerate.commands.launch", "--config_file", launch, "--num_processes", str(n),
                      "--mixed_precision", "no", "--main_process_port", str(free_port(args.dry_run)), script]
            overrides = [*common, f"train.micro_batch_size={m}"]
            runs["paths"][path] = {
                "launch_file": launch, "run": str(run), "resumed": f"{run}-resumed", "log": f"{run}.log",
                "check_command": [python, "-m", "fic", "launch-check", "--config_file", launch, "--recipe", recipe,
                                  "--script", script, "--num_processes", str(n), *overrides],
                "command": [*prefix, "--config", recipe, *overrides, f"out={run}"],
                "resume_command": [*prefix, "--config", recipe, *overrides, f"out={run}-resumed", "resume=true"]}
        plan["methods"][method] = runs
    return plan


def measure(args: argparse.Namespace) -> dict:
    if not args.dry_run:
        check_writable(args.work or f"runs/processes{args.processes}", folder=True, field="--work")
    plan = make_plan(args)
    if args.dry_run:
        commands = list(plan["setup_commands"])
        for runs in plan["methods"].values():
            commands.append(runs["reference_command"])
            for info in runs["paths"].values():
                commands += [info["check_command"], info["command"],
                             ["#", "copy", info["run"], "->", info["resumed"],
                              f"without checkpoints after step {plan['half']} and final/"], info["resume_command"]]
        for command in commands:
            print(shlex.join(command), file=sys.stderr)
        return {"processes": args.processes, "dry_run": True, "plan": plan, "ratio": None}
    check_inputs([*((runs["recipe"], "--recipes") for runs in plan["methods"].values()),
                  *((info["launch_file"], "--launch-dir") for runs in plan["methods"].values()
                    for info in runs["paths"].values())])
    work = Path(plan["work"])
    shutil.rmtree(work / "model", ignore_errors=True)
    for runs in plan["methods"].values():
        for folder in (runs["reference"], *(info[k] for info in runs["paths"].values() for k in ("run", "resumed"))):
            shutil.rmtree(folder, ignore_errors=True)
    deadline = time.monotonic() + args.budget_s if args.budget_s else None
    figures: dict = {"processes": args.processes, "micro_batch": args.micro_batch, "steps": args.steps,
                     "dev_instances": args.dev_instances, "tolerance": args.tolerance, "random_weights": True,
                     "model": f"a Llama of {args.layers} layers, hidden 32, SmolLM2's tokenizer, random weights",
                     "methods": {}}
    setup_log = work / "setup.log"
    for command in plan["setup_commands"]:
        rc, _, why = _run(command, setup_log, args.timeout, deadline)
        if rc != 0:
            return {**figures, "ok": False, "error": f"setup: {why} (log {setup_log})", "ratio": None}
    for method, runs in plan["methods"].items():
        figures["methods"][method] = run_method(runs, plan["half"], args, deadline)
    results = [r for done in figures["methods"].values() for r in [done, *done.get("paths", {}).values()]]
    figures["ok"] = all(done.get("ok") for done in figures["methods"].values())
    diffs = [r["max_rel_loss_diff"] for r in results if r.get("max_rel_loss_diff") is not None]
    figures["ratio"] = max(diffs) if diffs else None
    shutil.rmtree(work / "model", ignore_errors=True)
    return figures


def run_method(runs: dict, half: int, args: argparse.Namespace, deadline: float | None) -> dict:
    """One method: the one-process reference, then each path against it."""
    rc, seconds, why = _run(runs["reference_command"], Path(runs["log"]), args.timeout, deadline)
    done: dict = {"reference": {"seconds": round(seconds, 1), "log": runs["log"]}, "paths": {}}
    if rc != 0:
        return {**done, "ok": False, "error": f"one process: {why}"}
    reference = read_run(Path(runs["reference"]))
    done["reference"]["losses"] = reference["losses"]
    for path, info in runs["paths"].items():
        done["paths"][path] = run_path(info, half, reference, args, deadline)
    done["ok"] = all(r.get("ok") for r in done["paths"].values())
    return done


def summary(figures: dict) -> dict[str, tuple[str, str]]:
    """One line per method and path for a session's PASS/FAIL lines."""
    lines = {}
    for method, done in figures.get("methods", {}).items():
        if not done.get("paths"):
            lines[method] = ("FAIL", done.get("error", "failed"))
        for path, r in done.get("paths", {}).items():
            lines[f"{method}/{path}"] = (("PASS", f"losses within {r['max_rel_loss_diff']:.2g} of one process's, "
                                                  f"resumed within {r['resume_max_rel_loss_diff']:.2g}")
                                         if r.get("ok") else ("FAIL", r.get("error", "failed")))
    return lines


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
    """The largest absolute difference between two Hugging Face folders' weights (a LoRA run's: its
    adapters'); inf when their tensors differ in name or shape. A tensor only one folder holds counts
    when it is a tied copy of another of its tensors (ZeRO-2 and FSDP2 write the LM head tied to the
    embeddings out twice)."""
    from safetensors.torch import load_file

    name = "model.safetensors" if (a / "model.safetensors").is_file() else "adapter_model.safetensors"
    left, right = load_file(str(a / name)), load_file(str(b / name))
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
    folder = Path(given or BUNDLED_MODEL_DIR)
    if not (folder / "tokenizer_config.json").is_file():
        raise FicError("expected a folder with SmolLM2's tokenizer (`fic prepare-model` makes one)", path=str(folder),
                       field="--tokenizer")
    return folder


def build_model(out: Path, tokenizer: Path, layers: int) -> None:
    """A tiny random Llama with `tokenizer`'s vocabulary and chat template, saved with its files. Its
    end-of-turn token's embedding (tied to the head) points along the hidden state of a chat prompt
    with logit `STOP_LOGIT`: sampled replies end after a few tokens, at uneven lengths."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    from fic.core.chat import prompt_ids
    from fic.core.model import load_tokenizer
    from fic.training.checkpoints import copy_tokenizer

    tok = load_tokenizer(str(tokenizer))
    config = LlamaConfig(vocab_size=len(tok), hidden_size=32, num_hidden_layers=layers, num_attention_heads=2,
                         num_key_value_heads=1, intermediate_size=64, max_position_embeddings=2048,
                         tie_word_embeddings=True, bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id,
                         pad_token_id=tok.pad_token_id)
    with torch.random.fork_rng():
        torch.manual_seed(0)
        model = LlamaForCausalLM(config)
    prompt = prompt_ids(tok, [{"role": "user", "content": "Hello"}])
    with torch.no_grad():
        direction = model.model(input_ids=torch.tensor([list(prompt)])).last_hidden_state[0].mean(0)
        model.get_input_embeddings().weight[tok.eos_token_id] = direction / direction.norm() ** 2 * STOP_LOGIT
    model.save_pretrained(out)
    copy_tokenizer(str(tokenizer), out)


def _run(command: list[str], log: Path, timeout: float, deadline: float | None) -> tuple[int, float, str]:
    """(exit status, seconds, why it failed) of `command`, its output appended to `log`; the whole
    process group is killed past `timeout` seconds (or the bench's budget)."""
    limit = timeout if deadline is None else min(timeout, deadline - time.monotonic())
    if limit <= 5:
        return 124, 0.0, "no time left in --budget-s"
    log.parent.mkdir(parents=True, exist_ok=True)
    # One thread a process, as torchrun sets it: the runs share the CPU (the one-process VASD run took 58 s
    # with torch's default threads on 2 busy cores, 9 s with one).
    env = {"OMP_NUM_THREADS": "1", **os.environ, "TOKENIZERS_PARALLELISM": "false"}
    began = time.monotonic()
    with open(log, "a", encoding="utf-8") as out:
        out.write(f"$ {shlex.join(command)}\n")
        out.flush()
        proc = subprocess.Popen(command, env=env, stdout=out, stderr=subprocess.STDOUT,
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
