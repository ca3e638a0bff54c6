"""Reading records and writing outputs atomically; a lock on an output folder.

Every output FiC writes goes to a temporary file in the same folder and is renamed into
place, so an interrupted job never leaves a half-written file behind.

Every JSON or JSONL data file is read through one guarded reader (`read_json`,
`read_records`, `read_log`, `read_growing_log`): a file that is no regular file (`/dev/zero`, a pipe), larger than
`MAX_FILE_BYTES`, not UTF-8, nested deeper than the JSON decoder allows, or holding a number
Python refuses (an integer over 4,300 digits) is a `FicError` naming the file and the line,
never a traceback. Text is written with `backslashreplace`, so a lone surrogate read from a
`\ud800` escape is written back as that escape (valid JSON) instead of failing the write.

Runs that write into an output folder hold `folder_lock` on it: a second run into the same
folder fails at once, naming the first's process.

No write follows a link: a new file is a temporary renamed into place (a rename replaces a
link, never writes through it), and the few files written in place (the lock, appended logs)
are opened by `open_in_place`, which refuses a symbolic link, a hard link and anything but a
regular file. A copied run folder or a shared `runs/` holding `.fic-lock -> ~/.bashrc` makes
FiC refuse, never empty the file it points to.
"""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import errno
import fcntl
import hashlib
import json
import os
import shutil
import socket
import stat
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Callable, Iterable, Iterator

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


def _temporary_next_to(path: Path) -> tuple[int, str]:
    """A new temporary file in `path`'s folder (made if missing), with the mode a plain open()
    would give it: (its descriptor, its name)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    try:
        # A legal name of up to 255 bytes must stay legal with the prefix and suffix added.
        fd, tmp = tempfile.mkstemp(prefix=f".{_short(path.name)}.", suffix=".tmp", dir=path.parent)
    except OSError as err:  # name the folder the user chose, not our temporary file
        err.filename, err.filename2 = str(path.parent), None
        raise
    # mkstemp creates the file 0600; give it the mode a plain open() would (0666 minus umask).
    umask = os.umask(0)
    os.umask(umask)
    os.fchmod(fd, 0o666 & ~umask)  # by descriptor: the name may have been swapped for a link since
    return fd, tmp


@contextlib.contextmanager
def atomic_open(path: str | os.PathLike, mode: str = "w", encoding: str | None = "utf-8") -> Iterator[Any]:
    """Open a temporary file next to `path`; rename it onto `path` only if the block succeeds."""
    path = Path(path)
    fd, tmp = _temporary_next_to(path)
    binary = "b" in mode
    try:
        with os.fdopen(fd, mode, encoding=None if binary else encoding,
                       errors=None if binary else TEXT_ERRORS) as handle:
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


TEXT_ERRORS = "backslashreplace"  # a lone surrogate is written as `\udXXX`: in JSON, the escape it came from
MAX_FILE_BYTES = 4 << 30  # the largest data file read whole


def _short(name: str, limit: int = 200) -> str:
    """At most `limit` bytes of `name` (a temporary file's prefix), cut at a character boundary."""
    return name.encode("utf-8", "surrogateescape")[:limit].decode("utf-8", "ignore")


def write_together(writers: dict[str | os.PathLike, Callable[[Any], None]]) -> None:
    """Write files that belong together (a corpus and its data card): `writers[path](handle)`
    writes each into a temporary next to it; only when every one is written are they renamed
    into place. A failure on any (a full disk) leaves no temporary and none of the new files,
    so the old set stays whole."""
    staged: list[tuple[str, Path]] = []
    try:
        for path, write in writers.items():
            path = Path(path)
            fd, tmp = _temporary_next_to(path)
            staged.append((tmp, path))
            with os.fdopen(fd, "w", encoding="utf-8", errors=TEXT_ERRORS) as handle:
                write(handle)
                handle.flush()
                os.fsync(handle.fileno())
        for tmp, path in staged:
            os.replace(tmp, path)
    except BaseException as err:
        for tmp, path in staged:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(tmp)
        if isinstance(err, OSError) and staged and err.filename in (None, staged[-1][0]):
            err.filename, err.filename2 = str(staged[-1][1]), None
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


def open_in_place(path: str | os.PathLike, mode: str = "a") -> Any:
    """Open a file FiC writes in place in an output folder ("a": append, "r+": read and write,
    both creating it), without following a link: a symbolic link, a file with another name
    (a hard link) or anything but a regular file (a FIFO, a device) is a `FicError` naming it,
    so that nothing outside the folder is ever written or truncated."""
    flags = {"a": os.O_WRONLY | os.O_APPEND, "r+": os.O_RDWR}[mode]
    try:
        fd = os.open(path, flags | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK, 0o666)
    except OSError as err:
        if err.errno == errno.ELOOP:
            raise FicError("is a symbolic link; FiC does not write through links in an output folder (remove it)",
                           path=str(path)) from None
        if err.errno == errno.EISDIR:
            raise FicError("is a folder, expected a file", path=str(path)) from None
        if err.errno == errno.ENXIO:  # a FIFO without a reader (O_NONBLOCK: it does not hang)
            raise FicError("is not a regular file (a pipe), so FiC does not write it", path=str(path)) from None
        raise
    info = os.fstat(fd)
    if not stat.S_ISREG(info.st_mode) or info.st_nlink > 1:
        os.close(fd)
        what = "has another name (a hard link)" if stat.S_ISREG(info.st_mode) else \
            "is not a regular file (a device, pipe or socket)"
        raise FicError(f"{what}, so FiC does not write it in place (remove it)", path=str(path))
    os.set_blocking(fd, True)
    return os.fdopen(fd, mode, encoding="utf-8", errors=TEXT_ERRORS)


def append_jsonl(path: str | os.PathLike, record: dict) -> None:
    """Append one record and fsync it: used by resumable logs, where each line is one finished unit."""
    try:
        with open_in_place(path) as handle:
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
    text = read_data_text(path, "a JSON or JSONL file")
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
            records.append(loads(line, path=path, line=number))
        except FicError as err:
            if number == len(lines):
                write_text(path, "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in records))
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


# --------------------------------------------------------------------------- output-folder locks

LOCK_NAME = ".fic-lock"
_held: dict[str, Any] = {}  # resolved folder -> the open lock file of this process


NO_LOCKS = {errno.ENOLCK, errno.EOPNOTSUPP, errno.ENOSYS}  # what flock says where the filesystem has none


def lock_folder(folder: str | os.PathLike, *, field: str | None = "out") -> bool:
    """Take this process's lock on an output folder (made if missing), or fail at once with a
    `FicError` naming the process that holds it. Return False when this process holds it already
    (a recipe run again in one process), True when taken now.

    The lock is `flock` on `<folder>/.fic-lock`, so the kernel drops it when its process ends,
    whatever the way (kill -9 included): a stale lock never blocks a rerun. The file records the
    holder's process id, start time and command line for the message.
    """
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    key = str(folder.resolve())
    if key in _held:
        return False
    handle = open_in_place(folder / LOCK_NAME, "r+")
    try:
        fcntl.flock(handle.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        handle.seek(0)
        holder = handle.read(2000).strip() or "another process"
        handle.close()
        raise FicError(f"another FiC run is writing into this folder ({holder}); wait for it to end or choose "
                       "another output folder", path=str(folder), field=field) from None
    except OSError as err:
        handle.close()
        if err.errno not in NO_LOCKS:
            raise
        # A shared filesystem mounted without locks (Lustre's noflock, some NFS set-ups): a multi-node
        # run writes its out folder there; it goes on unlocked rather than not at all.
        print(f"fic: warning: {folder} is on a filesystem without file locks ({os.strerror(err.errno)}); a "
              "second run into this folder would not be stopped", file=sys.stderr, flush=True)
        _held[key] = None
        return True
    handle.seek(0)
    handle.truncate()
    command = " ".join(sys.argv)[:500]
    # The host too: on a filesystem several nodes share, the holder may be a process on another node.
    handle.write(f"process {os.getpid()} on {socket.gethostname()}, started {time.strftime('%Y-%m-%d %H:%M:%S')}: "
                 f"{command}\n")
    handle.flush()
    _held[key] = handle
    return True


def unlock_folder(folder: str | os.PathLike) -> None:
    """Release this process's lock on `folder` (nothing when it holds none)."""
    handle = _held.pop(str(Path(folder).resolve()), None)
    if handle is not None:
        with contextlib.suppress(OSError):
            handle.truncate(0)
        handle.close()  # closing the file releases the flock


@contextlib.contextmanager
def removed_if_failed(folder: str | os.PathLike, bookkeeping: Iterable[str] = ()) -> Iterator[None]:
    """For a command that may create `folder` (and folders above it): when the block fails, the
    folders it created are removed again if they hold nothing but the lock, the `bookkeeping`
    files named (the saved config) and empty files, so a failed command leaves no new output
    folder behind. A folder that existed before, or now holds results (conversations saved for
    a resume), stays as it is."""
    folder = Path(folder)
    top = None  # the highest folder of the path that does not exist yet
    for part in [folder, *folder.parents]:
        if os.path.lexists(part):
            break
        top = part
    try:
        yield
    except BaseException:
        if top is not None:
            _remove_created(folder, top, {LOCK_NAME, *bookkeeping})
        raise


def _remove_created(folder: Path, top: Path, bookkeeping: set[str]) -> None:
    try:
        entries = list(os.scandir(folder)) if folder.is_dir() and not folder.is_symlink() else None
    except OSError:
        return
    if entries is None or any(not (e.is_file(follow_symlinks=False) and (e.name in bookkeeping or
                                                                      e.stat(follow_symlinks=False).st_size == 0))
                              for e in entries):
        return  # something of value is there (or it is not ours): keep it all
    for entry in entries:
        with contextlib.suppress(OSError):
            os.unlink(entry.path)
    for part in [folder, *folder.parents]:
        with contextlib.suppress(OSError):
            part.rmdir()  # only while empty
        if part == top:
            break


@contextlib.contextmanager
def folder_lock(folder: str | os.PathLike, *, field: str | None = "out") -> Iterator[None]:
    """`lock_folder` for the duration of a block; a lock this process held before stays held."""
    taken = lock_folder(folder, field=field)
    try:
        yield
    finally:
        if taken:
            unlock_folder(folder)
