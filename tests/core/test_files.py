"""Shared file helpers: publishing a finished folder, tolerant logs, hashing."""

from __future__ import annotations

import hashlib
import json
import os

import pytest

from fic.core import files, records
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
    assert records.read_log(log) == [{"a": 1}, {"a": 2}]
    assert log.read_text() == '{"a": 1}\n{"a": 2}\n'  # rewritten: the next append starts a clean line
    log.write_text('{"a": 1}\n{"a"\n{"a": 3}\n')
    with pytest.raises(FicError, match="line 2 is not valid JSON"):
        records.read_log(log)
    assert records.read_log(tmp_path / "missing.jsonl") == []


def test_file_sha256(tmp_path):
    path = tmp_path / "blob"
    data = os.urandom(3 << 20)  # several read blocks
    path.write_bytes(data)
    assert records.file_sha256(path) == hashlib.sha256(data).hexdigest()


# --------------------------------------------------------------------------- the guarded reader

DEEP = 100_000


@pytest.mark.parametrize("name,text,needle", [
    ("deep-list.jsonl", '{"a": 1}\n{"b": ' + "[" * DEEP + "]" * DEEP + "}\n", "line 2 is nested too deeply"),
    ("deep-object.jsonl", '{"a": 1}\n' + '{"x": ' * DEEP + "1" + "}" * DEEP + "\n", "line 2 is nested too deeply"),
    ("deep-mixed.json", "[" + '[{"a": ' * (DEEP // 2) + "1" + "}]" * (DEEP // 2) + "]", "nested too deeply"),
    ("deep-first-line.jsonl", "[" * DEEP + "\n", "nested too deeply"),
    ("digits.jsonl", '{"a": 1}\n{"n": ' + "7" * 5000 + "}\n", "line 2 holds a number with more than"),
    ("digits.json", '[{"n": -' + "7" * 5000 + "}]", "holds a number with more than"),
    ("broken.jsonl", '{"a": 1}\n{"a" 2}\n', "line 2 is not valid JSON"),
])
def test_hostile_data_files_are_one_line_errors_naming_file_and_line(tmp_path, name, text, needle):
    path = tmp_path / name
    path.write_text(text)
    with pytest.raises(FicError) as err:
        records.read_records(path)
    assert needle in str(err.value) and str(path) in str(err.value)
    assert "\n" not in str(err.value)


@pytest.mark.parametrize("special", ["/dev/zero", "/dev/urandom", "fifo", "folder"])
def test_files_that_are_no_regular_file_are_refused_before_reading(tmp_path, special):
    if special == "fifo":
        special = tmp_path / "pipe"
        os.mkfifo(special)  # reading it would block for ever
    elif special == "folder":
        special = tmp_path
    for read in (records.read_records, records.read_log, records.read_json):
        with pytest.raises(FicError, match="regular file|is a folder"):
            read(special)


def test_a_file_over_the_size_limit_is_refused(tmp_path, monkeypatch):
    path = tmp_path / "big.jsonl"
    path.write_text('{"a": 1}\n' * 100)
    monkeypatch.setattr(records, "MAX_FILE_BYTES", 64)
    with pytest.raises(FicError, match="in one piece; split it"):
        records.read_records(path)


def test_read_json_and_read_log_use_the_same_guards(tmp_path):
    path = tmp_path / "state.json"
    path.write_text('{"step": ' + "[" * DEEP + "]" * DEEP + "}")
    with pytest.raises(FicError, match="nested too deeply") as err:
        records.read_json(path)
    assert str(path) in str(err.value)
    log = tmp_path / "log.jsonl"
    log.write_text('{"a": 1}\n{"n": ' + "1" * 5000 + '}\n{"a": 3}\n')
    with pytest.raises(FicError, match="line 2 holds a number .* the log is damaged"):
        records.read_log(log)
    log.write_text('{"a": 1}\n' + "[" * DEEP)  # a torn last line, however it is broken, is dropped
    assert records.read_log(log) == [{"a": 1}]


def test_a_lone_surrogate_is_written_as_its_escape_and_reads_back(tmp_path):
    path = tmp_path / "in.jsonl"
    path.write_text('{"text": "half a pair: \\ud800 here"}\n')
    (record,) = records.read_records(path)
    assert record["text"] == "half a pair: \ud800 here"
    for write in (files.write_jsonl, lambda p, rs: [files.append_jsonl(p, r) for r in rs]):
        out = tmp_path / "out.jsonl"
        out.unlink(missing_ok=True)
        write(out, [record])
        assert records.read_records(out) == [record]
    files.write_json(tmp_path / "one.json", record)
    assert records.read_json(tmp_path / "one.json") == record


def test_a_legal_250_character_name_can_be_written(tmp_path):
    path = tmp_path / ("n" * 245 + ".json")
    files.write_json(path, {"ok": True})
    assert records.read_json(path) == {"ok": True}
    assert [p.name for p in tmp_path.iterdir()] == [path.name]  # no temporary left
    longer = tmp_path / ("é" * 120 + ".jsonl")  # 240 bytes of two-byte characters
    files.write_jsonl(longer, [{"a": 1}])
    assert records.read_records(longer) == [{"a": 1}]


# --------------------------------------------------------------------------- folder locks

def test_a_folder_lock_refuses_a_second_process_naming_the_first(tmp_path):
    from locks import held_by_another_process

    folder = tmp_path / "out"
    with held_by_another_process(folder) as pid:
        with pytest.raises(FicError) as err:
            files.lock_folder(folder)
        assert f"process {pid}" in str(err.value) and str(folder) in str(err.value)
        assert "another FiC run is writing into this folder" in str(err.value)
    # The kernel dropped the lock with its process (kill -9): the folder is free at once.
    with files.folder_lock(folder):
        with files.folder_lock(folder):  # this process again: allowed (a recipe run twice in one process)
            pass
        assert str(folder.resolve()) in files._held
    assert str(folder.resolve()) not in files._held


# --------------------------------------------------------------------------- no write follows a link

@pytest.fixture
def precious(tmp_path):
    """A file outside the output folder that a link in it points to (`~/.bashrc` in the issue)."""
    path = tmp_path / "precious.txt"
    path.write_text("keep me\n")
    return path


@pytest.mark.parametrize("link", ["symlink", "hardlink"])
def test_a_lock_file_that_is_a_link_is_refused_and_its_target_kept(tmp_path, precious, link):
    folder = tmp_path / "out"
    folder.mkdir()
    (os.symlink if link == "symlink" else os.link)(precious, folder / files.LOCK_NAME)
    with pytest.raises(FicError, match="symbolic link" if link == "symlink" else "hard link") as err:
        files.lock_folder(folder)
    assert files.LOCK_NAME in str(err.value)
    assert precious.read_text() == "keep me\n"  # it was emptied through the link before
    assert str(folder.resolve()) not in files._held


def test_a_lock_file_that_is_a_fifo_is_refused_at_once(tmp_path):
    folder = tmp_path / "out"
    folder.mkdir()
    os.mkfifo(folder / files.LOCK_NAME)
    with pytest.raises(FicError, match="not a regular file"):
        files.lock_folder(folder)


@pytest.mark.parametrize("link", ["symlink", "hardlink"])
def test_an_appended_log_that_is_a_link_is_refused_before_any_work(tmp_path, precious, link):
    log = tmp_path / "conversations.jsonl"
    (os.symlink if link == "symlink" else os.link)(precious, log)
    with pytest.raises(FicError, match="link"):
        records.read_log(log)  # a resumed run reads its log first: refused there, before playing
    with pytest.raises(FicError, match="link"):
        files.append_jsonl(log, {"a": 1})
    assert precious.read_text() == "keep me\n"
    dangling = tmp_path / "dangling.jsonl"
    os.symlink(tmp_path / "nowhere" / "new.jsonl", dangling)
    with pytest.raises(FicError, match="symbolic link"):
        records.read_log(dangling)  # not "no log yet": it would create a file outside
    assert not (tmp_path / "nowhere").exists()


def test_atomic_writes_replace_a_link_instead_of_writing_through_it(tmp_path, precious):
    link = tmp_path / "metrics.json"
    os.symlink(precious, link)
    files.write_json(link, {"a": 1})
    assert not link.is_symlink() and records.read_json(link) == {"a": 1}
    assert precious.read_text() == "keep me\n"


def test_a_filesystem_without_locks_is_written_unlocked_with_a_warning(tmp_path, monkeypatch, capsys):
    """A multi-node run's out folder is on a shared filesystem; one mounted without locks (Lustre's
    noflock) makes flock fail with ENOLCK or EOPNOTSUPP: the run goes on, saying it is unlocked."""
    import errno
    import fcntl

    from fic.core import files

    def no_locks(fd, op):
        raise OSError(errno.ENOLCK, "No locks available")

    monkeypatch.setattr(fcntl, "flock", no_locks)
    assert files.lock_folder(tmp_path / "run") is True
    assert "without file locks" in capsys.readouterr().err
    files.unlock_folder(tmp_path / "run")


def test_the_lock_names_the_host_of_its_holder(tmp_path):
    import socket

    from fic.core import files

    files.lock_folder(tmp_path)
    try:
        assert f"on {socket.gethostname()}," in (tmp_path / files.LOCK_NAME).read_text()
    finally:
        files.unlock_folder(tmp_path)


def test_own_folder_takes_only_a_folder_of_its_run(tmp_path):
    """FiC writes into a folder only when it made it (its marker) or it is empty; a folder of the
    user's, or another run's, is refused with one line naming it and gets nothing written in it."""
    token = files.new_token()
    made = tmp_path / "made" / "below"
    files.own_folder(made, token)  # missing: made, and marked with the parent it made
    assert files.folder_token(made) == token and files.folder_token(made.parent) == token
    files.own_folder(made, token)  # its own: taken again (a resume)
    empty = tmp_path / "empty"
    empty.mkdir()
    files.own_folder(empty, token)
    assert files.folder_token(empty) == token
    for theirs in (tmp_path / "users", tmp_path / "another-runs"):
        theirs.mkdir()
        (theirs / "notes.txt").write_text("mine")
    files.write_text(tmp_path / "another-runs" / files.RUN_MARKER, files.new_token() + "\n")
    for theirs in (tmp_path / "users", tmp_path / "another-runs"):
        before = sorted(p.name for p in theirs.iterdir())
        with pytest.raises(FicError, match="is in the way: FiC did not make this folder") as err:
            files.own_folder(theirs, token)
        assert err.value.path == str(theirs) and sorted(p.name for p in theirs.iterdir()) == before


def test_publish_folder_with_a_token_replaces_only_its_runs_folder(tmp_path):
    token = files.new_token()
    theirs = _folder(tmp_path / "step-3", "theirs")
    with pytest.raises(FicError, match="is in the way") as err:
        files.publish_folder(_folder(tmp_path / ".step-3.tmp", "new"), theirs, token)
    assert err.value.path == str(theirs) and (theirs / "weights.bin").read_text() == "theirs"
    assert (tmp_path / ".step-3.tmp" / "weights.bin").read_text() == "new"  # the caller's to remove
    ours = tmp_path / "step-4"
    files.make_folder(ours, token=token)
    files.publish_folder(_folder(tmp_path / ".step-4.tmp", "new"), ours, token)
    assert (ours / "weights.bin").read_text() == "new"
