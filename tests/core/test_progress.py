"""Progress lines when the output is not a terminal (a log file, CI, a batch job)."""

from __future__ import annotations

from fic.core import progress
from fic.core.progress import Progress


def test_plain_lines_go_out_every_interval_and_at_the_end(capsys, monkeypatch):
    clock = iter([0.0, 10.0, 70.0, 75.0, 200.0]).__next__
    monkeypatch.setattr("fic.core.progress.time.monotonic", clock)
    bar = Progress(4, "eval", "conv", every_s=60.0)  # pytest's capture is not a terminal
    bar.update(1)            # t=10: too soon
    bar.update(1, turn=2)    # t=70: a line
    bar.update(1)            # t=75: too soon
    bar.update(1)            # t=200: the last one always prints
    bar.close()
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == 2
    assert lines[0].startswith("eval: 2/4 conv,") and "turn=2" in lines[0] and "min left" in lines[0]
    assert lines[1].startswith("eval: 4/4 conv,") and "about 0.0 min left" in lines[1]


def test_nothing_plain_when_disabled(capsys):
    bar = Progress(2, "x", enabled=False)
    bar.update(2)
    bar.close()
    assert capsys.readouterr().out == ""


class Clock:
    """A clock the test moves (`fic.core.progress` reads `time.monotonic`)."""

    def __init__(self):
        self.now = 0.0

    def __call__(self):
        return self.now


def test_a_phase_names_itself_with_its_own_count_and_its_time_left_from_its_own_rate(monkeypatch):
    clock = Clock()
    monkeypatch.setattr("fic.core.progress.time.monotonic", clock)
    bar = Progress(4, "vasd", "step", every_s=1000)
    try:
        def one_step(seconds: dict) -> None:  # rollouts, then a teacher pass over 4 micro-batches
            with progress.phase("rollouts"):
                progress.note(turn=5, conversations=1)
                progress.decoded(95, 0)
                clock.now += seconds["rollouts"]
            with progress.phase("teacher", "forward, no gradient"):
                for _ in progress.counting(range(4), "micro-batches"):
                    clock.now += seconds["teacher"] / 4
        with progress.phase("held-out"):  # scored before the first step: not a phase that follows the rollouts
            clock.now += 120.0
        one_step({"rollouts": 60.0, "teacher": 120.0})
        bar.update(1)  # t=300: 1 of 4 steps, 5 min a step
        assert "about 15.0 min left" in bar.line()

        with progress.phase("rollouts"):
            progress.note(turn=2, conversations=4)
            clock.now += 30.0
            during = bar.heartbeat()
            # its own progress and the last step's rollouts time, then the teacher's last time after it
            assert "now: rollouts 0.5 min in, turn 2, conversations 4, about 0.5 min left in it" in during
            assert "about 12.5 min left" in during  # 0.5 + 2 of the teacher + 2 steps of 5 min
            clock.now += 30.0
        with progress.phase("teacher", "forward, no gradient"):
            batches = progress.counting(range(4), "micro-batches")
            next(batches)
            clock.now += 90.0  # the first micro-batch runs slow: 90 s, where the last step took 30 s
            next(batches)
            first = bar.heartbeat()
            # the rollouts' line is gone: the teacher's own count, and the time left from its own rate
            assert "turn" not in first and "tokens decoded" not in first
            assert "now: teacher (forward, no gradient) 1.5 min in, 1/4 micro-batches, about 4.5 min left in it" in first
            assert "about 14.5 min left" in first  # 4.5 in this pass + 2 steps of 5 min
            clock.now += 60.0  # the second micro-batch still runs: the time left falls, it does not grow
            later = bar.heartbeat()
            assert "1/4 micro-batches, about 3.5 min left in it" in later and "about 13.5 min left" in later
    finally:
        bar.close()


def test_the_time_left_does_not_grow_while_a_unit_runs(monkeypatch):
    clock = Clock()
    monkeypatch.setattr("fic.core.progress.time.monotonic", clock)
    bar = Progress(3, "eval", "conv", every_s=1000)
    try:
        clock.now = 60.0
        bar.update(1)
        assert "about 2.0 min left" in bar.line()
        clock.now = 90.0
        assert "1.0 conv/min, about 1.5 min left" in bar.line()
        clock.now = 600.0  # the second unit runs long: never less than the units after it
        assert "about 1.0 min left" in bar.line()
    finally:
        bar.close()
