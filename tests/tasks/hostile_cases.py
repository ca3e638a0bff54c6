"""The hostile-output suite's cases and its evaluator, run in a child process by
tests/tasks/test_hostile.py (`python hostile_cases.py OUT_JSON SCRATCH`): replies a hostile model
could write, scored by the real tasks under the sandbox mode in force (`FIC_SANDBOX`, else
bubblewrap), each followed by the checks that nothing escaped:

- no file appeared outside the sandbox's folder (each case writes, or tries to, a marker in SCRATCH);
- no process was left (a process of a user id one of this suite's runs was given, one working in
  one of its run folders, or one whose command line holds the case's signature, a number unique
  to this suite's run: another FiC suite on the machine is not counted);
- the evaluator (this process) is alive: it reports every case, and the test checks it exited 0;
- nothing reached a TCP listener of the evaluator;
- no other process was touched: the evaluator's and a bystander's resource limits, nice value
  and CPU affinity are as before, and the bystander (a process of the same user outside the
  evaluator's group and session, as any other process of the machine) is alive.

One JSON line a case is written to OUT_JSON as it finishes, so a case that kills the evaluator is
named by the test (the last line missing)."""

from __future__ import annotations

import json
import os
import random
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

EVALUATOR = os.getpid()
GROUP = os.getpgid(0)
# The sleeps of the cases that start processes, made unique to this suite's run by a suffix, so
# that the processes of another suite running the same cases are never taken for this one's.
SIGNATURES = ("61.0101", "61.0202", "61.0303", "61.0404", "61.0505")
TAG = f"{random.SystemRandom().randrange(10**6):06d}"


def block(body: str) -> str:
    """A code reply: `solve()` runs `body`, then returns 1 (what the test expects)."""
    indented = "\n".join("    " + line for line in body.strip("\n").splitlines())
    return f"Here is my solution:\n```python\ndef solve():\n{indented}\n    return 1\n```"


def cases(scratch: Path, port: int, bystander: int = 0) -> list[dict]:
    """name, task, reply, the score it may get (None: 0), and a signature of processes it starts."""
    marker = lambda name: str(scratch / f"{name}.marker")  # noqa: E731
    gc_off = ("import gc\nfor f in gc.get_objects():\n    if type(f).__name__ == 'function' and f.__closure__:\n"
              "        for c in f.__closure__:\n            try:\n"
              "                if getattr(c.cell_contents, '__name__', '') == 'refuse':\n"
              "                    c.cell_contents = lambda what: None\n            except ValueError:\n"
              "                pass\n")
    code = [
        ("the issue's 47-token reply (RecursionError in ast.parse)", "return " + "-" * 3000 + "1"),
        ("6,000 unary minus (MemoryError in ast.parse)", "return " + "-" * 6000 + "1"),
        ("a loop that never ends", "while True:\n    pass"),
        ("a sleep that never ends", "import time\ntime.sleep(3600)"),
        ("a memory bomb", "x = []\nwhile True:\n    x.append(bytearray(64 << 20))"),
        ("200 forks that sleep", "import os, time\nfor _ in range(200):\n    try:\n        if os.fork() == 0:\n"
         "            time.sleep(61.0101)\n            os._exit(0)\n    except OSError:\n        break\n"
         "raise SystemExit(1)"),
        ("a multiprocessing fork bomb that catches refusals",
         "import multiprocessing as mp, time\nfor _ in range(100):\n    try:\n"
         "        mp.Process(target=time.sleep, args=(61.0202,)).start()\n    except Exception:\n        pass"),
        ("reading /etc/shadow inside try/except", "try:\n    open('/etc/shadow').read()\nexcept Exception:\n    pass"),
        ("writing a file outside its folder", f"open({marker('write')!r}, 'w').write('escaped')"),
        ("os.system touching a file outside", f"import os\nos.system('touch {marker('system')}')"),
        ("subprocess running id", "import subprocess\nprint(subprocess.run(['id'], capture_output=True).stdout)"),
        ("a socket to the evaluator's listener", f"import socket\nsocket.create_connection(('127.0.0.1', {port}))"),
        ("kill its parent", "import os\nos.kill(os.getppid(), 9)"),
        ("kill the evaluator by pid", f"import os\nos.kill({EVALUATOR}, 9)"),
        ("kill the evaluator's process group", f"import os\nos.killpg({GROUP}, 9)"),
        ("kill every process (-1)", "import os\nos.kill(-1, 9)"),
        ("pidfd_send_signal to its parent", "import os, signal\nsignal.pidfd_send_signal(os.pidfd_open(os.getppid()), 9)"),
        ("pidfd_send_signal to the evaluator", f"import os, signal\nsignal.pidfd_send_signal(os.pidfd_open({EVALUATOR}), 9)"),
        ("a setsid daemon that outlives the run",
         "import os, time\nif os.fork() == 0:\n    os.setsid()\n    if os.fork() == 0:\n        time.sleep(61.0303)\n"
         "    os._exit(0)\ntime.sleep(0.3)"),
        ("switching the guard off (gc), then reading /etc/shadow", gc_off + "print(open('/etc/shadow').read())"),
        ("switching the guard off (gc), then writing outside", gc_off + f"open({marker('gc-write')!r}, 'w').write('x')"),
        ("switching the guard off (gc), then os.system", gc_off + f"import os\nos.system('touch {marker('gc-system')}')"),
        ("switching the guard off (gc), then ctypes kill of the evaluator",
         gc_off + f"import ctypes\nassert ctypes.CDLL(None).kill({EVALUATOR}, 9) == 0"),
        ("switching the guard off (gc), then a raw socket",
         gc_off + f"import socket\nsocket.create_connection(('127.0.0.1', {port}), timeout=1)"),
        ("switching the guard off (gc), then 200 sleeping forks",
         gc_off + "import os, time\nfor _ in range(200):\n    try:\n        if os.fork() == 0:\n"
         "            time.sleep(61.0404)\n            os._exit(0)\n    except OSError:\n        break\nraise SystemExit(1)"),
        ("prlimit the evaluator's CPU time to 1 s (it would die at the next second)",
         f"import resource\nresource.prlimit({EVALUATOR}, resource.RLIMIT_CPU, (1, 1))"),
        ("prlimit the evaluator's file size to 1 byte",
         f"import resource\nresource.prlimit({EVALUATOR}, resource.RLIMIT_FSIZE, (1, 1))"),
        ("prlimit its parent's (the supervisor's) open files to 3",
         "import os, resource\nresource.prlimit(os.getppid(), resource.RLIMIT_NOFILE, (3, 3))"),
        ("prlimit and kill a bystander process of the same user",
         f"import os, resource\nresource.prlimit({bystander}, resource.RLIMIT_NOFILE, (3, 3))\nos.kill({bystander}, 9)"),
        ("renice and pin the evaluator",
         f"import os\nos.setpriority(os.PRIO_PROCESS, {EVALUATOR}, 19)\nos.sched_setaffinity({EVALUATOR}, {{0}})"),
        ("switching the guard off (gc), then prlimit of the evaluator and the bystander",
         gc_off + f"import resource\nfor pid in ({EVALUATOR}, {bystander}):\n"
         "    resource.prlimit(pid, resource.RLIMIT_CPU, (1, 1))"),
        ("switching the guard off (gc), then raw prlimit64 and kill of the bystander",
         gc_off + f"import ctypes\nlibc = ctypes.CDLL(None)\nlimit = (ctypes.c_ulong * 2)(3, 3)\n"
         f"assert libc.prlimit64({bystander}, 7, limit, None) == 0\nassert libc.kill({bystander}, 9) == 0"),
        ("switching the guard off (gc), then ptrace of the bystander",
         gc_off + f"import ctypes\nassert ctypes.CDLL(None).ptrace(16, {bystander}, 0, 0) == 0"),
        ("four forked children holding 120 MB each (the tree's memory)",
         "import os, time\nfor _ in range(4):\n    if os.fork() == 0:\n        held = b'x' * (120 << 20)\n"
         "        time.sleep(61.0505)\n        os._exit(0)\ntime.sleep(1.5)"),
        ("100 MB on stdout", "import sys\nfor _ in range(100):\n    sys.stdout.write('x' * (1 << 20))"),
        ("1,000 files of 1 MB in its folder (each under the file-size limit)",
         "for i in range(1000):\n    open(f'f{i}', 'wb').write(b'x' * (1 << 20))"),
        ("os._exit(0) before the tests end", "import os\nos._exit(0)"),
    ]
    # A program that catches a refusal (or starts a daemon) and returns 1 passes, and its note says
    # what was refused (or killed); every other case scores 0.
    lenient = ("catches", "try/except", "daemon")
    code = [(name, _tagged(body)) for name, body in code]
    found = [{"name": name, "task": "code", "reply": block(body), "may_score": (0.0, 1.0) if any(
              word in name for word in lenient) else (0.0,), "signature": _signature(body),
              "note_starts": "memory limit: the process tree" if "the tree's memory" in name
              else "disk limit: the run's folder" if "in its folder" in name else ""}
             for name, body in code]
    sql = [
        ("printf('%.*c', 2e9) (12-17 s in-process)", "SELECT length(printf('%.*c', 2000000000, 'x'))"),
        ("format('%.*c', 2e9)", "SELECT length(format('%.*c', 2000000000, 'y'))"),
        ("three slow calls in one query", "SELECT length(printf('%.*c', 2000000000, 'x')) + "
         "length(printf('%.*c', 2000000000, 'y')) + length(format('%.*c', 2000000000, 'z'))"),
        ("a recursive CTE that never ends",
         "WITH RECURSIVE c(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM c) SELECT count(*) FROM c"),
        ("ATTACH a file outside", f"ATTACH DATABASE '{marker('attach')}' AS other"),
        ("VACUUM INTO a file outside", f"VACUUM INTO '{marker('vacuum')}'"),
        ("load_extension", "SELECT load_extension('/tmp/evil.so')"),
        ("DELETE", "DELETE FROM pets"),
        ("DELETE behind a WITH", "WITH d AS (SELECT 1) DELETE FROM pets"),
        ("PRAGMA writable_schema", "PRAGMA writable_schema = ON"),
        ("a blob of 500 MB", "SELECT randomblob(500000000)"),
        ("a million rows", "WITH RECURSIVE c(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM c LIMIT 1000000) "
         "SELECT x FROM c"),
    ]
    found += [{"name": name, "task": "database", "reply": f"```sql\n{query}\n```", "may_score": (0.0,),
               "signature": None} for name, query in sql]
    calls = [
        ("function calls nested 5,000 deep", "[rent_car(city=" + "[" * 5000 + "1" + "]" * 5000 + ")]"),
        ("a 6 MB argument list", "[rent_car(city=[" + "1, " * 2_000_000 + "1])]"),
        ("calls inside calls", "[rent_car(city=rent_car(city=rent_car(city='Rome')))]"),
    ]
    found += [{"name": name, "task": "actions", "reply": reply, "may_score": (0.0,), "signature": None}
              for name, reply in calls]
    found += [{"name": "a math answer of 5,000 digits", "task": "math", "reply": "#### " + "9" * 5000,
               "may_score": (0.0,), "signature": None},
              {"name": "a LaTeX answer nested 300 deep", "task": "math",
               "reply": "\\boxed{" + "\\frac{1}{" * 300 + "2" + "}" * 300 + "}", "may_score": (0.0,), "signature": None}]
    return found


def _tagged(body: str) -> str:
    for token in SIGNATURES:
        body = body.replace(token, token + TAG)
    return body


def _signature(body: str) -> str | None:
    return next((token + TAG for token in SIGNATURES if token + TAG in body), None)


def instances(scratch: Path) -> dict:
    from fic.core.instance import Instance, Shard
    from fic.data.sources import load_source

    code = Instance("solve", "code", [Shard(1, "Write solve()."), Shard(2, "It returns 1.")],
                    {"metadata": {"func_name": "solve"}, "question_content": "Write solve(), which returns 1.",
                     "public_test_cases": json.dumps([{"input": "", "output": "1", "testtype": "functional"}])})
    database = Instance("pets", "database", [Shard(1, "How many pets?"), Shard(2, "Count every row.")],
                        {"db_id": "pets", "schema_sql": "CREATE TABLE pets (id INTEGER PRIMARY KEY, kind TEXT);",
                         "fully_specified_question": "How many pets are there?",
                         "reference_sql": "SELECT count(*) FROM pets"})
    math = Instance("m", "math", [Shard(1, "How many?"), Shard(2, "Two and three.")],
                    {"question": "What is 2 + 3?", "answer": "#### 5"})
    return {"code": code, "database": database, "math": math,
            "actions": load_source("actions-gen:test", "actions", limit=1)[0]}


def touchable(pid: int) -> dict:
    """What a hostile program might change about a process: its limits, nice value, affinity."""
    limits = Path(f"/proc/{pid}/limits").read_text()
    return {"limits": limits, "nice": os.getpriority(os.PRIO_PROCESS, pid), "cpus": sorted(os.sched_getaffinity(pid))}


def main(out: Path, scratch: Path) -> None:
    from dataclasses import replace

    from fic import tasks
    from fic.conversation.simulator import score_reply
    from fic.sandbox import python as sandbox
    from fic.tasks import code as code_module

    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "sandbox"))
    from sandboxed import record_run_uids, stray_processes

    uids: set[int] = set()
    sandbox._run_uid = record_run_uids(uids)  # this suite's runs: their processes are the ones to look for
    connections = []
    server = socket.create_server(("127.0.0.1", 0))
    server.settimeout(0.2)

    def listen():
        while True:
            try:
                connection, _ = server.accept()
                connections.append(1)
                connection.close()
            except OSError:
                continue

    threading.Thread(target=listen, daemon=True).start()
    bystander = subprocess.Popen(["sleep", "3600"], start_new_session=True)
    # Limits small enough for a suite: 1 s of CPU a test, 3 s of wall clock, 256 MB, 8 processes.
    code_module.LIMITS = sandbox.Limits(seconds=1.0, memory_mb=256, processes=8, output_mb=1, wall_seconds=3.0)
    os.environ.pop("FIC_SPIDER_DBS", None)
    database = tasks.get("database")
    database.limits = replace(database.limits, seconds=1.0)
    items = instances(scratch)
    mode = sandbox.check_mode()
    with open(out, "w") as log:
        for case in cases(scratch, server.getsockname()[1], bystander.pid):
            before = set(os.listdir(scratch))
            untouched = {"evaluator": touchable(EVALUATOR), "bystander": touchable(bystander.pid)}
            started = time.monotonic()
            _, score, note = score_reply(tasks.get(case["task"]), case["reply"], items[case["task"]])
            seconds = time.monotonic() - started
            time.sleep(0.05)
            stray = stray_processes(case["signature"], uids)
            files = sorted(set(os.listdir(scratch)) - before)
            touched = [name for name, pid in (("evaluator", EVALUATOR), ("bystander", bystander.pid))
                       if bystander.poll() is not None or touchable(pid) != untouched[name]]
            log.write(json.dumps({"name": case["name"], "task": case["task"], "mode": mode, "score": score,
                                  "may_score": list(case["may_score"]), "note": note, "seconds": round(seconds, 2),
                                  "note_starts": case.get("note_starts", ""),
                                  "files_outside": files, "processes_left": stray, "touched": touched,
                                  "connections": len(connections)}) + "\n")
            log.flush()
    bystander.kill()
    print("evaluator alive", flush=True)


if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
    main(Path(sys.argv[1]), Path(sys.argv[2]))
