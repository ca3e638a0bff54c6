"""Progress lines when the output is not a terminal (a log file, CI, a batch job)."""

from __future__ import annotations

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
