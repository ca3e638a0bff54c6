"""Every setting that sizes an allocation, a loop or a retry count has an upper bound, checked as
the config loads (so `--dry-run` refuses it before any model loads) and shown by `--keys` (issue
56, item 7), VASD's sections included."""

from __future__ import annotations

import dataclasses
import importlib
import types
import typing
from pathlib import Path

import pytest

import fic
from fic.cli.main import main
from fic.core.config import load_config, setting
from fic.core.errors import FicError
from fic.corpus.build import SFTDataConfig
from fic.demo.run import DemoConfig
from fic.evaluation.evaluate import EvalConfig
from fic.probe.run import ProbeConfig
from fic.training.sft import SFTConfig
from fic.training.vasd.config import VASDConfig

VERBS = (EvalConfig, SFTConfig, VASDConfig, SFTDataConfig, ProbeConfig, DemoConfig)
HUGE = "1" + "0" * 30  # 10**30


def config_classes() -> list[type]:
    """Every config dataclass in the package: each class all of whose fields are `setting()`s, in
    every module that declares one (found by reading the source, so a new module is swept too)."""
    root = Path(fic.__file__).parent
    found = []
    for path in sorted(root.rglob("*.py")):
        if "setting(" not in path.read_text(encoding="utf-8") or path.name == "__main__.py":
            continue
        module = importlib.import_module(".".join(path.relative_to(root.parent).with_suffix("").parts))
        for value in vars(module).values():
            if isinstance(value, type) and dataclasses.is_dataclass(value) and value.__module__ == module.__name__ \
                    and dataclasses.fields(value) and all("help" in f.metadata for f in dataclasses.fields(value)):
                found.append(value)
    return found


def is_number(kind: object) -> bool:
    """int or float, optional or a list of them (not bool, not a mapping)."""
    if kind in (int, float):
        return True
    return typing.get_origin(kind) in (list, typing.Union, types.UnionType) and \
        any(is_number(arg) for arg in typing.get_args(kind))


def number_settings() -> list[tuple[type, str, dataclasses.Field, object]]:
    """(the class a sweep loads, dotted key, field, type) for every number setting of every config
    dataclass: reached from a verb's config where one holds it, else loaded from its own class."""
    found, reached = [], set()

    def walk(cls: type, root: type, prefix: str) -> None:
        reached.add(cls)
        hints = typing.get_type_hints(cls)
        for f in dataclasses.fields(cls):
            kind = hints[f.name]
            if dataclasses.is_dataclass(kind):
                walk(kind, root, f"{prefix}{f.name}.")
            elif is_number(kind):
                found.append((root, prefix + f.name, f, kind))

    for verb in VERBS:
        walk(verb, verb, "")
    for cls in config_classes():
        if cls not in reached:
            walk(cls, cls, "")
    return found


def test_every_number_setting_refuses_ten_to_the_thirty_in_one_line_or_declares_why_it_has_no_upper_bound():
    """No silent acceptance: 10**30 given to any number setting of any config dataclass is a
    one-line error naming that key (its declared bound, or the bound its name implies), or the
    setting declares `unbounded` (it sizes nothing) and the value is accepted deliberately."""
    swept, accepted = set(), []
    for root, key, f, kind in number_settings():
        swept.add(key)
        value = f"[{HUGE}]" if typing.get_origin(kind) is list else HUGE
        try:
            load_config(root, None, [f"{key}={value}"])
            refused = None
        except FicError as err:
            refused = err if err.field in (key, f"{key}[0]") else None
        if refused is not None:
            assert "\n" not in str(refused) and "expected" in refused.message, (key, str(refused))
            assert not f.metadata.get("unbounded"), f"{key}: declared unbounded, yet refused"
        else:
            assert f.metadata.get("unbounded"), f"{root.__name__} accepts {key}={HUGE} with no declared reason"
            accepted.append(key)
    assert {"lora.r", "train.grad_accum_steps", "runs", "model.max_retries", "conversations_per_instance",
            "rollout.batch_size", "rollout.kv_reuse_mb", "train.pad_to_multiple"} <= swept
    assert "optim.lr" in accepted and "lora.r" not in accepted


def test_a_setting_is_bounded_or_declared_unbounded_not_both():
    with pytest.raises(ValueError, match="not both"):
        setting(1, "A number.", max=10, unbounded="sizes nothing")


@pytest.mark.parametrize("verb,override,field,bound", [
    ("train sft", "lora.r=1000000", "lora.r", "4096"),
    ("train sft", "lora.r=1000000000000000000000000000000", "lora.r", "4096"),
    ("train sft", "train.pad_to_multiple=1000000000", "train.pad_to_multiple", "65536"),
    ("train sft", "train.grad_accum_steps=1000000000000", "train.grad_accum_steps", "65536"),
    ("train sft", "train.micro_batch_size=100000", "train.micro_batch_size", "4096"),
    ("train sft", "checkpoint.keep_last=100000", "checkpoint.keep_last", "1000"),
    ("sft-data", "conversations_per_instance=1000000000000", "conversations_per_instance", "1000"),
    ("eval", "runs=1000000000000", "runs", "1000"),
    ("eval", "model.max_retries=1000000000000000000000000000000", "model.max_retries", "100"),
    ("eval", "model.batch_size=100000", "model.batch_size", "4096"),
    ("eval", "model.kv_reuse_mb=1e12", "model.kv_reuse_mb", "1048576"),
    ("eval", "user.max_idle_turns=1000000", "user.max_idle_turns", "1000"),
    ("probe", "judge.retries=1000000", "judge.retries", "100"),
    ("train vasd", "rollout.batch_size=100000", "rollout.batch_size", "4096"),
    ("train vasd", "rollout.kv_reuse_mb=1e12", "rollout.kv_reuse_mb", "1048576"),
    ("train vasd", "loss.top_k=1000000000", "loss.top_k", "1048576"),
    ("train vasd", "terms.labels.max_turns=1000000", "terms.labels.max_turns", "1000"),
    ("train vasd", "terms.reward.group_size=1000000", "terms.reward.group_size", "4096"),
    ("train vasd", "anchor.share=1e9", "anchor.share", "1000"),
    ("train vasd", "dev.every=1000000000000", "dev.every", "10000000"),
    ("train vasd", "logging.samples_every=1000000000000", "logging.samples_every", "10000000"),
])
def test_a_value_past_its_bound_is_refused_by_the_dry_run_before_any_model_loads(verb, override, field, bound, capsys,
                                                                                 monkeypatch):
    from fic.core import model

    monkeypatch.setattr(model, "load_model", lambda *a, **k: pytest.fail("a model was loaded"))
    assert main([*verb.split(), override, "--dry-run"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1
    assert f"field '{field}': expected a value <= {bound}, got" in err


def test_the_keys_listing_shows_each_settings_bounds(capsys):
    assert main(["train", "sft", "--keys"]) == 0
    text = capsys.readouterr().out
    assert "train.grad_accum_steps (an integer, default 1, 1 to 65,536):" in text
    assert "lora.r (an integer, default 16, 1 to 4,096):" in text
    assert "checkpoint.every (an integer, default 100, 0 to 10,000,000):" in text
    assert "logging.print_every_s (a number, default 60.0, 1 to a week):" in text  # the bound its name implies
    assert "optim.lr (a number, default 2e-05, at least 0, no upper bound (a learning rate)):" in text
    assert "optim.betas (a list of a number, default [0.9, 0.999], 0 to 1):" in text
    assert main(["eval", "--keys"]) == 0
    text = capsys.readouterr().out
    assert "model.max_retries (an integer, default 5, 0 to 100):" in text and "runs (an integer, default 1, 1 to 1,000)" \
        in text and "top_p (a number, default 1.0, above 0 to 1):" in text


def test_a_bound_holds_in_a_section_file_and_in_python_too(tmp_path):
    with pytest.raises(FicError, match="expected a value <= 1000, got 5000"):
        load_config(EvalConfig, None, ["runs=5000"])
    data = tmp_path / "bench.yaml"
    data.write_text("source: [gsm8k]\nlimit: 100000000\n")
    with pytest.raises(FicError, match=r"bench.yaml.*field 'data.limit': expected a value <= 10000000"):
        load_config(EvalConfig, None, [f"data={data}"])


@pytest.mark.parametrize("argv,flag,expected", [
    (["shard", "--source", "gsm8k", "--retries", HUGE], "--retries", "<= 100"),
    (["shard", "--source", "gsm8k", "--validate-runs", HUGE], "--validate-runs", "<= 1000"),
    (["shard", "--source", "gsm8k", "--validate-max-new-tokens", HUGE], "--validate-max-new-tokens", "<= 16777216"),
    (["shard", "--source", "gsm8k", "--limit", HUGE], "--limit", "<= 10000000"),
    (["shard", "--source", "gsm8k", "--seed", HUGE], "--seed", "<= 4294967295"),
    (["self-label", "--model", "m", "--source", "s", "--batch-size", HUGE], "--batch-size", "<= 4096"),
    (["self-label", "--model", "m", "--source", "s", "--max-new-tokens", HUGE], "--max-new-tokens", "<= 16777216"),
])
def test_a_verbs_flag_that_sizes_a_loop_or_a_batch_is_bounded_as_a_setting_is(argv, flag, expected, tmp_path, capsys):
    out = tmp_path / "out.jsonl"
    assert main([*argv, "--out", str(out)]) == 2
    err = capsys.readouterr().err.strip()
    assert err == f"fic {argv[0]}: error: field '{flag}': expected a value {expected}, got {HUGE}"
    assert not out.exists()
