"""Every recipe YAML loads with its config class, and an unknown key in it is an error."""

import importlib
from pathlib import Path

import pytest
import yaml

from fic.config import load_config
from fic.errors import FicError

RECIPES = sorted((Path(__file__).resolve().parents[1] / "recipes").rglob("*.yaml"))

# recipe file name (without .yaml) -> "module:ConfigClass"; every recipe must match one prefix.
CONFIG_CLASSES = {
    "eval": "fic.evaluate:EvalConfig",
    "sft-data": "fic.sft_data:SFTDataConfig",
    "sft": "fic.train_sft:SFTConfig",
}


def config_class(path: Path):
    stem = path.stem
    for prefix in sorted(CONFIG_CLASSES, key=len, reverse=True):
        if stem == prefix or stem.startswith(prefix + "-"):
            module, name = CONFIG_CLASSES[prefix].split(":")
            return getattr(importlib.import_module(module), name)
    raise AssertionError(f"{path}: no config class for this recipe name; add it to CONFIG_CLASSES")


def test_there_are_recipes():
    assert RECIPES, "no recipe YAML found under recipes/"


@pytest.mark.parametrize("path", RECIPES, ids=lambda p: str(p.relative_to(p.parents[1])))
def test_recipe_loads(path):
    config = load_config(config_class(path), path)
    assert config is not None


@pytest.mark.parametrize("path", RECIPES, ids=lambda p: str(p.relative_to(p.parents[1])))
def test_recipe_with_unknown_key_is_an_error(path, tmp_path):
    data = yaml.safe_load(path.read_text())
    data["surely_not_a_key"] = 1
    bad = tmp_path / path.name
    bad.write_text(yaml.safe_dump(data))
    with pytest.raises(FicError, match="surely_not_a_key"):
        load_config(config_class(path), bad)
