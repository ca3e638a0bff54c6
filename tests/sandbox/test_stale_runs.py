"""What a killed evaluator's runs leave (issue 56, items 1 and 7). Run folders: a run's folder,
`$TMPDIR/fic-run-*`, was left behind when the evaluator was killed, and nothing removed it. The
evaluator now holds a lock in its run folder while the run lasts; each run first removes the
folders whose lock no live process holds, and never a live run's or one without a lock.
Processes: in the rlimits mode a `setsid` grandchild of the program outlived a killed evaluator,
holding the run's IPC namespace and the segments in it; now the supervisor kills the tree when
the evaluator ends, as bubblewrap's end does in its mode."""

import contextlib
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest
from sandboxed import HEAD, ISOLATIONS, ROOT, expected_ipc, members, namespace_in

from fic.sandbox import python as sandbox
from fic.sandbox.python import Limits, run_python

REPO = Path(__file__).resolve().parents[2]
SLEEPER = "import time\ntime.sleep(120)\n"
EVALUATOR = ("import sys\nfrom fic.sandbox.python import Limits, run_python\n"
             "run_python(sys.argv[2], Limits(seconds=200, wall_seconds=200), isolation=sys.argv[1], guard=False)\n")


def start_evaluator(runs: Path, isolation: str, program: str = SLEEPER) -> tuple[subprocess.Popen, Path]:
    """A child evaluator in the middle of a long run of `program`, and that run's folder under `runs`."""
    before = set(runs.iterdir())
    child = subprocess.Popen([sys.executable, "-c", EVALUATOR, isolation, program], cwd=REPO,
                             start_new_session=True, env={**os.environ, "TMPDIR": str(runs), "PYTHONPATH": str(REPO)})
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        new = [p for p in set(runs.iterdir()) - before if (p / sandbox.OWNER).exists()]
        if new:
            return child, new[0]
        time.sleep(0.05)
    child.kill()
    raise AssertionError("the child evaluator never started its run")


@pytest.mark.parametrize("isolation", ISOLATIONS)
def test_the_folder_of_a_killed_evaluator_is_removed_at_the_next_run_and_a_live_one_is_kept(
        isolation, tmp_path, monkeypatch):
    runs = tmp_path / "runs"
    runs.mkdir()
    killed, dead_folder = start_evaluator(runs, isolation)
    live, live_folder = start_evaluator(runs, isolation)
    unlocked = runs / "fic-run-without-a-lock"  # a run between making its folder and locking it, or older FiC
    unlocked.mkdir()
    try:
        os.kill(killed.pid, signal.SIGKILL)
        killed.wait()
        time.sleep(0.5)
        assert dead_folder.exists()  # what the evaluator would have removed, had it lived
        monkeypatch.setenv("TMPDIR", str(runs))
        monkeypatch.setattr(tempfile, "tempdir", str(runs))
        assert run_python("print('next run')\n", Limits(seconds=10), isolation=isolation).passed
        assert not dead_folder.exists()
        assert live_folder.exists() and (live_folder / "work").exists() and live.poll() is None
        assert unlocked.exists()
        assert sorted(p.name for p in runs.iterdir()) == sorted([live_folder.name, unlocked.name])  # nothing else
    finally:
        live.kill()
        live.wait()
    assert sandbox.sweep_stale_runs(runs) == [live_folder]  # its evaluator gone, it goes at the next start too
    assert unlocked.exists()


def test_the_sweep_follows_no_link_and_leaves_other_users_folders(tmp_path):
    target = tmp_path / "keep"
    target.mkdir()
    (target / sandbox.OWNER).write_text("")
    (tmp_path / "fic-run-link").symlink_to(target)
    other = tmp_path / "fic-run-other"
    if ROOT:
        other.mkdir()
        (other / sandbox.OWNER).write_text("")
        os.chown(other, 12345, 12345)
    assert sandbox.sweep_stale_runs(tmp_path) == []
    assert (target / sandbox.OWNER).exists() and (tmp_path / "fic-run-link").is_symlink()
    assert other.exists() == ROOT


# A daemon two forks down (`setsid`: another session, no death signal), holding a segment it
# made in the run's IPC namespace (where the run has one: else SysV IPC is refused); the program
# reports the daemon's pid and waits.
DAEMON = HEAD + """import time
read, write = os.pipe()
if os.fork() == 0:
    os.setsid()
    if os.fork() == 0:
        SEGMENT
        os.write(write, str(os.getpid()).encode())
        time.sleep(300)
    os._exit(0)
print("daemon", os.read(read, 32).decode(), flush=True)
time.sleep(300)
"""


def printed(folder: Path) -> str:
    """What a run printed so far, once it names the daemon (the evaluator's stdout file in the run's folder)."""
    stdout, deadline = "", time.monotonic() + 60
    while "daemon" not in stdout and time.monotonic() < deadline:
        time.sleep(0.05)
        stdout = (folder / "stdout").read_text()
    return stdout


@pytest.mark.parametrize("isolation", ISOLATIONS)
def test_no_process_of_a_run_outlives_its_killed_evaluator(isolation, tmp_path):
    segment = "check(libc.shmget(0x5AFE, 16 << 20, IPC_CREAT | 0o600), 'shmget')"
    program = DAEMON.replace("SEGMENT", segment if expected_ipc(isolation) == "namespace" else "pass")
    evaluator, folder = start_evaluator(tmp_path, isolation, program)
    try:
        stdout = printed(folder)
        assert "daemon" in stdout, stdout
        namespace, daemon = namespace_in(stdout), int(stdout.split("daemon")[1].split()[0])
        own = namespace != os.readlink("/proc/self/ns/ipc")
        if own:
            assert members(namespace)
    finally:
        os.kill(evaluator.pid, signal.SIGKILL)
        evaluator.wait()
    deadline = time.monotonic() + 10
    while own and members(namespace) and time.monotonic() < deadline:
        time.sleep(0.05)
    left = members(namespace) if own else []
    if isolation == "rlimits":  # the daemon's pid is this machine's (bubblewrap's is its PID namespace's)
        while state(daemon) != "Z" and time.monotonic() < deadline:
            time.sleep(0.05)
        left = sorted({*left, daemon}) if state(daemon) != "Z" else left
    for pid in left:  # not to leave them on the machine when the test fails
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    # Every process of the run was in its namespace, and what it held in SysV IPC is gone with it.
    assert not left


def state(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return "Z"  # gone
