"""`fic demo` in miniature: the tiny random model, a few instances, a step or two per stage."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml
from tiny_demo import RECIPES, small

from fic.cli.main import main
from fic.core.stats import paired_bootstrap, sign_test
from fic.demo.run import STAGES, load_demo, split_overlap

ROOT = Path(__file__).resolve().parents[2]


pytestmark = [pytest.mark.usefixtures("fresh_accelerate_state"), pytest.mark.slow]  # end to end: the demo's every stage


def markers(out: Path) -> dict[str, float]:
    return {p.stem: p.stat().st_mtime_ns for p in (out / "stages").glob("*.json")}


def test_the_demo_runs_every_stage_to_its_table_and_reruns_from_a_stage(tiny_model_dir, tmp_path, capsys):
    """Every stage to the table; a second run skips them all; `--from` redoes a stage and what
    follows. Each stage is priced before it starts (from the finished ones of its kind), and one
    whose peak is above memory_budget_mb is refused before it starts, naming what lowers it."""
    out = tmp_path / "demo"
    assert main(["demo", "--recipes", str(RECIPES), *small(tiny_model_dir, out)]) == 0
    printed = capsys.readouterr().out
    assert "[demo] estimate: no figures for these settings yet" in printed  # a tiny model: no reference figures
    assert "[control] running (about" in printed and "measured here (sft)" in printed
    assert "SmolLM2-135M-Instruct + single-turn warm-up: test set, N = 4 instances" in printed
    # the recipe's stage 2 is label-free (teacher.view: full); its row carries its verdict, and on 4 instances
    # no sign test can reach p < 0.05
    for stage in ("starting point", "FiC stage 1 (SFT)",
                  "FiC stage 1+2 (SFT + VASD): no reliable gain over stage 1 on this task",
                  "control: more SFT for VASD's time"):
        assert f"| {stage} |" in printed
    assert "VASD vs SFT alone on the same 4 instances" in printed
    assert "VASD vs the equal-compute SFT control on the same 4 instances" in printed
    premise = json.loads((out / "premise.json").read_text())
    assert premise["points"] > 0 and 0 <= premise["single_turn_answer_rate"] <= 1
    report = (out / "report.md").read_text()
    assert "## test-unseen" in report and "Total" in report and (out / "demo_scores.png").is_file()
    assert set(markers(out)) == set(STAGES)
    card = json.loads((out / "data" / "card.json").read_text())
    assert not any(card["overlap_between_splits"].values())
    assert all(c["evaluation_overlap_dropped"] == 0 for c in card["corpora"].values())
    for stage in ("warmup", "sft", "vasd", "control"):  # only the final models are kept
        assert (out / stage / "final" / "config.json").is_file() and not (out / stage / "checkpoints").exists()
    # Every later stage was measured against the starting point's single-turn score.
    sft_metrics = json.loads((out / "eval-sft" / "test" / "metrics.json").read_text())
    assert sft_metrics["baseline_source"] and "eval-start" in sft_metrics["baseline_source"]

    before = markers(out)
    assert main(["demo", "--recipes", str(RECIPES), *small(tiny_model_dir, out)]) == 0  # nothing left to do
    assert "done before" in capsys.readouterr().out
    assert {k: v for k, v in markers(out).items() if k != "report"} == \
        {k: v for k, v in before.items() if k != "report"}

    assert main(["demo", "--recipes", str(RECIPES), "--from", "vasd", *small(tiny_model_dir, out)]) == 0
    after = markers(out)
    redone = {stage for stage in STAGES if after[stage] != before[stage]}
    assert redone == {"vasd", "eval-vasd", "control", "eval-control", "report"}

    sft = json.loads((out / "stages" / "sft.json").read_text())
    assert sft["units"] == 1 and sft["unit"] == "step" and sft["peak_rss_mb"] > 0
    capsys.readouterr()
    assert main(["demo", "--recipes", str(RECIPES), *small(tiny_model_dir, out)[:-1],
                 f"memory_budget_mb={sft['peak_rss_mb'] // 2}", "--from", "control", "--quiet"]) == 2
    err = capsys.readouterr().err.strip()
    assert "stage control needs about" in err and "control.model.gradient_checkpointing=true" in err
    assert "\n" not in err and not (out / "stages" / "control.json").exists()


def test_a_bad_stage_or_missing_recipe_is_one_line(tmp_path, capsys):
    assert main(["demo", "--recipes", str(RECIPES), "--from", "polish", f"out={tmp_path}/d"]) == 2
    assert "--from" in capsys.readouterr().err
    assert main(["demo", "--recipes", str(tmp_path)]) == 2
    assert "demo.yaml" in capsys.readouterr().err


def test_the_shipped_demo_splits_do_not_overlap():
    from fic.data.sources import load_source

    cfg = load_demo(str(RECIPES), ["data.train=200", "data.test=64", "data.test_unseen=32"])
    splits = {s: load_source(f"{cfg.data.source}:{s}", cfg.data.task, limit=n, seed=cfg.data.seed)
              for s, n in (("train", 200), ("dev", 16), ("test", 64), ("test-unseen", 32))}
    assert split_overlap(splits) == {k: 0 for k in split_overlap(splits)}
    dup = {"train": splits["train"][:3], "test": splits["train"][:3]}
    assert split_overlap(dup)["train/test"] >= 3  # the check would see a repeat


def test_paired_statistics():
    # Ratio of means with a paired bootstrap: an exact ratio of 0.5 has a tight interval around it.
    low, high = paired_bootstrap([[1, 0] * 50, [1, 1] * 50], lambda a, b: a / b if b else None, resamples=500)
    assert low < 0.5 < high and high - low < 0.3
    assert paired_bootstrap([[0, 0], [0, 0]], lambda a, b: a / b if b else None, resamples=100) == (None, None)
    result = sign_test([1] * 9 + [-1] + [0] * 5)
    assert (result["better"], result["worse"], result["tied"]) == (9, 1, 5)
    assert result["p_value"] == pytest.approx(22 / 1024)  # 2 * P(X <= 1), X ~ Bin(10, 1/2)


def test_stage_processes_hand_on_their_outputs_and_a_failed_stage_stops_the_demo(tiny_model_dir, tmp_path, capsys):
    """Each stage in a process of its own (the default): the stages after the first read what the
    earlier processes wrote, and a stage that fails ends the demo with that stage's one-line error."""
    out = tmp_path / "demo"
    settings = small(tiny_model_dir, out)
    assert main(["demo", "--recipes", str(RECIPES), *settings]) == 0  # quick, in-process
    capsys.readouterr()
    settings = [*settings[:-1], "stage_processes=true", "--quiet"]
    marker = json.loads((out / "stages" / "eval-vasd.json").read_text())
    assert main(["demo", "--recipes", str(RECIPES), "--from", "eval-vasd", *settings]) == 0
    redone = json.loads((out / "stages" / "eval-vasd.json").read_text())
    assert redone["figures"] == marker["figures"]  # the child read the VASD model the earlier process saved
    assert redone["peak_rss_mb"] > 0 and (out / "eval-vasd" / "test" / "metrics.json").is_file()

    (out / "vasd" / "final" / "config.json").write_text("{ not json")
    assert main(["demo", "--recipes", str(RECIPES), "--from", "eval-vasd", *settings]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "stage eval-vasd failed" in err[0] and "vasd/final" in err[0]
    assert not (out / "stages" / "eval-vasd.json").exists() and not (out / "stages" / "report.json").exists()


def test_a_second_demo_into_the_same_folder_fails_at_once(tmp_path, capsys):
    from locks import held_by_another_process

    out = tmp_path / "demo"
    with held_by_another_process(out) as pid:
        assert main(["demo", "--recipes", str(RECIPES), f"out={out}", "--quiet"]) == 2
    err = capsys.readouterr().err
    assert f"another FiC run is writing into this folder (process {pid}" in err and len(err.splitlines()) == 1
    assert not (out / "stages").exists()


def test_the_control_gets_vasds_cpu_seconds_at_sfts_cost_per_step_unless_its_steps_are_set(tmp_path):
    from fic.demo.run import control_steps

    cfg = load_demo(str(RECIPES), [f"out={tmp_path}"])
    (tmp_path / "stages").mkdir()
    (tmp_path / "stages" / "sft.json").write_text(json.dumps({"cpu_seconds": 1200.0, "figures": {"steps": 80}}))
    (tmp_path / "stages" / "vasd.json").write_text(json.dumps({"cpu_seconds": 2400.0, "figures": {"steps": 32}}))
    assert control_steps(cfg) == 160  # 2400 CPU s at 15 CPU s a step
    assert control_steps(cfg, 300.0) == 20
    assert control_steps(load_demo(str(RECIPES), [f"out={tmp_path}", "control_steps=170"])) == 170
    # Stage 1's dev scores are not training: the control's steps are priced without them.
    (tmp_path / "stages" / "sft.json").write_text(json.dumps(
        {"cpu_seconds": 1500.0, "figures": {"steps": 80, "plateau": {"cpu_seconds": 300.0}}}))
    assert control_steps(cfg) == 160


def test_stage_1_trains_to_its_dev_plateau_and_the_report_shows_the_curve(tiny_model_dir, tmp_path, capsys):
    """sft.dev.every: the demo scores stage 1 on the dev split as it trains (never test), the
    report draws the curve and tests the control against SFT (the plateau check), and the
    control itself runs exactly its steps."""
    out = tmp_path / "demo"
    settings = [s for s in small(tiny_model_dir, out)[:-1] if not s.startswith("sft.train.max_steps")]
    assert main(["demo", "--recipes", str(RECIPES), *settings, "sft.train.max_steps=3", "sft.dev.every=1",
                 "sft.dev.patience=1", "sft.dev.min_delta=200", "sft.dev.max_new_tokens=4", "--quiet"]) == 0
    printed = capsys.readouterr().out
    assert "The control vs SFT (the plateau check" in printed
    sft = json.loads((out / "stages" / "sft.json").read_text())["figures"]
    # a gain of 200 points is impossible: the rule stops at the first score after the start
    assert sft["steps"] == 1 and sft["plateau"]["stopped_at"] == 1 and len(sft["plateau"]["curve"]) == 2
    dev = yaml.safe_load((out / "sft" / "dev" / "step-1" / "config.yaml").read_text())
    assert dev["data"]["source"] == [f"jsonl:{out / 'data' / 'dev.jsonl'}"]
    assert "## Stage 1's dev curve" in (out / "report.md").read_text()
    assert yaml.safe_load((out / "control" / "config.yaml").read_text())["dev"]["every"] == 0


def test_the_shipped_demo_is_sized_for_8_gb_and_the_documented_faster_command_undoes_it():
    """demo.yaml sets what docs/performance.md measured under 8 GB (VASD at 4 x 2 rollouts,
    gradient checkpointing and widths padded to 64 in every training stage, evaluation's kept keys
    and values bounded); docs/demo.md's command for more memory, its shell braces expanded, loads
    as demo settings and restores the faster 8 x 1 without checkpointing."""
    import itertools
    import re
    import shlex

    shipped = load_demo(str(RECIPES), [])
    assert (shipped.vasd.train.micro_batch_size, shipped.vasd.train.grad_accum_steps) == (4, 2)
    assert shipped.eval.model.kv_reuse_mb == 1024
    for stage in (shipped.warmup, shipped.sft, shipped.vasd, shipped.control):
        assert stage.model.gradient_checkpointing and stage.train.pad_to_multiple == 64
    text = (ROOT / "docs" / "demo.md").read_text(encoding="utf-8")
    block = re.search(r"### Memory and time.*?```bash\n(.*?)```", text, re.DOTALL)
    assert block, "docs/demo.md lost its command for more memory"
    words = shlex.split(block.group(1).replace("\\\n", " "))
    assert words[:2] == ["fic", "demo"]
    overrides = []
    for word in words[2:]:  # what the shell's {a,b} expansion hands the command
        parts = re.split(r"\{([^}]*)\}", word)
        choices = [p.split(",") if i % 2 else [p] for i, p in enumerate(parts)]
        overrides += ["".join(c) for c in itertools.product(*choices)]
    cfg = load_demo(str(RECIPES), overrides)
    assert (cfg.vasd.train.micro_batch_size, cfg.vasd.train.grad_accum_steps) == (8, 1)
    assert not any(s.model.gradient_checkpointing for s in (cfg.warmup, cfg.sft, cfg.vasd, cfg.control))
