"""Reading records and writing outputs atomically.

Every output FiC writes goes to a temporary file in the same folder and is renamed into
place, so an interrupted job never leaves a half-written file behind.
"""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import hashlib
import json
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any, Iterable, Iterator

from fic.errors import FicError


@contextlib.contextmanager
def atomic_open(path: str | os.PathLike, mode: str = "w", encoding: str | None = "utf-8") -> Iterator[Any]:
    """Open a temporary file next to `path`; rename it onto `path` only if the block succeeds."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    # mkstemp creates the file 0600; give it the mode a plain open() would (0666 minus umask).
    umask = os.umask(0)
    os.umask(umask)
    os.chmod(tmp, 0o666 & ~umask)
    binary = "b" in mode
    try:
        with os.fdopen(fd, mode, encoding=None if binary else encoding) as handle:
            yield handle
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise


def write_text(path: str | os.PathLike, text: str) -> None:
    with atomic_open(path) as handle:
        handle.write(text)


def write_json(path: str | os.PathLike, obj: Any) -> None:
    write_text(path, json.dumps(obj, indent=2, ensure_ascii=False) + "\n")


def write_jsonl(path: str | os.PathLike, records: Iterable[dict]) -> int:
    """Write records one JSON object per line, atomically; return how many were written."""
    count = 0
    with atomic_open(path) as handle:
        for record in records:
            handle.write(json.dumps(record, ensure_ascii=False) + "\n")
            count += 1
    return count


def append_jsonl(path: str | os.PathLike, record: dict) -> None:
    """Append one record and fsync it: used by resumable logs, where each line is one finished unit."""
    with open(path, "a", encoding="utf-8") as handle:
        handle.write(json.dumps(record, ensure_ascii=False) + "\n")
        handle.flush()
        os.fsync(handle.fileno())


def read_records(path: str | os.PathLike) -> list[dict]:
    """Read a JSON list, a single JSON object or JSONL file into a list of dicts.

    Errors name the file and the line (JSONL) or the 1-based record number (JSON list).
    """
    path = Path(path)
    if not path.exists():
        raise FicError("file not found", path=str(path))
    if path.is_dir():
        raise FicError("is a folder, expected a JSON or JSONL file", path=str(path))
    text = path.read_text(encoding="utf-8")
    stripped = text.lstrip()
    if not stripped:
        raise FicError("file is empty, expected JSON or JSONL records", path=str(path))
    if stripped.startswith("["):
        try:
            data = json.loads(text)
        except json.JSONDecodeError as err:
            raise FicError(f"not valid JSON (line {err.lineno}, column {err.colno}: {err.msg})",
                           path=str(path)) from None
        records = data
    else:
        records = []
        for lineno, line in enumerate(text.splitlines(), start=1):
            if not line.strip():
                continue
            try:
                records.append(json.loads(line))
            except json.JSONDecodeError as err:
                raise FicError(f"line {lineno} is not valid JSON ({err.msg})", path=str(path)) from None
    for index, record in enumerate(records):
        if not isinstance(record, dict):
            raise FicError(f"expected a JSON object, got {type(record).__name__}", path=str(path),
                           record=index + 1)
    return records


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
    path = Path(path)
    if not path.exists():
        return []
    lines = path.read_text(encoding="utf-8").splitlines()
    records = []
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        try:
            records.append(json.loads(line))
        except json.JSONDecodeError:
            if number == len(lines):
                write_text(path, "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in records))
                break
            raise FicError(f"line {number} is not valid JSON; the log is damaged", path=str(path)) from None
    return records


_RENAME_EXCHANGE = 2  # renameat2 flag (Linux >= 3.15): swap two paths in one step


def _exchange(a: Path, b: Path) -> bool:
    """Swap two paths atomically where the OS can (Linux renameat2); False where it cannot."""
    libc_name = ctypes.util.find_library("c")
    if not libc_name:
        return False
    libc = ctypes.CDLL(libc_name, use_errno=True)
    renameat2 = getattr(libc, "renameat2", None)
    if renameat2 is None:
        return False
    at_fdcwd = -100
    return renameat2(at_fdcwd, os.fsencode(a), at_fdcwd, os.fsencode(b), _RENAME_EXCHANGE) == 0


def publish_folder(tmp: str | os.PathLike, final: str | os.PathLike) -> None:
    """Move the finished folder `tmp` onto `final`, replacing an older `final`.

    A reader of `final` sees either the whole old folder or the whole new one, never none and
    never a mix: the two are swapped in one step (Linux renameat2 RENAME_EXCHANGE), then the
    old one is deleted. Where the OS cannot swap, the old folder is renamed aside first, which
    leaves a moment with no `final` but never a half-written one, and the old folder survives a
    crash in between (as `.<name>.old-*`, next to `final`).
    """
    tmp, final = Path(tmp), Path(final)
    if not final.exists():
        os.replace(tmp, final)
        return
    if _exchange(tmp, final):
        shutil.rmtree(tmp, ignore_errors=True)  # it holds the old folder now
        return
    aside = Path(tempfile.mkdtemp(prefix=f".{final.name}.old-", dir=final.parent))
    os.replace(final, aside / final.name)
    os.replace(tmp, final)
    shutil.rmtree(aside, ignore_errors=True)
