"""The sandbox owns its SysV IPC (issue 56, item 1): a reply with the guard bypassed created six
256 MiB `shmget` segments and detached them, 1.5 GiB held under a 1 GiB tree bound while the run
passed, and in the rlimits mode the segments (and 40 `msgget` queues) stayed after the run. Now
every run has an IPC namespace of its own in both modes (bubblewrap's `--unshare-ipc`; `unshare`
by the supervisor in the rlimits mode) whose objects count in the tree's memory bound and end with
the run; where no namespace can be had, SysV IPC is refused by seccomp, and the reply's note says
so. Each test runs with the guard left out (`guard=False`, ctypes allowed), as a program that
switched it off would, and its id names the mode it ran in; in the rlimits mode of an evaluator
that may not make an IPC namespace (no CAP_SYS_ADMIN), the same programs are refused instead."""

import os
import random
import threading
import time
from pathlib import Path

import pytest
from sandboxed import HEAD, ISOLATIONS, expected_ipc, members, namespace_in

from fic.sandbox import python as sandbox
from fic.sandbox.python import Limits, run_python

BOUND = Limits(seconds=10.0, memory_mb=256, processes=8, output_mb=1)  # a tree of 256 MiB
ROOMY = Limits(seconds=10.0, memory_mb=256, tree_memory_mb=1024, processes=8, output_mb=1)


def keys_here() -> set[int]:
    """The keys of every SysV object in this process's (the test's) IPC namespace."""
    found = set()
    for kind in ("shm", "msg", "sem"):
        lines = Path(f"/proc/sysvipc/{kind}").read_text().splitlines()[1:]
        found |= {int(line.split()[0]) for line in lines}
    return found


def assert_refused(result) -> None:
    assert result.layers["ipc"] == "refused", result.layers
    assert not result.passed and result.reason.startswith("refused: SysV IPC (this run has no IPC namespace of its own"), \
        result.reason


def shmem() -> int:
    """The machine's shared memory now, in bytes (/proc/meminfo's Shmem: SysV segments of every
    IPC namespace, and tmpfs files)."""
    line = next(line for line in Path("/proc/meminfo").read_text().splitlines() if line.startswith("Shmem:"))
    return int(line.split()[1]) << 10


@pytest.fixture
def base() -> int:
    return random.SystemRandom().randrange(0x10000000, 0x70000000) & ~0xFF  # keys no other test uses


def test_bubblewrap_runs_in_a_new_ipc_namespace():
    if not sandbox.bwrap_command():
        pytest.skip(f"bubblewrap cannot run here: {sandbox.bwrap_problem()}")
    assert "--unshare-ipc" in sandbox.bwrap_command()


@pytest.mark.parametrize("isolation", ISOLATIONS)
def test_shared_memory_no_process_holds_counts_in_the_tree_bound(isolation, base):
    # Six detached segments of 64 MiB under a 256 MiB tree bound: no process's resident size
    # shows them (each is 64 MiB while attached, under the 256 MiB a process may have).
    program = HEAD + f"for i in range(6):\n    segment({base} + i, 64 << 20)\n    print('segment', i, flush=True)\n"
    result = run_python(program, BOUND, isolation=isolation, guard=False)
    if expected_ipc(isolation) == "refused":
        assert_refused(result)
        assert "segment 0" not in result.stdout
        return
    assert result.layers["ipc"] == "namespace", result.layers
    assert not result.passed and result.reason.startswith("memory limit: the process tree held more than 256 MiB")
    assert "segment 5" not in result.stdout
    assert not {base + i for i in range(6)} & keys_here() and not members(namespace_in(result.stdout))


@pytest.mark.parametrize("isolation", ISOLATIONS)
def test_nothing_a_run_created_in_sysv_ipc_remains_after_it(isolation, base):
    program = HEAD + (f"for i in range(3):\n    segment({base} + i, 16 << 20)\n"
                      f"for i in range(8):\n    queue({base} + 16 + i, 8)\n"
                      f"check(libc.semget({base} + 32, 16, IPC_CREAT | 0o600), 'semget')\n"
                      "print('created', flush=True)\n")
    ours = {base + i for i in range(3)} | {base + 16 + i for i in range(8)} | {base + 32}
    assert not ours & keys_here()
    result = run_python(program, ROOMY, isolation=isolation, guard=False)
    assert not ours & keys_here()  # none of them is in the test's namespace (the rlimits mode left them there)
    if expected_ipc(isolation) == "refused":
        assert_refused(result)
        return
    assert result.passed, result.reason
    assert result.layers["ipc"] == "namespace", result.layers
    assert "created" in result.stdout  # every call succeeded: they existed, in the run's own namespace
    namespace = namespace_in(result.stdout)
    assert namespace != os.readlink("/proc/self/ns/ipc")
    assert not members(namespace)  # the namespace ended with the run, and its objects with it


@pytest.mark.parametrize("isolation", ISOLATIONS)
def test_the_memory_of_a_runs_sysv_objects_is_given_back_when_it_ends(isolation, base):
    # The objects are in a namespace the test cannot see, so the machine's shared memory says
    # whether they are gone: three detached segments of 128 MiB are in it while the run lasts
    # and leave it with the run (two runs of the rlimits mode used to leave 3 GiB behind).
    if expected_ipc(isolation) != "namespace":
        pytest.skip("this evaluator may not make an IPC namespace: SysV IPC is refused (the tests above)")
    program = HEAD + f"for i in range(3):\n    segment({base} + i, 128 << 20)\n" + \
        "import time\nprint('held', flush=True)\ntime.sleep(2)\n"
    # Another test process may take or free shared memory meanwhile (tmpfs files under `-n 2`), so
    # the rise counts from the lowest level seen before it and the fall from the highest after.
    held, results = 300 << 20, []
    run = threading.Thread(target=lambda: results.append(run_python(program, ROOMY, isolation=isolation,
                                                                     guard=False)))
    run.start()
    low = high = shmem()
    rise = 0
    while run.is_alive():
        now = shmem()
        low = min(low, now)
        # the fall counts from the highest level since the segments were made, not from an earlier one
        high = now if now - low > rise else max(high, now)
        rise = max(rise, now - low)
        time.sleep(0.05)
    run.join()
    assert results[0].passed and "held" in results[0].stdout, results[0].reason
    assert rise >= held, rise >> 20  # the segments were there, held by no process
    fall, deadline = 0, time.monotonic() + 10  # an ended namespace frees its objects soon after (a work queue)
    while fall < held and time.monotonic() < deadline:
        now = shmem()
        high = max(high, now)
        fall = max(fall, high - now)
        time.sleep(0.1)
    assert fall >= held, (rise >> 20, fall >> 20)


def test_where_no_namespace_can_be_had_sysv_ipc_is_refused_and_the_note_says_so(monkeypatch, base):
    # The rlimits mode of a user who may not make an IPC namespace (no CAP_SYS_ADMIN): here the
    # supervisor is told not to try, and seccomp refuses every SysV IPC call.
    monkeypatch.setattr(sandbox, "_IPC_NAMESPACE", False)
    for call in (f"segment({base}, 16 << 20)", f"queue({base} + 1, 1)",
                 f"check(libc.semget({base} + 2, 1, IPC_CREAT | 0o600), 'semget')"):
        result = run_python(HEAD + call + "\nprint('created')\n", ROOMY, isolation="rlimits", guard=False)
        assert_refused(result)
        assert namespace_in(result.stdout) == os.readlink("/proc/self/ns/ipc")  # the evaluator's own
        assert "created" not in result.stdout
    assert not {base, base + 1, base + 2} & keys_here()
