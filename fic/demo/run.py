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
4. `sft`: FiC stage 1, the SFT warm start (`fic/train_sft.py`); `premise`: on the dev split, how
   often the SFT model answers partial single-turn requests against the same points of sharded
   conversations (`fic.evaluation.premise`, what the per-turn teacher relies on); `eval-sft`;
5. `vasd`: FiC stage 2 from the SFT model (`fic/train_vasd.py`), then `eval-vasd`;
6. `control`: the equal-compute control, stage 1 continued from the SFT model for the wall time
   VASD took, then `eval-control`: a gain from VASD counts only against it;
7. `report`: one table and `report.md` with plots (`fic.demo.report`).

Stage 2's default was chosen on the dev split by the ablation in the repository's `experiments/`
(not installed), which runs these stages first and shares this output folder.

Every setting lives in the recipes folder's `demo.yaml`: one section per stage, each a full
config of that stage's own class (`fic sft-data`, `fic train sft`, `fic train vasd`, `fic eval`),
so every key is checked. `{out}` and `{base_model}` in any text setting are filled in; the data,
model and output paths of each stage are wired by the demo (the YAML shows them). A stage's `out`
set to anything but where the demo writes it (`warmup.out=elsewhere`) is refused when the config
loads (`--dry-run` included): `out=` moves the whole demo.

The demo deletes, and writes into, only folders it made: each stage folder holds the demo's marker
(`.fic-run`, `fic.core.files.own_folder`), and a folder of the user's in the way of a stage still to
run (a `warmup/` holding notes) stops the demo before any stage runs (`--dry-run` too) with one line
naming it; no stage folder is written through a link.
"""

from __future__ import annotations

import dataclasses
import gc
import resource
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from fic import tasks, train_sft, train_vasd
from fic.backends import make_backend
from fic.bundled.prepare import prepare_model
from fic.core.bounds import MAX_INSTANCES, MAX_MIB, MAX_RESAMPLES, MAX_STEPS
from fic.core.config import load_config, set_in, set_where, setting
from fic.core.errors import FicError, run_child
from fic.core.files import (
    check_own,
    check_writable,
    folder_lock,
    folder_token,
    guard_out,
    own_folder,
    remove_folder,
    run_token,
    write_json,
    write_jsonl,
)
from fic.core.model import BUNDLED_MODEL_DIR, check_model_folder, peak_memory_mb
from fic.core.records import read_json
from fic.corpus.build import SFTDataConfig, build_corpus
from fic.data.sources import load_source
from fic.data.splits import prompt_key
from fic.demo import costs
from fic.demo.report import write_demo_report
from fic.evaluation.evaluate import EvalConfig, evaluate
from fic.evaluation.premise import ask_or_answer
from fic.training.checkpoints import complete_checkpoints
from fic.training.sft import SFTConfig
from fic.training.vasd.config import VASDConfig

STAGES = ("data", "warmup", "eval-start", "sft", "premise", "eval-sft", "vasd", "eval-vasd", "control", "eval-control",
          "report")
TRAINED = ("warmup", "sft", "vasd", "control")
SPLITS = ("train", "dev", "test", "test-unseen")
EVAL_SETS = ("test", "test-unseen")


@dataclass
class DemoDataSection:
    source: str = setting("actions-gen", "A generated source with train, dev, test and test-unseen splits "
                          "(`SOURCE:SPLIT`), e.g. actions-gen.")
    task: str = setting("actions", "Task of the source.")
    seed: int = setting(0, "Seed of every split.")
    train: int = setting(600, "Train instances: the warm-up corpus, the SFT corpus and VASD's rollouts.", min=1,
                        max=MAX_INSTANCES)
    dev: int = setting(256, "Dev instances: settings are chosen on them (the stage 2 ablation; its paired sign "
                       "tests need a few hundred), the premise is measured on them, and stage 1's dev "
                       "curve and VASD's in-training evaluation read them (sft.dev.every, vasd.dev.every).", min=1,
                       max=MAX_INSTANCES)
    test: int = setting(128, "Test instances: every stage is evaluated on them.", min=1, max=MAX_INSTANCES)
    test_unseen: int = setting(64, "Instances of functions never seen in training, reported separately.", min=1,
                              max=MAX_INSTANCES)


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
    control: SFTConfig = setting(SFTConfig(), "The equal-compute control: stage 1 continued from the SFT model on its "
                                 "corpus for the compute VASD took (its train.max_steps is set by the demo, see "
                                 "control_steps).")
    control_steps: int = setting(0, "SFT steps of the control; 0: VASD's CPU seconds over the SFT stage's CPU "
                                 "seconds per step. That is right when both stages ran under the same load: CPU "
                                 "seconds are not load-free (an SFT step measured 30 CPU s on 2 cores shared with "
                                 "other work, 16 quiet), so after a loaded stage set it from quiet figures.", min=0,
                                 max=MAX_STEPS)
    eval: EvalConfig = setting(EvalConfig(), "Evaluation of every stage (fic eval); views, model, data, out and "
                               "baseline are set per run by the demo.")
    bootstrap: int = setting(2000, "Paired bootstrap resamples for the 95% intervals of R and retention.", min=100,
                              max=MAX_RESAMPLES)
    memory_budget_mb: float = setting(0, "Memory a stage may use, in MiB (0: what this machine has free when the "
                                      "stage starts). A stage whose estimated peak is above it is refused before it "
                                      "starts, with the settings that lower it (fic.demo.costs).", min=0,
                                      max=MAX_MIB)
    stage_processes: bool = setting(True, "Run each stage in a process of its own, so that what a stage held in "
                                    "memory is given back before the next one (the demo's peak is its largest "
                                    "stage's); false runs them all in this process.")
    smoke: bool = setting(False, "A smoke run (`fic demo --quick`): every output says its figures come from tiny "
                          "splits and a few steps, so their intervals are wide and they say nothing about the "
                          "method.")


# `fic demo --quick`: the whole pipeline in about 15 minutes on 2 quiet cores, into its own folder. Tiny
# splits and a few steps of every stage: a look at what the demo does and writes, not a measure.
QUICK = ("out=runs/demo-quick", "smoke=true", "label=SmolLM2-135M-Instruct + single-turn warm-up (smoke run)",
         "data.train=48", "data.dev=8", "data.test=16", "data.test_unseen=8", "bootstrap=200",
         "warmup.train.max_steps=4", "sft.train.max_steps=6", "vasd.train.max_steps=2",
         "vasd.train.micro_batch_size=2", "vasd.train.grad_accum_steps=1", "vasd.checkpoint.every=0",
         "vasd.logging.samples_every=0", "warmup.checkpoint.every=0", "sft.checkpoint.every=0",
         "control.checkpoint.every=0")


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


def load_demo(recipes: str, overrides: list[str], cls: type = DemoConfig) -> DemoConfig:
    """The settings of `recipes`/demo.yaml with the overrides, placeholders filled in; `cls`:
    DemoConfig or a subclass that adds sections of its own (an experiment's beside the demo's)."""
    path = Path(recipes) / "demo.yaml"
    if not path.is_file():
        raise FicError(f"no demo.yaml in {recipes} (the recipes folder of a backbone)", path=str(path),
                       field="--recipes")
    cfg = load_config(cls, path, overrides)
    expand(cfg, {"out": cfg.out, "base_model": cfg.base_model})
    check_wired_outs(cfg)
    return cfg


def wired_outs(cfg: DemoConfig) -> dict[str, Path]:
    """Each stage section's `out` key and where the demo writes that stage."""
    data = paths(cfg)["data"]
    return {**{f"{stage}.out": paths(cfg)[stage] for stage in TRAINED}, "warmup_data.out": data / "warmup.sft.jsonl",
            "sft_data.out": data / "sft.sft.jsonl", "eval.out": eval_dir(cfg, "start", "test")}


def check_wired_outs(cfg: DemoConfig) -> None:
    """Refuse a stage's `out` set to anything but where the demo writes that stage: the demo wires
    every stage's folder under `out`, and would otherwise show the setting and ignore it."""
    for key, wired in wired_outs(cfg).items():
        section = getattr(cfg, key.split(".")[0])
        where = set_in(cfg, key)
        if where is not None and Path(section.out) != wired:
            raise FicError(f"the demo writes this stage into {wired} (under out=) and cannot move one stage; set out= "
                           f"to move the whole demo, or leave {key} unset", path=where, field=key)


# --------------------------------------------------------------------------- where things go

def paths(cfg: DemoConfig) -> dict[str, Path]:
    out = Path(cfg.out)
    return {"data": out / "data", "stages": out / "stages", **{stage: out / stage for stage in TRAINED},
            "report": out / "report.md"}


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

    own_folder(paths(cfg)["data"], demo_token(cfg))
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
            task = tasks.of(i)
            found |= {("id", i.task_id), ("prompt", prompt_key(i)), ("answer", task.reference_answer(i))}
        return found

    names = list(splits)
    return {f"{a}/{b}": len(keys(splits[a]) & keys(splits[b])) for k, a in enumerate(names) for b in names[k + 1:]}


def demo_token(cfg: DemoConfig) -> str:
    """The token of the demo's folders (`fic.core.files.run_token`); from now on no folder below
    `out` is written through a link."""
    guard_out(cfg.out)
    return run_token(cfg.out)


def _train(stage: str, cfg: Any, run: Callable[[Any], dict], token: str) -> dict:
    """Run a training recipe into its folder (made by the demo, marked with its `token`): resume a
    killed run, start over from nothing; a folder the demo did not make is refused, not deleted."""

    out = Path(cfg.out)
    cfg.save_merged = cfg.save_merged or cfg.lora.enabled  # the next stage and the evaluation load a whole model
    cfg.resume = bool(complete_checkpoints(out)) and not (out / "final").exists()
    if not cfg.resume:
        remove_folder(out, token)  # a run of the demo's killed before its first checkpoint: nothing to keep
    own_folder(out, token)  # resumed: only the demo's own run
    result = run(cfg)
    remove_folder(out / "checkpoints", run_token(out))  # the demo keeps only the final model
    _free_memory()
    return {"steps": result["steps"], "final_loss": result["final_loss"], "model": str(result["model_dir"]),
            **({"plateau": result["plateau"]} if result.get("plateau") else {})}


def _free_memory() -> None:
    """Stages run one after another in this process: give a stage's GPU memory back before the next."""

    import torch

    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()


def stage_warmup(cfg: DemoConfig, progress: bool) -> dict:

    cfg.warmup.model.path, cfg.warmup.data.path = cfg.base_model, str(paths(cfg)["data"] / "warmup.sft.jsonl")
    cfg.warmup.out, cfg.warmup.logging.progress = str(paths(cfg)["warmup"]), progress
    return _train("warmup", cfg.warmup, train_sft.train, demo_token(cfg))


def stage_sft(cfg: DemoConfig, progress: bool) -> dict:

    cfg.sft.model.path, cfg.sft.data.path = str(model_of(cfg, "warmup")), str(paths(cfg)["data"] / "sft.sft.jsonl")
    cfg.sft.out, cfg.sft.logging.progress = str(paths(cfg)["sft"]), progress
    if cfg.sft.dev.every:  # stage 1 to its plateau on the dev split (never test)
        cfg.sft.dev.data.source, cfg.sft.dev.data.task = [f"jsonl:{split_file(cfg, 'dev')}"], cfg.data.task
    return _train("sft", cfg.sft, train_sft.train, demo_token(cfg))


def stage_vasd(cfg: DemoConfig, progress: bool) -> dict:

    v = cfg.vasd
    v.model.path, v.out, v.logging.progress = str(model_of(cfg, "sft")), str(paths(cfg)["vasd"]), progress
    v.data.source, v.data.task = [f"jsonl:{split_file(cfg, 'train')}"], cfg.data.task
    v.anchor.path = str(paths(cfg)["data"] / "sft.sft.jsonl")
    v.exclude.sources = [f"jsonl:{split_file(cfg, s)}" for s in ("dev", *EVAL_SETS)]
    if v.dev.every:
        v.dev.data.source, v.dev.data.task = [f"jsonl:{split_file(cfg, 'dev')}"], cfg.data.task
    return _train("vasd", v, train_vasd.train, demo_token(cfg))


def control_steps(cfg: DemoConfig, stage2_cpu_seconds: float | None = None) -> int:
    """SFT steps that take the compute VASD took (CPU seconds: on a quiet machine its wall time),
    at the SFT stage's own CPU seconds per step."""
    if cfg.control_steps:
        return cfg.control_steps
    stages = stage_summaries(cfg)
    spent = stages["vasd"]["cpu_seconds"] if stage2_cpu_seconds is None else stage2_cpu_seconds
    return equal_compute_steps(spent, stages["sft"])


def equal_compute_steps(cpu_seconds: float, sft_stage: dict) -> int:
    """SFT steps that take `cpu_seconds`, at the CPU seconds per step of an SFT stage's summary
    (stages/sft.json: a whole stage's average, steady under a shared machine's load, where a few
    timed steps are not)."""
    training = sft_stage["cpu_seconds"] - (sft_stage["figures"].get("plateau") or {}).get("cpu_seconds", 0.0)  # not its dev scores
    return max(1, round(cpu_seconds / (training / max(sft_stage["figures"]["steps"], 1))))


def stage_control(cfg: DemoConfig, progress: bool) -> dict:
    """The equal-compute control: more of stage 1 for VASD's wall time, from the SFT model, on the
    SFT corpus in a new order."""
    c = cfg.control
    c.model.path, c.data.path = str(model_of(cfg, "sft")), str(paths(cfg)["data"] / "sft.sft.jsonl")
    c.out, c.logging.progress, c.train.max_steps = str(paths(cfg)["control"]), progress, control_steps(cfg)
    c.dev.every = 0  # the control runs exactly its steps: it is also the check that stage 1 had stopped improving
    return _train("control", c, train_sft.train, demo_token(cfg))


def stage_premise(cfg: DemoConfig, progress: bool) -> dict:
    """Before VASD: how often the SFT model answers partial single-turn requests against the same
    point of a sharded conversation (dev split): the premise of the per-turn teacher."""
    instances = load_source(f"jsonl:{split_file(cfg, 'dev')}", cfg.data.task)
    backend = make_backend(dataclasses.replace(cfg.eval.model, model=str(model_of(cfg, "sft"))))
    figures = ask_or_answer(backend, instances, max_new_tokens=cfg.eval.max_new_tokens,
                            batch_size=cfg.eval.batch_size)
    write_json(Path(cfg.out) / "premise.json", figures)
    return {key: figures[key] for key in ("points", "single_turn_answer_rate", "multi_turn_answer_rate", "p_value")}


def evaluate_stage(cfg: DemoConfig, stage: str, model: Path, progress: bool) -> dict:
    """Evaluate one model on the test and test-unseen splits; R against the starting point."""

    figures, token = {}, demo_token(cfg)
    own_folder(eval_dir(cfg, stage, "test").parent, token)  # the demo's, so that --from may delete it
    for split in EVAL_SETS:
        own_folder(eval_dir(cfg, stage, split), token)
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
    "premise": stage_premise,
    "vasd": stage_vasd,
    "eval-vasd": lambda cfg, progress: evaluate_stage(cfg, "vasd", model_of(cfg, "vasd"), progress),
    "control": stage_control,
    "eval-control": lambda cfg, progress: evaluate_stage(cfg, "control", model_of(cfg, "control"), progress),
}


def stage_outputs(cfg: DemoConfig, stage: str) -> list[Path]:
    if stage == "data":
        return [paths(cfg)["data"]]
    if stage.startswith("eval-"):
        return [Path(cfg.out) / stage]
    if stage == "premise":
        return [Path(cfg.out) / "premise.json"]
    return [paths(cfg)[stage]] if stage in TRAINED else []


def cpu_seconds(who: int = resource.RUSAGE_SELF) -> float:
    usage = resource.getrusage(who)
    return usage.ru_utime + usage.ru_stime


def run_stage(cfg: DemoConfig, stage: str, progress: bool) -> None:
    """Run one stage in this process and write its marker: wall and CPU time, this process's peak
    memory, figures. CPU time is what other load on a shared machine barely moves: the control
    is sized by it."""
    began, cpu = time.perf_counter(), cpu_seconds()
    info = STAGE_RUNNERS[stage](cfg, progress)
    seconds, cpu = time.perf_counter() - began, cpu_seconds() - cpu
    peak = peak_memory_mb()
    size = info["steps"] if stage in TRAINED else costs.units(cfg, stage, None)  # what the stage's time bought
    write_json(paths(cfg)["stages"] / f"{stage}.json",
               {"stage": stage, "seconds": round(seconds, 1), "cpu_seconds": round(cpu, 1), "peak_rss_mb": round(peak),
                "units": size, "unit": costs.UNIT[costs.KIND[stage]], "figures": info})


def run_stage_process(stage: str, recipes: str, overrides: list[str], progress: bool, errors: Path) -> None:
    """Run one stage in a child process (`fic demo --stage STAGE` with the same settings); a stage
    that fails stops the demo with the child's own one-line error."""
    errors.unlink(missing_ok=True)
    command = [sys.executable, "-m", "fic", "demo", "--recipes", recipes, *overrides, "--stage", stage,
               *([] if progress else ["--quiet"])]
    code = run_child(command)  # a SIGTERM reaches the stage, which ends itself with its cleanups
    if code != 0:
        message = errors.read_text(encoding="utf-8").strip() if errors.is_file() else \
            f"the stage's process ended with exit code {code}"
        raise FicError(f"stage {stage} failed: {message}", field="--from")


def check_start(cfg: DemoConfig, start_from: str | None) -> None:
    """What the demo checks before any stage starts, in a real run and in --dry-run alike: `--from`
    names a stage, the task's scoring extras are installed, the base model folder is there (the
    bundled one is prepared by the data stage), and the output folder can be written."""
    if start_from is not None and start_from not in STAGES:
        raise FicError(f"unknown stage {start_from!r}; expected one of {', '.join(STAGES)}", field="--from")
    tasks.check_scoring([cfg.data.task], field="data.task")
    if Path(cfg.base_model) != BUNDLED_MODEL_DIR:
        check_model_folder(cfg.base_model, field="base_model")
    check_writable(cfg.out, folder=True, field="out")
    # A folder in a stage's place that the demo did not make stops it now, not after the stages before it.
    guard_out(cfg.out)
    for stage in stages_left(cfg, start_from):
        if stage != "premise":  # its output is a file
            for folder in stage_outputs(cfg, stage):
                check_own(folder, folder_token(cfg.out))


def stages_left(cfg: DemoConfig, start_from: str | None) -> list[str]:
    """The stages a run will do: those not done yet, and those `--from` runs again."""
    return [stage for stage in STAGES[:-1]
            if stage in redone(start_from) or not (paths(cfg)["stages"] / f"{stage}.json").is_file()]


def redone(start_from: str | None) -> tuple[str, ...]:
    """The stages `--from` runs again: it and every stage after it."""
    return STAGES[STAGES.index(start_from):] if start_from is not None else ()


def start_line(cfg: DemoConfig, stages: tuple[str, ...] = STAGES[:-1], start_from: str | None = None) -> str:
    """The demo's start line (`_start_line`), a smoke run's said first."""
    line = _start_line(cfg, stages, redone(start_from))
    if cfg.smoke:  # --quick's settings arrive as command-line overrides
        return line.replace("fic demo: ", "fic demo: SMOKE RUN (--quick: tiny splits, a few steps; wide intervals, "
                            "no measure of the method): ", 1).replace("set on the command line",
                                                                      "set by --quick or the command line")
    return line


def _start_line(cfg: DemoConfig, stages: tuple[str, ...], redo: tuple[str, ...] = ()) -> str:
    """What the demo will do, before any stage starts: the splits it generates (their sizes and
    where they were set), the stages left and done (`redo`: done, but to run again), each training
    stage's size, where it writes."""
    done = [stage for stage in stages if (paths(cfg)["stages"] / f"{stage}.json").is_file() and stage not in redo]
    left = [stage for stage in stages if stage not in done]
    by_where: dict[str, list[str]] = {}  # the split sizes, grouped by where they were set
    for split in SPLITS:
        key = f"data.{split.replace('-', '_')}"
        where = set_in(cfg, key)
        by_where.setdefault(set_where(where) if where else "the defaults",
                            []).append(f"{split} {getattr(cfg.data, key[5:])}")
    sizes = "; ".join(f"{', '.join(splits)} {where}" for where, splits in by_where.items())
    per_step = cfg.vasd.train.micro_batch_size * cfg.vasd.train.grad_accum_steps
    control = f"{cfg.control_steps} steps" if cfg.control_steps else "VASD's CPU seconds at SFT's cost per step"
    return (f"fic demo: splits of {cfg.data.source} with data.seed {cfg.data.seed} ({sizes}); warm-up {cfg.warmup.train.max_steps} steps, FiC stage 1 "
            f"{cfg.sft.train.max_steps} steps, stage 2 {cfg.vasd.train.max_steps} steps of {per_step} rollouts, the "
            f"control ({control}), each evaluated on test and test-unseen; stages to run: {', '.join(left) or 'none'}"
            f"{' (done before: ' + ', '.join(done) + ')' if done else ''}; outputs in {cfg.out}, the report in "
            f"{paths(cfg)['report']}")


def plan(cfg: DemoConfig, start_from: str | None = None) -> str:
    """The start line and the cost estimate of what is left (`fic demo --dry-run`, `--from` honoured);
    nothing runs, and the checks of a real run's start are made (`check_start`)."""
    check_start(cfg, start_from)
    redo, left = redone(start_from), stages_left(cfg, start_from)
    done = {stage: summary for stage, summary in stage_summaries(cfg).items() if stage not in redo}
    return start_line(cfg, start_from=start_from) + ("\n[demo] " + costs.plan(cfg, left, done)[0] if left else "")


def run_stages(cfg: DemoConfig, stages: tuple[str, ...], *, progress: bool, say: Callable[[str], None],
               launch: tuple[str, list[str]] | None) -> None:
    """Run the stages not done yet, in order, each in its own process when it can. Before the first
    one, the estimated minutes and peak of all of them; before each, its own estimate, and a stage
    whose peak would not fit is refused before it starts (`fic.demo.costs`)."""
    markers = paths(cfg)["stages"]
    left = [stage for stage in stages if not (markers / f"{stage}.json").is_file()]
    say(start_line(cfg, stages))
    if left:
        line, _ = costs.plan(cfg, left, stage_summaries(cfg))
        say(f"[demo] {line}")
    for stage in stages:
        marker = markers / f"{stage}.json"
        if marker.is_file():
            say(f"[{stage}] done before ({marker}); skipped")
            continue
        done = stage_summaries(cfg)
        control = float(control_steps(cfg)) if stage == "control" else None
        cost = costs.estimate(cfg, stage, done, control)
        costs.check_fits(cfg, stage, cost)
        say(f"[{stage}] running" + ("" if cost is None else f" (about {cost['minutes']:.1f} min, peak "
                                    f"{cost['peak_mb'] / 1024:.1f} GiB: {cost['source']})"))
        began = time.perf_counter()
        if cfg.stage_processes and launch is not None:
            run_stage_process(stage, *launch, progress, markers / f"{stage}.error")
        else:
            run_stage(cfg, stage, progress)
        say(f"[{stage}] finished in {(time.perf_counter() - began) / 60:.1f} min")


def run_demo(cfg: DemoConfig, *, start_from: str | None = None, progress: bool = True,
             say: Callable[[str], None] = print, launch: tuple[str, list[str]] | None = None) -> dict:
    """Run every stage not yet done (from `start_from` on: again); return the report's figures.
    With `launch` (the recipes folder and overrides) and `stage_processes`, each stage runs in a
    process of its own."""

    check_start(cfg, start_from)
    with folder_lock(cfg.out):  # a second demo into the same folder fails at once
        return _run_demo(cfg, start_from, progress, say, launch)


def _run_demo(cfg: DemoConfig, start_from: str | None, progress: bool, say: Callable[[str], None],
              launch: tuple[str, list[str]] | None) -> dict:
    markers = paths(cfg)["stages"]
    if start_from is not None:
        token = demo_token(cfg)
        for stage in redone(start_from):  # outputs too: an evaluation would resume, not redo
            (markers / f"{stage}.json").unlink(missing_ok=True)
            for output in stage_outputs(cfg, stage):
                if output.is_dir():
                    remove_folder(output, token)
                else:
                    output.unlink(missing_ok=True)
    run_stages(cfg, STAGES[:-1], progress=progress, say=say, launch=launch)
    runs = {split: {stage: eval_dir(cfg, stage, split) for stage in ("start", "sft", "vasd", "control")}
            for split in EVAL_SETS}
    report = write_demo_report(cfg, runs, stage_summaries(cfg), paths(cfg)["report"])
    write_json(markers / "report.json", {"stage": "report", "figures": report["summary"]})
    return report


def stage_summaries(cfg: DemoConfig) -> dict[str, dict]:
    """What each finished stage recorded (time, memory, figures)."""
    found = {}
    for stage in STAGES:
        marker = paths(cfg)["stages"] / f"{stage}.json"
        if marker.is_file():
            found[stage] = read_json(marker)
    return found
