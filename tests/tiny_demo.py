"""The demo's settings for a miniature run (the demo's tests and the stage 2 ablation's): the tiny
random model, a few instances, a step or two per stage, every stage in this process."""

from __future__ import annotations

from pathlib import Path

RECIPES = Path(__file__).resolve().parents[1] / "recipes" / "smollm2-135m-instruct"


def small(model, out) -> list[str]:
    return [f"base_model={model}", f"out={out}", "data.train=16", "data.dev=2", "data.test=4", "data.test_unseen=2",
            "warmup.train.max_steps=1", "sft.train.max_steps=1", "vasd.train.max_steps=1",
            "vasd.train.micro_batch_size=2", "vasd.rollout.max_new_tokens=4", "eval.max_new_tokens=4",
            "control.train.max_steps=1", "bootstrap=100", "stage_processes=false", "--quiet"]
