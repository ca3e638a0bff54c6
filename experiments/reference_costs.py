"""The reference machine's price list: what the ablation's `--dry-run` estimates from before
anything has run in its folder.

`fic demo` prices its stages only from what finished in its own folder (`fic.demo.costs`). The
ablation plans many runs at once, so before its first run it falls back on the figures of one
machine, the reference machine (2 quiet cores with AMX, the bundled SmolLM2-135M, the shipped
demo.yaml), written here as the stage markers that machine left; they apply only where a stage
runs the shipped model and memory-relevant settings and this machine computes as that one did
(a CPU with fast bfloat16: `off_reference` says why not).
"""

from __future__ import annotations

import dataclasses
from typing import Any

from fic.core.model import default_device, fast_bf16
from fic.demo.costs import KIND

# Reference machine, the shipped demo.yaml: seconds a unit and the stage's peak resident MiB, from
# the whole demo of 2026-12-02 (docs/results.md): data 29 s with the model's first preparation; SFT
# 12.2 s a training step (warm-up 15.1 with its load and save), 5.3 GB with the dev probe; VASD 53.2 s
# a step, 8.0 GB; evaluation 0.84-0.90 s a conversation with kv_reuse_mb=1024, 5.3 GB; the premise
# check 1.56 s a dev instance.
REFERENCE = {
    "data": {"seconds": 30.0, "peak_mb": 2000},
    "sft": {"seconds": 12.5, "peak_mb": 5300},
    "vasd": {"seconds": 53.2, "peak_mb": 8200},
    "premise": {"seconds": 1.6, "peak_mb": 4200},
    "eval": {"seconds": 0.87, "peak_mb": 5400},
}
# A dev-curve conversation against an evaluation's average one: float32 weights and the sharded view,
# the longest (2026-12-02: 3.4 s against 0.9).
DEV_CONVERSATION_COST = 3.8

# Settings whose shipped values the reference figures were measured with.
MEMORY_KEYS = ("train.micro_batch_size", "train.grad_accum_steps", "train.pad_to_multiple", "model.gradient_checkpointing",
               "data.max_seq_len", "rollout.max_conversation_tokens", "rollout.batch_size", "rollout.kv_reuse_mb",
               "model.batch_size", "model.kv_reuse_mb", "batch_size", "lora.enabled")


def stage_config(cfg: Any, stage: str) -> Any:
    """The stage's own config section (an evaluation's is `eval`)."""
    if KIND[stage] == "eval" or stage == "premise":
        return cfg.eval
    return getattr(cfg, stage, None)


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


def reference_markers(cfg: Any, shipped: Any) -> dict[str, dict]:
    """The stage markers the reference machine left, one per stage that runs as shipped, for
    `fic.demo.costs` to price from (put them before this folder's markers, which then win); none
    where `off_reference` says this machine is another."""
    if off_reference() is not None:
        return {}
    markers = {}
    for stage, kind in KIND.items():
        if not as_shipped(cfg, shipped, stage):
            continue
        figures = REFERENCE[kind]
        marker = {"stage": stage, "seconds": figures["seconds"], "units": 1, "peak_rss_mb": figures["peak_mb"],
                  "source": "reference machine"}
        if kind == "sft":  # one dev-curve conversation, scored beside the step (and not counted in it)
            dev = DEV_CONVERSATION_COST * REFERENCE["eval"]["seconds"]
            marker["seconds"] += dev
            marker["figures"] = {"plateau": {"seconds": dev, "curve": [None], "instances": 1, "views": ["sharded"]}}
        markers[f"reference {stage}"] = marker
    return markers
