"""`fic report` on run files that are damaged, not UTF-8, or of the wrong types or shape: one
line naming the file (and the line), exit 2, never a traceback."""

from __future__ import annotations

import json

import pytest

from fic.cli.main import main


def record(**changes) -> dict:
    """A conversation record as fic eval logs it, with the fields `fic report` draws from."""
    base = {"task": "math", "view": "sharded", "task_id": "m1", "run": 0, "score": 1.0, "num_shards": 3,
            "first_answer_turn": 1, "shards_at_first_answer": 2, "generated_tokens": 40, "prompt_tokens": 300,
            "premature_answer": False, "turns": [{"label": "clarification", "score": None},
                                                 {"label": "answer_attempt", "score": 1.0}]}
    return {**base, **changes}


def one_error_line(capsys) -> str:
    err = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
    assert len(err) == 1 and "Traceback" not in err[0], err
    return err[0]


def test_a_well_formed_evaluation_is_drawn(tmp_path):
    (tmp_path / "conversations.jsonl").write_text(json.dumps(record()) + "\n" + json.dumps(record(task_id="m2")) + "\n")
    assert main(["report", str(tmp_path)]) == 0
    assert "# FiC evaluation report" in (tmp_path / "report.md").read_text()


@pytest.mark.parametrize("name", ["conversations.jsonl", "metrics.jsonl"])
def test_a_log_with_a_byte_that_is_not_utf8_is_one_line_naming_the_line(tmp_path, capsys, name):
    good = json.dumps(record() if name == "conversations.jsonl" else {"step": 1, "loss": 2.0})
    (tmp_path / name).write_bytes(good.encode() + b"\n" + good.encode()[:-1] + b'\xff}\n' + good.encode() + b"\n")
    assert main(["report", str(tmp_path)]) == 2
    line = one_error_line(capsys)
    assert name in line and "line 2 is not UTF-8" in line


def test_a_torn_last_line_is_still_passed_over_even_inside_a_character(tmp_path):
    text = json.dumps(record()).encode() + b"\n" + '{"task": "é'.encode()[:-1]  # cut inside a two-byte character
    (tmp_path / "conversations.jsonl").write_bytes(text)
    assert main(["report", str(tmp_path)]) == 0
    assert (tmp_path / "conversations.jsonl").read_bytes() == text


@pytest.mark.parametrize("changes, needle", [
    ({"score": "x"}, "field 'score': expected a number from 0 to 1, got 'x'"),
    ({"turns": "abc"}, "field 'turns': expected a list of turn objects"),
    ({"view": "bogus"}, "field 'view': expected one of"),
    ({"task": ["math"]}, "field 'task': expected a task name"),
    ({"first_answer_turn": 7}, "field 'first_answer_turn': expected a turn index or null, got 7"),
    ({"turns": [{"label": 3, "score": None}]}, "turn 1: expected a label string"),
    ({"generated_tokens": None}, "field 'generated_tokens': expected a number"),
])
def test_records_with_the_right_keys_but_wrong_types_are_one_line(tmp_path, capsys, changes, needle):
    (tmp_path / "conversations.jsonl").write_text(json.dumps(record()) + "\n" + json.dumps(record(**changes)) + "\n")
    assert main(["report", str(tmp_path)]) == 2
    line = one_error_line(capsys)
    assert f"line 2: {needle}" in line and "conversations.jsonl" in line


def test_a_metrics_json_of_the_wrong_shape_inside_is_one_line(tmp_path, capsys):
    (tmp_path / "metrics.json").write_text(json.dumps({"tasks": {"math": 5}, "views": {"sharded": "x"}}))
    assert main(["report", str(tmp_path)]) == 2
    assert "metrics.json: not the run files of a fic eval run: a value has the wrong type or shape" in \
        one_error_line(capsys)


def test_training_metrics_of_the_wrong_types_draw_what_is_numeric(tmp_path, capsys):
    lines = [{"step": 1, "loss": 2.0}, {"step": "2", "loss": 1.0}, {"step": 3, "loss": "low"}, [1, 2], {"step": True}]
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in lines))
    assert main(["report", str(tmp_path)]) == 0  # steps 1 and 3, the loss of step 1


def test_a_demo_report_file_of_the_wrong_shape_is_one_line(tmp_path, capsys):
    (tmp_path / "stages").mkdir()
    (tmp_path / "stages" / "report.json").write_text(json.dumps({"figures": {"sets": 5}}))
    assert main(["report", str(tmp_path)]) == 2
    assert "report.json: not the report.json of a fic demo: a value has the wrong type or shape" in \
        one_error_line(capsys)
    (tmp_path / "stages" / "report.json").write_text("[1, 2]")
    assert main(["report", str(tmp_path)]) == 2
    assert "expected a JSON object" in one_error_line(capsys)
