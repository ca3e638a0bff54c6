"""The programs the sandbox runs by path (`fic/sandbox/launcher.py`, `guard.py`, `sql_worker.py`
and the code task's `fic/tasks/code_harness.py`) are modules of their own: of the standard library
alone (they run with `python -I -S`, outside FiC's environment), inert when imported, and doing
their work when run."""

import ast
import subprocess
import sys
from pathlib import Path

import pytest
from sandboxed import ROOT, Runs, stray_processes

import fic.sandbox
import fic.tasks
from fic.sandbox import guard, python, sql, sql_worker

PROGRAMS = [Path(fic.sandbox.__file__).with_name(name) for name in ("launcher.py", "guard.py", "sql_worker.py")] + [
    Path(fic.tasks.__file__).with_name("code_harness.py")]


@pytest.mark.parametrize("path", PROGRAMS, ids=lambda p: p.name)
def test_a_program_imports_the_standard_library_alone(path):
    imported = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            imported |= {alias.name.split(".")[0] for alias in node.names}
        elif isinstance(node, ast.ImportFrom):
            assert node.level == 0, f"{path.name} imports relatively: it runs as a script"
            imported.add(node.module.split(".")[0])
    assert imported <= set(sys.stdlib_module_names), imported - set(sys.stdlib_module_names)


def test_the_sandbox_runs_the_package_files():
    assert python.GUARD == PROGRAMS[1] and python.LAUNCHER == PROGRAMS[0] and sql.SQL_WORKER == PROGRAMS[2]


def run_guard(folder: Path, program: str, guard_on: bool) -> subprocess.CompletedProcess:
    """The guard run directly (no sandbox around it) in `folder` on `program`."""
    (folder / "program.py").write_text(program)
    env = {"FIC_SANDBOX_NONCE": "n0nce", "FIC_SANDBOX_GUARD": "on" if guard_on else "off"}
    return subprocess.run([python.python_interpreter(), "-I", "-S", "-B", str(python.GUARD)], cwd=folder, env=env,
                          capture_output=True, text=True, timeout=60)


def test_the_guard_refuses_and_says_so_or_runs_the_program_to_its_end(tmp_path):
    folder, secret = tmp_path / "run", tmp_path / "secret.txt"
    folder.mkdir()
    secret.write_text("the-secret-value")
    reader = f"print(open({str(secret)!r}).read())\n"
    refused = run_guard(folder, reader, guard_on=True)
    assert refused.returncode != 0 and "the-secret-value" not in refused.stdout
    assert f"{guard.REFUSED}reading {secret} (outside its folder)" in refused.stderr.splitlines()
    assert guard.DONE not in refused.stdout
    # Left out, the program runs to its end and the guard prints the run's nonce after it.
    done = run_guard(folder, reader, guard_on=False)
    assert done.returncode == 0 and done.stdout.rstrip().endswith(guard.DONE + "n0nce")
    assert "the-secret-value" in done.stdout


def test_the_programs_are_inert_when_imported():
    # Importing one (as the sandbox's own modules and the tests do) installs no hook, sets no
    # limit, reads no stdin: their work is in main(), run only as a script.
    code = ("import resource\nbefore = resource.getrlimit(resource.RLIMIT_AS)\n"
            "import fic.sandbox.guard, fic.sandbox.sql_worker, fic.sandbox.launcher, fic.tasks.code_harness\n"
            "assert resource.getrlimit(resource.RLIMIT_AS) == before\n"
            "open('/proc/self/status').close()\n"  # a read the guard's hook would refuse
            "print('inert')\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60,
                          stdin=subprocess.DEVNULL)
    assert done.returncode == 0 and done.stdout.strip() == "inert" and "refused" not in done.stderr, done.stderr


@pytest.fixture
def pets(database):
    return f"{database.as_uri()}?mode=ro"


def test_the_sql_worker_reads_and_refuses_writes(pets):
    limits = (2.0, 100, 1 << 20, 1 << 20, 10_000)
    assert sql_worker.run(pets, "SELECT kind FROM pets ORDER BY id", *limits) == ("rows", [("dog",), ("cat",)], 1)
    kind, reason = sql_worker.run(pets, "DELETE FROM pets", *limits)
    assert kind == "error" and reason.startswith(("refused", "SQL error: attempt to write"))
    kind, reason = sql_worker.run(pets, "ATTACH DATABASE ':memory:' AS other", *limits)
    assert kind == "error" and reason.startswith("refused")
    kind, reason = sql_worker.run(pets, "WITH RECURSIVE c(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM c "
                                        "LIMIT 1000) SELECT x FROM c", 2.0, 100, 1 << 20, 1 << 20, 10_000)
    assert kind == "error" and reason == "row limit: more than 100 rows"


def test_the_sql_worker_runs_by_path(database):
    rows, _, reason = sql.run_sql(database, "SELECT count(*) FROM pets")
    assert rows == [(2,)] and reason is None
    cmdline = Path(f"/proc/{sql._sql_worker.process.pid}/cmdline").read_bytes().split(b"\0")
    assert cmdline[1:5] == [b"-I", b"-S", b"-B", str(sql.SQL_WORKER).encode()]


def test_stray_processes_are_this_tests_runs_only(tmp_path):
    # Another suite's run on the same machine (another run user id, another folder) is not this
    # test's stray; a process of one of this test's run ids, or working in its folder, is.
    elsewhere, here = tmp_path / "elsewhere", tmp_path / "here"
    elsewhere.mkdir()
    here.mkdir()
    other_uid = python.RUN_UIDS[0] + 12345
    theirs = subprocess.Popen(["sleep", "60"], cwd=elsewhere, user=other_uid if ROOT else None)
    ours = subprocess.Popen(["sleep", "60"], cwd=here)
    try:
        found = stray_processes(None, set(), str(here))
        assert any(line.startswith(f"{ours.pid}:") for line in found)
        assert not any(line.startswith(f"{theirs.pid}:") for line in found)
        if ROOT:
            found = stray_processes(None, {other_uid}, str(here))
            assert any(line.startswith(f"{theirs.pid}:") for line in found)
        runs = Runs(tmp_path / "nowhere")
        assert not any(line.startswith(f"{theirs.pid}:") for line in runs.left_behind())
    finally:
        theirs.kill()
        ours.kill()
        theirs.wait()
        ours.wait()
