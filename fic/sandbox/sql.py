"""Running model-written SQL (`run_sql`) so that it can only read, and only for so long, and
reading pickles from data files without running code (`plain_pickle_loads`).

SQL runs in a separate worker process (killed when a query outlives its wall-clock limit: one
SQLite function call can run for many seconds where no interrupt reaches it), on a read-only
connection (`mode=ro` URI, `PRAGMA query_only`), with an authorizer that allows only reading
(no writes, ATTACH, PRAGMA or extension loading), limits on rows, bytes fetched, the length of
any one value and of the query text, and on the worker's memory.
"""

from __future__ import annotations

import atexit
import contextlib
import io
import os
import pickle
import select
import signal
import struct
import subprocess
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from fic.sandbox.python import python_interpreter


@dataclass(frozen=True)
class SQLLimits:
    seconds: float = 2.0           # wall clock: the worker process is killed when a query runs longer
    max_rows: int = 10_000
    max_bytes: int = 32 << 20     # bytes of all fetched values together
    max_value_bytes: int = 1 << 20  # SQLITE_LIMIT_LENGTH: the longest string or blob a query may build
    max_sql_bytes: int = 100_000    # SQLITE_LIMIT_SQL_LENGTH: the longest query text
    memory_mb: int = 1024          # address space of the worker process


# The worker: a separate interpreter (`-I -S`, standard library only) that runs one query at a
# time for the evaluator. A query can spend all its time inside one SQLite function call
# (`printf('%.*c', 2000000000, 'x')` ran 12-17 s against a 2 s limit in-process), where neither a
# progress handler nor an interrupt reaches it; a process can always be killed at the limit.
SQL_WORKER = r'''
import os, pickle, resource, sqlite3, struct, sys, time

ALLOWED = {sqlite3.SQLITE_SELECT, sqlite3.SQLITE_READ, sqlite3.SQLITE_FUNCTION, sqlite3.SQLITE_RECURSIVE}
memory = int(sys.argv[1]) << 20
resource.setrlimit(resource.RLIMIT_AS, (memory, memory))
resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
try:  # die with the evaluator
    import ctypes
    ctypes.CDLL(None).prctl(1, 9)  # PR_SET_PDEATHSIG, SIGKILL
except Exception:
    pass
requests, replies = os.fdopen(0, "rb"), os.fdopen(1, "wb")

def authorize(action, arg1, arg2, database, trigger):
    if action not in ALLOWED:
        return sqlite3.SQLITE_DENY
    if action == sqlite3.SQLITE_FUNCTION and str(arg2).lower() == "load_extension":
        return sqlite3.SQLITE_DENY
    return sqlite3.SQLITE_OK

def run(uri, query, seconds, max_rows, max_bytes, max_value_bytes, max_sql_bytes):
    connection = sqlite3.connect(uri, uri=True, timeout=0)
    try:
        connection.text_factory = lambda raw: raw.decode("utf-8", errors="replace")
        if hasattr(connection, "enable_load_extension"):
            connection.enable_load_extension(False)
        connection.execute("PRAGMA query_only = ON")
        connection.setlimit(sqlite3.SQLITE_LIMIT_LENGTH, max_value_bytes)
        connection.setlimit(sqlite3.SQLITE_LIMIT_SQL_LENGTH, max_sql_bytes)
        connection.setlimit(sqlite3.SQLITE_LIMIT_ATTACHED, 0)
        connection.set_authorizer(authorize)
        deadline = time.monotonic() + seconds
        connection.set_progress_handler(lambda: int(time.monotonic() > deadline), 1000)
        try:
            cursor = connection.execute(query)
            columns = len(cursor.description or ())
            rows, size = [], 0
            while True:
                batch = cursor.fetchmany(500)
                if not batch:
                    break
                rows += batch
                size += sum(len(v) if isinstance(v, (str, bytes)) else 8 for row in batch for v in row)
                if len(rows) > max_rows:
                    return ("error", "row limit: more than %d rows" % max_rows)
                if size > max_bytes:
                    return ("error", "size limit: more than %d MiB fetched" % (max_bytes >> 20))
        except sqlite3.Error as err:
            if time.monotonic() > deadline:
                return ("error", "time limit: still running after %g s, interrupted" % seconds)
            message = str(err)
            if "not authorized" in message or "prohibited" in message:
                return ("error", "refused: only reading queries may run (%s)" % message)
            return ("error", "SQL error: " + message)
        except (sqlite3.Warning, ValueError, OverflowError, MemoryError) as err:
            return ("error", "SQL error: %s" % (err,))
        return ("rows", rows, columns)
    finally:
        connection.close()

while True:
    head = requests.read(4)
    if len(head) < 4:
        break
    request = pickle.loads(requests.read(struct.unpack("!I", head)[0]))
    try:
        answer = run(*request)
    except MemoryError:
        answer = ("error", "memory limit: the query needed more than %d MiB" % (memory >> 20))
    except Exception as err:
        answer = ("error", "SQL error: %s: %s" % (type(err).__name__, err))
    data = pickle.dumps(answer, protocol=4)
    replies.write(struct.pack("!Q", len(data)) + data)
    replies.flush()
'''


class _Plain(pickle.Unpickler):
    """Unpickles only plain data (tuples, lists, str, bytes, numbers, None): no class is ever looked up."""

    def find_class(self, module: str, name: str) -> Any:
        raise pickle.UnpicklingError(f"refused: {module}.{name}")


def plain_pickle_loads(data: bytes) -> Any:
    """`pickle.loads` that builds plain data only (str, bytes, numbers, lists, tuples, dicts,
    None): a pickle naming any class or function is refused, so reading one from a data file
    (LiveCodeBench's private tests) cannot run code in the evaluator."""
    return _Plain(io.BytesIO(data)).load()


class _SQLWorker:
    """The worker process of this evaluator, started on first use and again after a kill."""

    def __init__(self) -> None:
        self.process: subprocess.Popen | None = None
        self.owner = 0
        self.memory_mb = 0
        self.lock = threading.Lock()

    def _start(self, memory_mb: int) -> subprocess.Popen:
        if self.process is not None and self.process.poll() is None and self.owner == os.getpid() \
                and self.memory_mb == memory_mb:
            return self.process
        self.stop()
        self.process = subprocess.Popen([python_interpreter(), "-I", "-S", "-B", "-c", SQL_WORKER, str(memory_mb)],
                                        stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                                        close_fds=True, start_new_session=True, env={"LANG": "C.UTF-8"})
        self.owner, self.memory_mb = os.getpid(), memory_mb
        return self.process

    def stop(self) -> None:
        process, self.process = self.process, None
        if process is not None and self.owner == os.getpid():
            with contextlib.suppress(ProcessLookupError):
                process.kill()
            process.wait()
            for stream in (process.stdin, process.stdout):
                with contextlib.suppress(OSError):
                    stream.close()

    def query(self, uri: str, query: str, limits: SQLLimits) -> tuple:
        with self.lock:
            process = self._start(limits.memory_mb)
            request = pickle.dumps((uri, query, limits.seconds, limits.max_rows, limits.max_bytes,
                                    limits.max_value_bytes, limits.max_sql_bytes), protocol=4)
            try:
                process.stdin.write(struct.pack("!I", len(request)) + request)
                process.stdin.flush()
                # The worker interrupts slow statements itself; this is for the ones it cannot.
                head = self._read(process, 8, time.monotonic() + limits.seconds + SQL_GRACE_S)
                size = struct.unpack("!Q", head)[0]
                if size > limits.max_bytes * 2 + (1 << 20):
                    raise _Killed("size limit: the result is larger than allowed")
                return _Plain(io.BytesIO(self._read(process, size, time.monotonic() + 30))).load()
            except _Killed as killed:
                self.stop()
                return ("error", str(killed).format(seconds=f"{limits.seconds:g}"))
            except (OSError, EOFError, pickle.UnpicklingError, struct.error):
                code = process.poll()
                self.stop()
                if code is not None and code < 0 and signal.Signals(-code).name in ("SIGKILL", "SIGSEGV"):
                    return ("error", f"the query crashed the SQL worker ({signal.Signals(-code).name})")
                return ("error", f"memory limit: the query needed more than {limits.memory_mb} MB")

    @staticmethod
    def _read(process: subprocess.Popen, size: int, deadline: float) -> bytes:
        chunks, got, fd = [], 0, process.stdout.fileno()
        while got < size:
            left = deadline - time.monotonic()
            if left <= 0 or not select.select([fd], [], [], left)[0]:
                raise _Killed("time limit: still running after {seconds} s, killed")
            chunk = os.read(fd, min(size - got, 1 << 20))
            if not chunk:
                raise EOFError("the SQL worker ended")
            chunks.append(chunk)
            got += len(chunk)
        return b"".join(chunks)


class _Killed(Exception):
    pass


SQL_GRACE_S = 0.5  # past the time limit, the worker is killed (it interrupts what it can itself)
_sql_worker = _SQLWorker()
atexit.register(_sql_worker.stop)


def run_sql(database: str | os.PathLike, query: str, limits: SQLLimits = SQLLimits()
            ) -> tuple[list[tuple] | None, int, str | None]:
    """Run one query read-only in the SQL worker process; return (rows, number of columns, None)
    or (None, 0, reason). A query still running `limits.seconds` (plus a half-second grace)
    after it started is stopped by killing the worker, which the next query restarts."""
    path = Path(database).resolve()
    if not path.is_file():
        return None, 0, f"database not found: {path}"
    if len(query.encode("utf-8", "surrogatepass")) > limits.max_sql_bytes:
        return None, 0, f"SQL error: the query is longer than {limits.max_sql_bytes} bytes"
    answer = _sql_worker.query(f"{path.as_uri()}?mode=ro", query, limits)
    if answer[0] == "rows":
        return [tuple(row) for row in answer[1]], int(answer[2]), None
    return None, 0, str(answer[1])
