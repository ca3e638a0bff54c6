"""`fic launch-check`: find a mistake in a launch set-up before any GPU job starts.

    fic launch-check --config_file launch/deepspeed_zero2.yaml --recipe recipes/<backbone>/sft.yaml \
        [--script fic/train_sft.py] [--num_processes N] [--num_machines M] [--global_batch B] [key=value ...]

The scripts in `launch/` run it before they start anything, so a wrong file costs a second on
the login node instead of a queue wait and a model load on every node. It reads YAML and JSON
only: importing torch or accelerate here would make the check slow, and able to fail for the
very reasons it looks for.

Each mistake is a `FicError` (one line naming the file, the key and what was expected; exit 2):
a missing file; a `distributed_type` FiC's trainers do not run under; a ZeRO stage other than
2 or 3; FSDP other than version 2 (`fsdp_config.fsdp_version`), or with a state-dict type FiC does not
save; `gradient_accumulation_steps` set in the accelerate or DeepSpeed config (the recipe's
`train.grad_accum_steps` owns it); a process count that does not fill `num_machines` nodes of
`--gpus_per_node` GPUs; multi-node DeepSpeed without the `standard` launcher; and a global
batch (`--global_batch`, or a DeepSpeed JSON's `train_batch_size`) that processes x micro-batch
does not divide.

On success it prints one summary line on stderr. With `--global_batch B` it also prints, on
stdout, the override that keeps B conversations per optimizer step at this GPU count
(`train.grad_accum_steps=K`): the launch scripts append it to the training command.
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Sequence

from fic.core.config import read_yaml, yaml_value
from fic.core.errors import FicError
from fic.core.files import read_json

# The set-ups FiC's trainers are written and tested for (accelerate's names).
DISTRIBUTED_TYPES = ("NO", "MULTI_GPU", "DEEPSPEED", "FSDP")
ZERO_STAGES = (2, 3)
FSDP_VERSIONS = (2,)  # fully_shard; FSDP1's wrapper is not what FiC's checkpoints and final model are tested on
FSDP_STATE_DICTS = ("SHARDED_STATE_DICT", "FULL_STATE_DICT")
GPUS_PER_NODE = 8  # an A100 node
OWNED_BY_RECIPE = ("remove it: the recipe's train.grad_accum_steps sets the accumulation, and a second "
                   "setting would move where optimizer steps fall")


@dataclass
class Launch:
    """What a launch will run: the accelerate set-up and the recipe's batch."""

    distributed_type: str
    machines: int
    processes: int
    zero_stage: int | None
    micro_batch: int | None
    grad_accum: int | None

    @property
    def global_batch(self) -> int | None:
        if self.micro_batch is None or self.grad_accum is None:
            return None
        return self.processes * self.micro_batch * self.grad_accum

    def summary(self) -> str:
        zero = f" ZeRO-{self.zero_stage}" if self.zero_stage else " version 2" if self.distributed_type == "FSDP" else ""
        where = f"{self.processes} process{'es' if self.processes > 1 else ''} on {self.machines} " \
                f"machine{'s' if self.machines > 1 else ''}"
        if self.global_batch is None:
            return f"{self.distributed_type}{zero}, {where}"
        return (f"{self.distributed_type}{zero}, {where} x micro-batch {self.micro_batch} x accumulation "
                f"{self.grad_accum} = {self.global_batch} conversations per optimizer step")


def _file(path: str | Path, what: str) -> Path:
    path = Path(path)
    if not path.is_file():
        raise FicError(f"{what} not found", path=str(path))
    return path


def _positive_int(value: Any, path: str, field: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise FicError(f"expected a positive integer, got {value!r}", path=path, field=field)
    return value


def _recipe_batch(recipe: Path, overrides: Sequence[str]) -> tuple[int | None, int | None, str]:
    """The recipe's train.micro_batch_size and train.grad_accum_steps after `key=value` overrides
    (None where neither states it), and where the values were read."""
    train = read_yaml(recipe).get("train") or {}
    if not isinstance(train, dict):
        raise FicError("expected a mapping", path=str(recipe), field="train")
    values = {"micro_batch_size": train.get("micro_batch_size"), "grad_accum_steps": train.get("grad_accum_steps")}
    source = str(recipe)
    for text in overrides:
        key, sep, raw = text.partition("=")
        if not sep:
            raise FicError(f"expected key=value, got {text!r}", path="command line")
        if key in ("train.micro_batch_size", "train.grad_accum_steps"):
            values[key.split(".", 1)[1]] = yaml_value(raw, key)
            source = f"{recipe} (with command-line overrides)"
    micro, accum = (None if values[k] is None else _positive_int(values[k], source, f"train.{k}")
                    for k in ("micro_batch_size", "grad_accum_steps"))
    return micro, accum, source


def _deepspeed_json(name: str) -> dict:
    """The DeepSpeed JSON a launch config names (relative to the working directory, as accelerate reads it)."""
    path = _file(name, "DeepSpeed config file (deepspeed_config.deepspeed_config_file)")
    data = read_json(path, "a DeepSpeed JSON config")
    if not isinstance(data, dict):
        raise FicError("expected a JSON object", path=str(path))
    return data


def _check_divides(batch: int, launch: Launch, path: str, field: str) -> int:
    """Accumulation steps that make `batch` conversations per optimizer step, or a FicError."""
    unit = launch.processes * launch.micro_batch
    if batch % unit:
        raise FicError(f"a global batch of {batch} conversations is not divisible by {launch.processes} "
                       f"processes x train.micro_batch_size {launch.micro_batch} = {unit}; use a GPU count "
                       "or micro-batch whose product divides it", path=path, field=field)
    return batch // unit


def _check_processes(kind: str, machines: int, processes: int, gpus_per_node: int, where: str, given: str) -> None:
    if kind == "NO" and processes != 1:
        raise FicError(f"distributed_type NO runs one process, got {processes}{given}", path=where,
                       field="num_processes")
    if machines > 1 and processes != machines * gpus_per_node:
        raise FicError(f"expected num_machines x {gpus_per_node} GPUs = {machines * gpus_per_node} processes "
                       f"(one per GPU on every node), got {processes}{given}", path=where, field="num_processes")
    if machines == 1 and processes > gpus_per_node:
        raise FicError(f"expected at most {gpus_per_node} processes on one machine (one per GPU), "
                       f"got {processes}{given}", path=where, field="num_processes")


def _check_deepspeed(config: dict, where: str, machines: int) -> tuple[int, dict, str]:
    """The ZeRO stage, the DeepSpeed JSON the config names ({} for none) and its path."""
    section = config.get("deepspeed_config") or {}
    if not isinstance(section, dict):
        raise FicError("expected a mapping", path=where, field="deepspeed_config")
    json_path = str(section.get("deepspeed_config_file") or "")
    ds_json = _deepspeed_json(json_path) if json_path else {}
    if section.get("gradient_accumulation_steps") is not None:
        raise FicError(OWNED_BY_RECIPE, path=where, field="deepspeed_config.gradient_accumulation_steps")
    if ds_json.get("gradient_accumulation_steps", "auto") != "auto":
        raise FicError(f'expected "auto" or no key: {OWNED_BY_RECIPE}', path=json_path,
                       field="gradient_accumulation_steps")
    if ds_json:  # accelerate then reads the stage from the JSON only
        stage, stage_path, stage_field = ((ds_json.get("zero_optimization") or {}).get("stage"), json_path,
                                          "zero_optimization.stage")
    else:
        stage, stage_path, stage_field = section.get("zero_stage"), where, "deepspeed_config.zero_stage"
    if stage not in ZERO_STAGES:
        raise FicError(f"expected ZeRO stage 2 or 3, got {stage!r}", path=stage_path, field=stage_field)
    launcher = section.get("deepspeed_multinode_launcher", "pdsh")  # accelerate's default
    if machines > 1 and launcher != "standard":
        raise FicError(f"expected 'standard' on {machines} machines, got {launcher!r}: the launch scripts "
                       "start one launcher per node, and pdsh would ssh into the nodes again",
                       path=where, field="deepspeed_config.deepspeed_multinode_launcher")
    return stage, ds_json, json_path


def _check_fsdp(config: dict, where: str) -> None:
    section = config.get("fsdp_config") or {}
    if not isinstance(section, dict):
        raise FicError("expected a mapping", path=where, field="fsdp_config")
    version = section.get("fsdp_version", 1)  # accelerate's default is FSDP1
    if version not in FSDP_VERSIONS:
        raise FicError(f"expected FSDP version 2 (fully_shard, what FiC is tested under), got {version!r}",
                       path=where, field="fsdp_config.fsdp_version")
    state = section.get("fsdp_state_dict_type", "FULL_STATE_DICT")
    if state not in FSDP_STATE_DICTS:
        raise FicError(f"expected one of {', '.join(FSDP_STATE_DICTS)}, got {state!r}", path=where,
                       field="fsdp_config.fsdp_state_dict_type")
    if section.get("gradient_accumulation_steps") is not None:
        raise FicError(OWNED_BY_RECIPE, path=where, field="fsdp_config.gradient_accumulation_steps")


def check(config_file: str | Path, recipe: str | Path, *, script: str | Path | None = None,
          num_processes: int | None = None, num_machines: int | None = None, gpus_per_node: int = GPUS_PER_NODE,
          global_batch: int | None = None, overrides: Sequence[str] = ()) -> tuple[Launch, int | None]:
    """Check a launch; return what it will run and, with `global_batch`, the accumulation steps
    that keep that batch. `num_processes`/`num_machines` are the command-line values that
    override the file's, as in `accelerate launch`."""
    config_path = _file(config_file, "launch config")
    recipe_path = _file(recipe, "recipe")
    if script is not None:
        _file(script, "training script")
    where = str(config_path)
    config = read_yaml(config_path)

    kind = config.get("distributed_type", "NO")
    if kind not in DISTRIBUTED_TYPES:
        raise FicError(f"expected one of {', '.join(DISTRIBUTED_TYPES)} (what FiC's trainers run under), "
                       f"got {kind!r}", path=where, field="distributed_type")
    if config.get("gradient_accumulation_steps") is not None:
        raise FicError(OWNED_BY_RECIPE, path=where, field="gradient_accumulation_steps")
    machines = _positive_int(num_machines if num_machines is not None else config.get("num_machines", 1),
                             where, "num_machines")
    processes = _positive_int(num_processes if num_processes is not None else config.get("num_processes", 1),
                              where, "num_processes")
    _check_processes(kind, machines, processes, gpus_per_node, where,
                     " (from --num_processes)" if num_processes is not None else "")
    stage, ds_json, json_path = _check_deepspeed(config, where, machines) if kind == "DEEPSPEED" else (None, {}, "")
    if kind == "FSDP":
        _check_fsdp(config, where)

    micro, accum, recipe_source = _recipe_batch(recipe_path, overrides)
    launch = Launch(kind, machines, processes, stage, micro, accum)
    wanted_accum = None
    if global_batch is not None:
        if micro is None:
            raise FicError("state the micro-batch so the launch can divide the global batch",
                           path=recipe_source, field="train.micro_batch_size")
        wanted_accum = _check_divides(_positive_int(global_batch, "command line", "--global_batch"), launch,
                                      "command line", "--global_batch")
        launch.grad_accum = wanted_accum
    ds_batch = ds_json.get("train_batch_size", "auto")
    if ds_batch != "auto" and micro is not None:  # DeepSpeed would refuse a mismatch only after loading the model
        needed = _check_divides(_positive_int(ds_batch, json_path, "train_batch_size"), launch, json_path,
                                "train_batch_size")
        if launch.grad_accum is not None and needed != launch.grad_accum:
            raise FicError(f"{ds_batch} conversations per step, but the launch makes {launch.global_batch}; "
                           'set it to "auto" (the recipe decides) or train.grad_accum_steps to '
                           f"{needed}", path=json_path, field="train_batch_size")
    return launch, wanted_accum


def add_arguments(parser: argparse.ArgumentParser, verb: str) -> None:
    parser.add_argument("--config_file", required=True, help="accelerate launch config, e.g. launch/deepspeed_zero2.yaml")
    parser.add_argument("--recipe", required=True, help="training recipe, e.g. recipes/<backbone>/sft.yaml")
    parser.add_argument("--script", default=None, help="training script that will run (checked to exist)")
    parser.add_argument("--num_processes", type=int, default=None, help="processes in all (overrides the file)")
    parser.add_argument("--num_machines", type=int, default=None, help="nodes (overrides the file)")
    parser.add_argument("--gpus_per_node", type=int, default=GPUS_PER_NODE, help="GPUs on each node (default 8)")
    parser.add_argument("--global_batch", type=int, default=None,
                        help="conversations per optimizer step to keep: prints train.grad_accum_steps=K on stdout")
    parser.add_argument("overrides", nargs="*", metavar="key=value", help="the recipe overrides the launch passes")


def run(args: argparse.Namespace) -> int:

    launch, accum = check(args.config_file, args.recipe, script=args.script, num_processes=args.num_processes,
                          num_machines=args.num_machines, gpus_per_node=args.gpus_per_node,
                          global_batch=args.global_batch, overrides=args.overrides)
    print(f"fic launch-check: ok: {args.config_file} + {args.recipe}: {launch.summary()}", file=sys.stderr)
    if accum is not None:
        print(f"train.grad_accum_steps={accum}")
    return 0
