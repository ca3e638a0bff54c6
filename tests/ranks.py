"""Run a piece of Python on N gloo ranks (N processes on this CPU) for tests of multi-process paths.

`on_ranks(code, world)` starts `world` processes with the environment a launcher sets (RANK,
WORLD_SIZE, LOCAL_RANK, MASTER_ADDR, MASTER_PORT); each joins a gloo process group with a short
collective timeout (the watchdog's bound, `fic.core.ranks.watch`) and runs `code` inside
`fic.core.errors.exit_status`, with `ranks` (its `fic.core.ranks.Ranks`) and `argv` in scope. A
rank that waits for the others longer than `timeout` seconds is killed: a test never hangs.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import textwrap
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
PRELUDE = """\
import datetime, sys
import torch.distributed as dist
from fic.core import ranks as ranks_module
from fic.core.errors import exit_status
bound = float(sys.argv[1])
def _main():
    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=bound))
    ranks_module.watch(bound)
    ranks = ranks_module.Ranks.current()
    argv = sys.argv[2:]
{body}
status = exit_status("rank", _main)
dist.destroy_process_group() if dist.is_initialized() and status == 0 else None
sys.exit(status)
"""


@dataclass
class RankResult:
    rank: int
    returncode: int
    stdout: str
    stderr: str


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def on_ranks(code: str, world: int, *args: str, bound: float = 30.0, timeout: float = 120.0) -> list[RankResult]:
    """Run `code` (the body of a function; `ranks` and `argv` in scope) on `world` gloo ranks."""
    script = PRELUDE.format(body=textwrap.indent(textwrap.dedent(code), "    "))
    port = str(free_port())
    procs = []
    for rank in range(world):
        env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), str(REPO / "tests")]), "RANK": str(rank), "LOCAL_RANK": str(rank),
               "WORLD_SIZE": str(world), "LOCAL_WORLD_SIZE": str(world), "MASTER_ADDR": "127.0.0.1",
               "MASTER_PORT": port, "OMP_NUM_THREADS": "1"}
        procs.append(subprocess.Popen([sys.executable, "-c", script, str(bound), *args], cwd=REPO, env=env,
                                      stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True))
    results = []
    for rank, proc in enumerate(procs):
        try:
            out, err = proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            for other in procs:
                other.kill()
            out, err = proc.communicate()
            err += f"\n(killed after {timeout} s)"
        results.append(RankResult(rank, proc.returncode, out, err))
    return results
