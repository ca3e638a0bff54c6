"""VASD's settings (`fic.training.vasd.config`): the dev section shared with SFT, and old keys
refused in one line that names their new place."""

from __future__ import annotations

import dataclasses

import pytest

from fic.core.config import load_config
from fic.core.errors import FicError
from fic.training.config import DevSection
from fic.training.sft import SFTConfig
from fic.training.vasd.config import VASDConfig


def test_sfts_dev_curve_and_vasds_held_out_evaluation_are_one_section():
    """The keys they share mean the same: the same fields, defaults aside, declared once."""
    vasd, sft = VASDConfig().dev, SFTConfig().dev
    assert type(vasd) is DevSection and isinstance(sft, DevSection)
    shared = {f.name: f.metadata["help"] for f in dataclasses.fields(DevSection)}
    assert {f.name: f.metadata["help"] for f in dataclasses.fields(type(sft)) if f.name in shared} == shared
    assert {f.name for f in dataclasses.fields(type(sft))} - set(shared) == {"metric", "patience", "min_delta"}
    cfg = load_config(VASDConfig, None, ["train.max_steps=1", "regularizer.kind=none", "dev.every=2",
                                         "dev.data.source=reasoning-gym:gsm_symbolic", "dev.batch_size=4"])
    assert (cfg.dev.every, cfg.dev.batch_size, cfg.dev.views) == (2, 4, ["full", "sharded"])


@pytest.mark.parametrize("override, field, new", [
    ("eval.every=1", "eval.every", "dev.every"),
    ("eval.data.limit=4", "eval.data", "dev.data"),
])
def test_an_old_key_is_refused_with_its_new_name(override, field, new):
    with pytest.raises(FicError) as err:
        load_config(VASDConfig, None, ["train.max_steps=1", "regularizer.kind=none", override])
    assert err.value.field == field and new in err.value.message and "\n" not in str(err.value)
