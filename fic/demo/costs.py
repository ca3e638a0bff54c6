"""What `fic demo` will cost here: minutes and peak memory per stage, said before a stage starts.

A stage's cost is its size in units (optimizer steps, conversations played, dev instances read)
times a cost per unit, and its peak resident memory. Both come from, in this order:

1. the latest finished stage of the same kind in this output folder (the SFT stage prices the
   control, the evaluations price the later ones): this machine, these settings;
2. the reference machine (`REFERENCE`: 2 quiet cores with AMX, the bundled SmolLM2-135M, the
   shipped demo.yaml), when the stage's memory-relevant settings are the shipped ones and this
   machine computes as that one did (a CPU with fast bfloat16: `off_reference` says why not);
3. nothing: the estimate says so rather than guess.

Before each stage the demo compares the peak with the memory this machine has free
(`memory_budget_mb`, 0: MemAvailable) and refuses a stage that would not fit, naming the
settings that lower it, rather than letting the kernel kill it halfway.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

from fic.core.errors import FicError
from fic.core.model import default_device, fast_bf16

# The stage each stage is priced like, and its unit.
KIND = {"data": "data", "warmup": "sft", "sft": "sft", "control": "sft", "vasd": "vasd", "premise": "premise",
        "eval-start": "eval", "eval-sft": "eval", "eval-vasd": "eval", "eval-control": "eval"}
UNIT = {"data": "stage", "sft": "step", "vasd": "step", "premise": "dev instance", "eval": "conversation"}

# Reference machine (2 quiet cores, AMX), the shipped demo.yaml: seconds a unit and the stage's peak
# resident MiB, from the whole demo of 2026-12-02 (docs/results.md): data 29 s with the model's first
# preparation; SFT 12.2 s a training step (warm-up 15.1 with its load and save), 5.3 GB with the dev
# probe; VASD 53.2 s a step, 8.0 GB; evaluation 0.84-0.90 s a conversation with kv_reuse_mb=1024,
# 5.3 GB; the premise check 1.56 s a dev instance.
REFERENCE = {
    "data": {"seconds": 30.0, "peak_mb": 2000},
    "sft": {"seconds": 12.5, "peak_mb": 5300},
    "vasd": {"seconds": 53.2, "peak_mb": 8200},
    "premise": {"seconds": 1.6, "peak_mb": 4200},
    "eval": {"seconds": 0.87, "peak_mb": 5400},
}
# What a stage costs besides its units when priced from the reference machine: the process start,
# the model's load and save (the warm-up's 12 steps took 15.1 s each against SFT's 12.2: 35 s). A
# smoke run's stages are mostly this.
STAGE_START_S = 35.0
# A dev-curve conversation against an evaluation's average one: float32 weights and the sharded view,
# the longest (2026-12-02: 3.4 s against 0.9).
DEV_CONVERSATION_COST = 3.8

# How to lower a stage's peak, said when it would not fit.
LOWER = {
    "sft": "{stage}.train.micro_batch_size (half of it, with grad_accum_steps doubled, keeps the step) and "
           "{stage}.model.gradient_checkpointing=true",
    "vasd": "vasd.train.micro_batch_size with vasd.train.grad_accum_steps (e.g. 2 x 4: 7.3 GB against 15.1 at 8 x 1 "
            "on the reference machine), vasd.model.gradient_checkpointing=true, vasd.rollout.kv_reuse_mb",
    "premise": "eval.model.batch_size",
    "eval": "eval.model.batch_size and eval.model.kv_reuse_mb",
    "data": "data.train",
}


def stage_config(cfg: Any, stage: str) -> Any:
    """The stage's own config section (an evaluation's is `eval`)."""
    if KIND[stage] == "eval" or stage == "premise":
        return cfg.eval
    return getattr(cfg, stage, None)


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


# Settings whose shipped values the reference figures were measured with.
MEMORY_KEYS = ("train.micro_batch_size", "train.grad_accum_steps", "train.pad_to_multiple", "model.gradient_checkpointing",
               "data.max_seq_len", "rollout.max_conversation_tokens", "rollout.batch_size", "rollout.kv_reuse_mb",
               "model.batch_size", "model.kv_reuse_mb", "batch_size", "lora.enabled")


def _value(section: Any, key: str) -> Any:
    for part in key.split("."):
        if section is None or not dataclasses.is_dataclass(section) or not hasattr(section, part):
            return None
        section = getattr(section, part)
    return section


def as_shipped(cfg: Any, shipped: Any, stage: str) -> bool:
    """Whether the stage runs the shipped model and memory-relevant settings (the reference's)."""
    if shipped is None or cfg.base_model != shipped.base_model:
        return False
    mine, theirs = stage_config(cfg, stage), stage_config(shipped, stage)
    return all(_value(mine, key) == _value(theirs, key) for key in MEMORY_KEYS)


def off_reference() -> str | None:
    """Why the reference figures do not price this machine, or None where they do. They were
    measured on a CPU computing in bfloat16 (AMX); a CPU without fast bfloat16 trains and plays in
    float32 (an SFT step of the demo took 29 s against the reference's 12.5 on 2026-12-02, on 2 cores
    of an AMD EPYC with AVX2 alone), and a GPU is another machine altogether."""
    if default_device() != "cpu":
        return "this run uses a GPU and the reference figures are of 2 CPU cores"
    if not fast_bf16("cpu"):
        return ("this CPU has no fast bfloat16 (AMX or AVX-512 BF16), so it computes in float32, and the reference "
                "figures are of one that has")
    return None


def unit_cost(cfg: Any, shipped: Any, stage: str, done: dict[str, dict]) -> dict | None:
    """{"seconds" a unit, "peak_mb", "source"} of `stage` (see the module docstring), or None.
    `done`: the finished stages' markers; `shipped`: the config demo.yaml ships."""
    kind = KIND[stage]
    for name, marker in reversed(list(done.items())):  # the stage itself (a re-run), else the latest of its kind
        size = marker.get("units")
        if KIND.get(name) == kind and marker.get("seconds") and marker.get("peak_rss_mb") and size:
            scoring = ((marker.get("figures") or {}).get("plateau") or {}).get("seconds", 0.0)  # not training
            return {"seconds": (marker["seconds"] - scoring) / size, "peak_mb": float(marker["peak_rss_mb"]),
                    "source": f"measured here ({name})"}
    if off_reference() is not None:
        return None
    if as_shipped(cfg, shipped, stage):
        return {**REFERENCE[kind], "source": "reference machine"}
    if kind == "vasd" and fewer_rollouts(cfg, shipped):  # the smoke run's: priced per rollout, its peak bounded
        share = rollouts(cfg.vasd) / rollouts(shipped.vasd)
        return {**REFERENCE[kind], "seconds": REFERENCE[kind]["seconds"] * share, "source": "reference machine"}
    return None


def rollouts(section: Any) -> int:
    return section.train.micro_batch_size * section.train.grad_accum_steps


def fewer_rollouts(cfg: Any, shipped: Any) -> bool:
    """Whether VASD runs the shipped settings but for fewer rollouts a step in micro-batches no
    larger than the shipped ones: its time scales with the rollouts, its peak is at most theirs."""
    if shipped is None or cfg.base_model != shipped.base_model:
        return False
    mine, theirs = cfg.vasd, shipped.vasd
    same = all(_value(mine, key) == _value(theirs, key) for key in MEMORY_KEYS
               if key not in ("train.micro_batch_size", "train.grad_accum_steps"))
    return same and mine.train.micro_batch_size <= theirs.train.micro_batch_size


def load_factor() -> tuple[float, str]:
    """How much slower than quiet this machine runs now: with a 1-minute load average of L others'
    runnable threads on C cores, the demo's C threads get C / (C + L) of them. The factor and a
    clause saying so (empty where the machine is quiet)."""
    import os

    try:
        load = os.getloadavg()[0]
    except OSError:
        return 1.0, ""
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    factor = 1.0 + max(load, 0.0) / cores
    if factor < 1.1:
        return 1.0, ""
    return factor, (f"; the reference figures x{factor:.1f} for this machine's load now (1-minute load average "
                    f"{load:.1f} on {cores} cores)")


def estimate(cfg: Any, shipped: Any, stage: str, done: dict[str, dict], control: float | None = None) -> dict | None:
    """{"minutes", "peak_mb", "source"} for `stage`, or None when nothing prices it. `control`: the
    control's steps when known; else what VASD's estimated time buys at SFT's cost a step."""
    cost = unit_cost(cfg, shipped, stage, done)
    if cost is None:
        return None
    if stage == "control" and control is None:
        vasd, sft = unit_cost(cfg, shipped, "vasd", done), cost
        control = cfg.control_steps or (vasd and cfg.vasd.train.max_steps * vasd["seconds"] / sft["seconds"]) or 0.0
    seconds = units(cfg, stage, control) * cost["seconds"] + dev_curve_seconds(cfg, shipped, stage, done)
    if cost["source"] == "reference machine":  # measured here: this machine's load is in its figures
        seconds = (seconds + STAGE_START_S) * load_factor()[0]
    return {"minutes": seconds / 60, "peak_mb": cost["peak_mb"], "source": cost["source"]}


def dev_curve_seconds(cfg: Any, shipped: Any, stage: str, done: dict[str, dict]) -> float:
    """The dev scores of a stage trained to its plateau (`dev.every`), at DEV_CONVERSATION_COST
    evaluation conversations each; 0 for the others."""
    section = getattr(cfg, stage, None) if KIND[stage] == "sft" and stage != "control" else None
    dev = getattr(section, "dev", None)
    if dev is None or not dev.every:
        return 0.0
    cost = unit_cost(cfg, shipped, "eval-start", done) or REFERENCE["eval"]
    scores = section.train.max_steps // dev.every + 1
    return DEV_CONVERSATION_COST * cost["seconds"] * scores * min(dev.data.limit or cfg.data.dev, cfg.data.dev) * len(dev.views)


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


def plan(cfg: Any, shipped: Any, stages: list[str], done: dict[str, dict],
         control: float | None = None) -> tuple[str, dict[str, dict | None]]:
    """A line with the estimated minutes and peak of `stages`, and each stage's estimate."""
    costs = {stage: estimate(cfg, shipped, stage, done, control) for stage in stages}
    known = {s: c for s, c in costs.items() if c is not None}
    why = off_reference()
    if not known:
        return ("estimate: no figures for these settings yet (they will come from the first stages)"
                + (f"; {why}" if why else "")), costs
    minutes = sum(c["minutes"] for c in known.values())
    peak = max(c["peak_mb"] for c in known.values())
    sources = sorted({c["source"].split(" (")[0] for c in known.values()})
    unknown = [s for s, c in costs.items() if c is None]
    loaded = load_factor()[1] if "reference machine" in sources else ""
    return (f"estimate: about {minutes:.0f} min for {len(known)} stage(s), peak {peak / 1024:.1f} GiB "
            f"({' and '.join(sources)} figures{loaded})" + (f"; not priced: {', '.join(unknown)}" if unknown else "")
            + (f" ({why})" if unknown and why else "")), costs
