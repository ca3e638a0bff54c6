"""VASD's settings (`fic.training.vasd.config`): the paper's VASD in at most 40 settings of its
own, each other arm a plug-in section under `terms:`, the dev section shared with SFT, and old
keys refused in one line that names their new place."""

from __future__ import annotations

import dataclasses
import typing

import pytest

from fic.core.config import load_config
from fic.core.errors import FicError
from fic.training.config import DevSection
from fic.training.sft import SFTConfig
from fic.training.vasd.config import TermsSection, VASDConfig
from fic.training.vasd.terms import PLUGINS


def test_sfts_dev_curve_and_vasds_held_out_evaluation_are_one_section():
    """The keys they share mean the same: the same fields, defaults aside, declared once."""
    vasd, sft = VASDConfig().dev, SFTConfig().dev
    assert type(vasd) is DevSection and isinstance(sft, DevSection)
    shared = {f.name: f.metadata["help"] for f in dataclasses.fields(DevSection)}
    assert {f.name: f.metadata["help"] for f in dataclasses.fields(type(sft)) if f.name in shared} == shared
    assert {f.name for f in dataclasses.fields(type(sft))} - set(shared) == {"metric", "patience", "min_delta"}
    cfg = load_config(VASDConfig, None, ["train.max_steps=1", "anchor.share=0", "dev.every=2",
                                         "dev.data.source=reasoning-gym:gsm_symbolic", "dev.batch_size=4"])
    assert (cfg.dev.every, cfg.dev.batch_size, cfg.dev.views) == (2, 4, ["full", "sharded"])


def own_settings(cls: type) -> list[str]:
    """The leaves of VASD's own sections under `cls`: fields its bases do not declare, nested
    sections followed only where they are VASD's own (not the shared data, exclude, user
    simulator and dev sections, nor the plug-ins' `terms`)."""
    inherited = {f.name for base in cls.__mro__[1:] if dataclasses.is_dataclass(base) for f in dataclasses.fields(base)}
    hints = typing.get_type_hints(cls)
    found = []
    for f in dataclasses.fields(cls):
        if f.name in inherited and not dataclasses.is_dataclass(hints[f.name]):
            continue
        tp = hints[f.name]
        if not dataclasses.is_dataclass(tp):
            found.append(f.name)
        elif tp.__module__ == VASDConfig.__module__ and tp is not TermsSection:
            found += [f"{f.name}.{leaf}" for leaf in own_settings(tp)]
    return found


def test_the_papers_vasd_has_at_most_40_settings_of_its_own_and_each_arm_its_own_section():
    core = own_settings(VASDConfig)
    assert len(core) <= 40, core
    assert {key.split(".")[0] for key in core} == {"train", "rollout", "teacher", "loss", "anchor", "logging"}
    assert {"loss.weight", "loss.max_log_ratio", "teacher.view", "anchor.share", "train.share_prefixes"} <= set(core)
    sections = {f.name: f.type for f in dataclasses.fields(TermsSection)}
    assert set(sections) == {plugin.name for plugin in PLUGINS} >= {"labels", "corrections", "reward", "reference",
                                                                   "turns"}
    terms = VASDConfig().terms
    assert all(getattr(getattr(terms, name), "weight", 0.0) == 0.0 for name in sections)  # every arm off by default
    assert VASDConfig().terms.turns.replies == "final"


@pytest.mark.parametrize("override, field, new", [
    ("eval.every=1", "eval.every", "dev.every"),
    ("eval.data.limit=4", "eval.data", "dev.data"),
    ("labels.weight=1", "labels.weight", "terms.labels.weight"),
    ("corrections.ask_share=0.3", "corrections.ask_share", "terms.corrections.ask_share"),
    ("reward.group_size=2", "reward.group_size", "terms.reward.group_size"),
    ("regularizer.kind=none", "regularizer.kind", "anchor.share"),
    ("regularizer.anchor_path=x.jsonl", "regularizer.anchor_path", "anchor.path"),
    ("regularizer.reference_weight=2", "regularizer.reference_weight", "terms.reference.weight"),
    ("regularizer.first_tokens=2", "regularizer.first_tokens", "anchor.first_tokens"),
    ("loss.turns=all", "loss.turns", "terms.turns.replies"),
    ("loss.decision_tokens=2", "loss.decision_tokens", "terms.turns.decision_tokens"),
])
def test_an_old_key_is_refused_with_its_new_name(override, field, new):
    with pytest.raises(FicError) as err:
        load_config(VASDConfig, None, ["train.max_steps=1", "anchor.share=0", override])
    assert err.value.field == field and new in err.value.message and "\n" not in str(err.value)


def test_a_run_with_nothing_to_train_is_refused():
    with pytest.raises(FicError, match="nothing to train") as err:
        load_config(VASDConfig, None, ["train.max_steps=1", "anchor.share=0", "loss.weight=0"])
    assert err.value.field == "loss.weight"
    load_config(VASDConfig, None, ["train.max_steps=1", "anchor.share=0", "loss.weight=0", "terms.labels.weight=1"])


def test_keys_lists_the_core_sections_and_every_plug_in_section(capsys):
    from fic.cli.main import main

    assert main(["train", "vasd", "--keys"]) == 0
    listed = [line.split(" ", 1)[0].rstrip(":") for line in capsys.readouterr().out.splitlines()]
    for plugin in PLUGINS:
        section = dataclasses.fields(plugin.section)
        assert f"terms.{plugin.name}" in listed and all(f"terms.{plugin.name}.{f.name}" in listed for f in section)
    assert {"anchor.path", "loss.divergence", "dev.every", "rollout.temperature"} <= set(listed)
    assert not {key for key in listed if key.startswith(("labels", "reward", "regularizer", "eval"))}
