"""The import graph of `fic/`: no cycle, no import of another package's private name, and
imports that run one way, from the later stages down to the core. The scripts beside the package
(`experiments/`, `tools/gpu/`) import fic's public modules and names only.

Every import counts, at the top of a module or inside a function: a lazy import is still an
edge a reader (and a refactor) has to respect.
"""

from __future__ import annotations

import ast
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "fic"
SCRIPTS = [*sorted((ROOT / "experiments").glob("*.py")), *sorted((ROOT / "tools" / "gpu").glob("*.py"))]

# The stages, lowest first: a module may import its own package and any of a lower rank.
RANKS = {
    "core": 0,
    "sandbox": 1, "bundled": 1,
    "tasks": 2, "backends": 2,
    "data": 3,
    "conversation": 4,
    "corpus": 5, "training": 5, "evaluation": 5,
    "train_sft": 6, "train_vasd": 6,  # the recipes, launched as scripts
    "probe": 7, "demo": 7, "bench": 7,
    "cli": 8,
}
TOP = {"__init__", "__main__"}  # fic/__init__.py (the version) and python -m fic


def modules() -> dict[str, Path]:
    found = {}
    for path in PACKAGE.rglob("*.py"):
        parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
        name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        found[name] = path
    return found


def stage_of(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else "__init__"


def imports(path: Path, known: dict[str, Path]) -> list[tuple[str, list[str], int]]:
    """(imported module, names taken from it, line) for every `fic` import in the file."""
    inside = path.is_relative_to(PACKAGE.parent)  # a script elsewhere has no relative imports of fic
    package = ".".join(path.relative_to(PACKAGE.parent).with_suffix("").parts[:-1]) if inside else ""
    found = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            found += [(a.name, [], node.lineno) for a in node.names if a.name.split(".")[0] == "fic"]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                base = ".".join(package.split(".")[:len(package.split(".")) - node.level + 1] + ([base] if base else []))
            if base.split(".")[0] != "fic":
                continue
            for alias in node.names:  # `from fic.x import y` may name a submodule y
                sub = f"{base}.{alias.name}"
                found.append((sub, [], node.lineno) if sub in known else (base, [alias.name], node.lineno))
    return found


def edges() -> dict[str, list[tuple[str, list[str], int]]]:
    known = modules()
    return {name: imports(path, known) for name, path in known.items()}


def test_the_stage_table_names_every_package():
    stages = {stage_of(m) for m in modules()} - TOP
    assert stages == set(RANKS), f"add {stages - set(RANKS)} to RANKS (or drop {set(RANKS) - stages})"


def test_imports_run_from_later_stages_down_to_the_core():
    upward = []
    for module, found in edges().items():
        here = stage_of(module)
        if here in TOP:
            continue
        for target, _, line in found:
            there = stage_of(target)
            if there in TOP or there == here:
                continue
            if RANKS[there] >= RANKS[here]:
                upward.append(f"{module}:{line} imports {target} ({there} is not below {here})")
    assert not upward, "\n".join(upward)


def test_no_module_imports_another_packages_private_name():
    private = []
    for module, found in edges().items():
        for target, names, line in found:
            theirs = target.rsplit(".", 1)[0] if target in modules() and "." in target else target
            for name in names:
                if name.startswith("_") and not name.startswith("__") and stage_of(target) != stage_of(module):
                    private.append(f"{module}:{line} imports {target}.{name}")
            if target.split(".")[-1].startswith("_") and stage_of(theirs) != stage_of(module) \
                    and not target.endswith("__init__"):
                private.append(f"{module}:{line} imports the private module {target}")
    assert not private, "\n".join(private)


def test_no_import_cycle():
    graph = defaultdict(set)
    for module, found in edges().items():
        for target, _, _ in found:
            if target != module and target in modules():
                graph[module].add(target)
    state: dict[str, int] = {}
    cycles = []

    def visit(node: str, trail: list[str]) -> None:
        state[node] = 1
        for nxt in sorted(graph[node]):
            if state.get(nxt) == 1:
                cycles.append(" -> ".join(trail[trail.index(nxt):] + [nxt]) if nxt in trail else f"{node} -> {nxt}")
            elif nxt not in state:
                visit(nxt, trail + [nxt])
        state[node] = 2

    for module in sorted(graph):
        if module not in state:
            visit(module, [module])
    assert not cycles, "\n".join(cycles)


def test_the_checker_sees_an_upward_import(tmp_path, monkeypatch):
    """The walk is not vacuous: a core module importing a recipe is caught."""
    fake = tmp_path / "fic"
    (fake / "core").mkdir(parents=True)
    (fake / "core" / "__init__.py").write_text("")
    (fake / "core" / "bad.py").write_text("def f():\n    from fic.train_vasd import train\n")
    (fake / "train_vasd.py").write_text("from fic.core import bad\n")
    monkeypatch.setattr(__import__(__name__), "PACKAGE", fake)
    found = edges()
    assert ("fic.train_vasd", ["train"], 2) in found["fic.core.bad"]
    try:
        test_imports_run_from_later_stages_down_to_the_core()
    except AssertionError as err:
        assert "fic.core.bad:2 imports fic.train_vasd" in str(err)
    else:
        raise AssertionError("the upward import was not reported")
    try:
        test_no_import_cycle()
    except AssertionError as err:
        assert "fic.core.bad" in str(err) and "fic.train_vasd" in str(err)
    else:
        raise AssertionError("the cycle was not reported")


def script_imports(path: Path) -> list[str]:
    """What a script beside the package takes from fic that it may not: a private module or name,
    or a module or name fic does not have (a moved module breaks the script here, not on a GPU)."""
    import importlib

    wrong = []
    for target, names, line in imports(path, modules()):
        if target not in modules():
            wrong.append(f"{path.name}:{line} imports {target}, not a module of fic")
            continue
        if any(part.startswith("_") and not part.startswith("__") for part in target.split(".")):
            wrong.append(f"{path.name}:{line} imports the private module {target}")
        module = importlib.import_module(target)
        for name in names:
            if name.startswith("_"):
                wrong.append(f"{path.name}:{line} imports the private name {target}.{name}")
            elif not hasattr(module, name):
                wrong.append(f"{path.name}:{line} imports {target}.{name}, which fic does not have")
    return wrong


def test_the_scripts_beside_the_package_use_its_public_names_only():
    assert SCRIPTS, "experiments/ and tools/gpu/ hold no script"
    wrong = [line for path in SCRIPTS for line in script_imports(path)]
    assert not wrong, "\n".join(wrong)


def test_the_script_checker_sees_a_private_or_missing_import(tmp_path):
    script = tmp_path / "lab.py"
    script.write_text("from fic.demo.run import _run_demo, paths\nfrom fic.demo import ablation\n"
                      "import fic.core._nowhere\nfrom fic.core.files import nothing_here\n")
    assert script_imports(script) == [
        "lab.py:1 imports the private name fic.demo.run._run_demo",
        "lab.py:2 imports fic.demo.ablation, which fic does not have",
        "lab.py:3 imports fic.core._nowhere, not a module of fic",
        "lab.py:4 imports fic.core.files.nothing_here, which fic does not have"]
