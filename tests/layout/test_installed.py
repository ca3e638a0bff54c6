"""The package as a user installs it: nothing installed reads the repository.

Fast: no module of `fic/` names a path outside the package (climbing from `__file__`, or a path into
the repository's `tools/` or `experiments/`), and the figures the package holds in place of a
repository file equal that file. Slow: `pip install` of a wheel (not editable) into a fresh virtual
environment, used from a folder outside the repository: `fic --help`, every module of the installed
package imported, a few verbs run, and every file the interpreter opened or listed is outside the
repository (an audit hook records them)."""

from __future__ import annotations

import ast
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "fic"
CLIMBS = re.compile(r"\.parents\[|\.parent\.parent|dirname\([^)]*dirname\(")  # out of the file's own folder
REPOSITORY_PATH = re.compile(r"(?:\./)?(?:tools|experiments)/[\w./{}<>*-]*")  # folders the package never ships


def outside_paths(source: str) -> list[int]:
    """Lines of `source` that reach out of its package: a path climbed from `__file__`, or a string
    that is a path into the repository's tools/ or experiments/ (not prose that names one)."""
    found = [n for n, line in enumerate(source.splitlines(), 1) if "__file__" in line and CLIMBS.search(line)]
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and REPOSITORY_PATH.fullmatch(node.value):
            found.append(node.lineno)
    return sorted(found)


def test_no_module_of_the_package_names_a_path_outside_it():
    reaching = [f"{path.relative_to(ROOT)}:{line}" for path in sorted(PACKAGE.rglob("*.py"))
                for line in outside_paths(path.read_text(encoding="utf-8"))]
    assert not reaching, f"these lines read the repository, which an installed package does not have: {reaching}"


def test_the_path_checker_sees_a_climb_and_a_repository_path():
    source = ('REPO = Path(__file__).resolve().parents[2]\nHERE = Path(__file__).with_name("launcher.py")\n'
              'SHAPES = "tools/gpu/shapes"\nSAID = "run python experiments/ablation.py from a checkout"\n'
              'UP = os.path.dirname(os.path.dirname(__file__))\nOWN = Path(x).parents[0]\n')
    assert outside_paths(source) == [1, 3, 5]


def test_the_figures_held_in_place_of_a_recipe_are_the_recipes():
    from fic.bench.vasd import RECIPE_CHUNK_TOKENS
    from fic.core.config import load_config
    from fic.training.vasd.config import VASDConfig

    recipe = load_config(VASDConfig, ROOT / "recipes" / "smollm2-135m-instruct" / "vasd.yaml")
    assert RECIPE_CHUNK_TOKENS == recipe.train.loss_chunk_tokens


# --------------------------------------------------------------------------- a real install

# Records every path the interpreter opens or lists under the repository (FIC_REPOSITORY) into
# FIC_REPOSITORY_READS, opened before the hook so that writing to it is not itself recorded.
AUDIT = '''
import os, sys
_root = os.environ.get("FIC_REPOSITORY")
if _root:
    _log = open(os.environ["FIC_REPOSITORY_READS"], "a", encoding="utf-8")
    # the packages the test's environment borrows from the developer's (a virtual environment the
    # checkout may hold, e.g. .venv or CI's .venv-ci) are not the repository's files
    _borrowed = tuple(p + os.sep for p in os.environ.get("FIC_BORROWED", "").split(os.pathsep) if p)
    def _hook(event, args, _root=_root + os.sep, _log=_log, _borrowed=_borrowed):
        if event in ("open", "os.listdir", "os.scandir") and args and isinstance(args[0], (str, bytes, os.PathLike)):
            path = os.path.abspath(os.fsdecode(args[0]))
            if (path + os.sep).startswith(_root) and not (path + os.sep).startswith(_borrowed or ("\0",)):
                _log.write(f"{event} {path} ({' '.join(sys.argv)[:200]})\\n")
                _log.flush()
    sys.addaudithook(_hook)
'''

IMPORT_ALL = '''
import importlib, pkgutil, sys
import fic
assert fic.__file__.startswith(sys.argv[1]), fic.__file__
names = [m.name for m in pkgutil.walk_packages(fic.__path__, "fic.") if m.name != "fic.__main__"]
for name in names:
    module = importlib.import_module(name)
    assert module.__file__.startswith(sys.argv[1]), (name, module.__file__)
assert len(names) > 100 and "fic.bench.zero" in names and "fic.demo.ablation" not in names, names
print(len(names), "modules")
'''

SANDBOX = '''
import os
from fic.sandbox import python as sandbox
if sandbox.bwrap_command() is None:  # as the test suite does where bubblewrap cannot run (tests/conftest.py)
    os.environ.setdefault(sandbox.POLICY_VARIABLE, "rlimits")
os.environ.setdefault(sandbox.UNHELD_VARIABLE, ",".join(sandbox.unheld(sandbox.mode())))
result = sandbox.run_python("print(6 * 7)")
assert result.passed and result.stdout.strip() == "42", result
'''


def site_packages(venv: Path) -> Path:
    return next((venv / "lib").glob("python*/site-packages"))


@pytest.mark.slow  # builds a wheel, makes a virtual environment, imports all of fic in it
def test_a_non_editable_install_works_outside_the_repository(tmp_path):
    # A wheel from a copy of what the package is built from: the worktree gets no build/ or egg-info.
    source = tmp_path / "source"
    source.mkdir()
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(ROOT / name, source / name)
    shutil.copytree(PACKAGE, source / "fic", ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    clean = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME")}
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "--no-index",
                    "--quiet", "-w", str(tmp_path / "wheels"), str(source)], check=True, env=clean, cwd=tmp_path)
    wheel = next((tmp_path / "wheels").glob("fic-*.whl"))

    # A fresh environment, fic installed from the wheel (pip runs from this one, no network), and then
    # this environment's packages (torch, transformers, ...) behind it so that nothing is reinstalled.
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, env=clean)
    python = venv / "bin" / "python"
    subprocess.run([sys.executable, "-m", "pip", "--python", str(python), "install", "--no-deps", "--no-index",
                    "--quiet", str(wheel)], check=True, env=clean, cwd=tmp_path)
    site = site_packages(venv)
    assert (site / "fic" / "bench" / "zero.py").is_file() and not (site / "fic" / "bench" / "shapes.py").exists()
    assert not any((site / "fic").rglob("*.pth")) and not (site / "experiments").exists()
    theirs = [p for p in sys.path if p.endswith("site-packages") and Path(p).is_dir()]
    (site / "zz_fic_test_packages.pth").write_text("\n".join(theirs) + "\n")
    (site / "sitecustomize.py").write_text(AUDIT)

    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    reads = tmp_path / "reads.txt"
    env = {**clean, "FIC_REPOSITORY": str(ROOT), "FIC_REPOSITORY_READS": str(reads),
           "FIC_BORROWED": os.pathsep.join({sys.prefix, os.path.realpath(sys.prefix)}),
           "PATH": f"{venv / 'bin'}{os.pathsep}{clean.get('PATH', '')}"}

    def run(*argv: str) -> str:
        done = subprocess.run(list(argv), cwd=elsewhere, env=env, capture_output=True, text=True, timeout=600)
        assert done.returncode == 0, (argv, done.stdout[-2000:], done.stderr[-2000:])
        return done.stdout

    assert "demo" in run(str(venv / "bin" / "fic"), "--help")
    assert "modules" in run(str(python), "-c", IMPORT_ALL, str(site))
    assert "train.max_steps" in run(str(venv / "bin" / "fic"), "train", "vasd", "--keys")
    run(str(venv / "bin" / "fic"), "sft-data", "data.source=[actions-gen:train]", "data.task=actions", "data.limit=4",
        "out=corpus.jsonl")
    assert (elsewhere / "corpus.jsonl").is_file()
    run(str(venv / "bin" / "fic"), "bench", "zero", "--stage", "3", "--dry-run", "--json")
    run(str(python), "-c", SANDBOX)  # the sandbox's launcher, run by path from the installed package
    assert not reads.exists() or not reads.read_text().strip(), f"the installed package read the repository:\n" \
        f"{reads.read_text()[:3000]}"
