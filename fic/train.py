"""`fic train METHOD --config YAML [key=value ...]`: a thin wrapper over the recipe scripts.

The recipes are plain scripts (`accelerate launch fic/train_sft.py --config ...` on many
GPUs); this verb runs the same `main` in this process, for a single CPU or GPU.
"""

from __future__ import annotations

import argparse
import importlib

METHODS = {"sft": "fic.train_sft"}


def add_arguments(parser: argparse.ArgumentParser, verb: str) -> None:
    parser.add_argument("method", choices=sorted(METHODS), help="training method")
    parser.add_argument("--config", required=True, help="recipe YAML, e.g. recipes/smollm2-135m-instruct/sft.yaml")
    parser.add_argument("overrides", nargs="*", metavar="key=value", help="override recipe settings")


def run(args: argparse.Namespace) -> int:
    return int(importlib.import_module(METHODS[args.method]).main(["--config", args.config, *args.overrides]) or 0)
