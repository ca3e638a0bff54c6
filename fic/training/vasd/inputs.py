"""What a VASD run reads before it trains: its files checked, the rollout tasks (none of the
evaluation's), the held-out tasks, and the settings only the tokenizer can check.

`check_inputs` runs before the model loads, so a wrong path fails in a second.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

from fic.backends.vllm import import_vllm
from fic.core.errors import FicError
from fic.core.files import check_writable
from fic.core.instance import Instance
from fic.core.model import check_model_folder
from fic.data.sources import InstancesSection, load_sharded
from fic.data.splits import exclude_instances, prompt_key
from fic.training.vasd.config import VASDConfig
from fic.training.vasd.prompts import teacher_prompts, teacher_views


def check_inputs(cfg: VASDConfig) -> None:
    """Missing or wrong files and an output folder that cannot be written."""
    check_writable(cfg.out, folder=True, field="out")
    folder = Path(cfg.model.path)
    if (folder / "adapter_config.json").is_file() and not (folder / "config.json").is_file():
        raise FicError("is a LoRA adapter, not a model; start VASD from the merged SFT model "
                       "(train SFT with save_merged=true and use out/final-merged)", path=str(folder), field="model.path")
    check_model_folder(cfg.model.path)
    if cfg.anchor.share > 0 and not Path(cfg.anchor.path).is_file():
        raise FicError("SFT corpus not found (make one with `fic sft-data`)", path=cfg.anchor.path,
                       field="anchor.path")
    if cfg.rollout.backend == "vllm":
        import_vllm()


def multi_turn_instances(data: InstancesSection, section: str) -> list[Instance]:
    """The instances of `data`, sharded where needed, with at least two shards (one shard is
    nothing to reveal over several turns); none at all is an error that says what was dropped."""
    loaded = load_sharded(data, section=section, several_shards=True)
    if not loaded.instances:
        reasons = "; ".join(f"{n} x {why}" for why, n in loaded.dropped.items()) or "the sources are empty"
        raise FicError(f"no instance with two or more shards in {', '.join(data.source)} ({reasons})",
                       field=f"{section}.source")
    return loaded.instances


def load_rollout_tasks(cfg: VASDConfig) -> tuple[list[Instance], str, dict]:
    """The rollout instances (none of the evaluation's), a digest of them for resume checks, and
    the overlap with the evaluation data that was dropped."""
    instances, overlap = exclude_instances(multi_turn_instances(cfg.data, "data"), cfg.exclude)
    if not instances:
        raise FicError(f"no instance with two or more shards in {', '.join(cfg.data.source)} outside the excluded "
                       "evaluation data", field="data.source")
    digest = hashlib.sha256("\n".join(json.dumps(i.to_dict(), sort_keys=True) for i in instances).encode())
    return instances, digest.hexdigest(), overlap


def load_held_out(cfg: VASDConfig, rollout_tasks: list[Instance]) -> list[Instance]:
    """The held-out tasks of the in-training evaluation (`dev.data`, drawn with its own seed);
    an overlap with the rollout tasks is an error, not a silently inflated figure."""
    if not cfg.dev.every:
        return []
    held_out = multi_turn_instances(cfg.dev.data, "dev.data")
    training = {i.task_id for i in rollout_tasks}
    prompts = {prompt_key(i) for i in rollout_tasks}
    shared = [i.task_id for i in held_out if i.task_id in training or prompt_key(i) in prompts]
    if shared:
        raise FicError(f"{len(shared)} of {len(held_out)} held-out instances are rollout tasks too (e.g. "
                       f"{shared[0]}); give dev.data another source or seed, or name it in exclude.sources",
                       field="dev.data")
    return held_out


def check_against_tokenizer(cfg: VASDConfig, tokenizer: Any, instances: list[Instance]) -> None:
    """Settings that only the tokenizer and data can check, before any model loads."""
    if cfg.loss.estimator == "topk" and cfg.loss.top_k >= len(tokenizer):
        raise FicError(f"top_k {cfg.loss.top_k} is not below the vocabulary size {len(tokenizer)}",
                       field="loss.top_k")
    for instance in instances[:8]:  # one bad instance is enough to tell the user the view cannot be rendered
        try:
            teacher_prompts(tokenizer, instance, teacher_views(cfg))
        except FicError as err:
            raise FicError(f"teacher view {cfg.teacher.view!r} cannot be rendered for {instance.task_id}: "
                           f"{err.message}", field="teacher.view") from None
