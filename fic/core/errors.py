"""User-facing errors.

A `FicError` is bad input (a file, a record, a config key) rather than a bug: the CLI prints
it on one line and exits with status 2. Everything else is a bug and keeps its traceback.
"""

from __future__ import annotations

import contextlib
import errno
import signal
import sys
import threading
import time
from typing import Callable, Iterator


class FicError(Exception):
    """Bad input the user can fix. `str()` reads `path: record N: field 'x': what was expected`."""

    def __init__(self, message: str, *, path: str | None = None, record: int | str | None = None,
                 field: str | None = None):
        self.message, self.path, self.record, self.field = message, path, record, field
        super().__init__(self.__str__())

    def __str__(self) -> str:
        where = []
        if self.path is not None:
            where.append(str(self.path))
        if self.record is not None:
            where.append(f"record {self.record}")
        if self.field is not None:
            where.append(f"field '{self.field}'")
        return ": ".join(where + [self.message])


# What went wrong, in words a user acts on; errno's own strings ("File exists") describe the
# system call, not the user's mistake.
_OS_REASONS = {
    "EACCES": "permission denied",
    "EPERM": "permission denied",
    "EROFS": "the file system is read-only",
    "ENOSPC": "no space left on the device",
    "EDQUOT": "disk quota exceeded",
    "ENOTDIR": "a part of this path is a file, not a folder",
    "EEXIST": "a file is in the way: expected a folder here",
    "EISDIR": "is a folder, expected a file",
    "ENOENT": "no such file or folder",
    "ENAMETOOLONG": "the name is too long",
    "ELOOP": "too many symbolic links",
    "EMFILE": "too many open files",
}


def os_error(err: OSError) -> FicError:
    """The one-line FicError for an operating-system error: the path and what went wrong.

    The CLI turns every `OSError` into this; the training recipes, which `accelerate launch`
    runs outside the CLI, catch `OSError` and print it the same way.
    """

    name = errno.errorcode.get(err.errno or -1, "")
    reason = _OS_REASONS.get(name) or err.strerror or str(err) or type(err).__name__
    path = err.filename
    if path is not None and err.filename2 is not None:
        path = f"{path} -> {err.filename2}"
    return FicError(reason, path=None if path is None else str(path))


def one_line(text: str) -> str:
    """`text` on one line: messages from libraries (transformers, servers) may span several."""
    return " ".join(part.strip() for part in str(text).splitlines() if part.strip())


class Terminated(KeyboardInterrupt):
    """SIGTERM (a batch scheduler's cancel, `kill`), raised in the main thread like Ctrl-C so that
    every cleanup runs: temporaries are removed, the resumable logs keep what finished."""


def _terminate(signum: int, frame: object) -> None:
    raise Terminated()


# Python runs a signal's handler between bytecodes, so SIGTERM waits for a long native call (one
# micro-batch's backward pass can take a minute on a CPU). Inside `cut_short_on_sigterm` a
# watchdog thread, woken at once through the interpreter's wakeup fd, gives the handler
# ABORT_GRACE_S seconds and then ends the process itself: what such a block computes is only
# kept once it is over (an optimizer step, a generation call), so nothing half-written is left.
ABORT_GRACE_S = 3.0
_cut_short = threading.Event()
_watchdog: list[threading.Thread] = []


def terminate_on_sigterm() -> None:
    """Turn SIGTERM into `Terminated` (its default kills the process with no cleanup, leaving
    hidden `.NAME.*.tmp` files and half-written checkpoint folders), and start the watchdog of
    `cut_short_on_sigterm`. Main thread only."""
    if threading.current_thread() is not threading.main_thread():
        return
    signal.signal(signal.SIGTERM, _terminate)
    if _watchdog:
        return
    import os

    read, write = os.pipe()
    os.set_blocking(write, False)
    try:
        signal.set_wakeup_fd(write, warn_on_full_buffer=False)
    except (ValueError, OSError):  # another owner of the wakeup fd: only the handler then
        os.close(read)
        os.close(write)
        return

    def watch() -> None:
        while True:
            try:
                got = os.read(read, 64)
            except OSError:
                return
            if signal.SIGTERM in got and _cut_short.wait(0):
                time.sleep(ABORT_GRACE_S)  # the handler's chance to end the run the usual way
                if _cut_short.is_set():
                    print("fic: terminated (SIGTERM) in the middle of a step: nothing of it was kept; "
                          "resume=true continues from the last checkpoint", file=sys.stderr, flush=True)
                    os._exit(143)

    _watchdog.append(threading.Thread(target=watch, name="fic-sigterm", daemon=True))
    _watchdog[0].start()


@contextlib.contextmanager
def cut_short_on_sigterm() -> Iterator[None]:
    """A block SIGTERM may end within seconds even inside a long native call: the forward and
    backward passes of a training step, whose work is only kept by the optimizer step after it."""
    _cut_short.set()
    try:
        yield
    finally:
        _cut_short.clear()


def exit_status(prog: str, run: Callable[[], object]) -> int:
    """Run a command-line entry point (`fic VERB`, a recipe script) to its exit status: bad input or
    an operating-system refusal as one line on stderr and 2, SIGTERM 143, Ctrl-C 130; no traceback.
    `run` returns its status, or anything else (a recipe's results) for 0."""
    terminate_on_sigterm()
    try:
        status = run()
        return status if isinstance(status, int) else 0
    except FicError as err:
        print(f"{prog}: error: {one_line(err)}", file=sys.stderr)
        return 2
    except OSError as err:  # a path under a file, a read-only folder, a full disk: the user's to fix
        print(f"{prog}: error: {one_line(os_error(err))}", file=sys.stderr)
        return 2
    except Terminated:
        print(f"{prog}: terminated (SIGTERM)", file=sys.stderr)
        return 143
    except KeyboardInterrupt:
        print(f"{prog}: interrupted", file=sys.stderr)
        return 130
