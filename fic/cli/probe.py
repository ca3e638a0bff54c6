"""`fic probe --config YAML [key=value ...]`: interaction awareness (`fic.probe.run`); prints the
follow-up table, the single-turn accuracy per dataset and where the report is."""

from __future__ import annotations

import argparse
from pathlib import Path

from fic.core.config import add_config_arguments, load_cli_config, print_keys, resolved_yaml
from fic.probe.report import REPORT_NAME, follow_up_table
from fic.probe.run import ProbeConfig, plan, probe


def add_arguments(parser: argparse.ArgumentParser, verb: str) -> None:
    add_config_arguments(parser, example="recipes/smollm2-135m-instruct/probe.yaml",
                         overrides_help="override settings, e.g. model.model=CKPT baseline=runs/probe-base "
                         "out=runs/probe-sft")
    parser.add_argument("--quiet", action="store_true", help="no progress bars")


def run(args: argparse.Namespace) -> int:
    if print_keys(args, ProbeConfig):
        return 0
    cfg = load_cli_config(ProbeConfig, args.config, args.overrides)
    if args.dry_run:
        print(resolved_yaml(cfg) + plan(cfg))
        return 0
    metrics = probe(cfg, progress=not args.quiet)
    print("\n".join(follow_up_table(metrics)))
    for dataset, figures in metrics["datasets"].items():
        acc = figures["accuracy"]
        print(f"task accuracy on {dataset}: {100 * acc['rate']:.1f}% of {acc['n']} single-turn replies")
    phases = ", ".join(f"{name.replace('_', ' ')} {seconds:.0f} s" for name, seconds in metrics["phases_s"].items())
    print(f"judge: {metrics['judge']['description']}; {metrics['elapsed_s']:.0f} s ({phases})")
    print(f"report: {Path(cfg.out) / REPORT_NAME}")
    return 0
