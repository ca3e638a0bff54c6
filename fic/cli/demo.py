"""The `fic demo` verb: the main job (`fic.demo.run`), one stage in its own process (`--stage`,
used by the demo itself), or the stage 2 ablation on the dev split (`--ablate`, `fic.demo.ablation`)."""

from __future__ import annotations

import argparse

from fic.core.config import DRY_RUN_HELP, print_keys, resolved_yaml
from fic.core.errors import FicError, one_line, os_error
from fic.core.files import write_text
from fic.demo.ablation import ablation_dir, run_ablation
from fic.demo.ablation import plan as ablation_plan
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
    parser.add_argument("--quick", action="store_true", help="a smoke run of every stage in a few minutes on 2 CPU "
                        "cores, into runs/demo-quick: tiny splits and a few steps (wide intervals; a look at what the "
                        "demo does and writes, not a measure). Overrides given beside it win")
    parser.add_argument("--ablate", action="store_true", help="train and compare the stage 2 variants of "
                        "ablation.variants (and the equal-compute control) on the dev split, instead of the demo")
    parser.add_argument("--stage", default=None, choices=STAGES[:-1], help=argparse.SUPPRESS)  # one stage's process


def run(args: argparse.Namespace) -> int:
    if args.quick:  # before the user's overrides, which win; stage processes get the same list
        args.overrides = [*QUICK, *args.overrides]
    if args.keys:  # demo.yaml is always read: its values are what a run uses
        print_keys(args, DemoConfig, run=load_demo(args.recipes, args.overrides))
        return 0
    cfg = load_demo(args.recipes, args.overrides)
    if args.dry_run:
        launch = (args.recipes, args.overrides)
        print(resolved_yaml(cfg) + (ablation_plan(cfg, launch) if args.ablate else
                                    plan(cfg, launch, start_from=args.start_from)))
        return 0
    if args.stage is not None:  # a stage's own process: its error goes to the demo that started it
        errors = paths(cfg)["stages"] / f"{args.stage}.error"
        try:
            run_stage(cfg, args.stage, progress=not args.quiet)
        except (FicError, OSError) as err:
            write_text(errors, one_line(os_error(err) if isinstance(err, OSError) else err))
            return 2
        return 0
    launch = (args.recipes, args.overrides)
    if args.ablate:
        figures = run_ablation(cfg, progress=not args.quiet, launch=launch)
        print(figures["table"])
        print(f"table: {ablation_dir(cfg) / 'table.md'}")
        return 0
    report = run_demo(cfg, start_from=args.start_from, progress=not args.quiet, launch=launch)
    print(report["table"])
    print(f"report: {paths(cfg)['report']}")
    return 0
