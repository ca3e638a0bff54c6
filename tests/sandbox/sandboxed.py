"""What the sandbox tests share: the modes this machine runs, the limits of their runs, the
check that a run left no process behind (also used by the hostile-output suite's evaluator,
tests/tasks/hostile_cases.py), and what the SysV IPC tests need to make objects and find the
run's IPC namespace."""

from __future__ import annotations

import os
import time
from pathlib import Path

from fic.sandbox import python as sandbox
from fic.sandbox.python import Limits

ISOLATIONS = ["rlimits"] + (["bubblewrap"] if sandbox.bwrap_command() else [])
# For runs meant to hit the CPU time limit: a wall clock far past it, so that CPU time decides
# on a loaded machine too (under a load of 5 per core, 1.5 s of CPU took more than 9.5 s).
FAST = Limits(seconds=1.5, memory_mb=256, processes=8, output_mb=1, wall_seconds=120)
# For runs meant to be refused or to hit another limit: time enough to start on a loaded machine.
ROOMY = Limits(seconds=10.0, memory_mb=256, processes=8, output_mb=1)
ROOT = os.geteuid() == 0

# A program's first lines for the SysV IPC tests, which run it without the guard (ctypes allowed):
# `segment` and `queue` make objects, and it prints the IPC namespace it runs in (`namespace_in`).
HEAD = """
import ctypes, os
libc = ctypes.CDLL(None, use_errno=True)
libc.shmat.restype = ctypes.c_void_p
IPC_CREAT = 0o1000

def check(value, what):
    if value == -1 or value is None:
        raise OSError(ctypes.get_errno(), what + ": " + os.strerror(ctypes.get_errno()))
    return value

def segment(key, size):  # created, every page written, detached: held by no process
    shmid = check(libc.shmget(key, size, IPC_CREAT | 0o600), "shmget")
    address = check(libc.shmat(shmid, None, 0), "shmat")
    ctypes.memset(address, 1, size)
    check(libc.shmdt(ctypes.c_void_p(address)), "shmdt")

def queue(key, messages):
    qid = check(libc.msgget(key, IPC_CREAT | 0o600), "msgget")
    message = ctypes.create_string_buffer(ctypes.sizeof(ctypes.c_long) + 1024)
    ctypes.c_long.from_buffer(message).value = 1
    for _ in range(messages):
        check(libc.msgsnd(qid, message, 1024, 0), "msgsnd")

print("namespace", os.readlink("/proc/self/ns/ipc"), flush=True)
"""


def record_run_uids(uids: set[int]):
    """A stand-in for `sandbox._run_uid` that records each user id it gives a run in `uids`: the
    processes of those ids are this test's, whatever other FiC suites run on the machine."""
    original = sandbox._run_uid

    def recorded() -> int | None:
        uid = original()
        if uid is not None:
            uids.add(uid)
        return uid

    return recorded


def stray_processes(signature: str | None, uids: set[int], folders: str | None = None) -> list[str]:
    """Processes this test's runs left behind, and no other's (two FiC suites on one machine must
    not fail each other): of a user id one of its runs was given (`uids`, see `record_run_uids`),
    working in one of its run folders (under `folders`, the test's own TMPDIR by default), or
    holding its case's signature (a number unique to the suite's run) on their command line."""
    ours = os.path.realpath(folders or os.environ["TMPDIR"])
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == os.getpid():
            continue
        try:
            status = Path(f"/proc/{entry}/status").read_text()
            uid = int(next(line.split()[1] for line in status.splitlines() if line.startswith("Uid:")))
            cmdline = Path(f"/proc/{entry}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            try:
                cwd = os.readlink(f"/proc/{entry}/cwd")
            except OSError:
                cwd = ""
        except (OSError, StopIteration, ValueError):
            continue
        if "Z" in status.split("State:")[1][:4]:
            continue  # a zombie is dead already
        if uid in uids or cwd == ours or cwd.startswith(ours + "/") or (signature and signature in cmdline):
            found.append(f"{entry}: {cmdline[:80]}")
    return found


class Runs:
    """This test's sandbox runs: their folders under its own temporary folder and the user ids
    they were given, so that a process one of them left behind is told apart from other runs on
    the machine."""

    def __init__(self, folder: Path) -> None:
        self.folder, self.uids = folder, set()

    def left_behind(self, signature: str | None = None) -> list[str]:
        time.sleep(0.3)
        return stray_processes(signature, self.uids, str(self.folder))


def members(namespace: str) -> list[int]:
    """The processes of the machine in IPC namespace `namespace` (an ended namespace has none,
    and with it went every object created in it)."""
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                if os.readlink(f"/proc/{entry}/ns/ipc") == namespace:
                    found.append(int(entry))
            except OSError:
                continue
    return found


def expected_ipc(isolation: str) -> str:
    """What holds SysV IPC in `isolation` on this machine: bubblewrap always makes the run an IPC
    namespace; the rlimits mode makes one where the evaluator may (CAP_SYS_ADMIN), else seccomp
    refuses every SysV IPC call."""
    return "namespace" if isolation == "bubblewrap" or sandbox._may_unshare_ipc() else "refused"


def namespace_in(stdout: str) -> str:
    """The IPC namespace a run of HEAD printed it was in."""
    return next(line.split()[1] for line in stdout.splitlines() if line.startswith("namespace "))
