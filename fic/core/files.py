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

from fic.core.errors import FicError


def check_writable(path: str | os.PathLike, *, folder: bool = False, field: str | None = None) -> None:
    """Refuse an output location that cannot be written, before any model or data loads.

    `path` is a file to write, or with `folder=True` a folder to write into; missing folders
    are fine (they will be made). A `FicError` naming `path` (and `field`, the option or key
    that set it) when a part of the path is a file, `path` is a folder where a file is expected
    or the other way round, or the deepest existing folder is not writable. Nothing is created.
    A full disk cannot be foreseen: writes that hit one fail as `OSError`, which the CLI and the
    training recipes report through `fic.core.errors.os_error`.
    """
    path = Path(path)

    def refuse(reason: str) -> FicError:
        return FicError(f"cannot write here: {reason}", path=str(path), field=field)

    if path.is_dir() and not folder:
        raise refuse("it is a folder, expected a file")
    # Walk down from the top: `Path.exists()` is False under a file (ENOTDIR), so the first
    # part that exists but is not a folder is the one in the way.
    deepest = None
    for part in reversed([path, *path.parents] if folder else list(path.parents)):
        if not os.path.lexists(part):
            break
        if not part.is_dir():
            raise refuse(f"{part} is a file, not a folder" if part != path else "it is a file, expected a folder")
        deepest = part
    # access() asks the kernel, so a read-only mount counts even for root.
    if deepest is not None and not os.access(deepest, os.W_OK | os.X_OK):
        raise refuse(f"no permission to write in {deepest}")


@contextlib.contextmanager
def atomic_open(path: str | os.PathLike, mode: str = "w", encoding: str | None = "utf-8") -> Iterator[Any]:
    """Open a temporary file next to `path`; rename it onto `path` only if the block succeeds."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    try:
        fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    except OSError as err:  # name the folder the user chose, not our temporary file
        err.filename, err.filename2 = str(path.parent), None
        raise
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
    except BaseException as err:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        # A full disk fails write() or fsync() with no file name; a failed rename names our
        # temporary file. Either way the user's error message should name `path`.
        if isinstance(err, OSError) and err.filename in (None, tmp):
            err.filename, err.filename2 = str(path), None
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
    try:
        with open(path, "a", encoding="utf-8") as handle:
            handle.write(json.dumps(record, ensure_ascii=False) + "\n")
            handle.flush()
            os.fsync(handle.fileno())
    except OSError as err:
        if err.filename is None:  # a full disk fails write() or fsync() with no file name
            err.filename = str(path)
        raise


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
    if not path.exists():
        raise FicError("file not found", path=str(path))
    if path.is_dir():
        raise FicError("is a folder, expected a JSON or JSONL file", path=str(path))
    try:
        text = path.read_text(encoding="utf-8-sig")
    except UnicodeDecodeError as err:
        raise FicError(f"not UTF-8 text (byte {err.start}); expected a JSON or JSONL file",
                       path=str(path)) from None
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
    if isinstance(whole, list):
        numbered = list(enumerate(whole, start=1))
    elif isinstance(whole, dict):  # one object, possibly spread over several lines
        numbered = [(1, whole)]
    else:
        numbered = []
        for lineno, line in enumerate(text.splitlines(), start=1):
            if not line.strip():
                continue
            try:
                numbered.append((lineno, json.loads(line)))
            except json.JSONDecodeError as err:
                raise FicError(f"line {lineno} is not valid JSON ({err.msg})", path=str(path)) from None
    for index, (_, record) in enumerate(numbered, start=1):
        if not isinstance(record, dict):
            raise FicError(f"expected a JSON object, got {type(record).__name__}", path=str(path),
                           record=index)
    return numbered


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
