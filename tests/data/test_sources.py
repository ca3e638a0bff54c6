"""Every data source, the LiC round trip, and malformed input that must be refused clearly."""

import json
from pathlib import Path

import pytest

from fic.core.errors import FicError
from fic.core.instance import Instance
from fic.data.sources import load_source

LIC_SAMPLE = Path(__file__).resolve().parents[3] / "shared/data/lost_in_conversation/sample_5_per_task.json"
needs_lic = pytest.mark.skipif(not LIC_SAMPLE.exists(), reason="../shared (LiC sample data) is not present")

GOOD = {"task_id": "t1", "task": "math", "question": "Ann has 3 apples. She buys 4 more. How many now?",
        "answer": "3+4=7\n#### 7", "shards": [{"shard_id": 1, "shard": "how many apples does Ann have?"},
                                              {"shard_id": 2, "shard": "she had 3"},
                                              {"shard_id": 3, "shard": "she buys 4 more"}]}


def write_jsonl(path, records):
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    return path


@needs_lic
def test_lic_source_keeps_math_instances_unchanged():
    raw = [r for r in json.loads(LIC_SAMPLE.read_text()) if r["task"] == "math"]
    instances = load_source(f"lic:{LIC_SAMPLE}", "math")
    assert len(instances) == 5
    assert [i.to_dict() for i in instances] == raw


def test_lic_source_filters_by_task(tmp_path):
    other = {"task_id": "x", "task": "summary", "shards": [{"shard_id": 0, "shard": ""}]}
    path = tmp_path / "lic.json"
    path.write_text(json.dumps([other, GOOD]))
    assert [i.task_id for i in load_source(f"lic:{path}", "math")] == ["t1"]


def test_jsonl_source_plain_and_sharded(tmp_path):
    plain = {"question": "Bo has 2 cats. How many cats?", "answer": "#### 2", "task_id": "p"}
    path = write_jsonl(tmp_path / "mine.jsonl", [plain, GOOD])
    first, second = load_source(f"jsonl:{path}", "math")
    assert not first.is_sharded and first.task == "math" and first.fields["question"] == plain["question"]
    assert second.is_sharded and second.to_dict() == GOOD


def test_gsm8k_local_file_in_hub_format(tmp_path):
    rows = [{"question": "Tom has 5 pens. He loses 2. How many are left?", "answer": "5-2=<<5-2=3>>3\n#### 3"},
            {"question": "A box has 6 eggs. How many in 2 boxes?", "answer": "#### 12"}]
    path = write_jsonl(tmp_path / "gsm8k_test.jsonl", rows)
    instances = load_source(f"gsm8k:{path}", "math")
    assert [i.fields["answer"] for i in instances] == [r["answer"] for r in rows]
    assert instances[0].task_id == "gsm8k-gsm8k_test/0" and not instances[0].is_sharded


def test_gsm8k_hub_split_goes_through_datasets(monkeypatch):
    import datasets

    calls = []

    def fake_load_dataset(*args, **kwargs):
        calls.append((args, kwargs))
        return datasets.Dataset.from_list([{"question": "q 1?", "answer": "#### 1"}])

    monkeypatch.setattr(datasets, "load_dataset", fake_load_dataset)
    instances = load_source("gsm8k:train", "math", limit=1)
    assert calls == [(("openai/gsm8k", "main"), {"split": "train[:1]"})]
    assert instances[0].task_id == "gsm8k-train/0"


def test_reasoning_gym_is_deterministic_and_keeps_worked_solutions():
    a = load_source("reasoning-gym:gsm_symbolic", "math", limit=5, seed=3)
    b = load_source("reasoning-gym:gsm_symbolic", "math", limit=5, seed=3)
    c = load_source("reasoning-gym:gsm_symbolic", "math", limit=5, seed=4)
    assert [i.to_dict() for i in a] == [i.to_dict() for i in b]
    assert [i.fields["question"] for i in a] != [i.fields["question"] for i in c]
    assert all(len(i.fields["answer"].splitlines()) > 1 for i in a)  # the worked solution is kept
    legs = load_source("reasoning-gym:leg_counting", "math", limit=2)
    assert all(i.fields["answer"].startswith("#### ") for i in legs)


MALFORMED = [
    # (file text, what the error must mention)
    ("{not json", "line 1 is not valid JSON"),
    ("[1, 2]", "expected a JSON object"),
    (json.dumps({**GOOD, "shards": None}), "field 'shards'"),
    (json.dumps({k: v for k, v in GOOD.items() if k != "shards"}), "field 'shards': missing"),
    (json.dumps({**GOOD, "shards": []}), "non-empty list of shards"),
    (json.dumps({**GOOD, "shards": [{"shard_id": 1, "shard": "  "}]}), "shards[0].shard': expected non-empty text"),
    (json.dumps({**GOOD, "shards": [{"shard_id": 1, "shard": "a"}, {"shard_id": 1, "shard": "b"}]}),
     "duplicate shard_id 1"),
    (json.dumps({**GOOD, "shards": [{"shard_id": "1", "shard": "a"}]}), "shards[0].shard_id': expected an integer"),
    (json.dumps({**GOOD, "shards": [{"shard_id": 1, "shard_text": "a"}]}), "the LiC data names this key 'shard'"),
    (json.dumps({**GOOD, "task": "poetry"}), "unknown task 'poetry'"),
    (json.dumps({**GOOD, "answer": "seven"}), "field 'answer'"),
    (json.dumps({**GOOD, "answer": "#### seven"}), "no number after '####'"),
    (json.dumps({k: v for k, v in GOOD.items() if k != "question"}), "field 'question'"),
    (json.dumps({k: v for k, v in GOOD.items() if k != "task_id"}), "field 'task_id'"),
    (json.dumps(GOOD) + "\n" + json.dumps(GOOD), "duplicate task_id 't1'"),
    ("", "file is empty"),
]


@pytest.mark.parametrize("text,needle", MALFORMED)
def test_malformed_input_is_refused_with_file_record_and_field(tmp_path, text, needle):
    path = tmp_path / "bad.jsonl"
    path.write_text(text)
    with pytest.raises(FicError) as err:
        load_source(f"lic:{path}", "math") if '"task": "poetry"' not in text else load_source(f"jsonl:{path}", "math")
    message = str(err.value)
    assert needle in message
    assert str(path) in message


def test_record_number_is_reported(tmp_path):
    path = write_jsonl(tmp_path / "d.jsonl", [GOOD, {**GOOD, "task_id": "t2", "answer": "no"}])
    with pytest.raises(FicError, match="record 2: field 'answer'"):
        load_source(f"jsonl:{path}", "math")


def test_bad_source_specs():
    with pytest.raises(FicError, match="unknown source"):
        load_source("hub:gsm8k", "math")
    with pytest.raises(FicError, match="needs a value"):
        load_source("lic:", "math")
    with pytest.raises(FicError, match="not a number"):
        load_source("reasoning-gym:spell_backward", "math", limit=1)
    with pytest.raises(FicError, match="could not create dataset"):
        load_source("reasoning-gym:no_such_generator", "math", limit=1)


def test_round_trip_keeps_extra_shard_keys():
    record = {"task_id": "s", "task": "math", "question": "q", "answer": "#### 1",
              "shards": [{"shard_id": 1, "shard": "x", "doc_idxs": [1, 2]}], "extra_key": {"a": 1}}
    assert Instance.from_dict(record).to_dict() == record


# --------------------------------------------------------------------------- the README's source table, promise by promise


def test_readme_lic_reads_json_and_jsonl_and_skips_other_tasks_unchecked(tmp_path):
    other = {"task_id": "code-1", "task": "code", "shards": "not even checked"}
    listed = tmp_path / "lic.json"
    listed.write_text(json.dumps([other, GOOD]))
    lines = write_jsonl(tmp_path / "lic.jsonl", [other, GOOD])
    for path in (listed, lines):
        assert [i.to_dict() for i in load_source(f"lic:{path}", "math")] == [GOOD]


def test_readme_gsm8k_defaults_to_the_test_split(monkeypatch):
    import datasets

    calls = []
    monkeypatch.setattr(datasets, "load_dataset", lambda *a, **k: calls.append((a, k)) or
                        datasets.Dataset.from_list([{"question": "q 1?", "answer": "#### 1"}]))
    assert load_source("gsm8k", "math")[0].task_id == "gsm8k-test/0"
    assert calls == [(("openai/gsm8k", "main"), {"split": "test"})]


@pytest.mark.parametrize("suffix", [".json", ".parquet"])
def test_readme_gsm8k_local_json_and_parquet(tmp_path, suffix):
    rows = [{"question": "Tom has 5 pens. He loses 2. How many are left?", "answer": "5-2=3\n#### 3"}]
    path = tmp_path / f"rows{suffix}"
    if suffix == ".json":
        path.write_text("\ufeff" + json.dumps(rows), encoding="utf-8")  # saved on Windows: a byte-order mark
    else:
        import pyarrow
        import pyarrow.parquet

        pyarrow.parquet.write_table(pyarrow.Table.from_pylist(rows), path)
    [instance] = load_source(f"gsm8k:{path}", "math")
    assert instance.task_id == "gsm8k-rows/0" and instance.fields == rows[0]


def test_readme_jsonl_takes_plain_question_answer_records_with_stable_ids(tmp_path):
    rows = [{"question": "Bo has 2 cats. How many cats?", "answer": "#### 2"},
            {"question": "Al has 4 hats and gives away 1. How many?", "answer": "4-1=3\n#### 3"}]
    path = tmp_path / "mine.jsonl"
    path.write_text("\ufeff" + json.dumps(rows[0]) + "\n\n" + json.dumps(rows[1]) + "\n", encoding="utf-8")
    first, second = load_source(f"jsonl:{path}", "math")
    # <file name>:<line>, blank lines counted, so an id points at its line; the task is --task.
    assert (first.task_id, second.task_id) == ("mine.jsonl:1", "mine.jsonl:3")
    assert first.task == "math" and first.fields == rows[0] and not first.is_sharded
    assert [i.task_id for i in load_source(f"jsonl:{path}", "math")] == ["mine.jsonl:1", "mine.jsonl:3"]
    listed = tmp_path / "mine.json"
    listed.write_text(json.dumps(rows))
    assert [i.task_id for i in load_source(f"jsonl:{listed}", "math")] == ["mine.json:1", "mine.json:2"]


def test_jsonl_default_id_colliding_with_an_explicit_one_is_refused(tmp_path):
    path = write_jsonl(tmp_path / "mine.jsonl", [{"question": "Bo has 2 cats. How many?", "answer": "#### 2"},
                                                  {**GOOD, "task_id": "mine.jsonl:1"}])
    with pytest.raises(FicError, match=r"record 2: field 'task_id': duplicate task_id 'mine.jsonl:1'"):
        load_source(f"jsonl:{path}", "math")


def test_gsm8k_row_without_an_answer_and_a_broken_parquet_file(tmp_path):
    path = write_jsonl(tmp_path / "rows.jsonl", [{"question": "q?", "answer": "#### 1"}, {"question": "q2?"}])
    with pytest.raises(FicError, match=r"rows.jsonl: record 2: field 'answer': missing"):
        load_source(f"gsm8k:{path}", "math")
    broken = tmp_path / "rows.parquet"
    broken.write_bytes(b"not parquet at all")
    with pytest.raises(FicError, match=r"rows.parquet: field 'source': cannot be read as Parquet \(Parquet magic bytes"):
        load_source(f"gsm8k:{broken}", "math")


# --------------------------------------------------------------------------- the one loader of the stages

MIA = "Mia has 17 yellow spools, 68 dark yellow spools, and 101 blue spools. What percent of her spools are yellow?"


def mixed_file(tmp_path):
    """One of each fate: sharded, sharded here, unshardable, a single shard, a task FiC does not know."""
    records = [GOOD,
               {"task_id": "cats", "task": "math", "question": "Sam has 3 cats. Each eats 2 cans. How many cans?",
                "answer": "3*2=6\n#### 6"},
               {"task_id": "mia", "task": "math", "question": MIA, "answer": "#### 45"},
               {"task_id": "one", "task": "math", "question": "Ann has 3 apples. How many?", "answer": "#### 3",
                "shards": [{"shard_id": 1, "shard": "Ann has 3 apples. How many?"}]},
               {"task_id": "s1", "task": "summary-like", "text": "..."}]
    return write_jsonl(tmp_path / "mixed.jsonl", records)


def test_load_sharded_shards_what_has_no_shards_and_counts_what_it_left_out(tmp_path):
    from fic.data.sources import SINGLE_SHARD, InstancesSection, load_sharded

    data = InstancesSection(source=[f"jsonl:{mixed_file(tmp_path)}"], task="all")
    loaded = load_sharded(data)
    assert [i.task_id for i in loaded.instances] == ["t1", "cats", "one"]  # the file's order
    (report,) = loaded.sources
    assert report.loaded == 4 and report.sharded_here == 1 and loaded.origins == []
    assert [(i.task_id, i.is_sharded) for i, _ in report.rejected] == [("mia", False)]  # as loaded
    unshardable = report.rejected[0][1]
    assert "only one fact" in unshardable
    assert loaded.dropped == {unshardable: 1, "task 'summary-like' is not a FiC task": 1}
    several = load_sharded(data, several_shards=True)
    assert [i.task_id for i in several.instances] == ["t1", "cats"]
    assert several.dropped == {**loaded.dropped, SINGLE_SHARD: 1}


def test_load_sharded_keeps_tasks_without_a_rule_sharder_as_loaded_only_when_asked(tmp_path, monkeypatch):
    from fic.data.sources import InstancesSection, load_sharded

    monkeypatch.delenv("FIC_SPIDER_DBS", raising=False)
    sql = {"task_id": "q1", "task": "database", "db_id": "shop", "schema_sql": "CREATE TABLE t (a INT);",
           "fully_specified_question": "How many rows has t?", "reference_sql": "SELECT count(*) FROM t"}
    data = InstancesSection(source=[f"jsonl:{write_jsonl(tmp_path / 'db.jsonl', [sql])}"], task="database")
    assert [i.task_id for i in load_sharded(data, shard_all=False).instances] == ["q1"]
    loaded = load_sharded(data)
    assert loaded.instances == [] and list(loaded.dropped) == [loaded.sources[0].rejected[0][1]]
    assert "no rule sharder" in loaded.sources[0].rejected[0][1]


def test_load_sharded_takes_another_sharder_and_reshards_on_request(tmp_path):
    from fic.core.instance import Shard
    from fic.data.sources import InstancesSection, load_sharded

    given = []

    def halves(instances):
        given.extend(instances)
        done = [Instance(i.task_id, i.task, [Shard(1, "first"), Shard(2, "second")], dict(i.fields))
                for i in instances if i.task_id != "cats"]
        return done, [(i, "the model gave one shard") for i in instances if i.task_id == "cats"]

    path = write_jsonl(tmp_path / "two.jsonl", [GOOD, {"task_id": "cats", "task": "math", "answer": "#### 6",
                                                      "question": "Sam has 3 cats. Each eats 2 cans. How many?"}])
    data = InstancesSection(source=[f"jsonl:{path}"])
    kept = load_sharded(data, sharder=halves)
    assert [i.task_id for i in given] == ["cats"] and [i.to_dict() for i in kept.instances] == [GOOD]
    given.clear()
    again = load_sharded(data, sharder=halves, reshard=True)
    assert [(i.task_id, i.is_sharded) for i in given] == [("t1", False), ("cats", False)]  # old shards dropped
    assert [i.shard_texts for i in again.instances] == [["first", "second"]]
    assert again.sources[0].rejected[0][0].task_id == "cats" and again.dropped == {"the model gave one shard": 1}


def test_every_stage_counts_the_same_reasons(tmp_path):
    """The corpus, the evaluator and VASD read instances through the one loader: the same file
    gives the same reasons (VASD's in its one-line error when nothing is left)."""
    from fic.core.config import load_config
    from fic.corpus.build import SFTDataConfig
    from fic.corpus.build import load_instances as corpus_instances
    from fic.data.sources import SINGLE_SHARD
    from fic.evaluation.evaluate import EvalConfig
    from fic.evaluation.evaluate import load_instances as eval_instances
    from fic.training.vasd.config import VASDConfig
    from fic.training.vasd.inputs import load_rollout_tasks

    source = [f"data.source=jsonl:{mixed_file(tmp_path)}", "data.task=all"]
    _, skipped = eval_instances(load_config(EvalConfig, None, ["model.model=m", "views=[sharded]", *source]))
    unshardable = next(reason for reason in skipped if "only one fact" in reason)
    assert skipped == {unshardable: 1, "task 'summary-like' is not a FiC task": 1}
    _, sources = corpus_instances(load_config(SFTDataConfig, None, source))
    assert {why: n for why, n in sources[0]["dropped"].items() if why in {**skipped, SINGLE_SHARD: 0}} == \
        {**skipped, SINGLE_SHARD: 1}
    singles = write_jsonl(tmp_path / "singles.jsonl", [
        {"task_id": "one", "task": "math", "question": "Ann has 3 apples. How many?", "answer": "#### 3",
         "shards": [{"shard_id": 1, "shard": "Ann has 3 apples. How many?"}]}])
    cfg = load_config(VASDConfig, None, [f"data.source=jsonl:{singles}", "anchor.share=0", "train.max_steps=1"])
    with pytest.raises(FicError, match=f"1 x {SINGLE_SHARD}") as err:
        load_rollout_tasks(cfg)
    assert err.value.field == "data.source" and "\n" not in str(err.value)
