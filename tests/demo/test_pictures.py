"""The pictures of the demo's runs: curves beside every training run, the evaluation figures of
every stage, the demo's figure (intervals, premature answers, first-answer accuracy, the unseen
set, a legend clear of every bar), and `fic report` redrawing them all."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from fic.cli.main import main
from fic.demo.report import demo_figure
from fic.evaluation.report import p_intervals, scores_figure, timing_figure, tokens_figure

pytestmark = pytest.mark.slow  # end to end: the demo's runs, then their pictures

ROOT = Path(__file__).resolve().parents[2]
RECIPES = ROOT / "recipes" / "smollm2-135m-instruct"
PNG = b"\x89PNG\r\n\x1a\n"
EVAL_PNGS = ("scores_by_view.png", "answer_timing.png", "tokens_per_conversation.png")


@pytest.fixture(scope="module")
def demo(tiny_model_dir, tmp_path_factory) -> Path:
    from accelerate.state import AcceleratorState, GradientState, PartialState

    out = tmp_path_factory.mktemp("pictures") / "demo"
    try:
        assert main(["demo", "--recipes", str(RECIPES), f"base_model={tiny_model_dir}", f"out={out}",
                     "data.train=8", "data.dev=2", "data.test=2", "data.test_unseen=2", "warmup.train.max_steps=1",
                     "sft.train.max_steps=1", "vasd.train.max_steps=1", "vasd.train.micro_batch_size=2",
                     "vasd.rollout.max_new_tokens=4", "eval.max_new_tokens=4", "bootstrap=100",
                     "warmup.logging.wandb=false", "sft.logging.wandb=false", "vasd.logging.wandb=false",
                     "stage_processes=false", "--quiet"]) == 0  # each stage's own process: test_demo
    finally:
        AcceleratorState._reset_state(True)
        GradientState._reset_state()
        PartialState._reset_state()
    return out


def test_every_run_of_the_demo_has_its_pictures(demo):
    for stage in ("warmup", "sft", "vasd"):
        assert (demo / stage / "curves.png").read_bytes()[:8] == PNG, stage
    for stage in ("start", "sft", "vasd"):
        for split in ("test", "test-unseen"):
            for name in EVAL_PNGS:
                assert (demo / f"eval-{stage}" / split / name).read_bytes()[:8] == PNG, (stage, split, name)
            assert "tokens_per_conversation.png" in (demo / f"eval-{stage}" / split / "report.md").read_text()
    assert (demo / "demo_scores.png").read_bytes()[:8] == PNG
    summary = json.loads((demo / "stages" / "report.json").read_text())["figures"]
    for split in ("test", "test-unseen"):  # the figure's data, intervals included, is kept for `fic report`
        for row in summary["sets"][split]["rows"].values():
            assert set(row["P_interval"]) >= {"full", "sharded"} and "first_answer_accuracy" in row


def test_fic_report_redraws_every_picture_of_the_demo(demo, capsys):
    pictures = sorted(demo.rglob("*.png"))
    before = {p: p.stat().st_mtime_ns for p in pictures}
    assert main(["report", str(demo)]) == 0
    written = {Path(line.removeprefix("wrote ")) for line in capsys.readouterr().out.splitlines()}
    assert set(pictures) <= written and demo / "demo_scores.png" in written
    assert all(p.stat().st_mtime_ns > before[p] for p in pictures)


def test_eval_figures_name_every_axis_and_show_p_with_its_interval(demo):
    run = demo / "eval-start" / "test"
    metrics = json.loads((run / "metrics.json").read_text())
    records = [json.loads(line) for line in (run / "conversations.jsonl").read_text().splitlines()]
    intervals = p_intervals(records)
    assert set(intervals["actions"]) == {"full", "concat", "sharded"}
    for low, high in (v for view in intervals.values() for v in view.values()):
        assert 0 <= low <= high <= 100
    for fig, count in ((scores_figure(metrics, intervals), 1), (timing_figure(metrics), 2), (tokens_figure(metrics), 2)):
        assert len(fig.get_axes()) == count
        for ax in fig.get_axes():
            assert ax.get_title() and ax.get_ylabel() and ax.get_xlabel()
    assert [t.get_text() for t in timing_figure(metrics).get_axes()[0].get_xticklabels()][-1] == "never"


def row(p_full: float, p_sharded: float, premature: float, first: float | None) -> dict:
    out = {"P": {"full": p_full, "sharded": p_sharded}, "instances": 128,
           "P_interval": {"full": [p_full - 8, min(100, p_full + 6)], "sharded": [p_sharded - 9, p_sharded + 8]},
           "premature_answer_rate": premature}
    return out if first is None else {**out, "first_answer_accuracy": first}


def summary(first: bool) -> dict:
    rows = {"start": row(96, 90, 0.99, 0.93 if first else None), "sft": row(98, 94, 0.84, 0.95 if first else None),
            "vasd": row(99, 97, 0.95, 0.96 if first else None)}
    return {"label": "test model", "sets": {"test": {"rows": rows}, "test-unseen": {"rows": rows}}}


@pytest.mark.parametrize("first", [True, False])
def test_the_demo_figure_has_both_sets_intervals_rates_and_a_legend_over_no_bar(first):
    fig = demo_figure(summary(first))
    axes = fig.get_axes()
    assert len(axes) == 4  # (scores, rates) for test and test-unseen
    assert [ax.get_title().split(":")[0] for ax in axes] == ["test", "test", "test-unseen", "test-unseen"]
    for ax in axes:
        assert ax.get_title() and ax.get_ylabel()
    labels = [t.get_text() for t in axes[1].get_legend().get_texts()]
    assert labels == (["premature answers", "first-answer accuracy"] if first else ["premature answers"])
    assert [t.get_text() for t in axes[0].get_legend().get_texts()] == ["P(full)", "P(sharded)", "95% interval"]
    assert axes[0].containers and any(c.__class__.__name__ == "ErrorbarContainer" for c in axes[0].containers)
    fig.canvas.draw()
    renderer = fig.canvas.get_renderer()
    bars = [patch.get_window_extent(renderer) for ax in axes for patch in ax.patches]
    assert len(bars) == 2 * (3 * 2 + 3 * (2 if first else 1))
    for ax in axes:
        legend = ax.get_legend().get_window_extent(renderer)
        assert not any(legend.overlaps(bar) for bar in bars), ax.get_title()


def test_fic_report_draws_an_evaluation_still_playing(demo, tmp_path, capsys):
    import shutil

    playing = tmp_path / "playing"
    playing.mkdir()
    lines = (demo / "eval-start" / "test" / "conversations.jsonl").read_text().splitlines()
    (playing / "conversations.jsonl").write_text("\n".join(lines[:-1]) + "\n" + lines[-1][:20])  # one being written
    assert main(["report", str(playing)]) == 0
    assert all((playing / name).read_bytes()[:8] == PNG for name in EVAL_PNGS)
    assert "# FiC evaluation report" in (playing / "report.md").read_text()
    assert (playing / "conversations.jsonl").read_text().endswith(lines[-1][:20])  # read, never repaired
    shutil.rmtree(playing)
