"""Writing outputs atomically; the folders FiC makes and deletes; a lock on an output folder.

Every output FiC writes goes to a temporary file in the same folder and is renamed into
place, so an interrupted job never leaves a half-written file behind.

Text is written with `backslashreplace`, so a lone surrogate read from a `\ud800` escape is
written back as that escape (valid JSON) instead of failing the write. Reading is
`fic.core.records`.

Runs that write into an output folder hold `folder_lock` on it: a second run into the same
folder fails at once, naming the first's process.

No write follows a link: a new file is a temporary renamed into place (a rename replaces a
link, never writes through it), and the few files written in place (the lock, appended logs)
are opened by `open_in_place`, which refuses a symbolic link, a hard link and anything but a
regular file. A copied run folder or a shared `runs/` holding `.fic-lock -> ~/.bashrc` makes
FiC refuse, never empty the file it points to.

No folder operation follows a link either: below an output folder a run writes into (one it
locks, or names with `guard_out`), every folder FiC makes, writes into, rotates or deletes goes
through `make_folder`, `own_folder`, `remove_folder` and `publish_folder`, which `lstat` every part
of the path below the output folder and refuse a symbolic link with the same line as a linked file
(the output folder itself may be a link: where a run goes is the user's choice).

FiC deletes only what FiC made: every folder it makes holds a marker (`.fic-run`, the token of
the run that made it). `remove_folder` deletes a folder, `publish_folder` (given the token)
replaces one, and `own_folder` takes an existing one to write into, only when its marker is the
run's token or it is empty; anything else in the way (a user's folder, another run's) is a
`FicError` naming it (`check_own`, which `--dry-run` asks too), and it is left as it was.
"""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import errno
import fcntl
import json
import os
import secrets
import shutil
import socket
import stat
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Callable, Iterable, Iterator

from fic.core.errors import FicError, on_abort


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
    make_folder(path.parent)
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
    check_no_link(Path(path).parent)
    try:
        fd = os.open(path, flags | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK, 0o666)
    except OSError as err:
        if err.errno == errno.ELOOP:
            raise FicError(LINK_REFUSED, path=str(path)) from None
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


def publish_folder(tmp: str | os.PathLike, final: str | os.PathLike, token: str | None = None) -> None:
    """Move the finished folder `tmp` onto `final`, replacing an older `final`; with `token`, only
    an older `final` the run of `token` made (or an empty one): anything else there is refused
    (`check_own`) and kept. Without it the caller vouches that `final` is its own (a trained model
    folder, published without a marker, that only a resume of the same run replaces).

    A reader of `final` sees either the whole old folder or the whole new one, never none and
    never a mix: the two are swapped in one step (Linux renameat2 RENAME_EXCHANGE), then the
    old one is deleted. Where the OS cannot swap, the old folder is renamed aside first, which
    leaves a moment with no `final` but never a half-written one, and the old folder survives a
    crash in between (as `.<name>.old-*`, next to `final`). A link at `final` or above it (below
    an output folder) is refused (`check_no_link`).
    """
    tmp, final = Path(tmp), Path(final)
    check_no_link(tmp)
    check_no_link(final)
    if os.path.islink(final):
        raise FicError(LINK_REFUSED, path=str(final))
    if token is not None:
        check_own(final, token)
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


# --------------------------------------------------------------------------- folders below an output folder

LINK_REFUSED = "is a symbolic link; FiC does not write through links in an output folder (remove it)"
RUN_MARKER = ".fic-run"  # in every folder FiC makes: the token of the run that made it
_guarded: set[str] = set()  # output folders this process writes below (absolute, links not resolved)


def guard_out(folder: str | os.PathLike) -> None:
    """Refuse, from now on in this process, a link anywhere below the output folder `folder`
    (`check_no_link`); `lock_folder` does it for the folder it locks."""
    _guarded.add(os.path.abspath(folder))


def check_no_link(path: str | os.PathLike, root: str | os.PathLike | None = None) -> None:
    """A `FicError` when `path`, or a folder between it and the output folder it lies below (`root`,
    else each folder named to `guard_out`), is a symbolic link. The output folder itself may be one."""
    full = os.path.abspath(path)
    for top in [os.path.abspath(root)] if root is not None else list(_guarded):
        if full != top and not full.startswith(top.rstrip(os.sep) + os.sep):
            continue
        part = top
        for name in full[len(top):].split(os.sep):
            if name:
                part = os.path.join(part, name)
                if os.path.islink(part):
                    raise FicError(LINK_REFUSED, path=part)


def new_token() -> str:
    """A new run token (the marker of the folders a run makes)."""
    return secrets.token_hex(8)


def make_folder(path: str | os.PathLike, *, token: str | None = None) -> bool:
    """Make the folder `path` and the missing ones above it, refusing a link below an output folder
    (`check_no_link`); with `token`, each folder made holds it as its marker (`RUN_MARKER`). True
    when `path` was made now. A file in the way is the usual `OSError`."""
    path = Path(path)
    check_no_link(path)
    missing = []
    for part in [path, *path.parents]:
        if os.path.lexists(part):
            break
        missing.append(part)
    for part in reversed(missing):
        with contextlib.suppress(FileExistsError):  # made meanwhile (another rank)
            os.mkdir(part)
        if token is not None:
            write_text(part / RUN_MARKER, token + "\n")
    check_no_link(path)  # a link swapped in meanwhile
    if not path.is_dir():
        raise FileExistsError(errno.EEXIST, "File exists", str(path))
    return bool(missing)


def folder_token(folder: str | os.PathLike) -> str | None:
    """The token of the run that made `folder` (its marker), or None (no marker: not FiC's)."""
    try:
        fd = os.open(Path(folder) / RUN_MARKER, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK)
    except OSError:
        return None
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return None
        return os.read(fd, 200).decode("utf-8", "replace").strip() or None
    finally:
        os.close(fd)


def run_token(folder: str | os.PathLike) -> str:
    """The token of the runs that write into `folder`: its marker, given now (a new token) where it
    has none. The folders a run makes below `folder` hold the same token, so a later run into the
    same folder (a resume, the demo's next stage) knows them for its own."""
    token = folder_token(folder)
    if token is None:
        make_folder(folder)
        token = new_token()
        write_text(Path(folder) / RUN_MARKER, token + "\n")
    return token


def owned(folder: str | os.PathLike, token: str) -> bool:
    """Whether `folder` is a folder the run of `token` made (a link never is)."""
    return not os.path.islink(folder) and folder_token(folder) == token


IN_THE_WAY = ("is in the way: FiC did not make this folder (it holds no marker of this run), so it neither "
              "deletes nor writes anything in it; move it away or choose another output folder")


def check_own(folder: str | os.PathLike, token: str | None) -> None:
    """Refuse, changing nothing, what `remove_folder` and `own_folder` refuse at `folder`: a link
    at it or above it (below an output folder), a file in its place, a folder that holds something
    and no marker of the run of `token` (a user's folder, another run's; with no token, any that
    holds something). Nothing there, or an empty folder, is fine."""
    folder = Path(folder)
    check_no_link(folder)
    if os.path.islink(folder):
        raise FicError(LINK_REFUSED, path=str(folder))
    if not os.path.lexists(folder):
        return
    if not folder.is_dir():
        raise FicError("is in the way: a file where FiC keeps a folder of its own; move it away or choose another "
                       "output folder", path=str(folder))
    if not (token is not None and owned(folder, token)) and any(os.scandir(folder)):
        raise FicError(IN_THE_WAY, path=str(folder))


def own_folder(folder: str | os.PathLike, token: str) -> None:
    """Make `folder` a folder of the run of `token` to write into: made and marked when missing,
    marked when empty, taken as it is when it holds that run's marker (a resume, the next stage);
    anything else there is refused (`check_own`) and nothing is written in it."""
    check_own(folder, token)
    make_folder(folder, token=token)
    if folder_token(folder) != token:  # an empty folder: made meanwhile, or left empty by someone
        write_text(Path(folder) / RUN_MARKER, token + "\n")


def remove_folder(folder: str | os.PathLike, token: str) -> None:
    """Delete `folder` (nothing when it is missing) if the run of `token` made it, or it is empty;
    a link (at it or above it, below an output folder), or a folder FiC did not make or another
    run made, is a `FicError` naming it, and nothing is deleted (`check_own`)."""
    folder = Path(folder)
    check_own(folder, token)
    if not os.path.lexists(folder):
        return
    if owned(folder, token):
        shutil.rmtree(folder)
        return
    try:
        folder.rmdir()  # empty when checked: only while still empty, so nothing of anyone's is lost
    except OSError:
        raise FicError(IN_THE_WAY, path=str(folder)) from None


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
    make_folder(folder, token=new_token())
    guard_out(folder)
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
    def remove() -> None:
        if top is not None:
            _remove_created(folder, top, {LOCK_NAME, RUN_MARKER, *bookkeeping})

    try:
        with on_abort(remove):  # a SIGTERM's watchdog, ending the process, removes it too
            yield
    except BaseException:
        remove()
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
            if part != folder and [e.name for e in os.scandir(part)] == [RUN_MARKER]:
                os.unlink(part / RUN_MARKER)  # a folder made for it, marked and now empty
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
