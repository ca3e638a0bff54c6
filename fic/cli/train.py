"""`fic train METHOD --config YAML [key=value ...]`: a thin wrapper over the recipe scripts.

The recipes are plain scripts (`accelerate launch fic/train_sft.py --config ...` on many
GPUs); this verb runs the same `main` in this process, for a single CPU or GPU.
"""

from __future__ import annotations

import argparse
import importlib

METHODS = {"sft": "fic.train_sft", "vasd": "fic.train_vasd"}


def add_arguments(parser: argparse.ArgumentParser, verb: str) -> None:
    parser.add_argument("method", choices=sorted(METHODS), help="training method")
    # REMAINDER, not nargs="*": argparse would fill an empty override list next to `method`
    # and then refuse everything after --config.
    parser.add_argument("args", nargs=argparse.REMAINDER, metavar="--config YAML [key=value ...]",
                        help="recipe YAML and overrides, e.g. --config recipes/smollm2-135m-instruct/sft.yaml "
                        "train.max_steps=10")


def run(args: argparse.Namespace) -> int:
    return int(importlib.import_module(METHODS[args.method]).main(args.args) or 0)
