"""The front door stays a front door (issue 52): the README is short and reaches the pipeline within
the first screenful after set-up, and docs/results.md holds current answers, not a run log."""

from __future__ import annotations

from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_the_readme_is_short_and_the_pipeline_comes_early():
    lines = (ROOT / "README.md").read_text(encoding="utf-8").splitlines()
    headings = [n for n, line in enumerate(lines, 1) if line.startswith("## ")]
    pipeline = next(n for n, line in enumerate(lines, 1) if line == "## The pipeline")
    assert len(lines) < 250, f"README.md is {len(lines)} lines: the manual is docs/"
    assert pipeline < 110, f"the pipeline starts at README line {pipeline}"
    assert lines[headings[0] - 1] == "## Set-up"  # what FiC is, then how to set it up


def test_the_results_page_is_current_answers_not_a_log():
    text = (ROOT / "docs" / "results.md").read_text(encoding="utf-8")
    assert len(text.splitlines()) < 400, "docs/results.md holds the current answers; the history is experiments/LOG.md"
    assert "session" not in "".join(line for line in text.splitlines() if line.startswith("## "))
