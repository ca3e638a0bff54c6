"""The `actions-gen` source (`fic.data.actions_gen`): deterministic, disjoint splits, held-out
templates, well-formed instances, and `fic shard` on it."""

import json
import re

import pytest

from fic import tasks
from fic.cli.main import main
from fic.core.errors import FicError
from fic.core.instance import Instance
from fic.data import actions_gen
from fic.data.actions_gen import SPLITS, generate, split_of
from fic.data.sources import load_source

ACTIONS = tasks.get("actions")

def reference_call(record):
    return ACTIONS.reference_answer(Instance.from_dict(record))


def test_generated_splits_are_deterministic_and_never_share_a_call():
    train = generate("train", 600, seed=0)
    assert train == generate("train", 600, seed=0)
    assert train != generate("train", 600, seed=1)
    calls = {split: {reference_call(r) for r in generate(split, 150, seed=3)} for split in ("dev", "test")}
    calls["train"] = {reference_call(r) for r in train} | {reference_call(r) for r in generate("train", 300, seed=7)}
    assert len(calls["dev"]) == len(calls["test"]) == 150  # no repeats within a split
    assert not calls["train"] & calls["dev"] and not calls["train"] & calls["test"] and not calls["dev"] & calls["test"]
    assert all(split_of(call) == split for split, found in calls.items() for call in found)


def test_test_unseen_shares_no_function_with_the_seen_splits():
    def functions(records):
        return {f["name"] for r in records for f in r["function"]}

    seen = functions(generate("train", 600)) | functions(generate("dev", 100)) | functions(generate("test", 100))
    unseen = generate("test-unseen", 150)
    assert len(seen) >= 20 and len(functions(unseen)) >= 6
    assert not functions(unseen) & seen


@pytest.mark.parametrize("split", SPLITS)
def test_generated_instances_are_well_formed(split):
    instances = load_source(f"actions-gen:{split}", "actions", limit=130, seed=5)
    assert len(instances) == 130
    for inst in instances:
        reference = inst.fields["reference_answer"]
        (name, params), = reference[0].items()
        given = {p: v[0] for p, v in params.items() if v != [""]}
        assert 2 <= len(given) <= 5 and len(inst.shards) == len(given) + 1
        assert name in {f["name"] for f in inst.fields["function"]} and 2 <= len(inst.fields["function"]) <= 3
        assert ACTIONS.score(ACTIONS.gold_reply(inst), inst) == 1.0
        assert not re.search(r"\d", inst.shard_texts[0])  # the intent only
        for value in given.values():
            shown = str(int(value)) if isinstance(value, float) and value.is_integer() else str(value)
            stated = re.compile(rf"(?<![\w.:-]){re.escape(shown)}(?![\w:]|\.\w)")  # 7 is not in 07:30
            assert stated.search(ACTIONS.full_prompt(inst)), (shown, ACTIONS.full_prompt(inst))
            assert sum(bool(stated.search(text)) for text in inst.shard_texts[1:]) == 1  # one argument a shard


def test_generated_source_refuses_bad_specs(monkeypatch):
    with pytest.raises(FicError, match="unknown split"):
        load_source("actions-gen:validation", "actions")
    with pytest.raises(FicError, match="--task actions"):
        load_source("actions-gen:train", "math")
    # Two small templates: 90 timer calls and 160 bike rentals, each drawn once at most.
    small = tuple(t for t in actions_gen.UNSEEN if t.name in ("set_timer", "rent_bike"))
    monkeypatch.setattr(actions_gen, "UNSEEN", small)
    assert len({reference_call(r) for r in generate("test-unseen", 200)}) == 200
    with pytest.raises(FicError, match="ran out of distinct instances"):
        generate("test-unseen", 251)


def test_cli_shards_and_shows_generated_instances(tmp_path, capsys):
    out = tmp_path / "dev.jsonl"
    assert main(["shard", "--source", "actions-gen:dev", "--task", "actions", "--limit", "4", "--out", str(out)]) == 0
    records = [json.loads(line) for line in out.read_text().splitlines()]
    assert records == generate("dev", 4)
    assert main(["views", "--data", str(out), "--view", "sharded", "--show", "1"]) == 0
    printed = capsys.readouterr().out
    assert "Functions:" in printed and records[0]["shards"][1]["shard"] in printed
    assert main(["shard", "--source", "actions-gen:dev", "--out", str(tmp_path / "x.jsonl")]) == 2
    assert "--task actions" in capsys.readouterr().err


def test_sliced_splits_are_prefixes_of_one_sequence_and_disjoint():
    whole = generate("test-unseen", 90, seed=0)
    assert generate("test-unseen", 30, seed=0) == whole[:30]  # a longer run changes no earlier instance
    test, dev, train = (load_source(f"actions-gen:test-unseen[{a}:{b}]", "actions")
                        for a, b in ((0, 30), (30, 60), (60, 90)))
    assert [i.task_id for i in test + dev + train] == [r["task_id"] for r in whole]
    calls = [{ACTIONS.reference_answer(i) for i in part} for part in (test, dev, train)]
    assert sum(map(len, calls)) == 90 and not calls[0] & calls[1] and not calls[1] & calls[2]
    assert [i.task_id for i in load_source("actions-gen:test-unseen[30:60]", "actions", limit=5)] == \
        [r["task_id"] for r in whole[30:35]]  # limit counts within the slice
    assert len(load_source("actions-gen:dev[10:]", "actions", limit=4)) == 4  # an open slice makes limit
    assert actions_gen.parse_split("test-unseen") == ("test-unseen", 0, None)
    for bad in ("test-unseen[5:5]", "test-unseen[a:b]", "dev[3]", "nope[0:4]"):
        with pytest.raises(FicError, match="unknown split|empty slice"):
            actions_gen.parse_split(bad)
