"""The code task's test harness: the program `fic.tasks.code` runs in the sandbox
(`fic.sandbox.python`), copied there as `program.py` beside `tests.json`, which holds the
solution's source (LiC's preamble and the prompt's imports included), the function's name, the
instance's tests and the CPU seconds each test may use. Standard library only: it runs with
`python -I -S`, outside FiC's environment.

Each test runs under its own CPU-time alarm (LiC's limit per test); a failed test ends the run
with exit status 1 and one line on stderr, `fic-test: <why>`, which the task puts in the note.
"""

import io
import json
import signal
import sys
from decimal import Decimal

TEST_FAILED = "fic-test: "


class TestTimeout(BaseException):  # not an Exception: `except Exception` in a solution does not swallow it
    pass


def alarm(signum, frame):
    raise TestTimeout()


def fail(message):
    sys.stderr.write("\n" + TEST_FAILED + message + "\n")
    sys.stderr.flush()
    raise SystemExit(1)


def decode(raw):
    if not raw:
        return []
    try:
        return json.loads(raw)
    except ValueError:  # LiveCodeBench's private tests: base64 of zlib of a pickled JSON string
        import base64
        import pickle
        import zlib

        return json.loads(pickle.loads(zlib.decompress(base64.b64decode(raw.encode("utf-8")))))


def plain(value):
    try:
        return json.loads(json.dumps(value))
    except (TypeError, ValueError):
        return value


def numbers(line):
    try:
        return [Decimal(part) for part in line.split()]
    except Exception:
        return None


def same_output(printed, expected):
    """LiC's stdio rule: the same lines once stripped; a line that differs matches when both are
    the same numbers (compared as decimals: "2.50" is "2.5", 10**17 is not 10**17 + 1)."""
    got = [line.strip() for line in printed.strip().split("\n")]
    want = [line.strip() for line in expected.strip().split("\n")]
    if len(got) != len(want):
        return False
    for a, b in zip(got, want):
        if a == b:
            continue
        x, y = numbers(a), numbers(b)
        try:
            if x is None or y is None or x != y:
                return False
        except Exception:  # a signalling NaN
            return False
    return True


def run_test(number, seconds, run):
    signal.setitimer(signal.ITIMER_PROF, seconds)
    try:
        return run()
    except TestTimeout:
        fail("time limit: test %d used %g s of CPU time (LiC's limit per test)" % (number, seconds))
    finally:
        signal.setitimer(signal.ITIMER_PROF, 0)


def run_tests(source, func_name, cases, check, seconds):
    """Run the solution's `source` against each case (or HumanEval's `check`): running the
    model's code is this program's purpose, in the sandbox (hence the `exec`s)."""
    signal.signal(signal.SIGPROF, alarm)
    if check is not None:
        def run_check():
            namespace = {"__name__": "solution"}
            program = source + "\n\n" + check + "\n\ncheck(" + func_name + ")\n"
            exec(compile(program, "solution.py", "exec"), namespace)  # noqa: S102
        run_test(1, seconds, run_check)
        return
    for number, case in enumerate(cases, start=1):
        if case.get("testtype") == "stdin":
            stdin, stdout = sys.stdin, sys.stdout
            sys.stdin, sys.stdout = io.StringIO(case["input"]), io.StringIO()
            try:
                run_test(number, seconds, lambda: exec(compile(source, "solution.py", "exec"),  # noqa: S102
                                                       {"__name__": "__main__"}))
                printed = sys.stdout.getvalue()
            finally:
                sys.stdin, sys.stdout = stdin, stdout
            assert same_output(printed, case["output"]), \
                "test %d: expected output %r, got %r" % (number, case["output"][:200], printed[:200])
            continue

        def call(case=case):
            namespace = {"__name__": "solution"}
            exec(compile(source, "solution.py", "exec"), namespace)  # noqa: S102
            function = namespace.get(func_name)
            if function is None and "Solution" in namespace:
                function = getattr(namespace["Solution"](), func_name)
            args = [json.loads(line) for line in case["input"].split("\n") if line.strip()]
            return plain(function(*args))
        result = run_test(number, seconds, call)
        expected = json.loads(case["output"])
        assert result == expected, "test %d: expected %r, got %r" % (number, expected, result)


def main():
    with open("tests.json", encoding="utf-8") as handle:
        tests = json.load(handle)
    run_tests(tests["source"], tests["func_name"], decode(tests["public"]) + decode(tests["private"]), tests["check"],
              tests["seconds"])


if __name__ == "__main__":
    main()
