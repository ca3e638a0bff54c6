"""Commands run one after another, each with a timeout, all within a budget, each into its log
(`fic bench zero`; the repository's GPU-session tools too)."""

from __future__ import annotations

import os
import shlex
import signal
import socket
import subprocess
import time
from pathlib import Path

from fic.core.errors import FicError
from fic.core.files import open_in_place


def free_port(dry_run: bool) -> int:
    """A free TCP port for a launcher's main process (29500, accelerate's default, in a dry run)."""
    if dry_run:
        return 29500
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def check_inputs(files: list[tuple[str, str]]) -> None:
    """Each (path, option) a bench reads where it runs (a recipe, a launch file) exists, else one
    error naming the option that points elsewhere."""
    for path, field in files:
        if not Path(path).is_file():
            raise FicError("no such file: run from a FiC checkout's root, or name the folder", path=path, field=field)


class Runner:
    """Runs commands with a per-command timeout and a whole-run budget, logging each. `cwd` and
    `env` (added to this process's environment) are the commands'; by default this process's."""

    def __init__(self, timeout: float, budget: float | None, cwd: str | os.PathLike | None = None,
                 env: dict[str, str] | None = None):
        self.timeout, self.deadline = timeout, (time.monotonic() + budget if budget else None)
        self.cwd = cwd
        self.env = {**os.environ, **(env or {})}
        self.env.setdefault("TOKENIZERS_PARALLELISM", "false")

    def left(self) -> float:
        return self.timeout if self.deadline is None else min(self.timeout, self.deadline - time.monotonic())

    def run(self, command: list[str], log: Path) -> tuple[int, float, str]:
        """(exit status, seconds, why it failed); 124 on a timeout."""
        log.parent.mkdir(parents=True, exist_ok=True)
        limit = self.left()
        if limit <= 5:
            return 124, 0.0, "no time left in --budget-s"
        began = time.monotonic()
        with open_in_place(log) as out:
            out.write(f"$ {shlex.join(command)}\n")
            out.flush()
            proc = subprocess.Popen(command, cwd=self.cwd, env=self.env, stdout=out, stderr=subprocess.STDOUT,
                                    start_new_session=True)
            try:
                rc = proc.wait(timeout=limit)
            except subprocess.TimeoutExpired:
                _kill_group(proc)
                return 124, time.monotonic() - began, f"timed out after {limit:.0f} s"
        return rc, time.monotonic() - began, "" if rc == 0 else f"exit {rc}: {_last_line(log)}"


def _kill_group(proc: subprocess.Popen) -> None:
    try:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(timeout=15)
    except (ProcessLookupError, subprocess.TimeoutExpired):
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        proc.wait()


def _last_line(log: Path) -> str:
    """The log's last line that names an error (else its last line), cut to 300 characters."""
    try:
        lines = [ln.strip() for ln in log.read_text(errors="replace").replace("\r", "\n").splitlines() if ln.strip()]
    except OSError:
        return ""
    errors = [ln for ln in lines if "Error" in ln or "error:" in ln]
    return (errors or lines or [""])[-1][:300]
