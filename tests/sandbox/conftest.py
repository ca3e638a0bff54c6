"""Fixtures of the sandbox tests."""

from __future__ import annotations

import sqlite3
import tempfile

import pytest
from sandboxed import Runs, record_run_uids

from fic.sandbox import python as sandbox


@pytest.fixture
def runs_here(tmp_path, monkeypatch) -> Runs:
    """Sandbox runs put their folders under this test's own temporary folder and record the user
    ids they are given (`Runs.left_behind` looks for those only)."""
    monkeypatch.setenv("TMPDIR", str(tmp_path))
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    runs = Runs(tmp_path)
    monkeypatch.setattr(sandbox, "_run_uid", record_run_uids(runs.uids))
    return runs


@pytest.fixture
def database(tmp_path):
    """A database of two pets, for the SQL tests."""
    path = tmp_path / "db.sqlite"
    connection = sqlite3.connect(path)
    connection.executescript("CREATE TABLE pets (id INTEGER PRIMARY KEY, kind TEXT);"
                             "INSERT INTO pets VALUES (1, 'dog'), (2, 'cat');")
    connection.commit()
    connection.close()
    return path
