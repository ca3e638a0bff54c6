"""`fic push PATH --repo-id USER/NAME`: a saved model or adapter folder (out/final, out/final-merged,
out/checkpoints/step-N/model: the model card FiC wrote is its README) or a JSONL dataset (out of
`fic shard` or `fic sft-data`, with its card) to the Hugging Face hub (`fic.core.push`). Training runs
push their final model themselves with `hub.push=true`."""

from __future__ import annotations

import argparse
from pathlib import Path

from fic.core.errors import FicError
from fic.core.push import check, plan, push


def add_arguments(parser: argparse.ArgumentParser, verb: str) -> None:
    parser.add_argument("path", metavar="PATH", help="a model folder or a JSONL dataset FiC wrote")
    parser.add_argument("--repo-id", required=True, metavar="USER/NAME",
                        help="the hub repository (a model repository for a model, a dataset repository for a "
                        "dataset); made if it does not exist")
    parser.add_argument("--public", action="store_true", help="make a new repository public (default: private)")
    parser.add_argument("--revision", default=None, metavar="BRANCH", help="the branch to push to (default: main)")
    parser.add_argument("--dry-run", action="store_true", help="say what would be uploaded, and check the token")


def run(args: argparse.Namespace) -> int:
    path = Path(args.path)
    if not path.exists():
        raise FicError("not found", path=str(path))
    line = plan(path, args.repo_id, private=not args.public, revision=args.revision)
    check(args.repo_id, field="--repo-id")
    if args.dry_run:
        print(f"fic push: would {line}")
        return 0
    print(f"fic push: {line}")
    print(f"pushed {path} to {push(path, args.repo_id, private=not args.public, revision=args.revision)}")
    return 0
