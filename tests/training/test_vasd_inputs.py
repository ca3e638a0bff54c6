"""What a VASD run reads before it trains (`fic.training.vasd.inputs`): rollout tasks never
include the evaluation's instances, and the held-out dev tasks are drawn with their own seed."""

from __future__ import annotations

import json

import pytest

from fic.core.config import load_config
from fic.core.errors import FicError
from fic.training.vasd.config import VASDConfig


def test_rollout_tasks_never_include_the_evaluation_instances(tmp_path):
    from fic.training.vasd.inputs import load_rollout_tasks as load_instances

    held_out = tmp_path / "eval.jsonl"
    settings = ["data.source=reasoning-gym:gsm_symbolic", "data.limit=12", "data.seed=9", "anchor.share=0",
                "train.max_steps=1"]
    everything, _, none_dropped = load_instances(load_config(VASDConfig, None, settings))
    assert none_dropped["dropped"] == 0
    picked = everything[3:7]
    held_out.write_text("".join(json.dumps(i.to_dict()) + "\n" for i in picked))
    cfg = load_config(VASDConfig, None, [*settings, f"exclude.sources=[jsonl:{held_out}]"])
    instances, _, overlap = load_instances(cfg)
    assert overlap["dropped"] == 4 and not {i.task_id for i in instances} & {i.task_id for i in picked}
    cfg.exclude.on_overlap = "refuse"
    with pytest.raises(FicError, match="overlap|evaluation"):
        load_instances(cfg)


def test_held_out_tasks_are_drawn_with_the_evals_own_seed_and_an_overlap_is_refused():
    """The in-training held-out set used to be drawn with the training seed: from a generated
    source, every held-out instance was a rollout task. dev.data has its own seed; an overlap
    with the rollout tasks is refused in one line, before any model loads."""
    from fic.training.vasd.inputs import load_held_out, load_rollout_tasks

    common = ["data.source=reasoning-gym:gsm_symbolic", "data.limit=16", "data.seed=9", "anchor.share=0",
              "train.max_steps=1", "dev.every=1", "dev.data.source=reasoning-gym:gsm_symbolic", "dev.data.limit=8"]
    cfg = load_config(VASDConfig, None, [*common, "dev.data.seed=3"])
    rollout_tasks, _, _ = load_rollout_tasks(cfg)
    held_out = load_held_out(cfg, rollout_tasks)
    assert len(held_out) == 8
    assert not {i.task_id for i in held_out} & {i.task_id for i in rollout_tasks}
    assert not {i.fields["question"] for i in held_out} & {i.fields["question"] for i in rollout_tasks}
    same_seed = load_config(VASDConfig, None, [*common, "dev.data.seed=9"])
    with pytest.raises(FicError, match=r"(\d+) of \1 held-out instances are rollout tasks too") as err:
        load_held_out(same_seed, load_rollout_tasks(same_seed)[0])
    assert "\n" not in str(err.value) and err.value.field == "dev.data"
