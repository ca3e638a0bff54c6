"""Modules an expert reads in one sitting: no module of `fic/` over 600 lines, and each file of
VASD's step (`fic/training/vasd/`, one concern a file) under 300."""

from __future__ import annotations

from pathlib import Path

FIC = Path(__file__).resolve().parents[2] / "fic"


def lines(path: Path) -> int:
    return len(path.read_text(encoding="utf-8").splitlines())


def test_no_module_of_fic_is_over_600_lines():
    assert {str(p.relative_to(FIC)): n for p in FIC.rglob("*.py") if (n := lines(p)) > 600} == {}


def test_each_file_of_vasds_step_is_under_300_lines():
    files = list((FIC / "training" / "vasd").rglob("*.py"))
    assert len(files) > 10  # the step, split by concern
    assert {str(p.relative_to(FIC)): n for p in files if (n := lines(p)) >= 300} == {}
