"""Every verb is parsed in `fic/cli/` and calls its stage's function; the stages parse nothing."""

from __future__ import annotations

import ast
import importlib
import sys
from pathlib import Path

import pytest

from fic.cli.main import VERBS, build_parser, main

PACKAGE = Path(__file__).resolve().parents[2] / "fic"
# Modules with a command line of their own that is not a verb: each benchmark's options (under
# `fic bench NAME`) and the recipe scripts' (`accelerate launch fic/train_sft.py ...`).
OWN_COMMAND_LINE = {"bench", "training/loop.py"}


def test_every_verb_lives_in_fic_cli():
    assert {module for module, _ in VERBS.values() if not module.startswith("fic.cli.")} == set()
    for module, _ in VERBS.values():
        loaded = importlib.import_module(module)
        assert callable(loaded.add_arguments) and callable(loaded.run), module


def test_no_stage_parses_a_command_line():
    parsing = []
    for path in PACKAGE.rglob("*.py"):
        where = path.relative_to(PACKAGE).as_posix()
        if where.startswith("cli/") or where.split("/")[0] in OWN_COMMAND_LINE or where in OWN_COMMAND_LINE:
            continue
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else \
                [node.module] if isinstance(node, ast.ImportFrom) else []
            if "argparse" in names:
                parsing.append(where)
    assert not parsing, f"argparse outside fic/cli: {parsing}"


@pytest.mark.parametrize("verb", sorted(VERBS))
def test_each_verb_has_its_help(verb, capsys):
    with pytest.raises(SystemExit) as done:
        main([verb, "--help"])
    assert done.value.code == 0 and f"usage: fic {verb}" in capsys.readouterr().out


def test_only_the_verb_being_run_gets_its_arguments(capsys):
    assert build_parser("eval").parse_args(["eval", "--config", "x.yaml"]).config == "x.yaml"
    with pytest.raises(SystemExit):  # built for another verb, eval has no options yet
        build_parser("shard").parse_args(["eval", "--config", "x.yaml"])
    assert "unrecognized arguments: --config" in capsys.readouterr().err


def test_an_unknown_verb_is_refused_by_argparse(capsys):
    with pytest.raises(SystemExit) as done:
        main(["evaluate"])
    assert done.value.code == 2 and "invalid choice: 'evaluate'" in capsys.readouterr().err


def test_the_bench_help_and_package_name_every_benchmark():
    import fic.bench
    from fic.cli.bench import BENCHES

    assert all(name in VERBS["bench"][1] for name in BENCHES), VERBS["bench"][1]
    modules = {p.stem for p in (PACKAGE / "bench").glob("*.py")} - {"__init__"}
    assert all(f"`{name}`" in fic.bench.__doc__ for name in modules), fic.bench.__doc__


@pytest.mark.parametrize("method", ["sft", "vasd"])
def test_train_help_names_the_command_the_user_typed(method, capsys, monkeypatch):
    with pytest.raises(SystemExit):
        main(["train", method, "--help"])
    assert capsys.readouterr().out.startswith(f"usage: fic train {method} ")
    # run as a script (`accelerate launch fic/train_METHOD.py --help`): the script's name
    monkeypatch.setattr(sys, "argv", [f"fic/train_{method}.py", "--help"])
    with pytest.raises(SystemExit):
        importlib.import_module(f"fic.train_{method}").main()
    assert capsys.readouterr().out.startswith(f"usage: train_{method}.py ")
