"""The LLM sharder (scripted sharder model, malformed outputs) and shard validation (scripted assistant)."""

from __future__ import annotations

import json
import re

import pytest
from scripted import FunctionBackend

from fic.cli.main import main
from fic.core.instance import Instance, Shard
from fic.core.parsing import number_values
from fic.data.llm_sharder import parse_shards, shard_with_llm
from fic.evaluation.shard_validation import validate_shards

QUESTION = ("Ara joined the team four years ago. She plays 40 games every year. She scores 21 points a game. "
            "How many points has she scored?")
GOOD = {"shards": [{"shard_id": 1, "shard": "how many points has Ara scored?"},
                   {"shard_id": 2, "shard": "she joined the team 4 years ago"},
                   {"shard_id": 3, "shard": "she plays 40 games every year"},
                   {"shard_id": 4, "shard": "she scores 21 points a game"}]}


def plain(task_id="ara", question=QUESTION, answer="#### 3360"):
    return Instance(task_id, "math", [], {"question": question, "answer": answer})


def test_numbers_are_compared_as_values():
    assert set(number_values("four years, $1.50 each, 1,200 people")) == {4, 1.5, 1200}
    assert set(number_values("someone went home")) == set()
    assert number_values("a dozen eggs at -3 and 3/4") == {12: 1, 3: 1, 0.75: 1}


def test_parse_shards_accepts_json_in_chatter_and_bare_lists():
    shards = parse_shards("Sure!\n```json\n" + json.dumps(GOOD) + "\n```", plain())
    assert [s.shard_id for s in shards] == [1, 2, 3, 4] and shards[1].shard == "she joined the team 4 years ago"
    listed = parse_shards(json.dumps([s["shard"] for s in GOOD["shards"]]), plain())
    assert [s.shard for s in listed] == [s.shard for s in shards]


@pytest.mark.parametrize("reply, reason", [
    ("I cannot do that.", "no JSON"),
    ('{"pieces": []}', "no 'shards' list"),
    ('{"shards": ["how many points has Ara scored, with 4 years, 40 games, 21 points?"]}', "at least 2"),
    ('{"shards": ["how many points?", ""]}', "not a non-empty string"),
    ('{"shards": ["how many points?", 7]}', "not a non-empty string"),
    ('{"shards": ["goal", "4 years", "4 years", "40 games", "21 points"]}', "the same"),
    ('{"shards": ["how many points?", "4 years", "40 games"]}', "leave out value(s) of the question: 21"),
    ('{"shards": ["how many points?", "4 years", "40 games", "21 points", "plus 5 bonus"]}', "add value(s)"),
    ('{"shards": ["points after 4 years of 40 games at 21 points?", "4 years", "40 games"]}', "shard 1 holds"),
    (json.dumps({"shards": [f"fact {i}" for i in range(13)]}), "at most 12"),
])
def test_parse_shards_rejects_malformed_output(reply, reason):
    with pytest.raises(ValueError, match=re.escape(reason)):
        parse_shards(reply, plain())


class ScriptedChat(FunctionBackend):
    def __init__(self, fn):
        super().__init__(fn)
        self.calls = []

    def chat(self, conversations, params):
        self.calls.append((len(conversations), params.temperature, params.seed))
        return super().chat(conversations, params)


def test_llm_sharder_retries_then_drops_with_a_reason():
    tries = {"ara": 0, "bob": 0}

    def model(messages):
        task = messages[-1]["content"]
        key = "ara" if "Ara" in task else "bob"
        tries[key] += 1
        if key == "ara" and tries[key] >= 2:
            return json.dumps(GOOD)
        return '{"shards": ["just one"]}' if key == "ara" else "no idea"

    backend = ScriptedChat(model)
    bob = plain("bob", "Bob has 3 cats and 2 dogs. How many pets?", "#### 5")
    kept, dropped = shard_with_llm([plain(), bob], backend, retries=2, progress=False)
    assert [i.task_id for i in kept] == ["ara"] and kept[0].shard_texts == [s["shard"] for s in GOOD["shards"]]
    assert kept[0].fields["answer"] == "#### 3360"
    [(instance, reason)] = dropped
    assert instance.task_id == "bob" and "no JSON" in reason and "3 attempts" in reason
    # One batched call per round; retries sample (a greedy retry would repeat itself) with new seeds.
    assert [c[0] for c in backend.calls] == [2, 2, 1]
    assert backend.calls[0][1] == 0.0 and all(c[1] >= 0.7 for c in backend.calls[1:])
    assert len({c[2] for c in backend.calls}) == 3


def sharded(task_id, number):
    return Instance(task_id, "math", [Shard(1, f"what is the total for {task_id}?"), Shard(2, "part one is 3"),
                                      Shard(3, "part two is 4")],
                    {"question": f"{task_id}: part one is 3 and part two is 4. What is the total?",
                     "answer": f"#### {number}"})


def test_validation_keeps_only_instances_whose_concat_views_keep_up(smollm2_tokenizer):
    def assistant(prompt: str) -> str:
        # Right for "good" in every view, right for "bad" only with the full question, never for "lost".
        bulleted = "- what is the total" in prompt
        if "good" in prompt or ("bad" in prompt and not bulleted):
            return "3 + 4 = 7\n#### 7"
        return "#### 1"

    backend = FunctionBackend(assistant, smollm2_tokenizer)
    verdicts = validate_shards([sharded("good", 7), sharded("bad", 7), sharded("lost", 7)], backend, runs=2,
                               temperature=0.0, progress=False)
    by_id = {v.instance.task_id: v for v in verdicts}
    assert by_id["good"].keep and by_id["good"].scores == {"full": 1.0, "concat": 1.0, "shuffle-concat": 1.0}
    assert not by_id["bad"].keep
    assert "concat scores 0.00 < 0.8 x full 1.00" in by_id["bad"].reason
    assert "shuffle-concat" in by_id["bad"].reason
    assert by_id["lost"].keep and by_id["lost"].scores["full"] == 0.0  # 0 >= 0.8 x 0, as in LiC


def test_validation_threshold_is_a_share_of_full(smollm2_tokenizer):
    calls = {"n": 0}

    def assistant(prompt: str) -> str:  # concat right in 1 of 2 runs: 0.5 of full
        if "- what is the total" in prompt:
            calls["n"] += 1
            return "#### 7" if calls["n"] % 2 else "#### 2"
        return "#### 7"

    backend = FunctionBackend(assistant, smollm2_tokenizer)
    (strict,) = validate_shards([sharded("x", 7)], backend, runs=2, temperature=0.0, progress=False)
    (lenient,) = validate_shards([sharded("x", 7)], backend, runs=2, temperature=0.0, threshold=0.5,
                                 progress=False)
    assert not strict.keep and lenient.keep


def test_shard_cli_with_llm_sharder_and_validation(tmp_path, monkeypatch, capsys, smollm2_tokenizer):
    import fic.cli.data

    source = tmp_path / "plain.jsonl"
    source.write_text(json.dumps({"task_id": "ara", "task": "math", "question": QUESTION, "answer": "#### 3360"})
                      + "\n" + json.dumps({"task_id": "bob", "task": "math", "question": "Bob has 3 cats and 2 dogs. "
                                           "How many pets?", "answer": "#### 5"}) + "\n")
    (tmp_path / "sharder.yaml").write_text("kind: hf\nmodel: whatever\n")
    (tmp_path / "assistant.yaml").write_text("kind: hf\nmodel: whatever\n")
    sharder = ScriptedChat(lambda messages: json.dumps(GOOD) if "Ara" in messages[-1]["content"] else "nope")
    assistant = FunctionBackend(lambda prompt: "#### 3360", smollm2_tokenizer)
    made = []

    def fake_backend(path, option):
        made.append(option)
        return sharder if option == "--sharder-config" else assistant

    monkeypatch.setattr(fic.cli.data, "_backend_from_yaml", fake_backend)
    out = tmp_path / "out.jsonl"
    code = main(["shard", "--source", f"jsonl:{source}", "--out", str(out), "--sharder", "llm", "--sharder-config",
                 str(tmp_path / "sharder.yaml"), "--retries", "0", "--validate", str(tmp_path / "assistant.yaml"),
                 "--validate-runs", "1", "--validate-temperature", "0"])
    assert code == 0 and made == ["--sharder-config", "--validate"]
    [kept] = [json.loads(line) for line in out.read_text().splitlines()]
    assert kept["task_id"] == "ara" and len(kept["shards"]) == 4
    [rejected] = [json.loads(line) for line in (tmp_path / "out.rejected.jsonl").read_text().splitlines()]
    assert rejected["task_id"] == "bob" and rejected["rejected_stage"] == "shard"
    assert "no JSON" in rejected["rejected_reason"]
    assert "validation kept 1 of 1" in capsys.readouterr().out


@pytest.mark.parametrize("args, message", [
    (["--sharder", "llm"], "--sharder-config"),
    (["--sharder-config", "x.yaml"], "only used with --sharder llm"),
    (["--sharder", "llm", "--sharder-config", "missing.yaml"], "backend config not found"),
    (["--validate", "v.yaml", "--validate-threshold", "1.5"], "--validate-threshold"),
    (["--validate", "v.yaml", "--validate-runs", "0"], "--validate-runs"),
])
def test_shard_cli_bad_options(args, message, tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "data.jsonl").write_text(json.dumps({"task_id": "a", "task": "math", "question": QUESTION,
                                                     "answer": "#### 3360"}) + "\n")
    assert main(["shard", "--source", "jsonl:data.jsonl", "--out", "o.jsonl", *args]) == 2
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err
