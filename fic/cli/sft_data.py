"""`fic sft-data --config YAML [key=value ...]`: build the multi-turn SFT corpus
(`fic.corpus.build`); `--show N` prints the first N conversations."""

from __future__ import annotations

import argparse

from fic.core.config import add_config_arguments, load_config, print_keys, resolved_yaml
from fic.core.records import read_records
from fic.corpus.build import SFTDataConfig, build_corpus, card_paths, plan


def format_record(record: dict) -> str:
    lines = [f"== {record['id']}  kind={record['kind']}  replies={','.join(record['reply_kinds'])}"]
    for message in record["messages"]:
        mark = "" if message["role"] != "assistant" or message["train"] else " (not trained)"
        lines.append(f"[{message['role']}{mark}] {message['content']}")
    return "\n".join(lines)


def add_arguments(parser: argparse.ArgumentParser, verb: str) -> None:
    add_config_arguments(parser, example="recipes/smollm2-135m-instruct/sft-data.yaml",
                         overrides_help="override settings, e.g. seed=1 recovery_share=0.3 user.kind=llm")
    parser.add_argument("--show", type=int, default=0, metavar="N", help="print the first N conversations")


def run(args: argparse.Namespace) -> int:
    if print_keys(args, SFTDataConfig):
        return 0
    cfg = load_config(SFTDataConfig, args.config, args.overrides)
    if args.dry_run:
        print(resolved_yaml(cfg) + plan(cfg)[2])
        return 0
    info = build_corpus(cfg)
    if args.show:
        for record in read_records(cfg.out)[:args.show]:
            print(format_record(record) + "\n")
    kinds = ", ".join(f"{n} {k}" for k, n in info["conversations_by_kind"].items())
    shares = ", ".join(f"{k} {s:.0%}" for k, s in info["reply_kind_shares"].items())
    print(f"wrote {info['conversations']} conversations ({kinds}) from {info['instances']} instances to {cfg.out}")
    print(f"replies: {shares}; data card: {card_paths(cfg.out)[0]}")
    excluded = info["evaluation_excluded"]
    if excluded["sources"]:
        print(f"evaluation data kept out ({', '.join(excluded['sources'])}): {excluded['dropped']} overlapping "
              "instances found and dropped")
    return 0
