"""`fic eval --config YAML [key=value ...]`: play conversations in each view and report
(`fic.evaluation.evaluate`); prints P, A90 and U90_10 per view and the recovery rate."""

from __future__ import annotations

import argparse
import time
from pathlib import Path

from fic.core.config import add_config_arguments, load_cli_config, print_keys, resolved_yaml
from fic.core.errors import sigterm_note
from fic.evaluation.evaluate import LOG_NAME, REPORT_NAME, EvalConfig, evaluate, plan


def add_arguments(parser: argparse.ArgumentParser, verb: str) -> None:
    add_config_arguments(parser, example="recipes/smollm2-135m-instruct/eval.yaml",
                         overrides_help="override settings, e.g. out=runs/x runs=3")
    parser.add_argument("--quiet", action="store_true", help="no progress bar")


def run(args: argparse.Namespace) -> int:
    if print_keys(args, EvalConfig):
        return 0
    cfg = load_cli_config(EvalConfig, args.config, args.overrides)
    if args.dry_run:
        print(resolved_yaml(cfg) + plan(cfg))
        return 0
    started = time.perf_counter()
    with sigterm_note(lambda: _kept(Path(cfg.out) / LOG_NAME)):
        metrics = evaluate(cfg, progress=not args.quiet)
    elapsed = time.perf_counter() - started
    by_task = metrics["tasks"]
    for task, views in by_task.items():
        for view, figures in views.items():
            print(f"{task + ' / ' + view if len(by_task) > 1 else view:>24}: P={_fmt(figures['P'])} "
                  f"A90={_fmt(figures['A90'])} U90_10={_fmt(figures['U90_10'])}")
    if len(by_task) > 1:
        for view, figures in metrics["views"].items():
            print(f"{'all tasks / ' + view:>24}: P={_fmt(figures['P'])} A90={_fmt(figures['A90'])} "
                  f"U90_10={_fmt(figures['U90_10'])}")
    if metrics.get("reliability_note"):
        print(f"A90, U90_10: n/a ({metrics['reliability_note']})")
    if metrics["baseline_source"]:
        print(f"recovery rate R: {_fmt(metrics['recovery_rate'], 3)}   retention: {_fmt(metrics['retention'], 3)}"
              f"   (baseline {metrics['baseline_source']})")
    else:
        print(f"sharded/full of this run: {_fmt(metrics['sharded_over_full'], 3)}   (no recovery rate without "
              "baseline=<the base model's run>)")
    if metrics["context_full"]:
        print(f"{metrics['context_full']} conversation(s) ended with a full context (the model's context length "
              "could not take the next prompt and a reply; stop_reason context_full in conversations.jsonl)")
    print(f"{metrics['conversations']} conversations, {elapsed:.0f} s")
    print(f"report: {Path(cfg.out) / REPORT_NAME}")
    return 0


def _kept(log: Path) -> str:
    """What a SIGTERM leaves of an evaluation: its finished conversations, or none."""
    if log.is_file() and log.stat().st_size:
        return f"the conversations finished before are kept in {log}; run the same command again to resume"
    return "no conversation had finished, so none is kept"


def _fmt(value: float | None, digits: int = 1) -> str:
    return "n/a" if value is None else f"{value:.{digits}f}"
