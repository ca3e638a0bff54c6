"""Shared file helpers: publishing a finished folder, tolerant logs, hashing."""

from __future__ import annotations

import hashlib
import json
import os

import pytest

from fic.core import files
from fic.core.errors import FicError


def _folder(path, text):
    path.mkdir()
    (path / "weights.bin").write_text(text)
    (path / "config.json").write_text(json.dumps({"v": text}))
    return path


def test_publish_folder_replaces_an_old_folder_whole(tmp_path):
    final = _folder(tmp_path / "final", "old")
    files.publish_folder(_folder(tmp_path / ".final.tmp", "new"), final)
    assert (final / "weights.bin").read_text() == "new"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["final"]  # the old folder is gone, no leftovers


def test_publish_folder_never_leaves_no_folder_on_a_crash(tmp_path, monkeypatch):
    """The swap is one step: a crash right after it (deleting the old copy fails) still leaves
    a whole `final`. Without the atomic exchange, `final` would be renamed away first."""
    final = _folder(tmp_path / "final", "old")
    seen = []

    def crash(*args, **kwargs):
        seen.append(sorted(p.name for p in final.iterdir()))
        raise KeyboardInterrupt

    monkeypatch.setattr(files.shutil, "rmtree", crash)
    monkeypatch.setattr(files.os, "replace", lambda *a: (_ for _ in ()).throw(AssertionError("not atomic")))
    with pytest.raises(KeyboardInterrupt):
        files.publish_folder(_folder(tmp_path / ".final.tmp", "new"), final)
    assert seen == [["config.json", "weights.bin"]]
    assert (final / "weights.bin").read_text() == "new"


def test_publish_folder_into_an_empty_place(tmp_path):
    files.publish_folder(_folder(tmp_path / "tmp", "x"), tmp_path / "final")
    assert (tmp_path / "final" / "weights.bin").read_text() == "x"


def test_read_log_drops_only_a_torn_last_line(tmp_path):
    log = tmp_path / "log.jsonl"
    log.write_text('{"a": 1}\n{"a": 2}\n{"a": ')
    assert files.read_log(log) == [{"a": 1}, {"a": 2}]
    assert log.read_text() == '{"a": 1}\n{"a": 2}\n'  # rewritten: the next append starts a clean line
    log.write_text('{"a": 1}\n{"a"\n{"a": 3}\n')
    with pytest.raises(FicError, match="line 2 is not valid JSON"):
        files.read_log(log)
    assert files.read_log(tmp_path / "missing.jsonl") == []


def test_file_sha256(tmp_path):
    path = tmp_path / "blob"
    data = os.urandom(3 << 20)  # several read blocks
    path.write_bytes(data)
    assert files.file_sha256(path) == hashlib.sha256(data).hexdigest()
