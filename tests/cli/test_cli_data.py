"""The data verbs as a user runs them: exit codes, one-line errors, atomic outputs."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

from fic.cli.main import main

LIC_SAMPLE = Path(__file__).resolve().parents[3] / "shared/data/lost_in_conversation/sample_5_per_task.json"


def run_cli(*args):
    """Run `python -m fic` in a subprocess, as a user would."""
    return subprocess.run([sys.executable, "-m", "fic", *args], capture_output=True, text=True)


@pytest.mark.skipif(not LIC_SAMPLE.exists(), reason="../shared (LiC sample data) is not present")
def test_shard_lic_gives_the_five_math_instances_unchanged(tmp_path):
    out = tmp_path / "math.jsonl"
    result = run_cli("shard", "--source", f"lic:{LIC_SAMPLE}", "--task", "math", "--out", str(out))
    assert result.returncode == 0, result.stderr
    raw = [r for r in json.loads(LIC_SAMPLE.read_text()) if r["task"] == "math"]
    assert [json.loads(line) for line in out.read_text().splitlines()] == raw


def test_shard_reasoning_gym_then_views(tmp_path, capsys):
    out = tmp_path / "gsm.jsonl"
    assert main(["shard", "--source", "reasoning-gym:gsm_symbolic", "--limit", "12", "--seed", "2",
                 "--out", str(out)]) == 0
    records = [json.loads(line) for line in out.read_text().splitlines()]
    assert len(records) == 12 and all(len(r["shards"]) >= 2 for r in records)
    views_out = tmp_path / "views.jsonl"
    assert main(["views", "--data", str(out), "--view", "sharded", "--out", str(views_out), "--show", "1"]) == 0
    printed = capsys.readouterr().out
    assert "[user 1]" in printed and "[assistant] ..." in printed
    rendered = [json.loads(line) for line in views_out.read_text().splitlines()]
    assert rendered[0]["user_turns"] == [s["shard"] for s in records[0]["shards"]]
    # LiC's wording on request: its math system prompt and Q: ... A: frame.
    assert main(["views", "--data", str(out), "--view", "concat", "--prompts", "lic", "--show", "1"]) == 0
    printed = capsys.readouterr().out
    assert "[system] As an expert problem solver" in printed and "[user 1] Q: - " in printed and "\nA:" in printed


def test_shard_drops_unshardable_with_reasons(tmp_path, capsys):
    data = tmp_path / "mine.jsonl"
    data.write_text(json.dumps({"task_id": "a", "question": "How many legs do 3 cats have?", "answer": "#### 12"})
                    + "\n" + json.dumps({"task_id": "b", "question": "Ann has 3 pens. She buys 2. How many?",
                                         "answer": "#### 5"}) + "\n")
    out = tmp_path / "out.jsonl"
    assert main(["shard", "--source", f"jsonl:{data}", "--out", str(out)]) == 0
    assert [json.loads(x)["task_id"] for x in out.read_text().splitlines()] == ["b"]
    rejected = [json.loads(x) for x in (tmp_path / "out.rejected.jsonl").read_text().splitlines()]
    assert rejected[0]["task_id"] == "a" and "only one piece" in rejected[0]["rejected_reason"]
    assert "dropped 1" in capsys.readouterr().out


@pytest.mark.parametrize("args,needle", [
    (["shard", "--source", "lic:/no/such/file.json", "--out", "{tmp}/o.jsonl"], "file not found"),
    (["shard", "--source", "nowhere:x", "--out", "{tmp}/o.jsonl"], "unknown source"),
    (["shard", "--source", "reasoning-gym:gsm_symbolic", "--limit", "0", "--out", "{tmp}/o.jsonl"], "--limit"),
    (["views", "--data", "{tmp}/bad.jsonl", "--view", "sharded", "--out", "{tmp}/o.jsonl"], "duplicate shard_id"),
    (["views", "--data", "{tmp}/bad.jsonl", "--view", "diagonal", "--out", "{tmp}/o.jsonl"], "--view"),
])
def test_bad_input_exits_2_with_one_line_and_writes_nothing(tmp_path, args, needle):
    (tmp_path / "bad.jsonl").write_text(json.dumps(
        {"task_id": "a", "task": "math", "question": "q", "answer": "#### 1",
         "shards": [{"shard_id": 1, "shard": "x"}, {"shard_id": 1, "shard": "y"}]}) + "\n")
    result = run_cli(*[a.replace("{tmp}", str(tmp_path)) for a in args])
    assert result.returncode == 2
    assert needle in result.stderr and "Traceback" not in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1
    assert not (tmp_path / "o.jsonl").exists()
    assert not list(tmp_path.glob(".o.jsonl*"))  # no temporary file left behind


def test_atomic_write_leaves_old_file_when_interrupted(tmp_path):
    from fic.core.files import write_jsonl

    path = tmp_path / "out.jsonl"
    path.write_text("old\n")

    def records():
        yield {"a": 1}
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        write_jsonl(path, records())
    assert path.read_text() == "old\n"
    assert [p.name for p in tmp_path.iterdir()] == ["out.jsonl"]


@pytest.mark.parametrize("verb", [["eval"], ["probe"], ["sft-data"], ["demo"], ["train", "sft"], ["train", "vasd"]])
def test_every_config_verb_lists_its_keys_with_their_help(verb, capsys):
    assert main([*verb, "--keys"]) == 0
    listing = capsys.readouterr().out
    key = {"sft": "data.path", "vasd": "anchor.path"}.get(verb[-1], "data.source" if verb != ["demo"] else "sft.data.path")
    assert f"{key} (" in listing and "default" in listing
