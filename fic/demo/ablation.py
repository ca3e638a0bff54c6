"""`fic demo --ablate`: FiC stage 2's variants side by side on the dev split, to choose the default.

From the demo's own SFT model (the stages `data`, `warmup` and `sft` run first when they have not
yet), every variant of `ablation.variants` (overrides of the `vasd` section) trains with the
same seeds and rollout tasks, then plays the dev split in the full and sharded views. The
equal-compute control continues stage 1 for the variants' mean compute (CPU seconds). Each training run and
each evaluation is a process of its own (`fic train ...`, `fic eval ...` on a resolved config
written beside its outputs), so memory goes back between them; on a second call a finished one
is skipped and a killed one resumes from its last checkpoint.

One table (`out/ablation/table.md`, `ablation.json`): P(full), P(sharded), first-answer
accuracy, premature answers, tokens per sharded conversation, wall minutes, and each variant's
exact sign test on the sharded scores against SFT alone and against the control.
"""

from __future__ import annotations

import dataclasses
import json
import resource
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Callable

import yaml

from fic.core.config import config_to_dict, with_overrides
from fic.core.errors import FicError
from fic.core.files import folder_lock, read_log, write_json, write_text
from fic.core.stats import sign_test
from fic.demo.run import DemoConfig, control_steps, cpu_seconds, model_of, paths, run_stages, split_file
from fic.training.checkpoints import complete_checkpoints, step_of

ABLATION = "ablation"


def ablation_dir(cfg: DemoConfig) -> Path:
    return Path(cfg.out) / ABLATION


def _run(command: list[str], what: str) -> None:
    if subprocess.run(command).returncode != 0:
        raise FicError(f"the ablation's {what} failed (its error is above)", field="--ablate")


def _config_file(config: object, path: Path) -> Path:
    write_text(path, yaml.safe_dump(config_to_dict(config), sort_keys=False))
    return path


def train(kind: str, config: object, folder: Path, progress: bool) -> dict:
    """Train one run (`kind` sft or vasd) in its own process; its wall and CPU seconds (from a
    marker on a second call)."""
    marker = folder / "trained.json"
    if marker.is_file():
        return json.loads(marker.read_text(encoding="utf-8"))
    done = complete_checkpoints(folder)
    resumed_at = step_of(done[-1]) if done else 0
    if not done and folder.exists():
        shutil.rmtree(folder)  # killed before its first checkpoint: nothing to keep
    folder.mkdir(parents=True, exist_ok=True)
    began, cpu = time.perf_counter(), cpu_seconds(resource.RUSAGE_CHILDREN)
    _run([sys.executable, "-m", "fic", "train", kind, "--config", str(_config_file(config, folder / f"{kind}.yaml")),
          f"logging.progress={str(progress).lower()}", f"resume={str(bool(done)).lower()}"], f"{kind} run in {folder}")
    spent = {"seconds": time.perf_counter() - began, "cpu_seconds": cpu_seconds(resource.RUSAGE_CHILDREN) - cpu}
    if resumed_at:  # only the steps after the checkpoint were timed: scale to the whole run, and say so
        steps = config.train.max_steps
        spent = {k: v * steps / (steps - resumed_at) for k, v in spent.items()} | {"resumed_at_step": resumed_at,
                                                                                   "estimated": True}
    spent = {k: round(v, 1) if isinstance(v, float) else v for k, v in spent.items()}
    write_json(marker, spent)
    return spent


def evaluate_dev(cfg: DemoConfig, model: Path, folder: Path, progress: bool) -> Path:
    """Play the dev split in the full and sharded views (its own process; it resumes)."""
    run = dataclasses.replace(cfg.eval, model=dataclasses.replace(cfg.eval.model, model=str(model)),
                              data=dataclasses.replace(cfg.eval.data, source=[f"jsonl:{split_file(cfg, 'dev')}"],
                                                       task=cfg.data.task, limit=None),
                              views=["full", "sharded"], out=str(folder), baseline="")
    if not (folder / "metrics.json").is_file():
        folder.mkdir(parents=True, exist_ok=True)
        _run([sys.executable, "-m", "fic", "eval", "--config", str(_config_file(run, folder / "eval.yaml")),
              *([] if progress else ["--quiet"])], f"evaluation in {folder}")
    return folder


def vasd_config(cfg: DemoConfig, overrides: list[str], out: Path) -> object:
    """The demo's VASD stage config with a variant's overrides, wired like the stage."""
    base = dataclasses.replace(cfg.vasd)
    base = with_overrides(base, overrides, f"ablation.variants ({' '.join(overrides) or 'no overrides'})")
    base.model.path, base.out = str(model_of(cfg, "sft")), str(out)
    base.data.source, base.data.task = [f"jsonl:{split_file(cfg, 'train')}"], cfg.data.task
    base.regularizer.anchor_path = str(paths(cfg)["data"] / "sft.sft.jsonl")
    base.exclude.sources = [f"jsonl:{split_file(cfg, s)}" for s in ("dev", "test", "test-unseen")]
    base.save_merged = base.save_merged or base.lora.enabled
    return base


def run_ablation(cfg: DemoConfig, *, progress: bool = True, say: Callable[[str], None] = print,
                 launch: tuple[str, list[str]] | None = None) -> dict:
    """Train and evaluate every variant (see the module docstring); return the table's figures."""
    with folder_lock(cfg.out):  # the demo and a second ablation into the same folder fail at once
        return _run_ablation(cfg, progress, say, launch)


def _run_ablation(cfg: DemoConfig, progress: bool, say: Callable[[str], None],
                  launch: tuple[str, list[str]] | None) -> dict:
    run_stages(cfg, ("data", "warmup", "sft"), progress=progress, say=say, launch=launch)
    root = ablation_dir(cfg)
    runs, seconds = {"sft": evaluate_dev(cfg, model_of(cfg, "sft"), root / "sft" / "dev", progress)}, {}
    for name, overrides in cfg.ablation.variants.items():
        say(f"[ablation] {name}: {' '.join(overrides) or 'the recipe as it is'}")
        folder = root / name
        config = vasd_config(cfg, list(overrides), folder / "train")
        seconds[name] = train("vasd", config, folder / "train", progress)
        final = folder / "train" / ("final-merged" if config.lora.enabled else "final")
        runs[name] = evaluate_dev(cfg, final, folder / "dev", progress)
    if cfg.ablation.control and seconds:
        mean = sum(s["cpu_seconds"] for s in seconds.values()) / len(seconds)
        control = dataclasses.replace(cfg.control)
        control.model.path, control.data.path = str(model_of(cfg, "sft")), str(paths(cfg)["data"] / "sft.sft.jsonl")
        control.out = str(root / "control" / "train")
        control.train.max_steps, control.dev.every = control_steps(cfg, mean), 0
        say(f"[ablation] control: {control.train.max_steps} more SFT steps (the variants' mean "
            f"{mean / 60:.1f} CPU minutes)")
        seconds["control"] = train("sft", control, Path(control.out), progress)
        final = Path(control.out) / ("final-merged" if control.lora.enabled else "final")
        runs["control"] = evaluate_dev(cfg, final, root / "control" / "dev", progress)
    figures = ablation_table(runs, seconds)
    write_json(root / "ablation.json", figures)
    write_text(root / "table.md", figures["table"] + "\n")
    return figures


def _sharded_scores(run: Path) -> dict[str, float]:
    return {r["task_id"]: float(r["score"]) for r in read_log(run / "conversations.jsonl") if r["view"] == "sharded"}


def ablation_table(runs: dict[str, Path], seconds: dict[str, dict]) -> dict:
    """The figures of every run and the markdown table."""
    rows = {}
    for name, run in runs.items():
        views = json.loads((run / "metrics.json").read_text(encoding="utf-8"))["views"]
        sharded = views["sharded"]
        rows[name] = {"P_full": views["full"]["P"], "P_sharded": sharded["P"],
                      "first_answer_accuracy": sharded.get("first_answer_accuracy"),
                      "premature_answer_rate": sharded["premature_answer_rate"],
                      "tokens_per_sharded_conversation": sharded["generated_tokens_per_conversation"],
                      "minutes": round(seconds[name]["seconds"] / 60, 1) if name in seconds else None,
                      "time_estimated": bool(seconds.get(name, {}).get("estimated")),
                      "cpu_minutes": round(seconds[name]["cpu_seconds"] / 60, 1) if name in seconds else None}
        for other in ("sft", "control"):
            if other in runs and other != name:
                mine, theirs = _sharded_scores(run), _sharded_scores(runs[other])
                rows[name][f"vs_{other}"] = sign_test(mine[i] - theirs[i] for i in sorted(set(mine) & set(theirs)))
    n = len(_sharded_scores(runs["sft"]))
    lines = [f"Stage 2 variants on the dev split, N = {n} instances (P in %, greedy, LiC's rules)", "",
             "| run | P(full) | P(sharded) | first-answer acc. | premature | tokens / sharded conv. | train min (wall / CPU) | "
             "vs SFT (wins-losses, p) | vs control (wins-losses, p) |", "|---|---|---|---|---|---|---|---|---|"]
    for name, row in rows.items():
        def test(other: str, row: dict = row) -> str:
            t = row.get(f"vs_{other}")
            return "-" if t is None else f"{t['better']}-{t['worse']}, p = {t['p_value']:.3g}"
        minutes = "-" if row["minutes"] is None else f"{row['minutes']} / {row['cpu_minutes']}"
        minutes += " (resumed: scaled)" if row["time_estimated"] else ""
        lines.append(f"| {name} | {row['P_full']:.1f} | {row['P_sharded']:.1f} | "
                     f"{row['first_answer_accuracy']:.1f} | {100 * row['premature_answer_rate']:.1f}% | "
                     f"{row['tokens_per_sharded_conversation']:.1f} | {minutes} | "
                     f"{test('sft')} | {test('control')} |")
    return {"rows": rows, "table": "\n".join(lines)}
