"""Run folders of dead evaluators are removed at the next start (issue 56, item 7): a run's
folder, `$TMPDIR/fic-run-*`, was left behind when the evaluator was killed, and nothing removed
it. The evaluator now holds a lock in its run folder while the run lasts; each run first removes
the folders whose lock no live process holds, and never a live run's or one without a lock."""

import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest
from sandboxed import ISOLATIONS, ROOT

from fic.sandbox import python as sandbox
from fic.sandbox.python import Limits, run_python

REPO = Path(__file__).resolve().parents[2]
SLEEPER = ("import sys\nfrom fic.sandbox.python import Limits, run_python\n"
           "run_python('import time\\ntime.sleep(120)\\n', Limits(seconds=200, wall_seconds=200), "
           "isolation=sys.argv[1])\n")


def start_evaluator(runs: Path, isolation: str) -> tuple[subprocess.Popen, Path]:
    """A child evaluator in the middle of a long run, and that run's folder under `runs`."""
    before = set(runs.iterdir())
    child = subprocess.Popen([sys.executable, "-c", SLEEPER, isolation], cwd=REPO, start_new_session=True,
                             env={**os.environ, "TMPDIR": str(runs), "PYTHONPATH": str(REPO)})
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        new = [p for p in set(runs.iterdir()) - before if (p / sandbox.OWNER).exists()]
        if new:
            return child, new[0]
        time.sleep(0.05)
    child.kill()
    raise AssertionError("the child evaluator never started its run")


@pytest.mark.parametrize("isolation", ISOLATIONS)
def test_the_folder_of_a_killed_evaluator_is_removed_at_the_next_run_and_a_live_one_is_kept(
        isolation, tmp_path, monkeypatch):
    runs = tmp_path / "runs"
    runs.mkdir()
    killed, dead_folder = start_evaluator(runs, isolation)
    live, live_folder = start_evaluator(runs, isolation)
    unlocked = runs / "fic-run-without-a-lock"  # a run between making its folder and locking it, or older FiC
    unlocked.mkdir()
    try:
        os.kill(killed.pid, signal.SIGKILL)
        killed.wait()
        time.sleep(0.5)
        assert dead_folder.exists()  # what the evaluator would have removed, had it lived
        monkeypatch.setenv("TMPDIR", str(runs))
        monkeypatch.setattr(tempfile, "tempdir", str(runs))
        assert run_python("print('next run')\n", Limits(seconds=10), isolation=isolation).passed
        assert not dead_folder.exists()
        assert live_folder.exists() and (live_folder / "work").exists() and live.poll() is None
        assert unlocked.exists()
        assert sorted(p.name for p in runs.iterdir()) == sorted([live_folder.name, unlocked.name])  # nothing else
    finally:
        live.kill()
        live.wait()
    assert sandbox.sweep_stale_runs(runs) == [live_folder]  # its evaluator gone, it goes at the next start too
    assert unlocked.exists()


def test_the_sweep_follows_no_link_and_leaves_other_users_folders(tmp_path):
    target = tmp_path / "keep"
    target.mkdir()
    (target / sandbox.OWNER).write_text("")
    (tmp_path / "fic-run-link").symlink_to(target)
    other = tmp_path / "fic-run-other"
    if ROOT:
        other.mkdir()
        (other / sandbox.OWNER).write_text("")
        os.chown(other, 12345, 12345)
    assert sandbox.sweep_stale_runs(tmp_path) == []
    assert (target / sandbox.OWNER).exists() and (tmp_path / "fic-run-link").is_symlink()
    assert other.exists() == ROOT
