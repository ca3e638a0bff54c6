"""`fic demo --quick`: a smoke run of every stage into its own folder, saying everywhere that it is
one (tiny splits, a few steps, wide intervals)."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from fic.cli.main import main
from fic.demo.run import QUICK, load_demo

ROOT = Path(__file__).resolve().parents[2]
RECIPES = ROOT / "recipes" / "smollm2-135m-instruct"


def test_quick_is_small_goes_to_its_own_folder_and_says_it_is_a_smoke_run(capsys):
    assert main(["demo", "--quick", "--dry-run"]) == 0
    printed = capsys.readouterr().out
    config = yaml.safe_load(printed.split("\nfic demo: ")[0])
    assert config["out"] == "runs/demo-quick" and config["smoke"] is True and "smoke run" in config["label"]
    assert config["data"]["test"] == 16 and config["sft"]["train"]["max_steps"] == 6
    assert "fic demo: SMOKE RUN (--quick: tiny splits, a few steps; wide intervals" in printed
    assert "outputs in runs/demo-quick" in printed and "[demo] estimate: " in printed
    # overrides given beside --quick win; without it nothing of --quick applies
    assert main(["demo", "--quick", "data.test=32", "--dry-run"]) == 0
    assert yaml.safe_load(capsys.readouterr().out.split("\nfic demo: ")[0])["data"]["test"] == 32
    full = load_demo(str(RECIPES), [])
    assert full.out == "runs/demo" and not full.smoke and full.data.test == 256
    assert f"out={config['out']}" in QUICK  # the smoke run never writes into the measured demo's folder


@pytest.mark.slow  # end to end: every stage of the smoke run, on the tiny model
@pytest.mark.usefixtures("fresh_accelerate_state")
def test_the_quick_demo_runs_every_stage_and_its_report_says_smoke_run(tiny_model_dir, tmp_path, capsys):
    out = tmp_path / "quick"
    assert main(["demo", "--quick", f"base_model={tiny_model_dir}", f"out={out}", "eval.max_new_tokens=4",
                 "vasd.rollout.max_new_tokens=4", "stage_processes=false", "--quiet"]) == 0
    printed = capsys.readouterr().out
    assert printed.startswith("fic demo: SMOKE RUN") and "test set, N = 16 instances" in printed
    report = (out / "report.md").read_text()
    assert "**Smoke run** (`fic demo --quick`): 16 test instances" in report and "(smoke run)" in report
    assert (out / "demo_scores.png").is_file()
