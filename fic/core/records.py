"""Reading data files: every JSON or JSONL file FiC reads goes through one guarded reader
(`read_json`, `read_records`, `read_log`, `read_growing_log`).

A file that is no regular file (`/dev/zero`, a pipe), larger than `MAX_FILE_BYTES`, not UTF-8,
nested deeper than the JSON decoder allows, or holding a number Python refuses (an integer over
4,300 digits) is a `FicError` naming the file and the line, never a traceback.
"""

from __future__ import annotations

import hashlib
import json
import os
import reprlib
import stat
import sys
from pathlib import Path
from typing import Any

from fic.core.errors import FicError
from fic.core.files import open_in_place, write_text

MAX_FILE_BYTES = 4 << 30  # the largest data file read whole


def read_records(path: str | os.PathLike) -> list[dict]:
    """Read a JSON list, a single JSON object or JSONL file into a list of dicts.

    Errors name the file and the line (JSONL) or the 1-based record number (JSON list).
    """
    return [record for _, record in read_numbered_records(path)]


def read_numbered_records(path: str | os.PathLike) -> list[tuple[int, dict]]:
    """`read_records`, each record with where it is: its line in a JSONL file, its 1-based
    position in a JSON list (1 for a single object). A UTF-8 byte-order mark (files saved on
    Windows) is skipped."""
    path = Path(path)
    return parse_records(read_data_text(path, "a JSON or JSONL file"), path)


def parse_records(text: str, path: str | os.PathLike) -> list[tuple[int, dict]]:
    """`read_numbered_records` of text already read (a decompressed file), errors naming `path`."""
    stripped = text.lstrip()
    if not stripped:
        raise FicError("file is empty, expected JSON or JSONL records", path=str(path))
    whole = None
    if stripped.startswith(("[", "{")):
        try:
            whole = json.loads(text)
        except json.JSONDecodeError as err:
            if stripped.startswith("["):
                raise FicError(f"not valid JSON (line {err.lineno}, column {err.colno}: {err.msg})",
                               path=str(path)) from None
            # Not one object: JSONL, read line by line below.
        except (ValueError, RecursionError, MemoryError) as err:
            if stripped.startswith("["):
                raise _unreadable(err, path) from None
            # Perhaps JSONL whose first line is the problem: read line by line below.
    if isinstance(whole, list):
        numbered = list(enumerate(whole, start=1))
    elif isinstance(whole, dict):  # one object, possibly spread over several lines
        numbered = [(1, whole)]
    else:
        numbered = []
        for lineno, line in enumerate(text.splitlines(), start=1):
            if line.strip():
                numbered.append((lineno, loads(line, path=path, line=lineno)))
    for index, (_, record) in enumerate(numbered, start=1):
        if not isinstance(record, dict):
            raise FicError(f"expected a JSON object, got {type(record).__name__}", path=str(path),
                           record=index)
    return numbered


def read_data_text(path: str | os.PathLike, expected: str = "a text file", *, limit: int | None = None) -> str:
    """The text of a data file, checked: it exists, is a regular file (not `/dev/zero`, a pipe
    or a folder), is at most `limit` bytes (`MAX_FILE_BYTES`, or a config's bound) and is UTF-8
    (a byte-order mark is skipped)."""
    try:
        return read_data_bytes(path, expected, limit=limit).decode("utf-8-sig")
    except UnicodeDecodeError as err:
        raise FicError(f"not UTF-8 text (byte {err.start}); expected {expected}", path=str(path)) from None


def read_data_bytes(path: str | os.PathLike, expected: str = "a file", *, limit: int | None = None) -> bytes:
    """The bytes of a data file, through the checks of `read_data_text` but the decoding."""
    path = Path(path)
    try:
        info = path.stat()
    except FileNotFoundError:
        raise FicError("file not found", path=str(path)) from None
    if stat.S_ISDIR(info.st_mode):
        raise FicError(f"is a folder, expected {expected}", path=str(path))
    if not stat.S_ISREG(info.st_mode):
        raise FicError(f"is not a regular file (a device, pipe or socket), expected {expected}", path=str(path))
    limit = MAX_FILE_BYTES if limit is None else limit

    def too_large(size: int) -> FicError:
        if limit == MAX_FILE_BYTES:
            return FicError(f"is {size / (1 << 30):.1f} GiB, more than the {limit >> 30} GiB FiC reads in one piece; "
                            "split it", path=str(path))
        return FicError(f"is more than the {limit >> 10} KiB FiC reads as {expected}", path=str(path))

    if info.st_size > limit:
        raise too_large(info.st_size)
    try:
        with open(path, "rb") as handle:
            raw = handle.read(limit + 1)
        if len(raw) > limit:  # it grew, or it reports no size (/proc)
            raise too_large(len(raw))
        return raw
    except MemoryError:
        raise FicError("too large to read into memory", path=str(path)) from None


def loads(text: str, *, path: str | os.PathLike | None = None, line: int | None = None) -> Any:
    """`json.loads` for text read from a file: every way it can fail (bad JSON, nesting deeper
    than the decoder allows, an integer of more than 4,300 digits, no memory) is a `FicError`
    naming the file and the line."""
    try:
        return json.loads(text)
    except (ValueError, RecursionError, MemoryError) as err:
        raise _unreadable(err, path, line) from None


def _unreadable(err: BaseException, path: str | os.PathLike | None, line: int | None = None) -> FicError:
    where = f"line {line} " if line is not None else ""
    if isinstance(err, json.JSONDecodeError):
        what = f"is not valid JSON ({err.msg})" if line is not None else \
            f"not valid JSON (line {err.lineno}, column {err.colno}: {err.msg})"
    elif isinstance(err, RecursionError):
        what = f"is nested too deeply to read (JSON nested more than about {sys.getrecursionlimit()} levels)"
    elif isinstance(err, MemoryError):
        what = "is too large to read into memory"
    elif "digits" in str(err):
        what = f"holds a number with more than {sys.get_int_max_str_digits()} digits, which Python refuses"
    else:
        what = f"cannot be read as JSON ({err})"
    return FicError(f"{where}{what}" if where else what.removeprefix("is "), path=None if path is None else str(path))


def read_json(path: str | os.PathLike, expected: str = "a JSON file") -> Any:
    """One JSON document from a file, read through the same guards as `read_records`."""
    return loads(read_data_text(path, expected), path=path)


def file_sha256(path: str | os.PathLike) -> str:
    """The sha256 of a file's bytes, read in blocks (model files are gigabytes)."""
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def read_log(path: str | os.PathLike) -> list[dict]:
    """Records of a resumable JSONL log (one finished unit a line, appended with `append_jsonl`).

    A torn last line (the process died while writing it) is dropped and the file rewritten
    without it, so the unit is redone; a broken line elsewhere means the log is damaged.
    """
    return [record for _, record in read_numbered_log(path)]


def of_type(*kinds: type) -> Any:
    """A field's test for `checked_log`: a value of one of `kinds` (true or false is no number)."""
    return lambda value: isinstance(value, kinds) and (bool in kinds or not isinstance(value, bool))


def fields_problem(fields: Any) -> Any:
    """A record's test for `checked_log` from `fields` ((key, test, expected), ...): what is wrong
    with the first field that fails its test, in a few words, or None."""
    def problem(record: Any) -> str | None:
        if not isinstance(record, dict):
            return f"expected a JSON object, got {type(record).__name__}"
        return next((f"field {key!r}: expected {expected}, got {reprlib.repr(record.get(key))}"
                     for key, ok, expected in fields if not ok(record.get(key))), None)
    return problem


def checked_log(path: str | os.PathLike, problem: Any, what: str, redo: str) -> list[dict]:
    """`read_log` for a resume: each record checked by `problem` (a record -> what is wrong with
    it, or None) before any is kept or redone, so a record of the wrong shape (a string number, a
    text that is none) is one line naming the file and its line, not a traceback once the rest has run."""
    records = []
    for line, record in read_numbered_log(path):
        found = problem(record)
        if found is not None:
            raise FicError(f"line {line}: {found}; this {what} cannot be resumed (delete the line to {redo}, or use "
                           "another out=)", path=str(path))
        records.append(record)
    return records


def read_numbered_log(path: str | os.PathLike) -> list[tuple[int, Any]]:
    """`read_log`, each record with its line, for an error that names it."""
    path = Path(path)
    if not os.path.lexists(path):
        return []
    open_in_place(path).close()  # it will be appended to: a link is refused now, before any work
    lines = read_data_text(path, "a JSONL log").splitlines()
    records = []
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        try:
            records.append((number, loads(line, path=path, line=number)))
        except FicError as err:
            if number == len(lines):
                write_text(path, "".join(json.dumps(r, ensure_ascii=False) + "\n" for _, r in records))
                break
            raise FicError(f"{err.message}; the log is damaged", path=str(path)) from None
    return records


def read_growing_log(path: str | os.PathLike, expected: str = "a JSONL log") -> list[tuple[int, Any]]:
    """(line, value) of every line of a JSONL log another process may be appending to, read only
    (`fic report` on a running job): the last line, the one being written, is passed over when
    it is torn (cut inside a character or a value); a broken line elsewhere is a `FicError`
    naming it (the log is damaged). The checks of `read_data_text` apply (a regular file, a size)."""
    lines = read_data_bytes(path, expected).splitlines()
    found = []
    for number, raw in enumerate(lines, start=1):
        if not raw.strip():
            continue
        try:
            found.append((number, loads(raw.decode("utf-8-sig" if number == 1 else "utf-8"), path=path, line=number)))
        except UnicodeDecodeError as err:
            if number < len(lines):
                raise FicError(f"line {number} is not UTF-8 text (byte {err.start} of the line); the log is damaged",
                               path=str(path)) from None
        except FicError as err:
            if number < len(lines):
                raise FicError(f"{err.message}; the log is damaged", path=str(path)) from None
    return found
