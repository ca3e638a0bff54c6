"""`fic.bench.random_weights`: the random-weight SmolLM2-shaped folder `fic bench zero` trains, built
from the shape the package holds (no repository file), with the bundled model's tokenizer."""

from __future__ import annotations

import json

import pytest

from fic.bench import random_weights
from fic.core.errors import FicError


def test_the_packaged_smollm2_shape_is_the_bundled_models_architecture(smollm2_dir):
    real = json.loads((smollm2_dir / "config.json").read_text())
    for key, value in random_weights.SMOLLM2["config"].items():
        assert real[key] == (pytest.approx(value) if isinstance(value, float) else value), key


def test_the_module_builds_a_few_layers_of_smollm2_with_random_weights(tmp_path, smollm2_dir, capsys):
    from fic.core.model import load_model, load_tokenizer

    out = tmp_path / "model"
    assert random_weights.main(["--out", str(out), "--tokenizer", str(smollm2_dir), "--layers", "2",
                                "--set=intermediate_size=64", "--dtype", "float32"]) == 0
    record = json.loads(capsys.readouterr().out.strip().splitlines()[-1])  # after any library warning
    assert record == json.loads((out / random_weights.RANDOM_MARKER).read_text())
    assert record["random_weights"] and (record["layers"], record["full_layers"]) == (2, 30)
    model = load_model(out, dtype="float32")
    assert model.config.num_hidden_layers == 2 and model.config.hidden_size == 576
    assert model.config.eos_token_id == load_tokenizer(out).eos_token_id
    assert sum(p.numel() for p in model.parameters()) == record["parameters"]


def test_the_tokenizer_folder_is_the_given_one_or_the_prepared_bundled_model(tmp_path, smollm2_dir, monkeypatch):
    assert random_weights.tokenizer_dir(str(smollm2_dir)) == str(smollm2_dir)
    with pytest.raises(FicError, match="no tokenizer.json in this folder"):
        random_weights.tokenizer_dir(str(tmp_path))
    monkeypatch.chdir(tmp_path)  # no models/smollm2-135m-instruct here
    with pytest.raises(FicError, match="run `fic prepare-model`") as missing:
        random_weights.tokenizer_dir(None)
    assert missing.value.field == "--tokenizer"
    assert random_weights.tokenizer_dir(None, ("elsewhere", str(smollm2_dir))) == str(smollm2_dir)
    assert random_weights.main(["--out", str(tmp_path / "m"), "--tokenizer", str(tmp_path)]) == 2


def test_a_users_folder_at_out_is_refused_not_replaced(tmp_path, capsys):
    """FiC deletes only what it made: the build replaces an older random-weight folder, never a user's."""
    out = tmp_path / "mine"
    out.mkdir()
    (out / "notes.txt").write_text("mine")
    assert random_weights.main(["--out", str(out), "--tokenizer", str(tmp_path / "no-tokenizer-here")]) == 2
    err = capsys.readouterr().err
    assert str(out) in err and "field '--out': is in the way" in err
    assert [p.name for p in out.iterdir()] == ["notes.txt"]
