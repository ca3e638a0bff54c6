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


# A SIGTERM ends every verb within SIGTERM_BOUND_S, whatever it is doing. Python runs a signal's
# handler between bytecodes, so the handler waits for a long native call (one micro-batch's
# backward pass can take a minute on a CPU), and a process holding a model takes seconds to
# finalize under load (6 s measured: the interpreter's last garbage collections; skipped after a
# SIGTERM, `_exit_if_terminated`). So a watchdog
# thread, woken at once through the interpreter's wakeup fd, gives the run ABORT_GRACE_S to end the
# usual way (Terminated: cleanups run, one line); then it runs the cleanups registered with
# `on_abort` (a new output folder holding no finished work is removed) and ends the process itself,
# saying what the cut-short block loses (`sigterm_note`). Whatever is kept is only kept once it is
# whole (an optimizer step, a conversation, a renamed file), so nothing half-written is left.
SIGTERM_BOUND_S = 3.0  # the documented bound (docs/evaluation.md, "Shutdown")
ABORT_GRACE_S = 2.5    # the run's own chance; the rest of the bound is the exit itself
STEP_NOTE = "in the middle of a step: nothing of it was kept"
_notes: list = []          # what a SIGTERM now would lose and keep (`sigterm_note`), innermost last
_at_signal: list = [None]  # the note when SIGTERM came (the block is gone by the time it is said)
_prog = ["fic"]                      # the verb, for the watchdog's line
_handled = threading.Event()         # the handler raised Terminated: the run is ending the usual way
_said = threading.Event()            # the run said how it ended: the watchdog ends it quietly
_on_abort: list[Callable[[], object]] = []
_watchdog: list[threading.Thread] = []


def _note_now() -> Callable[[], str] | None:
    """The notes of the blocks running now, innermost first (what the cut-short block lost, then
    what the verb keeps), said when the line is written."""
    notes = [note for note in reversed(_notes) if note is not None]
    return (lambda: "; ".join(filter(None, map(_note_text, notes)))) if notes else None


def _note_text(note: object) -> str | None:
    if callable(note):
        try:
            return note()
        except Exception:  # the line is said whatever the note's own trouble
            return None
    return note  # type: ignore[return-value]


def _terminate(signum: int, frame: object) -> None:
    if _handled.is_set():  # a second SIGTERM (a parent passing its own on) must not cut the cleanups short
        return
    _at_signal[0] = _note_now()
    _handled.set()
    raise Terminated()


def terminated_line(prog: str, note: object) -> str:
    """The one line a SIGTERM ends a verb with: the verb, what the cut-short block lost and what
    the verb keeps."""
    note = _note_text(note)
    return f"{prog}: terminated (SIGTERM)" + (f"; {note}" if note else "")


def terminate_on_sigterm(prog: str | None = None) -> None:
    """Turn SIGTERM into `Terminated` (its default kills the process with no cleanup, leaving
    hidden `.NAME.*.tmp` files and half-written checkpoint folders), and start the watchdog that
    ends the process ABORT_GRACE_S after a SIGTERM it has not ended by itself. Main thread only."""
    if threading.current_thread() is not threading.main_thread():
        return
    if prog is not None:
        _prog[0] = prog
    signal.signal(signal.SIGTERM, _terminate)
    if _watchdog:
        return
    import atexit
    import os

    # Registered first, so it runs last of the exit handlers: after a SIGTERM the run ended the
    # usual way, the interpreter's teardown is skipped (a process holding a model took 6 s to
    # finalize under load, where a daemon watchdog can no longer act).
    atexit.register(_exit_if_terminated)

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
            if signal.SIGTERM not in got:
                continue
            sent = time.monotonic()
            _said.wait(ABORT_GRACE_S)  # the run's chance to end the usual way
            if not _said.is_set() and _handled.is_set():  # it is ending so: its cleanups get the rest of the bound
                _said.wait(SIGTERM_BOUND_S - ABORT_GRACE_S - 0.2)
            if _said.is_set():  # its line is said: the interpreter's teardown gets what is left of the grace
                time.sleep(max(0.0, ABORT_GRACE_S - (time.monotonic() - sent)))
            else:
                note = _note_now() or _at_signal[0]
                for cleanup in reversed(list(_on_abort)):
                    with contextlib.suppress(BaseException):
                        cleanup()
                with contextlib.suppress(BaseException):
                    print(terminated_line(_prog[0], note), file=sys.stderr, flush=True)
            os._exit(143)

    _watchdog.append(threading.Thread(target=watch, name="fic-sigterm", daemon=True))
    _watchdog[0].start()


def _exit_if_terminated() -> None:
    if _handled.is_set() and _said.is_set():
        import os

        for stream in (sys.stdout, sys.stderr):
            with contextlib.suppress(BaseException):
                stream.flush()
        os._exit(143)


@contextlib.contextmanager
def sigterm_note(note: str | Callable[[], str | None] | None) -> Iterator[None]:
    """While the block runs, a SIGTERM's line says `note` (what it loses, what is kept, how to go on;
    a callable says it when the line is written) before the enclosing blocks' notes; None adds
    nothing. Nests."""
    _notes.append(note)
    try:
        yield
    finally:
        _notes.pop()


def cut_short_on_sigterm(note: str | Callable[[], str | None] | None = STEP_NOTE) -> contextlib.AbstractContextManager:
    """A block SIGTERM may end within seconds even inside a long native call (every block may now:
    the watchdog is always armed), whose work is only kept once it is over: a training step (its
    note, the default), a generation call (None: the enclosing verb's note)."""
    return sigterm_note(note)


@contextlib.contextmanager
def on_abort(cleanup: Callable[[], object]) -> Iterator[None]:
    """While the block runs, `cleanup` runs before the watchdog ends the process after a SIGTERM
    (the usual way, an exception through the block, runs the block's own cleanups instead)."""
    _on_abort.append(cleanup)
    try:
        yield
    finally:
        _on_abort.remove(cleanup)


def run_child(command: list[str]) -> int:
    """Run a verb's child process (a stage of `fic demo`) to its exit status. A SIGTERM or Ctrl-C
    to the verb is passed on, and the child ends on its own within the bound, its cleanups run and
    its line said; `subprocess.run` killed it (SIGKILL) a quarter second after, even when the
    signal had reached it too (a terminal's or a scheduler's, sent to the whole process group)."""
    import subprocess

    child = subprocess.Popen(command)
    try:
        return child.wait()
    except KeyboardInterrupt as stop:
        with contextlib.suppress(ProcessLookupError):
            child.send_signal(signal.SIGTERM if isinstance(stop, Terminated) else signal.SIGINT)
        with contextlib.suppress(subprocess.TimeoutExpired):
            child.wait(timeout=SIGTERM_BOUND_S)  # this process's watchdog may end it first: the child ends alike
        raise
    finally:
        if child.poll() is None:  # not even the bound ended it
            child.kill()
            child.wait()


def exit_status(prog: str, run: Callable[[], object]) -> int:
    """Run a command-line entry point (`fic VERB`, a recipe script) to its exit status: bad input or
    an operating-system refusal as one line on stderr and 2, SIGTERM 143, Ctrl-C 130; no traceback.
    `run` returns its status, or anything else (a recipe's results) for 0."""
    terminate_on_sigterm(prog)
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
        print(terminated_line(prog, _at_signal[0]), file=sys.stderr, flush=True)
        _said.set()  # the exit handlers end the process without the interpreter's teardown
        return 143
    except KeyboardInterrupt:
        print(f"{prog}: interrupted", file=sys.stderr)
        return 130
