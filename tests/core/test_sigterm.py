"""SIGTERM ends a run within seconds, even inside a long native call of a training step."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest

SCRIPT = """
import sys, time, torch
from fic.core.errors import cut_short_on_sigterm, exit_status

def run():
    a = torch.randn(3000, 3000)
    print("ready", flush=True)
    with cut_short_on_sigterm() if sys.argv[1] == "step" else open(__file__):
        torch.linalg.matrix_power(a, 2 ** 40)  # one native call of 40+ products: no bytecode runs meanwhile
    print("finished", flush=True)

sys.exit(exit_status("fic test", run))
"""


@pytest.mark.slow  # a process that computes for seconds
@pytest.mark.parametrize("where", ["step", "outside"])
def test_sigterm_ends_a_long_native_call_in_a_step_within_seconds(where, tmp_path):
    """Inside a step (`cut_short_on_sigterm`) the watchdog ends the process 3 s after SIGTERM, with
    status 143 and one line; outside one, the usual handler waits for the call to return."""
    script = tmp_path / "long.py"
    script.write_text(SCRIPT)
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    proc = subprocess.Popen([sys.executable, str(script), where], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, env=env)
    assert proc.stdout.readline().strip() == "ready"
    time.sleep(1.0)
    sent = time.monotonic()
    proc.send_signal(signal.SIGTERM)
    try:
        out, err = proc.communicate(timeout=15 if where == "step" else 4)
    except subprocess.TimeoutExpired:
        proc.kill()
        out, err = proc.communicate()
        assert where == "outside", "SIGTERM did not end the step within 15 s"
        return  # outside a step the native call runs on (it would end at its end, as before)
    took = time.monotonic() - sent
    assert where == "step" and proc.returncode == 143 and took < 10
    assert "finished" not in out and "terminated (SIGTERM) in the middle of a step" in err
    assert len(err.strip().splitlines()) == 1
