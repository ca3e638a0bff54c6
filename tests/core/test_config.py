"""The config loader: YAML + key=value overrides, with errors naming file, key and expectation."""

import re
from dataclasses import dataclass

import pytest

from fic.core.config import describe, load_config, setting
from fic.core.errors import FicError


@dataclass
class Optim:
    lr: float = setting(1e-4, "learning rate", min=0.0)
    schedule: str = setting("cosine", "schedule", choices=["cosine", "constant"])


@dataclass
class Example:
    model: str = setting(help="model folder")
    steps: int = setting(10, "optimizer steps", min=1)
    views: list[str] = setting(["full"], "views to play")
    name: str | None = setting(None, "run name")
    bf16: bool = setting(False, "use bf16")
    optim: Optim = setting(Optim(), "optimizer")


def write(tmp_path, text):
    path = tmp_path / "c.yaml"
    path.write_text(text)
    return path


def test_yaml_and_nested_overrides(tmp_path):
    path = write(tmp_path, "model: m\nsteps: 3\noptim:\n  lr: 1e-3\n")
    config = load_config(Example, path, ["optim.schedule=constant", "views=[full,sharded]", "name=007",
                                         "bf16=true"])
    assert config.model == "m" and config.steps == 3
    assert config.optim.lr == pytest.approx(1e-3) and config.optim.schedule == "constant"
    assert config.views == ["full", "sharded"]
    assert config.name == "007"  # strings stay strings on the command line
    assert config.bf16 is True


def test_defaults_are_not_shared_between_instances():
    a = load_config(Example, None, ["model=a"])
    b = load_config(Example, None, ["model=b"])
    a.views.append("x")
    a.optim.lr = 5.0
    assert b.views == ["full"] and b.optim.lr == pytest.approx(1e-4)


@pytest.mark.parametrize("text,overrides,needle", [
    ("model: m\nstepz: 3\n", [], "field 'stepz': unknown key"),
    ("model: m\noptim:\n  lrr: 1\n", [], "field 'optim.lrr': unknown key"),
    ("model: m\nsteps: three\n", [], "field 'steps': expected an integer, got 'three'"),
    ("model: m\nsteps: 0\n", [], "field 'steps': expected a value >= 1"),
    ("model: m\noptim:\n  schedule: linear\n", [], "expected one of 'cosine', 'constant'"),
    ("model: m\nbf16: 1\n", [], "field 'bf16': expected true or false"),
    ("steps: 2\n", [], "field 'model': missing required key"),
    ("model: m\n", ["steps=2.5"], "field 'steps': expected an integer"),
    ("model: m\n", ["optim.lr=-1"], "field 'optim.lr': expected a value >= 0.0"),
    ("model: m\n", ["nokey"], "expected key=value"),
    ("- a\n- b\n", [], "expected a mapping of settings"),
    ("model: [unclosed\n", [], "not valid YAML"),
])
def test_bad_values_name_file_key_and_expectation(tmp_path, text, overrides, needle):
    path = write(tmp_path, text)
    with pytest.raises(FicError) as err:
        load_config(Example, path, overrides)
    assert needle in str(err.value)
    assert str(path) in str(err.value) or "command line" in str(err.value)


def test_missing_file(tmp_path):
    with pytest.raises(FicError, match="config file not found"):
        load_config(Example, tmp_path / "nope.yaml")


def test_describe_lists_every_key_with_help():
    text = describe(Example)
    for key in ("model", "steps", "views", "optim.lr", "optim.schedule"):
        assert f"\n{key} (" in "\n" + text
    assert "learning rate" in text and "one of cosine, constant" in text


@dataclass
class Checked:
    name: str = setting("", "must not be empty")

    def check(self, source):
        if not self.name:
            raise FicError("must not be empty", path=source, field="name")


@dataclass
class Outer:
    inner: Checked = setting(Checked(name="x"), "a checked section")


def test_nested_check_errors_name_the_full_key():
    with pytest.raises(FicError, match="field 'inner.name': must not be empty"):
        load_config(Outer, None, ["inner.name="])


@dataclass
class _Picks:
    names: list[str] = setting([], "Names.")
    task: str | list[str] = setting("math", "One name or several.")
    size: int = setting(1, "A size.")


@dataclass
class _Holder:
    picks: _Picks = setting(_Picks(names=["declared"], size=7), "A section whose parent declares its defaults.")


def test_a_section_override_keeps_the_defaults_its_parent_declares():
    """`picks.task=code` must not reset `picks.names` to the class's own default."""
    cfg = load_config(_Holder, None, ["picks.task=code"])
    assert cfg.picks.names == ["declared"] and cfg.picks.size == 7 and cfg.picks.task == "code"
    assert load_config(_Holder, None, ["picks.size=3"]).picks.names == ["declared"]
    assert load_config(_Holder, None, ["picks.names=[a, b]"]).picks.names == ["a", "b"]


def test_brackets_make_a_list_wherever_a_list_is_allowed_and_one_item_needs_none():
    cfg = load_config(_Picks, None, ["task=[math, code]", "names=jsonl:x.jsonl"])
    assert cfg.task == ["math", "code"] and cfg.names == ["jsonl:x.jsonl"]
    assert load_config(_Picks, None, ["task=007"]).task == "007"  # text stays text


@dataclass
class Floats:
    lr: float = setting(1e-4, "learning rate", min=0.0)
    share: float = setting(0.5, "a share", min=0.0, max=1.0)
    maybe: float | None = setting(None, "an optional number")


@pytest.mark.parametrize("override", [
    "lr=inf", "lr=.inf", "lr=nan", "lr=.nan", "lr=-inf", "lr=NaN", "share=nan", "share=.NaN", "maybe=inf",
    "maybe=nan", "lr=1e400", "lr=" + "9" * 400,
])
def test_non_finite_numbers_are_refused_on_the_command_line(override):
    # NaN passes every range check (all comparisons are false); inf trains to NaN weights.
    with pytest.raises(FicError) as err:
        load_config(Floats, None, [override])
    assert "expected a finite number" in str(err.value)
    assert f"field '{override.split('=')[0]}'" in str(err.value)


@pytest.mark.parametrize("text", ["lr: .inf\n", "share: .nan\n", "maybe: -.inf\n", "lr: nan\n"])
def test_non_finite_numbers_are_refused_in_yaml(tmp_path, text):
    path = write(tmp_path, text)
    with pytest.raises(FicError, match="expected a finite number") as err:
        load_config(Floats, path)
    assert str(path) in str(err.value)


@pytest.mark.parametrize("cls_path,override", [
    ("fic.train_sft:SFTConfig", "optim.lr=inf"),
    ("fic.train_sft:SFTConfig", "optim.lr=nan"),
    ("fic.train_sft:SFTConfig", "train.epochs=nan"),
    ("fic.corpus.build:SFTDataConfig", "single_turn_share=nan"),
    ("fic.evaluation.evaluate:EvalConfig", "temperature=nan"),
    ("fic.evaluation.evaluate:EvalConfig", "top_p=inf"),
])
def test_every_real_float_setting_refuses_non_finite_values(cls_path, override):
    import importlib

    module, name = cls_path.split(":")
    cls = getattr(importlib.import_module(module), name)
    with pytest.raises(FicError, match="expected a finite number"):
        load_config(cls, None, [override, "model.model=m", "data.source=gsm8k"] if name == "EvalConfig"
                    else [override])


# --------------------------------------------------------------------------- the bounded YAML reader

@dataclass
class Fields:
    fields: dict[str, str] = setting({}, "a mapping setting, flattened as data.fields is")
    views: list[str] = setting([], "a list setting")


DEEP = 5000
BOMB = ('fields:\n  a0: &a0 "lol"\n' + "".join(f"  a{i}: &a{i} [{', '.join([f'*a{i - 1}'] * 10)}]\n"
                                              for i in range(1, 10)))


@pytest.mark.parametrize("text, needle", [
    ("views: " + "[" * DEEP + "]" * DEEP + "\n", "nested more than 64 levels deep (line 1)"),
    ("views:\n" + "".join("  " * i + "- \n" for i in range(1, 200)), "nested more than 64 levels deep"),
    (BOMB, "expands to more than 100,000 values (aliases)"),
    ("views: &a [1, *a]\n", "the alias *a refers to a value that contains it"),
])
def test_yaml_nested_deeply_or_an_alias_bomb_is_one_line_at_once(tmp_path, text, needle):
    import time

    started = time.monotonic()
    with pytest.raises(FicError) as err:
        load_config(Fields, write(tmp_path, text))
    assert needle in str(err.value) and "c.yaml" in str(err.value) and "\n" not in str(err.value)
    assert time.monotonic() - started < 5  # the bomb never finished: flattening expanded every alias


def test_a_yaml_file_larger_than_the_bound_is_refused_before_pyyaml_reads_it(tmp_path, monkeypatch):
    import time

    import yaml

    from fic.core import config

    path = tmp_path / "big.yaml"
    path.write_text("views:\n" + "  - x\n" * 2_000_000)  # 12 MB: PyYAML would take minutes
    monkeypatch.setattr(yaml, "load", lambda *a, **k: pytest.fail("PyYAML was asked to read it"))
    started = time.monotonic()
    with pytest.raises(FicError, match=f"more than the {config.MAX_YAML_BYTES >> 10} KiB FiC reads as a YAML file"):
        load_config(Fields, path)
    assert time.monotonic() - started < 1
    with pytest.raises(FicError, match="is not a regular file"):
        load_config(Fields, "/dev/zero")  # it would be read for ever


def test_a_nested_command_line_value_is_one_line_naming_the_key():
    with pytest.raises(FicError) as err:
        load_config(Fields, None, ["views=" + "[" * DEEP + "]" * DEEP])
    assert "nested more than 64 levels deep" in str(err.value) and "views" in str(err.value)
    with pytest.raises(FicError, match="expands to more than"):
        load_config(Fields, None, ["views=" + BOMB.replace("fields:\n", "[").replace("\n  ", ", ").rstrip("\n") + "]"])


def test_a_mapping_too_deep_for_python_is_one_line_not_a_recursion_error():
    from fic.core.config import from_mapping

    nested: dict = {"x": "y"}  # a mapping setting is flattened key by key
    for _ in range(DEEP):
        nested = {"k": nested}
    with pytest.raises(FicError, match="nested too deeply to check"):
        from_mapping(Fields, {"fields": nested}, "run.json")


# --------------------------------------------------------------------------- physical bounds

CONFIGS = ["fic.train_sft:SFTConfig", "fic.train_vasd:VASDConfig", "fic.evaluation.evaluate:EvalConfig",
           "fic.corpus.build:SFTDataConfig", "fic.probe.run:ProbeConfig", "fic.demo.run:DemoConfig"]


def bounded_keys(cls, prefix=""):
    """Every numeric field of a config (nested sections too) a physical bound applies to by its name."""
    import dataclasses
    import typing

    from fic.core.bounds import PHYSICAL_BOUNDS

    found = []
    for name, hint in typing.get_type_hints(cls).items():
        if dataclasses.is_dataclass(hint):
            found += bounded_keys(hint, f"{prefix}{name}.")
        elif {int, float} & set(typing.get_args(hint) or (hint,)) and any(name.endswith(s) for s, *_ in PHYSICAL_BOUNDS):
            found.append(prefix + name)
    return found


def config_class(path):
    import importlib

    module, name = path.split(":")
    return getattr(importlib.import_module(module), name)


@pytest.mark.parametrize("path", CONFIGS)
def test_every_timeout_token_count_and_seed_has_its_physical_bound(path):
    cls = config_class(path)
    keys = bounded_keys(cls)
    assert keys  # the walk is not vacuous
    for key in keys:
        name = key.rsplit(".", 1)[-1]
        for value in ("1000000000000", "-1") if not name.endswith("top_p") else ("0", "-0.5"):
            with pytest.raises(FicError) as err:
                load_config(cls, None, [f"{key}={value}"])
            assert err.value.field == key and "expected a value" in str(err.value), (key, value, str(err.value))


def test_the_issue_s_values_are_refused_at_load_time_naming_the_field():
    cases = [("fic.evaluation.evaluate:EvalConfig", "model.timeout_s=1e12", "<= 604,800 seconds (a week)"),
             ("fic.train_sft:SFTConfig", "train.seed=-1", ">= 0"),
             ("fic.train_sft:SFTConfig", "train.seed=4294967296", "<= 4,294,967,295 (a seed is 32 bits)"),
             ("fic.train_vasd:VASDConfig", "rollout.top_p=0", "> 0"),
             ("fic.evaluation.evaluate:EvalConfig", "max_new_tokens=1000000000", "<= 16,777,216")]
    for path, override, needle in cases:
        with pytest.raises(FicError, match=f"field '{override.split('=')[0]}': expected a value {re.escape(needle)}"):
            load_config(config_class(path), None, [override])
    load_config(config_class("fic.train_sft:SFTConfig"), None, ["train.seed=4294967295", "model.path=x"])


@pytest.mark.parametrize("text,field,what", [
    ("model: m\n1: x\n", "1", "an integer (1)"),
    ("model: m\nyes: x\n", "true", "true (YAML reads yes, no, on and off as true or false)"),
    ("model: m\noptim:\n  2.5: x\n", "optim.2.5", "a number (2.5)"),
    ("model: m\nviews: [{a: {null: 1}}]\n", "views[0].a.null", "null"),
    ("model: m\noptim: {lr: 0.1, 3: x, schedule: cosine}\n", "optim.3", "an integer (3)"),
])
def test_a_key_that_is_no_string_at_any_depth_is_one_line_naming_its_path(tmp_path, text, field, what):
    """An integer or `yes:` key was a TypeError while naming the unknown key (and a sort of mixed keys)."""
    with pytest.raises(FicError) as err:
        load_config(Example, write(tmp_path, text))
    assert str(err.value) == f"{tmp_path / 'c.yaml'}: field '{field}': keys must be strings; got {what}: quote the key"


def test_a_data_section_file_with_an_integer_key_names_that_file(tmp_path, capsys):
    from fic.cli.main import main

    data = tmp_path / "bench.yaml"
    data.write_text("source: [gsm8k]\nfields:\n  question: problem\n  7: answer\n")
    assert main(["eval", f"data={data}", "model.model=m", "--dry-run"]) == 2
    assert capsys.readouterr().err.strip() == (f"fic eval: error: {data}: field 'fields.7': keys must be strings; got "
                                               "an integer (7): quote the key")
