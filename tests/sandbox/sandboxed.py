"""What the sandbox tests share: the modes this machine runs, the limits of their runs, and the
check that a run left no process behind (also used by the hostile-output suite's evaluator,
tests/tasks/hostile_cases.py)."""

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
