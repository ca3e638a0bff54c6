"""What `fic demo` will cost here: minutes and peak memory per stage, said before a stage starts.

A stage's cost is its size in units (optimizer steps, conversations played, dev instances read)
times the seconds a unit took, and its peak resident memory, both measured: by the latest finished
stage of the same kind in this output folder (the SFT stage prices the control, the first
evaluation the later ones), on this machine with these settings. A stage nothing has priced yet is
said to be unpriced rather than guessed from another machine.

A shared machine's load moves wall time more than any figure here (the smoke run took 15 minutes
quiet and two hours under a load of 4-8 on 2 cores), so the plan's line says the load at start and
how much slower that makes a stage than the same stage on a quiet machine.

Before each stage the demo compares the measured peak with the memory this machine has free
(`memory_budget_mb`, 0: MemAvailable) and refuses a stage that would not fit, naming the
settings that lower it, rather than letting the kernel kill it halfway.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from fic.core.errors import FicError

# The stage each stage is priced like, and its unit.
KIND = {"data": "data", "warmup": "sft", "sft": "sft", "control": "sft", "vasd": "vasd", "premise": "premise",
        "eval-start": "eval", "eval-sft": "eval", "eval-vasd": "eval", "eval-control": "eval"}
UNIT = {"data": "stage", "sft": "step", "vasd": "step", "premise": "dev instance", "eval": "conversation"}

# How to lower a stage's peak, said when it would not fit.
LOWER = {
    "sft": "{stage}.train.micro_batch_size (half of it, with grad_accum_steps doubled, keeps the step) and "
           "{stage}.model.gradient_checkpointing=true",
    "vasd": "vasd.train.micro_batch_size with vasd.train.grad_accum_steps, vasd.model.gradient_checkpointing=true, "
            "vasd.rollout.kv_reuse_mb",
    "premise": "eval.model.batch_size",
    "eval": "eval.model.batch_size and eval.model.kv_reuse_mb",
    "data": "data.train",
}


def units(cfg: Any, stage: str, control: float | None) -> float:
    """The stage's size in its unit; `control`: the control's steps (what VASD's time buys)."""
    kind = KIND[stage]
    if kind == "data":
        return 1.0
    if stage == "control":
        return control or 0.0
    if kind == "sft":
        return float(getattr(cfg, stage).train.max_steps or 0)
    if kind == "vasd":
        return float(cfg.vasd.train.max_steps or 0)
    if kind == "premise":
        return float(cfg.data.dev)
    views = 3 if stage == "eval-start" else 2  # full, concat, sharded on test at the start; full and sharded after
    return float(cfg.data.test * views + cfg.data.test_unseen * 2)


def load_now() -> tuple[float, int]:
    """This machine's 1-minute load average and the cores this process may use (load 0.0 where the
    OS does not say)."""
    try:
        load = os.getloadavg()[0]
    except OSError:
        load = 0.0
    return load, len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


def load_note(load: float, cores: int) -> str:
    """'' on a quiet machine; else what the load means for a stage: its threads, one a core, share
    the cores with `load` other runnable ones."""
    slower = (load + cores) / cores
    if slower < 1.25:
        return ""
    return (f"this machine's load is {load:.1f} on {cores} cores: a stage runs about {slower:.1f}x slower than on "
            "a quiet one")


def unit_cost(stage: str, done: dict[str, dict]) -> dict | None:
    """{"seconds" a unit, "peak_mb", "source"} of `stage` from the latest finished stage of its kind
    (the stage itself on a re-run), or None. `done`: stage markers in the order they finished; a
    marker's own "stage" and "source" (default: measured here) name it."""
    kind = KIND[stage]
    for name, marker in reversed(list(done.items())):
        size = marker.get("units")
        if KIND.get(marker.get("stage", name)) == kind and marker.get("seconds") and marker.get("peak_rss_mb") and size:
            scoring = (_plateau(marker) or {}).get("seconds", 0.0)  # the dev curve's scoring, not training
            return {"seconds": (marker["seconds"] - scoring) / size, "peak_mb": float(marker["peak_rss_mb"]),
                    "source": f"{marker.get('source', 'measured here')} ({marker.get('stage', name)})"}
    return None


def _plateau(marker: dict) -> dict | None:
    return (marker.get("figures") or {}).get("plateau")


def dev_conversation_seconds(cfg: Any, done: dict[str, dict]) -> float | None:
    """Seconds a dev-curve conversation took: the latest finished stage that scored a dev curve, its
    scoring seconds over the conversations it played (scores x instances x views); None before one."""
    for marker in reversed(list(done.values())):
        curve = _plateau(marker)
        if curve and curve.get("seconds") and curve.get("curve") and curve.get("views"):
            instances = min(curve.get("instances") or cfg.data.dev, cfg.data.dev)
            return curve["seconds"] / (len(curve["curve"]) * instances * len(curve["views"]))
    return None


def dev_curve_seconds(cfg: Any, stage: str, done: dict[str, dict]) -> float | None:
    """The dev scores of a stage trained to its plateau (`dev.every`): 0 for a stage without them,
    None while no finished stage has measured what a dev conversation costs."""
    section = getattr(cfg, stage, None) if KIND[stage] == "sft" and stage != "control" else None
    dev = getattr(section, "dev", None)
    if dev is None or not dev.every:
        return 0.0
    conversation = dev_conversation_seconds(cfg, done)
    if conversation is None:
        return None
    scores = section.train.max_steps // dev.every + 1
    return conversation * scores * min(dev.data.limit or cfg.data.dev, cfg.data.dev) * len(dev.views)


def estimate(cfg: Any, stage: str, done: dict[str, dict], control: float | None = None) -> dict | None:
    """{"minutes", "peak_mb", "source"} for `stage`, or None when nothing measured prices it.
    `control`: the control's steps when known; else what VASD's measured time buys at SFT's cost a step."""
    cost, dev_curve = unit_cost(stage, done), dev_curve_seconds(cfg, stage, done)
    if cost is None or dev_curve is None:
        return None
    if stage == "control" and control is None:
        vasd = unit_cost("vasd", done)
        if not cfg.control_steps and vasd is None:
            return None  # its steps are what VASD's time buys: unknown until a VASD stage has run here
        control = cfg.control_steps or cfg.vasd.train.max_steps * vasd["seconds"] / cost["seconds"]
    seconds = units(cfg, stage, control) * cost["seconds"] + dev_curve
    return {"minutes": seconds / 60, "peak_mb": cost["peak_mb"], "source": cost["source"]}


def available_mb() -> float | None:
    """The memory this machine can give a new process (MemAvailable), in MiB; None where unknown."""
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) / 1024
    except OSError:
        pass
    return None


def check_fits(cfg: Any, stage: str, cost: dict | None) -> None:
    """Refuse a stage whose peak would not fit the budget (`memory_budget_mb`, else MemAvailable)."""
    budget = cfg.memory_budget_mb or available_mb()
    if cost is None or budget is None or cost["peak_mb"] <= budget:
        return
    raise FicError(f"stage {stage} needs about {cost['peak_mb'] / 1024:.1f} GiB ({cost['source']}) and "
                   f"{budget / 1024:.1f} GiB is free: lower it with {LOWER[KIND[stage]].format(stage=stage)}, or set "
                   "memory_budget_mb to what this machine can give", field="memory_budget_mb")


def plan(cfg: Any, stages: list[str], done: dict[str, dict], control: float | None = None,
         load: tuple[float, int] | None = None) -> tuple[str, dict[str, dict | None]]:
    """A line with the estimated minutes and peak of `stages` and the load now (`load`: the load
    average and the cores, else this machine's), and each stage's estimate."""
    costs = {stage: estimate(cfg, stage, done, control) for stage in stages}
    known = {s: c for s, c in costs.items() if c is not None}
    note = load_note(*(load or load_now()))
    note = f"; {note}" if note else ""
    if not known:
        return f"estimate: no figures for these settings yet (they will come from the first stages){note}", costs
    minutes = sum(c["minutes"] for c in known.values())
    peak = max(c["peak_mb"] for c in known.values())
    sources = sorted({c["source"].split(" (")[0] for c in known.values()})
    unknown = [s for s, c in costs.items() if c is None]
    return (f"estimate: about {minutes:.0f} min for {len(known)} stage(s), peak {peak / 1024:.1f} GiB "
            f"({' and '.join(sources)} figures)" + (f"; not priced yet: {', '.join(unknown)}" if unknown else "")
            + note), costs
