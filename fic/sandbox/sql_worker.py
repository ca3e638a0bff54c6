"""The SQL worker, run as `python -I -S -B sql_worker.py MEMORY_MB` by `fic.sandbox.sql`: a
separate interpreter (standard library only) that runs one query at a time for the evaluator.

A query can spend all its time inside one SQLite function call (`printf('%.*c', 2000000000, 'x')`
ran 12-17 s against a 2 s limit in-process), where neither a progress handler nor an interrupt
reaches it; a process can always be killed at the limit, and this one is.

Each request on stdin is a 4-byte length and a pickle of `run`'s arguments; each answer on
stdout an 8-byte length and a pickle of `("rows", rows, columns)` or `("error", reason)`.
"""

import contextlib
import os
import pickle
import resource
import sqlite3
import struct
import sys
import time

ALLOWED = {sqlite3.SQLITE_SELECT, sqlite3.SQLITE_READ, sqlite3.SQLITE_FUNCTION, sqlite3.SQLITE_RECURSIVE}


def authorize(action, arg1, arg2, database, trigger):
    """Reading only: no writes, ATTACH, PRAGMA or extension loading."""
    if action not in ALLOWED:
        return sqlite3.SQLITE_DENY
    if action == sqlite3.SQLITE_FUNCTION and str(arg2).lower() == "load_extension":
        return sqlite3.SQLITE_DENY
    return sqlite3.SQLITE_OK


def run(uri, query, seconds, max_rows, max_bytes, max_value_bytes, max_sql_bytes):
    """One query on a read-only connection, within the limits; the answer as the module says."""
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


def main():
    memory = int(sys.argv[1]) << 20
    resource.setrlimit(resource.RLIMIT_AS, (memory, memory))
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    with contextlib.suppress(Exception):  # die with the evaluator, where ctypes works
        import ctypes

        ctypes.CDLL(None).prctl(1, 9)  # PR_SET_PDEATHSIG, SIGKILL
    requests, replies = os.fdopen(0, "rb"), os.fdopen(1, "wb")
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


if __name__ == "__main__":
    main()
