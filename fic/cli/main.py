"""The `fic` command line.

Each verb is handled by a module of `fic/cli/` that defines `add_arguments(parser, verb)` and
`run(args) -> int` (`args.verb` names the verb when a module serves several); `run` calls its
stage's function (`fic.evaluation.evaluate.evaluate`, `fic.corpus.build.build_corpus`, ...) and
prints what it made. Modules are imported only when their verb runs, so `fic --help` stays
fast. A `FicError` (bad input) or an `OSError` (a path under a file, a read-only folder, a full
disk: `fic.core.errors.os_error` names the path) prints one line and exits 2. Verbs call
`fic.core.files.check_writable` on their outputs before loading anything.
"""

from __future__ import annotations

import argparse
import importlib
import logging
import sys

from fic import __version__
from fic.core.errors import exit_status

# verb -> (module, one-line help)
VERBS: dict[str, tuple[str, str]] = {
    "prepare-model": ("fic.cli.data", "turn the bundled SmolLM2-135M-Instruct GGUF into a Hugging Face folder"),
    "shard": ("fic.cli.data", "load a source and write sharded instances (LiC schema) as JSONL"),
    "views": ("fic.cli.data", "render sharded instances in a view (full, concat, sharded, ...) as chat messages"),
    "masks": ("fic.cli.data", "print conversations rendered by a chat template with their loss masks"),
    "eval": ("fic.cli.eval", "play conversations in each view and report scores and the recovery rate"),
    "probe": ("fic.cli.probe", "interaction awareness: let the model write the user's next turn and judge it"),
    "self-label": ("fic.cli.self_label", "replace instances' reference answers by a model's own filtered calls "
                   "(label-free adaptation data; the originals dropped)"),
    "sft-data": ("fic.cli.sft_data", "build the multi-turn SFT warm-start corpus from sharded instances"),
    "train": ("fic.cli.train", "train with a recipe: `fic train sft --config recipes/<backbone>/sft.yaml`"),
    "demo": ("fic.cli.demo", "the main job: warm-up, FiC's SFT and VASD on one task, evaluated stage by stage, "
             "one table"),
    "report": ("fic.cli.report", "(re)draw a run's figures: training curves, evaluation report, the demo's figure"),
    "push": ("fic.cli.push", "push a saved model or adapter, or a dataset FiC wrote, to the Hugging Face hub"),
    "bench": ("fic.cli.bench", "benchmarks that print figures (rollout, sft, vasd, zero, decode, sigterm); --json for "
              "one JSON object"),
    "launch-check": ("fic.cli.launch_check", "check a launch config and recipe before a multi-GPU job starts"),
}


def build_parser(verb: str | None = None) -> argparse.ArgumentParser:
    """The `fic` parser; only `verb`'s module is imported and adds its arguments (start-up stays light)."""
    parser = argparse.ArgumentParser(prog="fic", description="FiC: teach LLMs not to get lost in multi-turn "
                                     "conversation. Run `fic VERB --help` for a verb's options.")
    parser.add_argument("--version", action="version", version=f"fic {__version__}")
    sub = parser.add_subparsers(dest="verb", metavar="VERB")
    for name, (module, help_text) in VERBS.items():
        verb_parser = sub.add_parser(name, help=help_text, description=help_text)
        verb_parser.set_defaults(module=module)
        if name == verb:
            importlib.import_module(module).add_arguments(verb_parser, name)
    return parser


class _StderrHandler(logging.StreamHandler):
    """Writes to the `sys.stderr` of the moment: `main` may run many times in one process (tests,
    notebooks), and a handler bound to the first call's stream fails once that stream is closed."""

    @property
    def stream(self):  # type: ignore[override]
        return sys.stderr

    @stream.setter
    def stream(self, value: object) -> None:
        pass


def main(argv: list[str] | None = None) -> int:
    # fic's own progress lines (model preparation, training, evaluation) go through logging.
    root = logging.getLogger()
    if not any(isinstance(h, _StderrHandler) for h in root.handlers):
        handler = _StderrHandler()
        handler.setFormatter(logging.Formatter("%(message)s"))
        root.addHandler(handler)
    root.setLevel(logging.INFO)
    for chatty in ("httpx", "httpx2", "openai"):  # a line per request and per retry (the openai backend's SDK)
        logging.getLogger(chatty).setLevel(logging.WARNING)
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = build_parser(next((a for a in argv if not a.startswith("-")), None))
    args = parser.parse_args(argv)
    if args.verb is None:
        parser.print_help()
        return 2
    module = importlib.import_module(args.module)
    return exit_status(f"fic {args.verb}", lambda: module.run(args))


if __name__ == "__main__":
    sys.exit(main())
