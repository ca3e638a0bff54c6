"""The data verbs: `prepare-model`, `shard`, `views`, `masks`."""

from __future__ import annotations

import argparse
from collections import Counter
from pathlib import Path

from tqdm import tqdm

from fic.errors import FicError


def add_arguments(parser: argparse.ArgumentParser, verb: str) -> None:
    if verb == "prepare-model":
        parser.add_argument("--out", default=None, help="output folder (default: models/smollm2-135m-instruct)")
        parser.add_argument("--force", action="store_true", help="rebuild even if the folder is already prepared")
    elif verb == "shard":
        parser.add_argument("--source", required=True,
                            help="lic:PATH, gsm8k[:SPLIT|:PATH], reasoning-gym:NAME or jsonl:PATH")
        parser.add_argument("--task", default="math", help="task of the instances (default: math)")
        parser.add_argument("--out", required=True, help="output JSONL file (LiC schema, one instance a line)")
        parser.add_argument("--sharder", default="rule", choices=["rule"],
                            help="how to shard instances that have no shards yet (default: rule)")
        parser.add_argument("--limit", type=int, default=None, help="at most this many instances")
        parser.add_argument("--seed", type=int, default=0, help="seed for generated sources and phrasing")
        parser.add_argument("--reshard", action="store_true",
                            help="re-shard instances that already have shards instead of keeping them")
    elif verb == "views":
        parser.add_argument("--data", required=True, help="sharded instances (JSONL or LiC JSON)")
        parser.add_argument("--view", required=True, help="full, concat, shuffle-concat, sharded, recap or snowball")
        parser.add_argument("--out", default=None, help="output JSONL file of rendered views")
        parser.add_argument("--show", type=int, default=0, metavar="N", help="print the first N rendered views")
        parser.add_argument("--seed", type=int, default=0, help="seed of the shuffle-concat order")
    elif verb == "masks":
        parser.add_argument("--model", required=True, help="model or tokenizer folder whose chat template is used")
        parser.add_argument("--data", required=True,
                            help="JSONL of conversations with a 'messages' list (e.g. an SFT corpus)")
        parser.add_argument("--show", type=int, default=1, metavar="N", help="how many conversations to print")
        parser.add_argument("--trust-remote-code", action="store_true", help="allow custom tokenizer code")


def run(args: argparse.Namespace) -> int:
    return {"prepare-model": prepare_model, "shard": shard, "views": views, "masks": masks}[args.verb](args)


def prepare_model(args: argparse.Namespace) -> int:
    from fic.model import BUNDLED_MODEL_DIR, prepare_model as prepare

    out = prepare(Path(args.out) if args.out else BUNDLED_MODEL_DIR, force=args.force)
    print(f"bundled model ready in {out}")
    return 0


def shard(args: argparse.Namespace) -> int:
    from fic.files import write_jsonl
    from fic.sharding import ShardingError, shard_rule
    from fic.sources import load_source

    if args.limit is not None and args.limit < 1:
        raise FicError(f"expected a positive number, got {args.limit}", field="--limit")
    instances = load_source(args.source, args.task, limit=args.limit, seed=args.seed)
    kept, rejected, reasons = [], [], Counter()
    for instance in tqdm(instances, desc="sharding", unit="inst", disable=None):
        if instance.is_sharded and not args.reshard:
            kept.append(instance)
            continue
        try:
            kept.append(shard_rule(instance, seed=args.seed))
        except ShardingError as err:
            reasons[err.message] += 1
            rejected.append({**instance.to_dict(), "rejected_reason": err.message})
    if not kept:
        raise FicError(f"no instance could be sharded ({dict(reasons)})", field="--source")
    count = write_jsonl(args.out, (instance.to_dict() for instance in kept))
    print(f"wrote {count} sharded instances to {args.out}")
    if rejected:
        rejected_path = Path(args.out).with_suffix(".rejected.jsonl")
        write_jsonl(rejected_path, rejected)
        summary = "; ".join(f"{n} x {reason}" for reason, n in reasons.most_common())
        print(f"dropped {len(rejected)} that could not be sharded ({summary}); see {rejected_path}")
    return 0


def load_sharded(path: str) -> list:
    """Sharded instances of any task from a JSONL or LiC JSON file."""
    from fic.files import read_records
    from fic.instance import Instance

    return [Instance.from_dict(record, path=path, record_no=number)
            for number, record in enumerate(read_records(path), start=1)]


def views(args: argparse.Namespace) -> int:
    from fic.files import write_jsonl
    from fic.views import VIEWS, format_view, render_view

    if args.view not in VIEWS:
        raise FicError(f"expected one of {', '.join(VIEWS)}, got {args.view!r}", field="--view")
    records = [render_view(instance, args.view, seed=args.seed) for instance in load_sharded(args.data)]
    for record in records[: args.show]:
        print(format_view(record) + "\n")
    if args.out:
        write_jsonl(args.out, records)
        print(f"wrote {len(records)} {args.view} views to {args.out}")
    elif not args.show:
        raise FicError("nothing to do: give --out FILE and/or --show N", field="--out")
    return 0


def masks(args: argparse.Namespace) -> int:
    from fic.chat import format_masks, render_chat
    from fic.files import read_records
    from fic.model import load_tokenizer

    tokenizer = load_tokenizer(args.model, trust_remote_code=args.trust_remote_code)
    records = read_records(args.data)
    for number, record in enumerate(records[: args.show], start=1):
        messages = record.get("messages")
        if not isinstance(messages, list) or not messages:
            raise FicError("expected a non-empty 'messages' list", path=args.data, record=number, field="messages")
        print(f"== {args.data} record {number}")
        print(format_masks(tokenizer, render_chat(tokenizer, messages)) + "\n")
    return 0
