"""`fic prepare-model` and `fic masks` as a user runs them."""

import json

from fic.cli.main import main


def test_prepare_model_is_idempotent_through_the_cli(smollm2_dir, capsys):
    before = {p.name: p.stat().st_mtime_ns for p in smollm2_dir.iterdir()}
    assert main(["prepare-model", "--out", str(smollm2_dir)]) == 0
    assert f"bundled model ready in {smollm2_dir}" in capsys.readouterr().out
    assert {p.name: p.stat().st_mtime_ns for p in smollm2_dir.iterdir()} == before


def test_masks_prints_trained_spans(smollm2_dir, tmp_path, capsys):
    conversation = {"messages": [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "Ann has 3 pens."},
        {"role": "assistant", "content": "#### 3", "train": False},
        {"role": "user", "content": "She buys 2 more. How many?"},
        {"role": "assistant", "content": "Got it."},
        {"role": "user", "content": "That's all."},
        {"role": "assistant", "content": "3 + 2 = 5\n#### 5"},
    ]}
    data = tmp_path / "c.jsonl"
    data.write_text(json.dumps(conversation) + "\n")
    assert main(["masks", "--model", str(smollm2_dir), "--data", str(data)]) == 0
    lines = capsys.readouterr().out.splitlines()
    final = [line for line in lines if line.startswith("[F]")]
    trained = [line for line in lines if line.startswith("[A]")]
    assert final and "#### 5<|im_end|>" in "".join(final)
    assert any("Got it.<|im_end|>" in line for line in trained)
    assert not any("#### 3" in line for line in final + trained)  # the train: false turn is context only


def test_masks_bad_input_exits_2(smollm2_dir, tmp_path, capsys):
    data = tmp_path / "c.jsonl"
    data.write_text(json.dumps({"prompt": "no messages here"}) + "\n")
    assert main(["masks", "--model", str(smollm2_dir), "--data", str(data)]) == 2
    assert "field 'messages'" in capsys.readouterr().err
    assert main(["masks", "--model", str(tmp_path / "missing"), "--data", str(data)]) == 2
    assert "fic prepare-model" in capsys.readouterr().err
