"""The demo report's words and figure: its paired tests are sentences after the table (not more
rows), counted in good English, and the figure's stage names never overlap."""

from __future__ import annotations

from types import SimpleNamespace

from fic.demo.report import demo_figure, render_table


def row(full, sharded):
    return {"P": {"full": full, "concat": None, "sharded": sharded}, "P_interval": {"full": [full - 5, full + 5],
            "sharded": [sharded - 5, sharded + 5]}, "first_answer_accuracy": 10.0, "premature_answer_rate": 0.8,
            "final_not_answer_rate": 0.1, "recovery_rate": {"value": 0.5, "low": 0.4, "high": 0.6},
            "retention": {"value": 1.0, "low": 0.9, "high": 1.1}, "tokens_per_sharded_conversation": 80.0,
            "own_ratio": {"value": sharded / full, "low": sharded / full - 0.1, "high": sharded / full + 0.1},
            "instances": 256}


def summary():
    rows = {"start": row(66, 7), "sft": row(78, 24), "vasd": row(79, 55), "control": row(88, 70)}
    paired = {"instances": 256, "better": 92, "worse": 1, "tied": 163, "p_value": 2e-16, "shown": True}
    return {"label": "test model", "sets": {"test": {"rows": rows, "vasd_vs_sft": paired,
                                                      "vasd_vs_control": {**paired, "better": 1, "worse": 64,
                                                                          "tied": 1, "shown": False},
                                                      "control_vs_sft": None}}}


def test_the_paired_tests_are_a_list_after_the_table_in_good_english():
    lines = render_table(summary(), "test").split("\n")
    last_row = max(k for k, line in enumerate(lines) if line.startswith("|"))
    assert lines[last_row + 1] == ""  # a line right under a table would be rendered as one more row
    tests = lines[last_row + 2:]
    assert len(tests) == 2 and all(line.startswith("- ") for line in tests)
    assert "92 wins, 1 loss, 163 ties" in tests[0]
    assert "1 win, 64 losses, 1 tie" in tests[1] and "gain NOT shown" in tests[1]


def test_the_figure_s_stage_names_do_not_overlap():
    fig = demo_figure(summary())
    fig.canvas.draw()
    renderer = fig.canvas.get_renderer()
    for ax in fig.get_axes():
        boxes = [label.get_window_extent(renderer) for label in ax.get_xticklabels()]
        assert len(boxes) == 4
        assert not any(a.overlaps(b) for k, a in enumerate(boxes) for b in boxes[k + 1:]), ax.get_title()


def test_each_stage_shows_its_own_ratio_beside_r_and_a_gold_reading_teacher_is_named():
    from fic.demo.report import GOLD_TEACHER, stage_names

    table = render_table(summary(), "test").split("\n")
    header = [cell.strip() for cell in table[1].split("|")]
    vasd = [cell.strip() for cell in next(line for line in table if line.startswith("| FiC stage 1+2")).split("|")]
    assert header[header.index("R [95% CI]") + 1] == "own P(sharded)/P(full) [95% CI]"
    assert vasd[header.index("own P(sharded)/P(full) [95% CI]")] == f"{55 / 79:.2f} [{55 / 79 - 0.1:.2f}, {55 / 79 + 0.1:.2f}]"
    gold = SimpleNamespace(vasd=SimpleNamespace(teacher=SimpleNamespace(view="gold-hinted")))
    label_free = SimpleNamespace(vasd=SimpleNamespace(teacher=SimpleNamespace(view="full")))
    assert stage_names(gold)["vasd"] == GOLD_TEACHER and "reads the gold" in GOLD_TEACHER
    assert "gold" not in stage_names(label_free)["vasd"]
    table = render_table({**summary(), "names": stage_names(gold)}, "test")
    assert f"| {GOLD_TEACHER} |" in table


def test_stage_2_s_row_carries_its_verdict_against_stage_1_and_the_control():
    from fic.demo.report import STAGE_NAMES, stage_names

    cfg = SimpleNamespace(vasd=SimpleNamespace(teacher=SimpleNamespace(view="full")))
    tests = summary()["sets"]["test"]  # ahead of SFT (92-1), behind the control (1-64)
    name = stage_names(cfg, tests)["vasd"]
    assert name == f"{STAGE_NAMES['vasd']}: a gain over stage 1, not over the equal-compute control"
    table = render_table({**summary(), "names": stage_names(cfg, tests)}, "test")
    assert f"| {name} |" in table
    not_shown = {**tests, "vasd_vs_sft": {**tests["vasd_vs_sft"], "better": 30, "worse": 28, "shown": False}}
    assert stage_names(cfg, not_shown)["vasd"].endswith(": no reliable gain over stage 1 on this task")
    both = {**tests, "vasd_vs_control": tests["vasd_vs_sft"]}
    assert stage_names(cfg, both)["vasd"].endswith("a gain over stage 1 and the equal-compute control on this run")
    assert stage_names(cfg, {**tests, "vasd_vs_control": None})["vasd"].endswith("(no equal-compute control)")
    assert stage_names(cfg)["vasd"] == STAGE_NAMES["vasd"]  # no tests (no stage 2 evaluated yet): no verdict
