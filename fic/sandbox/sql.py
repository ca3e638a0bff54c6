"""Running model-written SQL (`run_sql`) so that it can only read, and only for so long, and
reading pickles from data files without running code (`plain_pickle_loads`).

SQL runs in a separate worker process (`fic/sandbox/sql_worker.py`, killed when a query outlives its wall-clock limit: one
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

from fic.sandbox.bubblewrap import python_interpreter


@dataclass(frozen=True)
class SQLLimits:
    seconds: float = 2.0           # wall clock: the worker process is killed when a query runs longer
    max_rows: int = 10_000
    max_bytes: int = 32 << 20     # bytes of all fetched values together
    max_value_bytes: int = 1 << 20  # SQLITE_LIMIT_LENGTH: the longest string or blob a query may build
    max_sql_bytes: int = 100_000    # SQLITE_LIMIT_SQL_LENGTH: the longest query text
    memory_mb: int = 1024          # address space of the worker process


# The worker process (see there): run by path, as a script of the standard library alone.
SQL_WORKER = Path(__file__).with_name("sql_worker.py")


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
        self.process = subprocess.Popen([python_interpreter(), "-I", "-S", "-B", str(SQL_WORKER), str(memory_mb)],
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
