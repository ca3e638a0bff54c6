"""`fic report --format lic`: an evaluation's conversations in Lost in Conversation's log format,
checked against LiC's schema (github.com/microsoft/lost_in_conversation: `utils_log.log_conversation`
writes the record, `utils_log.get_log_files` names the file, `simulator_sharded.py` and
`simulator_full.py` write the trace, `app_conv_viewer.py` reads it), and read back unchanged."""

from __future__ import annotations

import json
import re
import shutil
from datetime import datetime

import pytest
from scripted import FunctionBackend

from fic.cli.main import main
from fic.conversation.labels import LABELS
from fic.core.config import load_config
from fic.core.files import read_records
from fic.evaluation.evaluate import EvalConfig, evaluate
from fic.evaluation.lic_logs import LIC_KEYS, conv_type, from_lic, view_of

MODEL = "org/my-model"  # a name with a slash: LiC's file names replace it


def problems(path):
    path.write_text("".join(json.dumps({"question": f"Ann has {i + 2} apples. Ben gives her {i + 3} more apples. "
                                        "How many apples does Ann have?", "answer": f"#### {2 * i + 5}"}) + "\n"
                            for i in range(3)))
    return path


def assistant(messages) -> str:
    said = " ".join(m["content"] for m in messages if m["role"] == "user")
    if "Ann has 2 apples" in said and "3 more" in said:
        return "2 + 3 = 5\n#### 5"  # the first problem, once its numbers are there
    return "Could you tell me more about it?"


@pytest.fixture
def run(tmp_path):
    cfg = load_config(EvalConfig, None, [f"model.model={MODEL}", f"data.source=jsonl:{problems(tmp_path / 'mine.jsonl')}",
                                         "views=[full, concat, sharded]", "runs=2", f"out={tmp_path / 'run'}"])
    metrics = evaluate(cfg, assistant=FunctionBackend(assistant), progress=False)
    return tmp_path / "run", metrics


def lic_records(folder) -> dict[str, list[dict]]:
    return {str(p.relative_to(folder)): read_records(p) for p in sorted(folder.rglob("*.jsonl"))}


def check_lic_schema(record: dict) -> None:
    """A record as LiC's code writes and reads it."""
    assert tuple(record)[:len(LIC_KEYS)] == LIC_KEYS and set(record) - set(LIC_KEYS) <= {"fic"}
    assert re.fullmatch(r"[0-9a-f]{24}", record["conv_id"])  # bson ObjectId's hex
    assert isinstance(record["is_correct"], bool) and isinstance(record["score"], float)
    single = view_of(record["conv_type"]) in ("full", "concat", "shuffle-concat")
    assert (record["system_model"] == "NA") == single and (record["user_model"] == "NA") == single
    trace = record["trace"]
    assert trace[0]["role"] == "system" and {e["role"] for e in trace} <= {"system", "user", "assistant", "log"}
    for entry in trace:
        datetime.strptime(entry["timestamp"], "%Y-%m-%d %H:%M:%S")  # the viewer's format_timestamp
        if entry["role"] != "log":
            assert isinstance(entry["content"], str)
            continue
        event = entry["content"]
        kind = event["type"]
        assert kind in ("shard_revealed", "system-verification", "answer-evaluation", "conversation-completed")
        if kind == "shard_revealed":
            assert isinstance(event["shard_id"], int)
        elif kind == "system-verification":
            assert event["response"]["response_type"] in LABELS
        elif kind == "answer-evaluation":
            assert set(event) == {"type", "exact_answer", "is_correct", "score", "evaluation_return"}
            assert isinstance(event["is_correct"], bool) and "score" in event["evaluation_return"]
        else:
            assert event["is_correct"] is True
    if single:  # simulator_full: system, user, assistant, the evaluation
        assert [e["role"] for e in trace] == ["system", "user", "assistant", "log"]


def test_an_evaluation_exports_to_lic_s_files_and_schema_and_reads_back_unchanged(run, capsys):
    folder, metrics = run
    played = read_records(folder / "conversations.jsonl")
    assert all(r["model"] == MODEL for r in played)  # every conversation record names its model
    assert main(["report", "--format", "lic", str(folder)]) == 0
    assert "lic_logs" in capsys.readouterr().out
    files = lic_records(folder / "lic_logs")
    # LiC's layout: <task>/<conv_type>/<conv_type>_<task>_<model>.jsonl, the model's "/" made "_"
    assert sorted(files) == ["math/concat-t0.0/concat-t0.0_math_org_my-model.jsonl",
                             "math/full-t0.0/full-t0.0_math_org_my-model.jsonl",
                             "math/sharded-at0.0-ut1.0/sharded-at0.0-ut1.0_math_org_my-model.jsonl"]
    exported = [r for records in files.values() for r in records]
    assert len(exported) == len(played) == 3 * 3 * 2
    for record in exported:
        check_lic_schema(record)
        assert record["assistant_model"] == MODEL and record["dataset_fn"] == "mine.jsonl"
    assert len({r["conv_id"] for r in exported}) == len(exported)

    # The viewer's statistics (solved = is_correct, turns = user messages) are FiC's P and turns.
    for records in files.values():
        view = view_of(records[0]["conv_type"])
        solved = 100 * sum(r["is_correct"] for r in records) / len(records)
        assert solved == pytest.approx(metrics["views"][view]["P"])
        turns = sum(sum(e["role"] == "user" for e in r["trace"]) for r in records) / len(records)
        assert turns == pytest.approx(metrics["views"][view]["turns_per_conversation"])
    sharded = files["math/sharded-at0.0-ut1.0/sharded-at0.0-ut1.0_math_org_my-model.jsonl"]
    solved = next(r for r in sharded if r["is_correct"])
    assert solved["trace"][-1]["content"] == {"type": "conversation-completed", "is_correct": True}
    assert [e["content"]["shard_id"] for e in solved["trace"] if e["role"] == "log"
            and e["content"]["type"] == "shard_revealed"] == list(range(1, len([e for e in solved["trace"]
                                                                                if e["role"] == "user"]) + 1))

    # The round trip: LiC's record read back is FiC's, turn by turn.
    back = {(r["task_id"], r["view"], r["run"]): r for r in map(from_lic, exported)}
    for record in played:
        again = back[(record["task_id"], record["view"], record["run"])]
        for key in ("task", "score", "model", "system", "stop_reason", "num_shards", "first_answer_turn",
                    "premature_answer", "generated_tokens"):
            assert again[key] == record[key], key
        assert again["turns"] == [{k: t[k] for k in again["turns"][0]} for t in record["turns"]]
        assert set(again["turns"][0]) >= {"user", "shard_ids", "reply", "label", "answer", "score", "sent_at",
                                          "replied_at"}

    # exporting again replaces the files (LiC appends; a second export must not double them)
    assert main(["report", "--format", "lic", str(folder)]) == 0
    assert lic_records(folder / "lic_logs") == files


def test_a_record_lic_itself_wrote_reads_into_fic_s_fields():
    """A sharded conversation as simulator_sharded.py logs it: a turn that reveals nothing (the
    user's "I don't know"), LiC's labels, an answer that is wrong and then right."""
    t = "2025-05-01 10:00:00"
    record = {"conv_id": "6650f0c1a2b3c4d5e6f70809", "conv_type": "sharded", "task": "math", "task_id": "sharded-gsm8k-1",
              "dataset_fn": "sharded_instructions_600.json", "assistant_model": "gpt-4o-mini",
              "system_model": "gpt-4o-mini", "user_model": "gpt-4o-mini", "git_version": "abc", "is_correct": True,
              "score": 1.0, "trace": [
                  {"role": "system", "content": "You are a helpful assistant.", "timestamp": t},
                  {"role": "user", "content": "How many apples?", "timestamp": t, "cost_usd": 0.0},
                  {"role": "log", "content": {"type": "shard_revealed", "shard_id": 1}, "timestamp": t},
                  {"role": "assistant", "content": "How many do you have now?", "timestamp": t, "cost_usd": 0.0},
                  {"role": "log", "content": {"type": "system-verification",
                                              "response": {"response_type": "clarification"}}, "timestamp": t},
                  {"role": "user", "content": "I don't know, sorry.", "timestamp": t},
                  {"role": "assistant", "content": "Then it is 3.", "timestamp": t},
                  {"role": "log", "content": {"type": "system-verification",
                                              "response": {"response_type": "answer_attempt"}}, "timestamp": t},
                  {"role": "log", "content": {"type": "answer-evaluation", "exact_answer": "3", "is_correct": False,
                                              "score": 0.0, "evaluation_return": {"score": 0.0}}, "timestamp": t},
                  {"role": "user", "content": "I have 2 and get 3 more.", "timestamp": t},
                  {"role": "log", "content": {"type": "shard_revealed", "shard_id": 2}, "timestamp": t},
                  {"role": "assistant", "content": "#### 5", "timestamp": t},
                  {"role": "log", "content": {"type": "system-verification",
                                              "response": {"response_type": "answer_attempt"}}, "timestamp": t},
                  {"role": "log", "content": {"type": "answer-evaluation", "exact_answer": "5", "is_correct": True,
                                              "score": 1.0, "evaluation_return": {"score": 1.0}}, "timestamp": t},
                  {"role": "log", "content": {"type": "conversation-completed", "is_correct": True}, "timestamp": t}]}
    read = from_lic(record)
    assert read["view"] == "sharded" and read["model"] == "gpt-4o-mini" and read["score"] == 1.0
    assert [t["shard_ids"] for t in read["turns"]] == [[1], [], [2]]
    assert [t["label"] for t in read["turns"]] == ["clarification", "answer_attempt", "answer_attempt"]
    assert [(t["answer"], t["score"]) for t in read["turns"]] == [(None, None), ("3", 0.0), ("5", 1.0)]


def test_lic_s_conv_type_names():
    assert conv_type("full", 1.0) == "full" and conv_type("full", 0.0) == "full-t0.0"
    assert conv_type("sharded", 1.0, 1.0) == "sharded" and conv_type("sharded", 0.5, 1.0) == "sharded-at0.5-ut1.0"
    assert view_of("shuffle-concat-t0.0") == "shuffle-concat" and view_of("recap") == "recap"


def test_a_demo_folder_exports_one_merged_tree(run, tmp_path):
    folder, _ = run
    demo = tmp_path / "demo"
    (demo / "stages").mkdir(parents=True)
    shutil.copytree(folder, demo / "eval-start" / "test")
    shutil.copytree(folder, demo / "eval-start" / "test-unseen")
    for path in (demo / "eval-start" / "test-unseen").glob("*.jsonl"):  # the other split: other instances
        path.write_text(path.read_text().replace('"mine.jsonl:', '"unseen.jsonl:'))
    assert main(["report", "--format", "lic", str(demo), "--out", str(tmp_path / "exported")]) == 0
    trees = sorted(p.relative_to(tmp_path / "exported") for p in (tmp_path / "exported").rglob("lic_logs"))
    assert [str(p) for p in trees] == ["lic_logs"]  # one tree, not one per evaluation
    files = lic_records(tmp_path / "exported" / "lic_logs")
    assert len(files) == 3  # one model, one task, three conv_types: both splits' conversations in each file
    for records in files.values():
        assert {r["task_id"].split(":")[0] for r in records} == {"mine.jsonl", "unseen.jsonl"}
        assert len({r["conv_id"] for r in records}) == len(records)
    assert main(["report", "--format", "lic", str(tmp_path / "nothing")]) == 2


# --------------------------------------------------------------------------- LiC's viewer

LIC_MATH = [{"task_id": f"sharded-GSM8K/{i}", "task": "math", "question": f"Ann has {i + 2} apples. Ben gives her "
             f"{i + 3} more. How many apples does Ann have?", "answer": f"#### {2 * i + 5}",
             "shards": [{"shard_id": 1, "shard": "How many apples does Ann have?"},
                        {"shard_id": 2, "shard": f"Ann has {i + 2} apples."},
                        {"shard_id": 3, "shard": f"Ben gives her {i + 3} more."}]} for i in range(2)]


def viewer_models(log_folder, task: str, dataset_file: str) -> dict[str, list[dict]]:
    """What LiC's viewer (`app_conv_viewer.py`'s main) lists for a task, by its rule: every .jsonl of
    every conv_type folder of `<log_folder>/<task>/`, the records whose `dataset_fn` is the name of the
    task's own data file (`get_dataset_file()`, folders removed), grouped by `assistant_model`.
    An empty result is the viewer's empty model list ("An error occurred: None")."""
    task_folder = log_folder / task
    kept = []
    for conv_type_folder in sorted(p for p in task_folder.iterdir() if p.is_dir()):
        for file in sorted(f for f in conv_type_folder.iterdir() if f.name.endswith(".jsonl")):
            for line in file.read_text().splitlines():
                record = json.loads(line)
                if record["dataset_fn"] == dataset_file.split("/")[-1]:
                    kept.append(record)
    grouped: dict[str, list[dict]] = {}
    for record in kept:
        grouped.setdefault(record["assistant_model"], []).append(record)
    return grouped


def test_lic_s_viewer_shows_the_export_of_lic_s_own_instances(tmp_path, capsys):
    data = tmp_path / "lic_sample.json"  # LiC's instances, in LiC's format, under a name of the user's
    data.write_text(json.dumps(LIC_MATH))
    out = tmp_path / "run"
    cfg = load_config(EvalConfig, None, [f"model.model={MODEL}", f"data.source=lic:{data}", "views=[full, sharded]",
                                         f"out={out}"])
    evaluate(cfg, assistant=FunctionBackend(assistant), progress=False)
    assert main(["report", "--format", "lic", str(out)]) == 0
    shown = viewer_models(out / "lic_logs", "math", "data/sharded_math.json")  # LiC's TaskMath.get_dataset_file
    assert list(shown) == [MODEL] and len(shown[MODEL]) == 2 * 2
    assert {r["task_id"] for r in shown[MODEL]} == {i["task_id"] for i in LIC_MATH}  # ids the viewer looks up

    # a name given is written as given: the viewer's filter then keeps none of them
    assert main(["report", "--format", "lic", str(out), "--dataset-fn", "mine.json"]) == 0
    assert viewer_models(out / "lic_logs", "math", "data/sharded_math.json") == {}
    assert {r["dataset_fn"] for rs in lic_records(out / "lic_logs").values() for r in rs} == {"mine.json"}
    capsys.readouterr()
    assert main(["report", str(out), "--dataset-fn", "x.json"]) == 2
    assert "--dataset-fn" in capsys.readouterr().err


def test_instances_that_are_not_lic_s_keep_their_file_name(run):
    folder, _ = run
    assert main(["report", "--format", "lic", str(folder)]) == 0
    assert viewer_models(folder / "lic_logs", "math", "data/sharded_math.json") == {}  # the viewer cannot show them
