"""The run's folder has a total-size bound (issue 56, item 7): 250 files of 4 MB (each under the
file-size limit) scored 1 with no note, and on a tmpfs `/tmp` that was memory outside the tree's
bound. Now the supervisor stops a run whose folder grew past `Limits.folder_mb` (its files, and a
page for each file or folder), with a note; in bubblewrap the folder is a tmpfs of its own, sized
to match, so that files removed but held open count too, and no other file system in it takes
writes."""

import pytest
from sandboxed import ISOLATIONS

from fic.sandbox import python as sandbox
from fic.sandbox.python import Limits, run_python

LIMITS = Limits(seconds=20.0, memory_mb=256, processes=8, output_mb=4, folder_mb=64)
NOTE = "disk limit: the run's folder grew by more than 64 MiB"

MANY_FILES = "for i in range(250):\n    open(f'f{i}', 'wb').write(b'x' * (4 << 20))\nprint('wrote 1000 MB')\n"
HELD_OPEN = ("import os\nheld = []\nfor i in range(40):\n    f = open(f'g{i}', 'wb')\n    f.write(b'x' * (4 << 20))\n"
             "    f.flush()\n    os.remove(f'g{i}')\n    held.append(f)\nprint('held 160 MB')\n")
EMPTY_FILES = "for i in range(30000):\n    open(f'e{i}', 'w').close()\nprint('made 30,000 files')\n"


@pytest.mark.parametrize("isolation", ISOLATIONS)
@pytest.mark.parametrize("program", [MANY_FILES, HELD_OPEN, EMPTY_FILES], ids=["250x4MB", "held-open", "30k-empty"])
def test_what_a_run_adds_to_its_folder_is_bounded(isolation, program):
    result = run_python(program, LIMITS, isolation=isolation)
    assert result.layers["folder_mb"] == 64
    assert not result.passed and result.reason.startswith(NOTE), result.reason
    assert "wrote" not in result.stdout and "held" not in result.stdout and "made" not in result.stdout


@pytest.mark.parametrize("isolation", ISOLATIONS)
def test_the_bound_is_on_what_the_run_adds_not_on_the_files_it_was_given(isolation):
    # 80 MB of tests given (LiveCodeBench's can be large), 10 files of 3 MB written: it passes.
    given = {"tests.json": "x" * (80 << 20)}
    program = ("assert len(open('tests.json').read()) == 80 << 20\nfor i in range(10):\n"
               "    open(f'out{i}', 'wb').write(b'y' * (3 << 20))\nprint('ok')\n")
    result = run_python(program, LIMITS, isolation=isolation, files=given)
    assert result.passed, result.reason
    result = run_python(program.replace("range(10)", "range(30)"), LIMITS, isolation=isolation, files=given)
    assert not result.passed and result.reason.startswith(NOTE), result.reason


def test_in_bubblewrap_no_tmpfs_but_the_folder_takes_writes_even_without_landlock(monkeypatch):
    # /tmp and /dev (with /dev/shm) are tmpfs that an evaluator which is not root would leave
    # writable to the program (it keeps the user's id): memory outside both bounds where the
    # kernel has no Landlock. They are read-only, whatever the user id and Landlock.
    if not sandbox.bwrap_command():
        pytest.skip(f"bubblewrap cannot run here: {sandbox.bwrap_problem()}")
    launch_config = sandbox._launch_config

    def without_landlock(*args, **kwargs):
        return {**launch_config(*args, **kwargs), "landlock": False}

    monkeypatch.setattr(sandbox, "_launch_config", without_landlock)
    program = ("import os\nfor place in ('/tmp/x', '/dev/shm/x', '/dev/x'):\n    try:\n"
               "        open(place, 'wb').write(b'x')\n        print(place, 'written')\n"
               "    except OSError as err:\n        print(place, os.strerror(err.errno))\n"
               "open('/dev/null', 'wb').write(b'x')\nopen('x', 'wb').write(b'x')\nprint('folder written')\n")
    result = run_python(program, LIMITS, isolation="bubblewrap", guard=False)
    assert result.passed and result.layers["landlock"] == 0, (result.reason, result.layers)
    assert result.stdout.splitlines() == ["/tmp/x Read-only file system", "/dev/shm/x Read-only file system",
                                          "/dev/x Read-only file system", "folder written"], result.stdout
