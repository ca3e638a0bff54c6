"""The stage 2 ablation: FiC stage 2's variants side by side on the dev split, to choose the default.

    python experiments/ablation.py [--recipes DIR] [--config FILE] [--dry-run] [--keys] [--quiet] [--quick]
        [key=value ...]

Not part of the installed package: an experiment built on FiC's public API, run from the
repository root beside `fic demo`, whose output folder it shares. `--recipes` names the demo's
recipes folder (its demo.yaml: the splits, the stages and their settings); `--config FILE` holds
the ablation's own settings (the keys of `AblationSection`, e.g. `variants` and `seeds`; without
it, their defaults here); `key=value` overrides either (`data.dev=256`, `ablation.seeds=[0,1]`).

From the demo's own SFT model (the stages `data`, `warmup` and `sft` run first when they have not
yet; with `sft.dev.every` it is the plateau of stage 1), or from `ablation.start` (e.g. stage 1
continued by hand to where its dev curve flattens), every variant of `ablation.variants`
(overrides of the `vasd` section) trains once per seed of `ablation.seeds` on the same rollout
tasks, then plays the dev split in the full and sharded views, its weights in
`ablation.eval_dtype` (float32: paired wins and losses that are not bf16 batch-shape noise). Per
seed, the equal-compute control continues stage 1 for the variants' mean compute (CPU seconds). Each training run and
each evaluation is a process of its own (`fic train ...`, `fic eval ...` on a resolved config
written beside its outputs), so memory goes back between them; on a second call a finished one
is skipped and a killed one resumes from its last checkpoint.

One table (`out/ablation/table.md`, `ablation.json`): P(full), P(sharded), first-answer
accuracy, premature answers, tokens per sharded conversation, wall minutes, each run's exact sign
test on the sharded scores against SFT alone and against the control of its seed, and the choice
of `ablation.rule`, a rule fixed in the config before the table is read. With `ablation.test`,
once the rule has chosen, the test table (`test.md`, `test.json`): the test split is read only then.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import resource
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import reference_costs
import yaml

from fic.core.config import DRY_RUN_HELP, config_to_dict, print_keys, resolved_yaml, setting, with_overrides
from fic.core.errors import FicError, exit_status
from fic.core.files import folder_lock, own_folder, remove_folder, run_token, write_json, write_text
from fic.core.records import read_json, read_log
from fic.core.stats import detectable_gain, sign_test, sign_test_power
from fic.demo import costs
from fic.demo.report import (
    interval_text,
    never_answered,
    percent_text,
    premature_text,
    stage_figures,
    view_scores,
)
from fic.demo.run import (
    EVAL_SETS,
    QUICK,
    DemoConfig,
    control_steps,
    cpu_seconds,
    load_demo,
    model_of,
    paths,
    run_stages,
    split_file,
    stage_summaries,
)
from fic.training.checkpoints import complete_checkpoints, step_of


@dataclass
class AblationSection:
    variants: dict[str, list[str]] = setting({
        # over demo.yaml's vasd section (final-reply VASD, full-view teacher, 1e-4 cosine, rollouts at 0.3); the
        # answer-hinted teacher named where the 2026-12-04/05 ablation ran with it, when the demo shipped it
        "vasd-hinted": ["teacher.view=gold-hinted"],
        "vasd-full-view": ["teacher.view=full", "loss.max_log_ratio=0"],  # the paper's teacher
        "vasd-hinted-decision": ["teacher.view=gold-hinted", "terms.turns.replies=all", "terms.turns.nonfinal_tokens=4",
                                 "train.max_steps=28"],
        "vasd-labels": ["teacher.view=gold-hinted", "terms.labels.weight=1.0", "terms.labels.select=unanswerable",
                        "terms.labels.max_turns=8", "train.max_steps=28"],
        "corrections": ["teacher.view=gold-hinted", "loss.weight=0", "terms.corrections.weight=1.0"],
        # the dev arm ahead of its control in every seed (45-25, 34-26, 34-27); its 16 rollouts a step in student
        # micro-batches of 2 x 8, not 4 x 4: the same update, a peak of 7,061 MiB against 9,575 over its 17 steps
        "reward": ["teacher.view=gold-hinted", "loss.weight=0", "terms.reward.weight=1.0", "terms.reward.penalize=unanswerable",
                   "terms.reward.unanswered_reward=-0.5", "terms.reference.weight=1.0", "rollout.temperature=0.7",
                   "train.micro_batch_size=2", "train.grad_accum_steps=8", "train.max_steps=17"],
    }, "Name -> overrides of the vasd section (e.g. [terms.turns.replies=all]); each variant trains from the same SFT "
       "model with the same seeds and is evaluated on the dev split. Two variants that come to the same settings are "
       "refused.")
    control: bool = setting(True, "Also continue stage 1 for the variants' mean CPU time (the equal-compute "
                            "control, one per seed) and evaluate it.")
    seeds: list[int] = setting([0, 1, 2], "Seeds: every variant and the control train once per seed (train.seed, and "
                               "the data order's seed plus it), each against the control of its own seed.")
    eval_dtype: str = setting("float32", "Weights dtype of the dev evaluations: float32, so that paired wins and "
                              "losses are not bf16 batch-shape noise (7 of 16 greedy conversations changed with the "
                              "batch in bf16, none in float32).", choices=("float32", "auto", "bfloat16"))
    start: str = setting("", "A model to start every variant and the control from, in place of stage 1's (empty: "
                         "stage 1's model): e.g. stage 1 continued to where its dev curve stops rising. The table's "
                         "`sft` row is this model.")
    folder: str = setting("{out}/ablation", "Where the runs and the table go; an ablation from another start needs a "
                          "folder of its own (a folder holds one start's runs, and says so when given another).")
    rule: str = setting("beats_control", "The selection rule, fixed before the table is read. beats_control: among "
                        "the variants with more wins than losses against the control in every seed (exact sign test "
                        "p < 0.05 on the sharded scores), the highest mean P(sharded); with none, stage 1 continued "
                        "(the control) is the choice, and the table says so.", choices=("beats_control",))
    max_full_drop: float = setting(2.0, "beats_control also asks that a variant's P(full) be at most this many points "
                                   "below its seed's control's: a stage 2 that buys its multi-turn gain with single-turn "
                                   "skill is not chosen.", min=0.0, max=100.0)
    test: bool = setting(False, "After the dev table: the starting point, stage 1, the rule's choice and the control "
                         "(the first seed's runs) play the test and test-unseen splits, weights in eval_dtype; one "
                         "table (test.md) with R and retention against the starting point and the sign tests against "
                         "stage 1 and the control. The test split is read only here, after the choice.")
    test_runs: list[str] = setting([], "More variants (names of `variants`) played on test beside the choice, for the "
                                   "record (the table marks the choice).")


@dataclass
class AblationConfig(DemoConfig):
    """The demo's settings (`recipes/<backbone>/demo.yaml`) and the ablation's own section."""

    ablation: AblationSection = setting(AblationSection(), "The stage 2 variants compared on the dev split "
                                        "(`--config FILE` holds these keys).")


def load(recipes: str, config: str | None, overrides: list[str]) -> AblationConfig:
    """The demo's settings from `recipes`, the ablation's from `config` (a YAML of the `ablation`
    keys), then the `key=value` overrides of either."""
    if config is not None and not config.endswith((".yaml", ".yml")):
        raise FicError("expected a YAML file of the ablation's settings (.yaml or .yml)", path=config, field="--config")
    return load_demo(recipes, [*([f"ablation={config}"] if config else []), *overrides], cls=AblationConfig)


def demo_overrides(overrides: list[str]) -> list[str]:
    """The overrides a demo stage's own process (`fic demo --stage`) is given: the demo's, not the ablation's."""
    return [o for o in overrides if o.partition("=")[0].split(".")[0].strip() != "ablation"]


# A dev-evaluation conversation (full and sharded views, float32 weights) against the demo's
# evaluation conversation (bf16), on the reference machine. Derived, not yet timed in an ablation:
# a float32 sharded dev conversation took 3.4 s in the 2026-12-02 dev curve (64 at a time), and a
# full-view one is a single reply, taken as a quarter of that: (3.4 + 0.85) / 2 = 2.1 s = 2.5 x 0.87.
ABLATION_CONVERSATION_COST = 2.5
START = "start.json"  # the model the folder's runs start from
EVALUATED = "evaluated.json"  # a dev evaluation's wall and CPU seconds, beside its metrics
TRAINED_MARKER = "trained.json"  # a finished training run's wall and CPU seconds, in its train folder
VIEWS_SHOWN = ("full", "concat", "sharded")  # the test table's columns


def ablation_dir(cfg: AblationConfig) -> Path:
    return Path(cfg.ablation.folder)


def start_model(cfg: AblationConfig) -> Path:
    """The model every variant and the control start from: `ablation.start`, else stage 1's."""
    return Path(cfg.ablation.start) if cfg.ablation.start else model_of(cfg, "sft")


def check_start(cfg: AblationConfig) -> None:
    """A given start must be a saved model, and the folder's runs must all be from one start:
    a variant from one model beside a control from another would be compared for nothing."""
    start = start_model(cfg)
    if cfg.ablation.start and not (start / "config.json").is_file():
        raise FicError(f"no saved model (config.json) in {start}", field="ablation.start")
    root = ablation_dir(cfg)
    # a folder from before the start was recorded holds runs from stage 1's model
    recorded = (read_json(root / START)["start"] if (root / START).is_file()
                else str(model_of(cfg, "sft")) if (root / "sft").is_dir() else None)
    if recorded is not None and recorded != str(start):
        raise FicError(f"{root} holds an ablation from {recorded}, not {start}: give this start a folder of its "
                       f"own (ablation.folder=...)", field="ablation.start")


def _run(command: list[str], what: str) -> None:
    if subprocess.run(command).returncode != 0:
        raise FicError(f"the ablation's {what} failed (its error is above)")


def _timed_run(command: list[str], what: str) -> dict[str, float]:
    """`_run`, and the wall and CPU seconds the command's process took."""
    began, cpu = time.perf_counter(), cpu_seconds(resource.RUSAGE_CHILDREN)
    _run(command, what)
    return {"seconds": time.perf_counter() - began, "cpu_seconds": cpu_seconds(resource.RUSAGE_CHILDREN) - cpu}


def _config_file(config: object, path: Path) -> Path:
    write_text(path, yaml.safe_dump(config_to_dict(config), sort_keys=False))
    return path


def train(kind: str, config: object, folder: Path, progress: bool) -> dict:
    """Train one run (`kind` sft or vasd) in its own process; its wall and CPU seconds (from a
    marker on a second call)."""
    marker = folder / TRAINED_MARKER
    if marker.is_file():
        return json.loads(marker.read_text(encoding="utf-8"))
    done = complete_checkpoints(folder)
    resumed_at = step_of(done[-1]) if done else 0
    token = run_token(folder.parent)
    if not done:
        remove_folder(folder, token)  # ours, killed before its first checkpoint: nothing to keep; others refused
    own_folder(folder, token)  # resumed: only a run of ours
    spent = _timed_run([sys.executable, "-m", "fic", "train", kind, "--config",
                        str(_config_file(config, folder / f"{kind}.yaml")), f"logging.progress={str(progress).lower()}",
                        f"resume={str(bool(done)).lower()}"], f"{kind} run in {folder}")
    if resumed_at:  # only the steps after the checkpoint were timed: scale to the whole run, and say so
        steps = config.train.max_steps
        spent = {k: v * steps / (steps - resumed_at) for k, v in spent.items()} | {"resumed_at_step": resumed_at,
                                                                                   "estimated": True}
    spent = {k: round(v, 1) if isinstance(v, float) else v for k, v in spent.items()}
    write_json(marker, spent)
    return spent


def evaluate_split(cfg: AblationConfig, model: Path, folder: Path, split: str, views: list[str],
                   baseline: Path | None, progress: bool) -> Path:
    """Play `split` in `views` (its own process; it resumes), with the weights in
    `ablation.eval_dtype`; R and retention against `baseline`'s run where one is given."""
    run = dataclasses.replace(cfg.eval, model=dataclasses.replace(cfg.eval.model, model=str(model),
                                                                  dtype=cfg.ablation.eval_dtype),
                              data=dataclasses.replace(cfg.eval.data, source=[f"jsonl:{split_file(cfg, split)}"],
                                                       task=cfg.data.task, limit=None),
                              views=views, out=str(folder), baseline=str(baseline or ""))
    if not (folder / "metrics.json").is_file():
        fresh = not (folder / "conversations.jsonl").is_file()
        folder.mkdir(parents=True, exist_ok=True)
        spent = _timed_run([sys.executable, "-m", "fic", "eval", "--config", str(_config_file(run, folder / "eval.yaml")),
                            *([] if progress else ["--quiet"])], f"evaluation in {folder}")
        if fresh:  # a resumed one timed only its rest: it prices nothing
            size = getattr(cfg.data, split.replace("-", "_"))
            write_json(folder / EVALUATED, {k: round(v, 1) for k, v in spent.items()} | {"conversations": len(views) * size})
    return folder


def evaluate_dev(cfg: AblationConfig, model: Path, folder: Path, progress: bool) -> Path:
    """Play the dev split in the full and sharded views (see `evaluate_split`)."""
    return evaluate_split(cfg, model, folder, "dev", ["full", "sharded"], None, progress)


def vasd_config(cfg: AblationConfig, overrides: list[str], out: Path, seed: int = 0) -> object:
    """The demo's VASD stage config with a variant's overrides and a seed, wired like the stage."""
    base = dataclasses.replace(cfg.vasd)
    base = with_overrides(base, overrides, f"ablation.variants ({' '.join(overrides) or 'no overrides'})")
    base.model.path, base.out = str(start_model(cfg)), str(out)
    base.data.source, base.data.task = [f"jsonl:{split_file(cfg, 'train')}"], cfg.data.task
    base.anchor.path = str(paths(cfg)["data"] / "sft.sft.jsonl")
    base.exclude.sources = [f"jsonl:{split_file(cfg, s)}" for s in ("dev", "test", "test-unseen")]
    base.save_merged = base.save_merged or base.lora.enabled
    base.train.seed, base.data.seed = base.train.seed + seed, base.data.seed + seed
    return base


def check_variants(cfg: AblationConfig) -> None:
    """Refuse two variants that resolve to the same vasd settings: overrides are applied over
    demo.yaml's vasd section, so a variant named for what that section already sets (`[]` beside
    `[terms.labels.weight=1.0]` when labels are on there) would train the same run twice under two names."""
    seen: dict[str, str] = {}
    for name, overrides in cfg.ablation.variants.items():
        settings = json.dumps(config_to_dict(vasd_config(cfg, list(overrides), Path("train"))), sort_keys=True,
                              default=str)
        if settings in seen:
            raise FicError(f"variants {seen[settings]} and {name} come to the same vasd settings (their overrides "
                           f"over demo.yaml's vasd section: {list(cfg.ablation.variants[seen[settings]])} and "
                           f"{list(overrides)}); make them differ, e.g. set explicitly what one of them turns off",
                           field="ablation.variants")
        seen[settings] = name
    unknown = [name for name in cfg.ablation.test_runs if name not in cfg.ablation.variants]
    if unknown:
        raise FicError(f"ablation.test_runs names {', '.join(unknown)}, not a variant of ablation.variants "
                       f"({', '.join(cfg.ablation.variants) or 'none'})", field="ablation.test_runs")


def run_name(name: str, seed: int) -> str:
    """A run's folder and row: the variant's (or control's) name for seed 0, `name@seed` for any
    other, so that a seed added to `ablation.seeds` later keeps the runs seed 0 has finished."""
    return name if seed == 0 else f"{name}@{seed}"


def run_ablation(cfg: AblationConfig, *, progress: bool = True, say: Callable[[str], None] = print,
                 launch: tuple[str, list[str]] | None = None) -> dict:
    """Train and evaluate every variant in every seed (see the module docstring); return the table's figures."""
    check_variants(cfg)
    with folder_lock(cfg.out):  # the demo and a second ablation into the same folder fail at once
        return _run_ablation(cfg, progress, say, launch)


def _run_ablation(cfg: AblationConfig, progress: bool, say: Callable[[str], None],
                  launch: tuple[str, list[str]] | None) -> dict:
    run_stages(cfg, ("data", "warmup", "sft"), progress=progress, say=say, launch=launch)
    check_start(cfg)
    root, seeds = ablation_dir(cfg), list(cfg.ablation.seeds)
    write_json(root / START, {"start": str(start_model(cfg))})
    runs, seconds = {"sft": evaluate_dev(cfg, start_model(cfg), root / "sft" / "dev", progress)}, {}
    for seed in seeds:
        trained = []
        for name, overrides in cfg.ablation.variants.items():
            key = run_name(name, seed)
            say(f"[ablation] {key}: {' '.join(overrides) or 'the recipe as it is'}")
            folder = root / key
            config = vasd_config(cfg, list(overrides), folder / "train", seed)
            seconds[key] = train("vasd", config, folder / "train", progress)
            final = folder / "train" / ("final-merged" if config.lora.enabled else "final")
            runs[key] = evaluate_dev(cfg, final, folder / "dev", progress)
            trained.append(key)
        if cfg.ablation.control and trained:
            mean = sum(seconds[k]["cpu_seconds"] for k in trained) / len(trained)
            key = run_name("control", seed)
            control = dataclasses.replace(cfg.control)
            control.model.path, control.data.path = str(start_model(cfg)), str(paths(cfg)["data"] / "sft.sft.jsonl")
            control.out = str(root / key / "train")
            control.train.max_steps, control.dev.every = control_steps(cfg, mean), 0
            control.train.seed, control.data.seed = control.train.seed + seed, control.data.seed + seed
            if (Path(control.out) / TRAINED_MARKER).is_file():  # sized from the variants trained before it: kept, not resized
                say(f"[ablation] {key}: trained before; kept, though the variants' mean is now "
                    f"{mean / 60:.1f} CPU minutes (the table's train column shows both)")
            else:
                say(f"[ablation] {key}: {control.train.max_steps} more SFT steps (the variants' mean "
                    f"{mean / 60:.1f} CPU minutes)")
            seconds[key] = train("sft", control, Path(control.out), progress)
            final = Path(control.out) / ("final-merged" if control.lora.enabled else "final")
            runs[key] = evaluate_dev(cfg, final, root / key / "dev", progress)
    figures = ablation_table(runs, seconds, seeds, list(cfg.ablation.variants), cfg.ablation.rule,
                             cfg.ablation.max_full_drop)
    write_json(root / "ablation.json", figures)
    write_text(root / "table.md", figures["table"] + "\n")
    if cfg.ablation.test:  # only now, the choice made on dev: the test split chooses nothing
        figures["test"] = run_test(cfg, figures["choice"]["choice"], progress, say)
    return figures


def variant_of(key: str) -> str:
    """The variant (or `control`) a run's key names: `run_name` without its seed."""
    return key.split("@")[0]


def seed_of(key: str) -> int:
    """The seed a run's key names: the inverse of `run_name`."""
    return int(key.rsplit("@", 1)[1]) if "@" in key else 0


def run_keys(cfg: AblationConfig) -> list[str]:
    """Every run the ablation trains, in its order: the variants, then the control, per seed."""
    seeds = list(cfg.ablation.seeds)
    control = ["control"] if cfg.ablation.control and cfg.ablation.variants else []
    return [run_name(name, s) for s in seeds for name in [*cfg.ablation.variants, *control]]


def plan(cfg: AblationConfig, launch: tuple[str, list[str]] | None = None) -> str:
    """What the ablation will run and what is left, with an estimate (`--dry-run`); nothing runs.
    A dev evaluation is priced at ABLATION_CONVERSATION_COST of the demo's evaluation conversations
    each; a variant at its own steps at VASD's cost a step; the control at the variants' mean time."""
    check_variants(cfg)
    check_start(cfg)
    shipped = load_demo(launch[0], []) if launch is not None else None
    done = stage_summaries(cfg)
    priced = {**reference_costs.reference_markers(cfg, shipped), **done}  # what finished here wins
    first = [stage for stage in ("data", "warmup", "sft") if stage not in done]
    root, seeds = ablation_dir(cfg), list(cfg.ablation.seeds)
    keys = run_keys(cfg)
    trained = {k for k in keys if (root / k / "train" / TRAINED_MARKER).is_file()}
    scored = {k for k in ["sft", *keys] if (root / k / "dev" / "metrics.json").is_file()}
    start = "the model" if cfg.ablation.start else "stage 1's model"
    line = (f"experiments/ablation.py: from {start} in {start_model(cfg)} (stages first: "
            f"{', '.join(first) or 'none, done before'}), {len(cfg.ablation.variants)} variant(s) "
            f"({', '.join(cfg.ablation.variants) or 'none'}) x seeds {', '.join(map(str, seeds))}"
            f"{', the equal-compute control per seed' if cfg.ablation.control else ''}; each and stage 1 "
            f"evaluated on the dev split ({cfg.data.dev} instances, full and sharded, {cfg.ablation.eval_dtype}); "
            f"runs left: {', '.join(k for k in ['sft', *keys] if k not in scored) or 'none'}"
            f"{' (done before: ' + ', '.join(k for k in ['sft', *keys] if k in scored) + ')' if scored else ''}; "
            f"the table in {root / 'table.md'}")
    stage_costs = {stage: costs.estimate(cfg, stage, priced) for stage in first}
    steps = {name: vasd_config(cfg, list(o), root / name / "train").train.max_steps
             for name, o in cfg.ablation.variants.items()}
    step_s, conversation_s, source = _unit_seconds(priced, root, keys, steps)
    if step_s is None or conversation_s is None or any(c is None for c in stage_costs.values()):
        why = reference_costs.off_reference()
        return line + "\n[ablation] estimate: no figures for these settings yet" + (f"; {why}" if why else "")
    variant_minutes = {name: s * step_s / 60 for name, s in steps.items()}
    mean = sum(variant_minutes.values()) / max(len(variant_minutes), 1)
    left = [k for k in keys if k not in trained]
    train_minutes = sum(mean if variant_of(k) == "control" else variant_minutes[variant_of(k)] for k in left)
    eval_minutes = conversation_s * 2 * cfg.data.dev / 60
    evals = sum(1 for k in ["sft", *keys] if k not in scored)
    first_minutes = sum(c["minutes"] for c in stage_costs.values())
    test_minutes = conversation_s * test_conversations_left(cfg) / 60
    total = first_minutes + train_minutes + evals * eval_minutes + test_minutes
    return (line + f"\n[ablation] estimate: about {total:.0f} min ({source} figures): "
            + (f"stage 1 first {first_minutes:.0f} min, " if first else "")
            + f"{len(left)} training run(s) {train_minutes:.0f} min, "
            f"{evals} dev evaluation(s) of about {eval_minutes:.0f} min each"
            + (f", the test table {test_minutes:.0f} min" if cfg.ablation.test else ""))


def test_conversations_left(cfg: AblationConfig) -> int:
    """Conversations `ablation.test` has still to play (0 when off). Before the choice is made,
    the choice is counted as one more run unless the control is all there is to choose."""
    if not cfg.ablation.test:
        return 0
    root, seeds = ablation_dir(cfg), list(cfg.ablation.seeds)
    names = dict.fromkeys([*cfg.ablation.test_runs, *(["control"] if cfg.ablation.control else [])])
    keys = ["start", "sft", *(run_name(n, seeds[0]) for n in names)]
    chosen = read_json(root / "ablation.json")["choice"]["choice"] if (root / "ablation.json").is_file() else None
    if chosen is None and cfg.ablation.variants:
        keys.append("the choice")
    elif chosen is not None and chosen not in names:
        keys.append(run_name(chosen, seeds[0]))
    sizes = {"test": cfg.data.test, "test-unseen": cfg.data.test_unseen}
    return sum(sizes[split] * (3 if (key, split) == ("start", "test") else 2)
               for key in keys for split in EVAL_SETS if not (root / key / split / "metrics.json").is_file())


def _unit_seconds(priced: dict[str, dict], root: Path, keys: list[str],
                  steps: dict[str, int]) -> tuple[float | None, float | None, str]:
    """Seconds a VASD step and a dev conversation: from this folder's finished runs where there
    are some (`trained.json`, `evaluated.json`), else from `priced` (the demo's stage markers, the
    reference machine's before them: `reference_costs`)."""
    variants = [k for k in keys if variant_of(k) in steps and (root / k / "train" / TRAINED_MARKER).is_file()]
    timed = [read_json(root / k / "train" / TRAINED_MARKER) for k in variants]
    evaluated = [read_json(f) for f in sorted(root.glob(f"*/dev/{EVALUATED}"))]
    vasd, evaluation = costs.unit_cost("vasd", priced), costs.unit_cost("eval-start", priced)
    step_s = (sum(t["seconds"] for t in timed) / sum(steps[variant_of(k)] for k in variants) if timed
              else vasd and vasd["seconds"])
    conversation_s = (sum(e["seconds"] for e in evaluated) / sum(e["conversations"] for e in evaluated) if evaluated
                      else evaluation and ABLATION_CONVERSATION_COST * evaluation["seconds"])
    measured = timed or evaluated
    return step_s, conversation_s, "measured here" if measured else (vasd or evaluation or {}).get("source", "").split(" (")[0]


def _sharded_scores(run: Path) -> dict[str, float]:
    return {r["task_id"]: float(r["score"]) for r in read_log(run / "conversations.jsonl") if r["view"] == "sharded"}


def _paired(run: Path, other: Path) -> dict:
    mine, theirs = _sharded_scores(run), _sharded_scores(other)
    return sign_test(mine[i] - theirs[i] for i in sorted(set(mine) & set(theirs)))


def choose(rows: dict[str, dict], seeds: list[int], variants: list[str], max_full_drop: float | None = None) -> dict:
    """The `beats_control` rule: the variants with more wins than losses against the control of
    every seed at p < 0.05, and (with `max_full_drop`) a P(full) at most that many points below
    that control's, the highest mean P(sharded) of them; none: the control."""
    winners, kept_full = {}, []
    for name in variants:
        keys = [run_name(name, s) for s in seeds]
        tests = [rows.get(k, {}).get("vs_control") for k in keys]
        if all(t is not None and t["better"] > t["worse"] and t["p_value"] < 0.05 for t in tests):
            drops = [rows[run_name("control", s)]["P_full"] - rows[k]["P_full"] for s, k in zip(seeds, keys)]
            if max_full_drop is not None and max(drops) > max_full_drop:
                kept_full.append(f"{name} (P(full) {max(drops):.1f} points below the control's)")
                continue
            winners[name] = sum(rows[k]["P_sharded"] for k in keys) / len(keys)
    if not winners:
        why = ("no variant beat the equal-compute control in every seed (more wins than losses, p < 0.05)"
               + (f" with P(full) within {max_full_drop:g} points of it; beat it but lost single-turn skill: "
                  + ", ".join(kept_full) if kept_full else "") + ": stage 1 continued is the better use of the compute")
        return {"choice": "control", "why": why}
    best = max(winners, key=winners.get)
    return {"choice": best, "why": f"beat the control in every seed; the highest mean P(sharded) of those "
            f"({winners[best]:.1f})"}


def pooled_vs(rows: dict[str, dict], seeds: list[int], variants: list[str], other: str = "control") -> dict[str, dict]:
    """Each variant's wins and losses against `other` (its seed's control, or stage 1), summed over
    the seeds, with one exact sign test: for the record beside the rule, which reads each seed on
    its own. The seeds replay the same instances, but if the variant has no effect, each seed's run
    and its comparator are two draws of the same training: an instance's signs are fair coins,
    uncorrelated across seeds."""
    pooled = {}
    for name in variants:
        tests = [rows.get(run_name(name, s), {}).get(f"vs_{other}") for s in seeds]
        if all(tests):
            better, worse = sum(t["better"] for t in tests), sum(t["worse"] for t in tests)
            pooled[name] = sign_test([1] * better + [-1] * worse) | {"tied": sum(t["tied"] for t in tests)}
    return pooled


def ablation_table(runs: dict[str, Path], seconds: dict[str, dict], seeds: list[int] | None = None,
                   variants: list[str] | None = None, rule: str = "beats_control",
                   max_full_drop: float | None = None) -> dict:
    """The figures of every run, the rule's choice and the markdown table."""
    seeds = seeds or [0]
    rows = {}
    for name, run in runs.items():
        views = json.loads((run / "metrics.json").read_text(encoding="utf-8"))["views"]
        sharded = views["sharded"]
        rows[name] = {"P_full": views["full"]["P"], "P_sharded": sharded["P"],
                      "first_answer_accuracy": sharded.get("first_answer_accuracy"),
                      "premature_answer_rate": sharded["premature_answer_rate"],
                      "unanswerable_answer_rate": sharded.get("unanswerable_answer_rate"),
                      "never_answered_rate": never_answered(views),
                      "tokens_per_sharded_conversation": sharded["generated_tokens_per_conversation"],
                      "minutes": round(seconds[name]["seconds"] / 60, 1) if name in seconds else None,
                      "time_estimated": bool(seconds.get(name, {}).get("estimated")),
                      "cpu_minutes": round(seconds[name]["cpu_seconds"] / 60, 1) if name in seconds else None}
        control = run_name("control", seed_of(name))
        if name != "sft":
            rows[name]["vs_sft"] = _paired(run, runs["sft"])
        if control in runs and name not in ("sft", control):
            rows[name]["vs_control"] = _paired(run, runs[control])
    chosen = choose(rows, seeds, variants or [], max_full_drop) if variants is not None else None
    n = len(_sharded_scores(runs["sft"]))
    lines = [f"Stage 2 variants on the dev split, N = {n} instances, seeds {', '.join(map(str, seeds))} (P in %, "
             "greedy, LiC's rules)", "",
             "| run | P(full) | P(sharded) | first-answer acc. | premature (unanswerable) | never answered | tokens / sharded conv. | "
             "train min (wall / CPU) | vs SFT (wins-losses, p) | vs control (wins-losses, p) |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for name, row in rows.items():
        minutes = "-" if row["minutes"] is None else f"{row['minutes']} / {row['cpu_minutes']}"
        minutes += " (resumed: scaled)" if row["time_estimated"] else ""
        lines.append(f"| {name} | {row['P_full']:.1f} | {row['P_sharded']:.1f} | "
                     f"{row['first_answer_accuracy']:.1f} | {premature_text(row)} | "
                     f"{percent_text(row['never_answered_rate'])} | {row['tokens_per_sharded_conversation']:.1f} | "
                     f"{minutes} | {paired_text(row, 'sft')} | {paired_text(row, 'control')} |")
    if chosen is not None:
        lines += ["", f"Rule `{rule}` (fixed before the table was read): the choice is **{chosen['choice']}**: "
                      f"{chosen['why']}."]
    pooled = pooled_vs(rows, seeds, variants or []) if len(seeds) > 1 else {}
    pooled_sft = pooled_vs(rows, seeds, [*(variants or []), "control"], "sft") if len(seeds) > 1 else {}
    for against, tests in (("the control", pooled), ("stage 1 (the `sft` row)", pooled_sft)):
        if tests:
            lines += ["", f"Against {against}, seeds {', '.join(map(str, seeds))} pooled (for the record; the rule "
                          "reads each seed): " + "; ".join(f"{name} {t['better']}-{t['worse']}, p = {t['p_value']:.3g}"
                                                           for name, t in tests.items()) + "."]
    power = power_text(rows, n, len(seeds))
    if power:
        lines += ["", power]
    return {"rows": rows, "choice": chosen, "pooled": pooled, "pooled_vs_sft": pooled_sft, "table": "\n".join(lines)}


POWER_GAINS = (4.0, 6.0, 10.0)  # points: the gains the power sentence prices


def power_text(rows: dict[str, dict], n: int, seeds: int) -> str | None:
    """What this table can detect: the rule's chance (more wins than losses at p < 0.05 in every
    seed) of finding true gains of POWER_GAINS points and the gain it finds 80% of the time, at
    the share of instances on which a run and its comparator differ here (their mean)."""
    tests = [row.get("vs_control") or row.get("vs_sft") for name, row in rows.items() if name != "sft"]
    shares = [(t["better"] + t["worse"]) / n for t in tests if t and n]
    if not shares or not any(shares):
        return None
    discordant = sum(shares) / len(shares)
    found = " / ".join(f"{sign_test_power(n, discordant, g, seeds):.0%}" for g in POWER_GAINS)
    smallest = detectable_gain(n, discordant, seeds)
    eighty = (f"80% needs a true gain of about {smallest:g} points" if smallest is not None else
              "no gain this discordance allows is found 80% of the time")
    return (f"Power: with N = {n} and {seeds} seed(s), where {discordant:.0%} of instances differ between a run and "
            f"its comparator (this table's mean), the rule finds a true gain of "
            f"{' / '.join(f'{g:g}' for g in POWER_GAINS)} points {found} of the time; {eighty}.")


def paired_text(row: dict, other: str) -> str:
    t = row.get(f"vs_{other}")
    return "-" if t is None else f"{t['better']}-{t['worse']}, p = {t['p_value']:.3g}"


# --------------------------------------------------------------------------- after the choice: test

def final_model(folder: Path) -> Path:
    """The whole model a training run left (a LoRA run's `final` is only the adapter)."""
    return folder / "final-merged" if (folder / "final-merged").is_dir() else folder / "final"


def test_models(cfg: AblationConfig, choice: str) -> dict[str, Path]:
    """What the test table plays, by key: the starting point (the warm-up model, whose P(full) R
    divides by), stage 1 (the ablation's start), the rule's choice and `ablation.test_runs` (their
    first seed's runs) and the first seed's control."""
    seeds, root = list(cfg.ablation.seeds), ablation_dir(cfg)
    names = dict.fromkeys([choice, *cfg.ablation.test_runs, "control"])
    if not cfg.ablation.control:
        names.pop("control")
    models = {"start": model_of(cfg, "warmup"), "sft": start_model(cfg)}
    for name in names:
        key = run_name(name, seeds[0])
        models[key] = final_model(root / key / "train")
    return models


def run_test(cfg: AblationConfig, choice: str, progress: bool, say: Callable[[str], None]) -> dict:
    """`ablation.test`: every model of `test_models` plays the test split (the starting point in
    the full, concat and sharded views, the rest in full and sharded) and the test-unseen split
    (full and sharded), weights in `ablation.eval_dtype`; the table (`test.md`, `test.json`)."""
    root, models = ablation_dir(cfg), test_models(cfg, choice)
    runs: dict[str, dict[str, Path]] = {}
    for split in EVAL_SETS:
        runs[split] = {}
        for key, model in models.items():
            views = ["full", "concat", "sharded"] if (key, split) == ("start", "test") else ["full", "sharded"]
            say(f"[ablation] {key} on {split} ({', '.join(views)}, {cfg.ablation.eval_dtype})")
            baseline = None if key == "start" else runs[split]["start"]
            runs[split][key] = evaluate_split(cfg, model, root / key / split, split, views, baseline, progress)
    figures = test_table(cfg, runs, choice)
    write_json(root / "test.json", {k: v for k, v in figures.items() if k != "table"})
    write_text(root / "test.md", figures["table"] + "\n")
    say(figures["table"])
    return figures


def test_table(cfg: AblationConfig, runs: dict[str, dict[str, Path]], choice: str) -> dict:
    """Per split: each run's P per view, first-answer accuracy, premature and never-answered
    rates, R and retention against the starting point (95% paired bootstrap) and its exact sign
    test on the sharded scores against stage 1 and against the control."""
    seeds = list(cfg.ablation.seeds)
    control, chosen = run_name("control", seeds[0]), run_name(choice, seeds[0])
    names = {"start": f"starting point ({cfg.label})", "sft": "stage 1 (SFT, the ablation's start)",
             control: f"{control}: stage 1 continued, equal compute"}
    names[chosen] = f"{names.get(chosen, chosen)} (the rule's choice)"
    sets, lines = {}, []
    for split, by_key in runs.items():
        start = {"scores": view_scores(by_key["start"])}
        rows = {}
        for key, run in by_key.items():
            row = stage_figures(cfg, run, start)
            row.pop("scores")
            if key != "start":
                row["vs_sft"] = None if key == "sft" else _paired(run, by_key["sft"])
                row["vs_control"] = None if key in ("sft", control) or control not in by_key else _paired(
                    run, by_key[control])
            rows[key] = row
        sets[split] = rows
        lines += [f"{split} split, N = {rows['start']['instances']} instances, weights in {cfg.ablation.eval_dtype} "
                  "(P in %, greedy, LiC's rules; R and retention against the starting point's P(full), 95% paired "
                  "bootstrap; sign tests on the sharded scores)", "",
                  "| run | P(full) | P(concat) | P(sharded) | first-answer acc. | premature (unanswerable) | never answered | "
                  "R [95% CI] | own P(sharded)/P(full) [95% CI] | retention [95% CI] | vs SFT (wins-losses, p) | "
                  "vs control (wins-losses, p) |",
                  "|---|---|---|---|---|---|---|---|---|---|---|---|"]
        for key, row in rows.items():
            p = {view: "-" if row["P"].get(view) is None else f"{row['P'][view]:.1f}" for view in VIEWS_SHOWN}
            lines.append(f"| {names.get(key, key)} | {p['full']} | {p['concat']} | {p['sharded']} | "
                         f"{row['first_answer_accuracy']:.1f} | {premature_text(row)} | "
                         f"{percent_text(row['never_answered_rate'])} | {interval_text(row.get('recovery_rate'))} | "
                         f"{interval_text(row.get('own_ratio'))} | {interval_text(row.get('retention'))} | "
                         f"{paired_text(row, 'sft')} | "
                         f"{paired_text(row, 'control')} |")
        lines.append("")
    return {"choice": chosen, "sets": sets, "table": "\n".join(lines).rstrip()}



# --------------------------------------------------------------------------- the command line

def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--recipes", default="recipes/smollm2-135m-instruct",
                        help="recipes folder holding the demo.yaml the ablation starts from (default: the bundled "
                        "model's)")
    parser.add_argument("--config", default=None, metavar="FILE", help="a YAML file of the ablation's settings (the "
                        "`ablation` keys: variants, seeds, ...; default: this script's)")
    parser.add_argument("overrides", nargs="*", metavar="key=value", help="override demo.yaml or the ablation's "
                        "settings, e.g. data.dev=256 \"ablation.seeds=[0,1]\" ablation.test=true")
    parser.add_argument("--keys", action="store_true", help="list every key (demo.yaml's and the ablation's) with its "
                        "default, the value this run would use and its help, and exit")
    parser.add_argument("--dry-run", action="store_true", help=DRY_RUN_HELP)
    parser.add_argument("--quiet", action="store_true", help="no progress bars or lines")
    parser.add_argument("--quick", action="store_true", help="`fic demo --quick`'s tiny splits and few steps, into "
                        "its folder: a look at what the ablation does and writes, not a measure. Overrides given "
                        "beside it win")


def run(args: argparse.Namespace) -> int:
    if args.quick:  # before the user's overrides, which win
        args.overrides = [*QUICK, *args.overrides]
    cfg = load(args.recipes, args.config, args.overrides)
    if args.keys:
        print_keys(args, AblationConfig, run=cfg)
        return 0
    launch = (args.recipes, demo_overrides(args.overrides))  # each demo stage runs as `fic demo --stage`
    if args.dry_run:
        print(resolved_yaml(cfg) + plan(cfg, launch))
        return 0
    figures = run_ablation(cfg, progress=not args.quiet, launch=launch)
    print(figures["table"])
    print(f"table: {ablation_dir(cfg) / 'table.md'}")
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python experiments/ablation.py", description=__doc__.split("\n\n")[0])
    add_arguments(parser)
    args = parser.parse_args(argv)
    return exit_status("experiments/ablation.py", lambda: run(args))


if __name__ == "__main__":
    sys.exit(main())
