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


def test_a_demo_folder_exports_each_evaluation(run, tmp_path):
    folder, _ = run
    demo = tmp_path / "demo"
    (demo / "stages").mkdir(parents=True)
    shutil.copytree(folder, demo / "eval-start" / "test")
    assert main(["report", "--format", "lic", str(demo), "--out", str(tmp_path / "exported")]) == 0
    assert len(list((tmp_path / "exported" / "eval-start" / "test" / "lic_logs").rglob("*.jsonl"))) == 3
    assert main(["report", "--format", "lic", str(tmp_path / "nothing")]) == 2
