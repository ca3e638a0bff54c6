"""A folder lock held by another process, for tests that check a second run fails at once."""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
from pathlib import Path
from typing import Iterator

REPO = Path(__file__).resolve().parents[1]
HOLDER = ("import sys, time\nfrom fic.core.files import lock_folder\nlock_folder(sys.argv[1])\n"
          "print('locked', flush=True)\ntime.sleep(120)\n")


@contextlib.contextmanager
def held_by_another_process(folder: str | os.PathLike) -> Iterator[int]:
    """`fic.core.files.lock_folder(folder)` taken by a child process for the block; yields its pid."""
    holder = subprocess.Popen([sys.executable, "-c", HOLDER, str(folder)], stdout=subprocess.PIPE, text=True,
                              cwd=REPO, env={**os.environ, "PYTHONPATH": str(REPO)})
    try:
        assert holder.stdout.readline().strip() == "locked"
        yield holder.pid
    finally:
        holder.kill()
        holder.wait()
        holder.stdout.close()
