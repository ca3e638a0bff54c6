"""`fic demo`: the whole method on one task, start to finish, with the numbers that show it.

    fic demo                                         # the bundled SmolLM2-135M-Instruct, on CPU
    fic demo --from vasd                             # re-run from a stage (and everything after it)
    fic demo --recipes recipes/<backbone>            # any backbone with a demo.yaml

Stages (each writes its outputs under `out/` and a marker `out/stages/<stage>.json` with its
time and figures; a second run skips finished stages):

1. `data`: the task's train, dev, test and test-unseen splits (disjoint by construction;
   `actions-gen` for the bundled model), the single-turn warm-up corpus and the deferral SFT
   corpus, both from the train split only;
2. `warmup`: a short single-turn SFT on the task: the base model has never seen its format, so
   the starting point is "base model + single-turn warm-up", and every output says so;
3. `eval-start`: the starting point in the full, concat and sharded views (test; test-unseen in
   full and sharded, as every later stage);
4. `sft`: FiC stage 1, the SFT warm start (`fic/train_sft.py`), then `eval-sft`;
5. `vasd`: FiC stage 2 from the SFT model (`fic/train_vasd.py`), then `eval-vasd`;
6. `report`: one table and `report.md` with plots (`fic.demo.report`).

Every setting lives in the recipes folder's `demo.yaml`: one section per stage, each a full
config of that stage's own class (`fic sft-data`, `fic train sft`, `fic train vasd`, `fic eval`),
so every key is checked. `{out}` and `{base_model}` in any text setting are filled in; the data,
model and output paths of each stage are wired by the demo (the YAML shows them).
"""

from __future__ import annotations

import argparse
import dataclasses
import gc
import resource
import shutil
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from fic import tasks, train_sft, train_vasd
from fic.core.config import load_config, print_keys, setting
from fic.core.errors import FicError
from fic.core.files import check_writable, folder_lock, read_json, write_json, write_jsonl
from fic.core.model import BUNDLED_MODEL_DIR, prepare_model
from fic.corpus.build import SFTDataConfig, build_corpus
from fic.data.sources import load_source
from fic.data.splits import prompt_key
from fic.demo.report import write_demo_report
from fic.evaluation.evaluate import EvalConfig, evaluate
from fic.train_sft import SFTConfig
from fic.training.checkpoints import complete_checkpoints
from fic.training.vasd.config import VASDConfig

STAGES = ("data", "warmup", "eval-start", "sft", "eval-sft", "vasd", "eval-vasd", "report")
SPLITS = ("train", "dev", "test", "test-unseen")
EVAL_SETS = ("test", "test-unseen")


@dataclass
class DemoDataSection:
    source: str = setting("actions-gen", "A generated source with train, dev, test and test-unseen splits "
                          "(`SOURCE:SPLIT`), e.g. actions-gen.")
    task: str = setting("actions", "Task of the source.")
    seed: int = setting(0, "Seed of every split.")
    train: int = setting(600, "Train instances: the warm-up corpus, the SFT corpus and VASD's rollouts.", min=1)
    dev: int = setting(32, "Dev instances (VASD's in-training evaluation, when vasd.eval.every is set).", min=1)
    test: int = setting(128, "Test instances: every stage is evaluated on them.", min=1)
    test_unseen: int = setting(64, "Instances of functions never seen in training, reported separately.", min=1)


@dataclass
class DemoConfig:
    """Settings of `fic demo` (`recipes/<backbone>/demo.yaml`)."""

    base_model: str = setting("models/smollm2-135m-instruct", "The model the demo starts from (the bundled one is "
                              "prepared on first use).")
    label: str = setting("SmolLM2-135M-Instruct + single-turn warm-up", "How the starting point is named in every "
                         "output.")
    out: str = setting("runs/demo", "Output folder of every stage.")
    data: DemoDataSection = setting(DemoDataSection(), "The task's splits.")
    warmup_data: SFTDataConfig = setting(SFTDataConfig(), "The single-turn warm-up corpus (fic sft-data).")
    warmup: SFTConfig = setting(SFTConfig(), "The single-turn warm-up (fic train sft).")
    sft_data: SFTDataConfig = setting(SFTDataConfig(), "The deferral SFT corpus (fic sft-data).")
    sft: SFTConfig = setting(SFTConfig(), "FiC stage 1 (fic train sft).")
    vasd: VASDConfig = setting(VASDConfig(), "FiC stage 2 (fic train vasd).")
    eval: EvalConfig = setting(EvalConfig(), "Evaluation of every stage (fic eval); views, model, data, out and "
                               "baseline are set per run by the demo.")
    bootstrap: int = setting(2000, "Paired bootstrap resamples for the 95% intervals of R and retention.", min=100)


def expand(config: Any, values: dict[str, str]) -> None:
    """Fill `{name}` placeholders in every text setting of a (nested) config, in place."""
    for f in dataclasses.fields(config):
        value = getattr(config, f.name)
        if dataclasses.is_dataclass(value):
            expand(value, values)
        elif isinstance(value, str) and "{" in value:
            setattr(config, f.name, value.format(**values))
        elif isinstance(value, list) and any(isinstance(v, str) and "{" in v for v in value):
            setattr(config, f.name, [v.format(**values) if isinstance(v, str) else v for v in value])


def load_demo(recipes: str, overrides: list[str]) -> DemoConfig:
    path = Path(recipes) / "demo.yaml"
    if not path.is_file():
        raise FicError(f"no demo.yaml in {recipes} (the recipes folder of a backbone)", path=str(path),
                       field="--recipes")
    cfg = load_config(DemoConfig, path, overrides)
    expand(cfg, {"out": cfg.out, "base_model": cfg.base_model})
    return cfg


# --------------------------------------------------------------------------- where things go

def paths(cfg: DemoConfig) -> dict[str, Path]:
    out = Path(cfg.out)
    return {"data": out / "data", "stages": out / "stages", "warmup": out / "warmup", "sft": out / "sft",
            "vasd": out / "vasd", "report": out / "report.md"}


def split_file(cfg: DemoConfig, split: str) -> Path:
    return paths(cfg)["data"] / f"{split}.jsonl"


def eval_dir(cfg: DemoConfig, stage: str, split: str) -> Path:
    return Path(cfg.out) / f"eval-{stage}" / split


def model_of(cfg: DemoConfig, stage: str) -> Path:
    """The whole model a stage leaves: for a LoRA stage `final` is only the adapter."""
    return paths(cfg)[stage] / ("final-merged" if getattr(cfg, stage).lora.enabled else "final")


# --------------------------------------------------------------------------- stages

def stage_data(cfg: DemoConfig, progress: bool) -> dict:
    """The splits (and their overlap, which must be 0), the warm-up corpus and the SFT corpus."""

    if Path(cfg.base_model) == BUNDLED_MODEL_DIR and not (BUNDLED_MODEL_DIR / "config.json").is_file():
        prepare_model(BUNDLED_MODEL_DIR)
    sizes = {"train": cfg.data.train, "dev": cfg.data.dev, "test": cfg.data.test, "test-unseen": cfg.data.test_unseen}
    splits = {split: load_source(f"{cfg.data.source}:{split}", cfg.data.task, limit=n, seed=cfg.data.seed)
              for split, n in sizes.items()}
    for split, instances in splits.items():
        write_jsonl(split_file(cfg, split), (i.to_dict() for i in instances))
    overlap = split_overlap(splits)
    if any(overlap.values()):
        raise FicError(f"the generated splits overlap ({overlap}); the evaluation would not be held out",
                       field="data.source")
    held_out = [f"jsonl:{split_file(cfg, s)}" for s in ("dev", *EVAL_SETS)]
    cards = {}
    for name, corpus in (("warmup", cfg.warmup_data), ("sft", cfg.sft_data)):
        corpus.data.source, corpus.data.task = [f"jsonl:{split_file(cfg, 'train')}"], cfg.data.task
        corpus.out, corpus.exclude.sources = str(paths(cfg)["data"] / f"{name}.sft.jsonl"), held_out
        cards[name] = build_corpus(corpus, progress=progress)
    card = {"source": cfg.data.source, "task": cfg.data.task, "seed": cfg.data.seed,
            "instances": {split: len(instances) for split, instances in splits.items()},
            "overlap_between_splits": overlap,
            "corpora": {name: {"file": c["file"], "conversations": c["conversations"],
                               "evaluation_overlap_dropped": c["evaluation_excluded"]["dropped"]}
                        for name, c in cards.items()}}
    write_json(paths(cfg)["data"] / "card.json", card)
    return card


def split_overlap(splits: dict[str, list]) -> dict[str, int]:
    """Shared task ids, full prompts or reference answers between every pair of splits."""

    def keys(instances: list) -> set:
        found = set()
        for i in instances:
            task = tasks.get(i.task)
            found |= {("id", i.task_id), ("prompt", prompt_key(i)), ("answer", task.reference_answer(i))}
        return found

    names = list(splits)
    return {f"{a}/{b}": len(keys(splits[a]) & keys(splits[b])) for k, a in enumerate(names) for b in names[k + 1:]}


def _train(stage: str, cfg: Any, run: Callable[[Any], dict]) -> dict:
    """Run a training recipe into its folder: resume a killed run, start over from nothing."""

    out = Path(cfg.out)
    cfg.save_merged = cfg.save_merged or cfg.lora.enabled  # the next stage and the evaluation load a whole model
    cfg.resume = bool(complete_checkpoints(out)) and not (out / "final").exists()
    if not cfg.resume and out.exists():
        shutil.rmtree(out)  # a run killed before its first checkpoint: nothing to keep
    result = run(cfg)
    shutil.rmtree(out / "checkpoints", ignore_errors=True)  # the demo keeps only the final model
    _free_memory()
    return {"steps": result["steps"], "final_loss": result["final_loss"], "model": str(result["model_dir"])}


def _free_memory() -> None:
    """Stages run one after another in this process: give a stage's GPU memory back before the next."""

    import torch

    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()


def stage_warmup(cfg: DemoConfig, progress: bool) -> dict:

    cfg.warmup.model.path, cfg.warmup.data.path = cfg.base_model, str(paths(cfg)["data"] / "warmup.sft.jsonl")
    cfg.warmup.out, cfg.warmup.logging.progress = str(paths(cfg)["warmup"]), progress
    return _train("warmup", cfg.warmup, train_sft.train)


def stage_sft(cfg: DemoConfig, progress: bool) -> dict:

    cfg.sft.model.path, cfg.sft.data.path = str(model_of(cfg, "warmup")), str(paths(cfg)["data"] / "sft.sft.jsonl")
    cfg.sft.out, cfg.sft.logging.progress = str(paths(cfg)["sft"]), progress
    return _train("sft", cfg.sft, train_sft.train)


def stage_vasd(cfg: DemoConfig, progress: bool) -> dict:

    v = cfg.vasd
    v.model.path, v.out, v.logging.progress = str(model_of(cfg, "sft")), str(paths(cfg)["vasd"]), progress
    v.data.source, v.data.task = [f"jsonl:{split_file(cfg, 'train')}"], cfg.data.task
    v.regularizer.anchor_path = str(paths(cfg)["data"] / "sft.sft.jsonl")
    v.exclude.sources = [f"jsonl:{split_file(cfg, s)}" for s in ("dev", *EVAL_SETS)]
    if v.eval.every:
        v.eval.data.source, v.eval.data.task = [f"jsonl:{split_file(cfg, 'dev')}"], cfg.data.task
    return _train("vasd", v, train_vasd.train)


def evaluate_stage(cfg: DemoConfig, stage: str, model: Path, progress: bool) -> dict:
    """Evaluate one model on the test and test-unseen splits; R against the starting point."""

    figures = {}
    for split in EVAL_SETS:
        run = dataclasses.replace(cfg.eval, model=dataclasses.replace(cfg.eval.model, model=str(model)),
                                  data=dataclasses.replace(cfg.eval.data, source=[f"jsonl:{split_file(cfg, split)}"],
                                                           task=cfg.data.task, limit=None),
                                  views=["full", "concat", "sharded"] if (stage, split) == ("start", "test")
                                  else ["full", "sharded"],
                                  out=str(eval_dir(cfg, stage, split)),
                                  baseline="" if stage == "start" else str(eval_dir(cfg, "start", split)))
        metrics = evaluate(run, progress=progress)
        _free_memory()
        figures[split] = {view: metrics["views"][view]["P"] for view in run.views}
    return figures


STAGE_RUNNERS: dict[str, Callable[[DemoConfig, bool], dict]] = {
    "data": stage_data,
    "warmup": stage_warmup,
    "eval-start": lambda cfg, progress: evaluate_stage(cfg, "start", model_of(cfg, "warmup"), progress),
    "sft": stage_sft,
    "eval-sft": lambda cfg, progress: evaluate_stage(cfg, "sft", model_of(cfg, "sft"), progress),
    "vasd": stage_vasd,
    "eval-vasd": lambda cfg, progress: evaluate_stage(cfg, "vasd", model_of(cfg, "vasd"), progress),
}


def stage_outputs(cfg: DemoConfig, stage: str) -> list[Path]:
    if stage == "data":
        return [paths(cfg)["data"]]
    if stage.startswith("eval-"):
        return [Path(cfg.out) / stage]
    return [paths(cfg)[stage]] if stage in ("warmup", "sft", "vasd") else []


def run_demo(cfg: DemoConfig, *, start_from: str | None = None, progress: bool = True,
             say: Callable[[str], None] = print) -> dict:
    """Run every stage not yet done (from `start_from` on: again); return the report's figures."""

    check_writable(cfg.out, folder=True, field="out")
    with folder_lock(cfg.out):  # a second demo into the same folder fails at once
        return _run_demo(cfg, start_from, progress, say)


def _run_demo(cfg: DemoConfig, start_from: str | None, progress: bool, say: Callable[[str], None]) -> dict:
    markers = paths(cfg)["stages"]
    if start_from is not None:
        if start_from not in STAGES:
            raise FicError(f"unknown stage {start_from!r}; expected one of {', '.join(STAGES)}", field="--from")
        for stage in STAGES[STAGES.index(start_from):]:  # outputs too: an evaluation would resume, not redo
            (markers / f"{stage}.json").unlink(missing_ok=True)
            for output in stage_outputs(cfg, stage):
                shutil.rmtree(output, ignore_errors=True)
    for stage in STAGES[:-1]:
        marker = markers / f"{stage}.json"
        if marker.is_file():
            say(f"[{stage}] done before ({marker}); skipped")
            continue
        say(f"[{stage}] running")
        began = time.perf_counter()
        info = STAGE_RUNNERS[stage](cfg, progress)
        seconds = time.perf_counter() - began
        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
        write_json(marker, {"stage": stage, "seconds": round(seconds, 1), "peak_rss_mb_so_far": round(peak),
                            "figures": info})
        say(f"[{stage}] finished in {seconds / 60:.1f} min")
    runs = {split: {stage: eval_dir(cfg, stage, split) for stage in ("start", "sft", "vasd")} for split in EVAL_SETS}
    report = write_demo_report(cfg, runs, stage_summaries(cfg), paths(cfg)["report"])
    write_json(markers / "report.json", {"stage": "report", "figures": report["summary"]})
    return report


# --------------------------------------------------------------------------- CLI

def add_arguments(parser: argparse.ArgumentParser, verb: str) -> None:
    parser.add_argument("--recipes", default="recipes/smollm2-135m-instruct",
                        help="recipes folder holding demo.yaml (default: the bundled model's)")
    parser.add_argument("--from", dest="start_from", default=None, metavar="STAGE",
                        help=f"run again from this stage on: {', '.join(STAGES)}")
    parser.add_argument("overrides", nargs="*", metavar="key=value", help="override demo.yaml, e.g. out=runs/d2 "
                        "data.test=64 vasd.train.max_steps=4")
    parser.add_argument("--keys", action="store_true", help="list every key of demo.yaml with its help and exit")
    parser.add_argument("--quiet", action="store_true", help="no progress bars or lines")


def run(args: argparse.Namespace) -> int:
    if print_keys(args, DemoConfig):
        return 0
    cfg = load_demo(args.recipes, args.overrides)
    report = run_demo(cfg, start_from=args.start_from, progress=not args.quiet)
    print(report["table"])
    print(f"report: {paths(cfg)['report']}")
    return 0


def stage_summaries(cfg: DemoConfig) -> dict[str, dict]:
    """What each finished stage recorded (time, memory, figures)."""
    found = {}
    for stage in STAGES:
        marker = paths(cfg)["stages"] / f"{stage}.json"
        if marker.is_file():
            found[stage] = read_json(marker)
    return found
