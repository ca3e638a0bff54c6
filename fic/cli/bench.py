"""`fic bench NAME [--json]`: benchmarks that measure and print figures.

Each benchmark lives in its own module with `add_arguments(parser)` and
`measure(args) -> dict`; the dict holds its figures, the headline one under `ratio`.
With `--json` the figures are printed as one JSON object, else one `name: value` a line.
"""

from __future__ import annotations

import argparse
import importlib
import json

BENCHES: dict[str, tuple[str, str]] = {
    "rollout": ("fic.bench.rollout", "conversations played one at a time vs in lockstep batches"),
    "sft": ("fic.bench.sft", "FiC's SFT step vs TRL's SFTTrainer: target tokens/s on the same model and data"),
    "vasd": ("fic.bench.vasd", "a VASD step's phases, its overhead over bare passes, and the chunked divergence's "
             "memory"),
    "zero": ("fic.bench.zero", "SFT and VASD under DeepSpeed ZeRO-2/3 on one process: a checkpoint saved, resumed, "
             "and the losses after the resume equal to the uninterrupted run's; --processes N: SFT and VASD on N CPU "
             "processes under DDP, ZeRO-2, ZeRO-3 and FSDP2 equal to one process"),
    "decode": ("fic.bench.decode", "the hf decoding loop alone, old and new, against transformers' generate: ms "
               "and host waits a step, greedy and sampled"),
    "sigterm": ("fic.bench.sigterm", "how long fic eval and fic train sft take to end after a SIGTERM, under a "
                "load of busy processes (the documented bound: 3 s)"),
}


def add_arguments(parser: argparse.ArgumentParser, verb: str) -> None:
    sub = parser.add_subparsers(dest="bench", metavar="NAME", required=True)
    for name, (module, help_text) in BENCHES.items():
        bench_parser = sub.add_parser(name, help=help_text, description=help_text)
        bench_parser.add_argument("--json", action="store_true", help="print the figures as one JSON object")
        importlib.import_module(module).add_arguments(bench_parser)


def run(args: argparse.Namespace) -> int:
    print_figures(importlib.import_module(BENCHES[args.bench][0]).measure(args), args.json)
    return 0


def print_figures(figures: dict, as_json: bool) -> None:
    """A benchmark's figures as one JSON object, or one `name: value` a line."""
    if as_json:
        print(json.dumps(figures))
    else:
        for name, value in figures.items():
            print(f"{name}: {value:.4g}" if isinstance(value, float) else f"{name}: {value}")
