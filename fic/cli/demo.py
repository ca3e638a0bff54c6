"""The `fic demo` verb: the main job (`fic.demo.run`), or one stage in its own process (`--stage`,
used by the demo itself)."""

from __future__ import annotations

import argparse

from fic.core.config import DRY_RUN_HELP, print_keys, resolved_yaml
from fic.core.errors import FicError, one_line, os_error
from fic.core.files import write_text
from fic.demo.run import QUICK, STAGES, DemoConfig, load_demo, paths, plan, run_demo, run_stage


def add_arguments(parser: argparse.ArgumentParser, verb: str) -> None:
    parser.add_argument("--recipes", default="recipes/smollm2-135m-instruct",
                        help="recipes folder holding demo.yaml (default: the bundled model's)")
    parser.add_argument("--from", dest="start_from", default=None, metavar="STAGE",
                        help=f"run again from this stage on: {', '.join(STAGES)}")
    parser.add_argument("overrides", nargs="*", metavar="key=value", help="override demo.yaml, e.g. out=runs/d2 "
                        "data.test=64 vasd.train.max_steps=4")
    parser.add_argument("--keys", action="store_true", help="list every key of demo.yaml with its default, the value "
                        "this run would use (demo.yaml and the overrides) and its help, and exit")
    parser.add_argument("--dry-run", action="store_true", help=DRY_RUN_HELP)
    parser.add_argument("--quiet", action="store_true", help="no progress bars or lines")
    parser.add_argument("--quick", action="store_true", help="a smoke run of every stage (about 15 minutes on 2 quiet CPU "
                        "cores), into runs/demo-quick: tiny splits and a few steps (wide intervals; a look at what the "
                        "demo does and writes, not a measure). Overrides given beside it win")
    parser.add_argument("--ablate", action="store_true", help=argparse.SUPPRESS)  # moved: says where to
    parser.add_argument("--stage", default=None, choices=STAGES[:-1], help=argparse.SUPPRESS)  # one stage's process


def run(args: argparse.Namespace) -> int:
    if args.ablate:
        raise FicError("the stage 2 ablation is an experiment, not part of the package: from a FiC checkout, "
                       "python experiments/ablation.py (the same options and settings)", field="--ablate")
    if args.quick:  # before the user's overrides, which win; stage processes get the same list
        args.overrides = [*QUICK, *args.overrides]
    if args.keys:  # demo.yaml is always read: its values are what a run uses
        print_keys(args, DemoConfig, run=load_demo(args.recipes, args.overrides))
        return 0
    cfg = load_demo(args.recipes, args.overrides)
    if args.dry_run:
        print(resolved_yaml(cfg) + plan(cfg, start_from=args.start_from))
        return 0
    if args.stage is not None:  # a stage's own process: its error goes to the demo that started it
        errors = paths(cfg)["stages"] / f"{args.stage}.error"
        try:
            run_stage(cfg, args.stage, progress=not args.quiet)
        except (FicError, OSError) as err:
            write_text(errors, one_line(os_error(err) if isinstance(err, OSError) else err))
            return 2
        return 0
    report = run_demo(cfg, start_from=args.start_from, progress=not args.quiet, launch=(args.recipes, args.overrides))
    print(report["table"])
    print(f"report: {paths(cfg)['report']}")
    return 0
