"""Checkpoint folders are never written, rotated or deleted through a link, and rotation deletes
only the checkpoints this run's folder made (issue 56, items 3 and 4). A stand-in accelerator
writes one small file per checkpoint: what is tested is where folders go, not what they hold."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from fic.core import files
from fic.core.errors import FicError
from fic.training import checkpoints


class Main:
    """The main (and only) process of a run: `save_state` writes one weights file."""

    is_main_process, num_processes, distributed_type, _models = True, 1, None, []

    def wait_for_everyone(self):
        pass

    def save_state(self, folder, **kwargs):
        Path(folder, "model.safetensors").write_bytes(b"w")


@pytest.fixture
def elsewhere(tmp_path):
    """A folder of the user's outside the run, holding two checkpoints of their own."""
    folder = tmp_path / "elsewhere"
    for step in (1, 2):
        (folder / f"step-{step}").mkdir(parents=True)
        (folder / f"step-{step}" / "complete").write_text("theirs\n")
    return folder


def _untouched(folder: Path) -> list[str]:
    return sorted(str(p.relative_to(folder)) for p in folder.rglob("*"))


def test_a_checkpoints_link_is_refused_and_its_target_untouched(tmp_path, elsewhere):
    out = tmp_path / "run"
    out.mkdir()
    os.symlink(elsewhere, out / "checkpoints")
    before = _untouched(elsewhere)
    for step in (3, 4, 5):  # the run rotated the user's step-1 and step-2 away at keep_last=2
        with pytest.raises(FicError, match="is a symbolic link; FiC does not write through links") as err:
            checkpoints.save_checkpoint(Main(), out, step, {"step": step}, keep_last=2, lora=False)
        assert err.value.path == str(out / "checkpoints")
    assert _untouched(elsewhere) == before
    with pytest.raises(FicError, match="symbolic link"):  # a resume, or the check before a new run, says it first
        checkpoints.complete_checkpoints(out)


def test_a_step_link_is_refused_and_its_target_untouched(tmp_path, elsewhere):
    out = tmp_path / "run"
    checkpoints.save_checkpoint(Main(), out, 1, {"step": 1}, keep_last=1, lora=False)
    os.symlink(elsewhere / "step-2", out / "checkpoints" / "step-2")
    with pytest.raises(FicError, match="symbolic link") as err:
        checkpoints.save_checkpoint(Main(), out, 3, {"step": 3}, keep_last=1, lora=False)
    assert err.value.path == str(out / "checkpoints" / "step-2")
    assert (elsewhere / "step-2" / "complete").read_text() == "theirs\n"
    # a link where the new checkpoint goes is refused too, not followed by the rename
    os.unlink(out / "checkpoints" / "step-2")
    os.symlink(elsewhere / "step-1", out / "checkpoints" / "step-4")
    with pytest.raises(FicError, match="symbolic link"):
        checkpoints.save_checkpoint(Main(), out, 4, {"step": 4}, keep_last=1, lora=False)
    assert _untouched(elsewhere) == ["step-1", "step-1/complete", "step-2", "step-2/complete"]


def test_rotation_deletes_only_the_checkpoints_this_folder_made(tmp_path):
    out = tmp_path / "run"
    copied = out / "checkpoints" / "step-1"  # a checkpoint copied in (or written before folders were marked)
    copied.mkdir(parents=True)
    (copied / "complete").write_text("step 1\n")
    for step in (2, 3, 4):
        checkpoints.save_checkpoint(Main(), out, step, {"step": step}, keep_last=2, lora=False)
    assert sorted(p.name for p in (out / "checkpoints").iterdir() if not p.name.startswith(".")) == \
        ["step-1", "step-3", "step-4"]
    token = files.folder_token(out)
    assert token and files.folder_token(out / "checkpoints" / "step-4") == token
    # a stale temporary of another run (no marker of this folder's) is left alone, this run's own is removed
    foreign, own = out / "checkpoints" / ".step-7.tmp", out / "checkpoints" / ".step-8.tmp"
    foreign.mkdir()
    (foreign / "notes.txt").write_text("mine")
    files.make_folder(own, token=token)
    checkpoints.save_checkpoint(Main(), out, 5, {"step": 5}, keep_last=2, lora=False)
    assert (foreign / "notes.txt").read_text() == "mine" and not own.exists()


def test_stale_partial_checkpoints_of_this_run_are_removed_by_the_next_save(tmp_path):
    import time

    stale = tmp_path / "checkpoints" / ".step-3.tmp"  # a save of this run killed while writing
    files.make_folder(stale, token=files.run_token(tmp_path))
    (stale / "model.safetensors").write_bytes(b"\0" * 100)
    started = time.monotonic()
    checkpoints.save_checkpoint(Main(), tmp_path, 5, {"step": 5}, keep_last=2, lora=False)
    assert sorted(p.name for p in (tmp_path / "checkpoints").iterdir()) == [files.RUN_MARKER, "step-5"]
    assert time.monotonic() - started < 5


def test_a_users_folder_where_a_checkpoint_goes_is_refused_not_replaced(tmp_path):
    out = tmp_path / "run"
    theirs = out / "checkpoints" / "step-2"
    theirs.mkdir(parents=True)
    (theirs / "notes.txt").write_text("mine")
    checkpoints.save_checkpoint(Main(), out, 1, {"step": 1}, keep_last=3, lora=False)
    with pytest.raises(FicError, match="is in the way: FiC did not make this folder") as err:
        checkpoints.save_checkpoint(Main(), out, 2, {"step": 2}, keep_last=3, lora=False)
    assert err.value.path == str(theirs) and _untouched(theirs) == ["notes.txt"]
    # the refused save leaves no temporary behind
    assert sorted(p.name for p in (out / "checkpoints").iterdir()) == ["step-1", "step-2"]


def test_a_failed_save_removes_its_own_temporary_only(tmp_path):
    class Failing(Main):
        def save_state(self, folder, **kwargs):
            Path(folder, "model.safetensors").write_bytes(b"half")
            raise OSError(5, "Input/output error")

    out = tmp_path / "run"
    with pytest.raises(OSError, match="Input/output error"):
        checkpoints.save_checkpoint(Failing(), out, 1, {"step": 1}, keep_last=1, lora=False)
    assert sorted(p.name for p in (out / "checkpoints").iterdir()) == [files.RUN_MARKER]
