"""Model-written Python is contained by the operating system (`fic.sandbox.python`), in each
sandbox mode this machine runs, with the in-process guard and with it left out (`guard=False`):
programs that loop, sleep, allocate, fork, start daemons, open sockets, touch files outside their
folder, kill or re-limit their parent, the evaluator or a bystander. Each test checks the damage
did not happen (a check that fails if the containment is removed) and that the run says why."""

import json
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from sandboxed import FAST, ISOLATIONS, ROOMY, ROOT

from fic.sandbox import python as sandbox
from fic.sandbox.python import Limits, run_python


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
    assert not runs_here.left_behind()


@pytest.mark.parametrize("guard", [True, False], ids=["guard", "os-alone"])
@pytest.mark.parametrize("isolation", ISOLATIONS)
def test_a_setsid_daemon_does_not_outlive_the_run(isolation, guard, runs_here):
    program = ("import os, time\nif os.fork() == 0:\n    os.setsid()\n    if os.fork() == 0:\n"
               "        time.sleep(60)\n    os._exit(0)\ntime.sleep(0.3)\nprint('started')\n")
    result = run_python(program, ROOMY, isolation=isolation, guard=guard)
    assert result.passed and result.left == 1  # it ran, and its daemon was killed at the end
    assert not runs_here.left_behind()


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
    assert not runs_here.left_behind()
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
    # SysV IPC: a namespace of the run's own (bubblewrap's; the supervisor's unshare where permitted), else refused
    held = isolation == "bubblewrap" or sandbox._may_unshare_ipc()
    assert layers["ipc"] == ("namespace" if held else "refused" if layers["seccomp"] else "shared")
    assert isinstance(layers["landlock"], int)  # the ABI version, 0 where the kernel has none
