"""The code task scores as Lost in Conversation does (issue 19, item 9): LiC's import preamble
runs before the solution, each test has its own time limit and the run LiC's global limit of
(limit + 1) x tests + 5, as CPU time (a loaded machine must not score a base run and a trained
run differently), and stdio outputs that differ only as numbers match."""

from __future__ import annotations

import json

import pytest

from fic import tasks
from fic.core.instance import Instance, Shard
from fic.sandbox.python import Limits
from fic.tasks import code as code_module
from fic.tasks import code_harness


def functional(func_name: str, cases: list[tuple[list, object]]) -> Instance:
    tests = [{"input": "\n".join(json.dumps(a) for a in args), "output": json.dumps(out), "testtype": "functional"}
             for args, out in cases]
    return Instance("lcb", "code", [Shard(1, "Write it."), Shard(2, "Details.")],
                    {"metadata": {"func_name": func_name}, "question_content": f"Write {func_name}.",
                     "public_test_cases": json.dumps(tests)})


def stdin(cases: list[tuple[str, str]]) -> Instance:
    tests = [{"input": given, "output": want, "testtype": "stdin"} for given, want in cases]
    return Instance("stdio", "code", [Shard(1, "Read numbers."), Shard(2, "Print them.")],
                    {"metadata": {"func_name": "main"}, "question_content": "Read stdin, print the answer.",
                     "public_test_cases": json.dumps(tests)})


def reply(code: str) -> str:
    return f"```python\n{code.strip()}\n```"


@pytest.fixture
def task():
    return tasks.get("code")


def test_lic_preamble_names_work_without_their_imports(task):
    # `List[int]` and `math.fsum` (and deque, heappush, Counter, ...) without an import: LiC's
    # preamble provides them, so a solution LiC passes passes here too.
    code = """
def total(xs: List[int]) -> float:
    queue = deque(xs)
    heap = []
    for x in queue:
        heappush(heap, x)
    assert Counter(xs)[xs[0]] >= 1 and gcd(12, 8) == 4
    return math.fsum(heap) + fsum([0.0])
"""
    instance = functional("total", [([[1, 2, 3]], 6.0), ([[0.5, 0.25]], 0.75)])
    score, note = task.scored(reply(code), instance)
    assert score == 1.0, note


STDIO_CASES = [
    ("2.50\n3.0\n", "2.5\n3", True),          # the same numbers, written otherwise
    ("1e2", "100", True),                     # as decimals
    ("0.1 0.2  0.30", "0.1 0.2 0.3", True),   # element by element, any spacing
    ("2.5 x", "2.50 x", False),               # a line that is not all numbers must match exactly
    ("2.5\n3", "2.5", False),                 # other line counts
    ("100000000000000001", "100000000000000000", False),  # decimals, not floats: no rounding
    ("  same text  \n", "same text", True),   # lines are stripped
    ("nan", "NaN", False),                    # NaN is no number equal to itself (same text would match)
]


@pytest.mark.parametrize("printed,expected,passes", STDIO_CASES)
def test_stdio_outputs_that_differ_only_as_numbers_match(task, printed, expected, passes):
    code = f"import sys\nsys.stdin.read()\nprint({printed!r}, end='')\ndef main():\n    pass\n"
    score, note = task.scored(reply(code), stdin([("1 2\n", expected)]))
    assert score == (1.0 if passes else 0.0), note


@pytest.mark.parametrize("printed,expected,passes", STDIO_CASES)
def test_the_harness_compares_outputs_as_lic_does(printed, expected, passes):
    # The rule itself, in-process: the harness is a module (fic/tasks/code_harness.py) that the
    # sandbox runs by path, and its functions are importable.
    assert code_harness.same_output(printed, expected) is passes


def test_the_harness_reads_lics_packed_private_tests():
    import base64
    import pickle
    import zlib

    cases = [{"input": "1", "output": "1", "testtype": "functional"}]
    packed = base64.b64encode(zlib.compress(pickle.dumps(json.dumps(cases)))).decode()
    assert code_harness.decode(packed) == cases and code_harness.decode(json.dumps(cases)) == cases
    assert code_harness.decode("") == []


def test_a_failed_test_ends_the_harness_with_one_line_naming_it(capsys):
    import signal

    previous = signal.getsignal(signal.SIGPROF)  # the harness sets its own: it owns its process in the sandbox
    with pytest.raises(SystemExit) as stopped:
        try:
            code_harness.run_tests("def f(x):\n    while True:\n        pass\n", "f",
                                   [{"input": "1", "output": "1", "testtype": "functional"}], None, 0.2)
        finally:
            signal.signal(signal.SIGPROF, previous)
    assert stopped.value.code == 1
    assert capsys.readouterr().err.strip() == (f"{code_harness.TEST_FAILED}time limit: test 1 used 0.2 s of CPU "
                                               "time (LiC's limit per test)")


@pytest.mark.slow  # burns CPU seconds up to the limits
def test_each_test_has_its_own_cpu_limit_not_one_for_all(task, monkeypatch):
    # Scaled down from the 12 tests of 0.7 s against "still running after 6 s": 6 tests
    # of 0.3 s of CPU against 0.6 s a test. The run's limit is LiC's (0.6 + 1) x 6 + 5 = 14.6 s.
    monkeypatch.setattr(code_module, "LIMITS", Limits(seconds=0.6, memory_mb=256, processes=8, output_mb=1))
    code = """
import time
def busy(n):
    end = time.process_time() + 0.3
    while time.process_time() < end:
        pass
    return n
"""
    instance = functional("busy", [([n], n) for n in range(6)])
    assert task.limits(instance).seconds == pytest.approx((0.6 + 1) * 6 + 5)
    score, note = task.scored(reply(code), instance)
    assert score == 1.0, note
    # One test over its own limit fails, and the note names it.
    slow = code.replace("0.3", "0.3 if n != 3 else 5")
    score, note = task.scored(reply(slow), instance)
    assert score == 0.0 and note.startswith("time limit: test 4 used 0.6 s of CPU time")


def test_the_limits_are_cpu_time_not_wall_clock(task, monkeypatch):
    # Each test sleeps 1 s (wall clock, as a loaded machine would stretch it) and computes 0.1 s:
    # within 0.6 s of CPU a test.
    monkeypatch.setattr(code_module, "LIMITS", Limits(seconds=0.6, memory_mb=256, processes=8, output_mb=1))
    code = """
import time
def nap(n):
    time.sleep(1.0)
    end = time.process_time() + 0.1
    while time.process_time() < end:
        pass
    return n
"""
    score, note = task.scored(reply(code), functional("nap", [([1], 1), ([2], 2)]))
    assert score == 1.0, note


def test_the_default_limits_are_lics():
    assert code_module.LIMITS.seconds == 6.0
    instance = functional("f", [([n], n) for n in range(12)])
    assert tasks.get("code").limits(instance).seconds == (6 + 1) * 12 + 5  # 89 s of CPU for 12 tests
    assert tasks.get("code").limits(functional("f", [([1], 1)])).wall == 3 * 12 + 5


def test_private_tests_are_counted_without_running_a_pickle_in_the_evaluator(tmp_path):
    import base64
    import pickle
    import zlib

    def packed(value) -> str:
        return base64.b64encode(zlib.compress(pickle.dumps(value))).decode()

    cases = json.dumps([{"input": "1", "output": "1", "testtype": "functional"}] * 3)
    instance = functional("f", [([1], 1)])
    instance.fields["private_test_cases"] = packed(cases)
    assert code_module.test_count(instance) == 4

    marker = tmp_path / "ran"

    class Hostile:
        def __reduce__(self):
            return (open, (str(marker), "w"))

    instance.fields["private_test_cases"] = packed(Hostile())
    assert code_module.test_count(instance) == 1 and not marker.exists()  # refused, not run
