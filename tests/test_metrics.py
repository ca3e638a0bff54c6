"""Metrics against values computed by hand."""

from __future__ import annotations

import pytest

from fic.metrics import instance_stats, ratio, summarize


def rec(task_id, view, run, score, labels=("answer_attempt",), task="math", premature=False, tokens=10,
        context=50):
    first = next((k for k, label in enumerate(labels) if label == "answer_attempt"), None)
    return {"task_id": task_id, "task": task, "view": view, "run": run, "score": score,
            "turns": [{"label": label} for label in labels], "first_answer_turn": first,
            "premature_answer": premature, "generated_tokens": tokens, "prompt_tokens": context}


def test_instance_stats_percentiles_by_hand():
    # Ten runs, four correct: sorted 0 x6, 100 x4. p90 sits at rank 8.1 -> 100; p10 at rank 0.9 -> 0.
    assert instance_stats([1, 0, 0, 1, 1, 0, 0, 0, 0, 1]) == {"P": 40.0, "A90": 100.0, "U90_10": 100.0}
    # Graded scores 0, 50, 100: p90 at rank 1.8 -> 90, p10 at rank 0.2 -> 10.
    stats = instance_stats([0.5, 0.0, 1.0])
    assert stats["P"] == pytest.approx(50.0) and stats["A90"] == pytest.approx(90.0)
    assert stats["U90_10"] == pytest.approx(80.0)
    assert instance_stats([1.0]) == {"P": 100.0, "A90": 100.0, "U90_10": 0.0}
    with pytest.raises(ValueError):
        instance_stats([])


def test_task_and_overall_averages_and_ratios():
    records = []
    # math: instance a full 10 runs with 4 correct, instance b always correct -> P 70, A90 100, U 50.
    records += [rec("a", "full", r, s) for r, s in enumerate([1, 0, 0, 1, 1, 0, 0, 0, 0, 1])]
    records += [rec("b", "full", r, 1.0) for r in range(10)]
    # math sharded: a always wrong, b half -> P (0 + 50)/2 = 25.
    records += [rec("a", "sharded", r, 0.0, labels=("discussion",) * 3, premature=False) for r in range(10)]
    records += [rec("b", "sharded", r, float(r % 2), labels=("answer_attempt",), premature=True) for r in range(10)]
    # code (a second task, one instance): full 100, sharded 50 (two runs) -> tasks count equally.
    records += [rec("c", "full", 0, 1.0, task="code"), rec("c", "sharded", 0, 1.0, task="code"),
                rec("c", "sharded", 1, 0.0, task="code")]
    metrics = summarize(records)
    math_full, math_sharded = metrics["tasks"]["math"]["full"], metrics["tasks"]["math"]["sharded"]
    assert (math_full["P"], math_full["A90"], math_full["U90_10"]) == (70.0, 100.0, 50.0)
    assert math_sharded["P"] == 25.0
    # b sharded: 0/1 alternating over 10 runs -> p90 100, p10 0; a: all 0 -> A90 = (0 + 100) / 2.
    assert math_sharded["A90"] == 50.0 and math_sharded["U90_10"] == 50.0
    assert math_sharded["premature_answer_rate"] == 0.5 and math_full["premature_answer_rate"] is None
    assert metrics["tasks"]["code"]["sharded"]["P"] == 50.0
    # Overall: mean over tasks, not over conversations.
    assert metrics["views"]["full"]["P"] == pytest.approx((70 + 100) / 2)
    assert metrics["views"]["sharded"]["P"] == pytest.approx((25 + 50) / 2)
    assert metrics["recovery_rate"] == pytest.approx(37.5 / 85)
    assert metrics["retention"] == pytest.approx(1.0)  # own baseline
    assert metrics["by_task"]["math"]["recovery_rate"] == pytest.approx(25 / 70)
    assert metrics["conversations"] == len(records)

    # A previous run as the baseline: full P 100 overall, 80 on math.
    baseline = {"views": {"full": {"P": 100.0}}, "tasks": {"math": {"full": {"P": 80.0}}}}
    with_base = summarize(records, baseline)
    assert with_base["recovery_rate"] == pytest.approx(0.375)
    assert with_base["retention"] == pytest.approx(0.85)
    assert with_base["by_task"]["math"]["recovery_rate"] == pytest.approx(25 / 80)
    assert with_base["by_task"]["code"]["recovery_rate"] is None  # the baseline has no code task


def test_answer_attempt_rate_per_turn_and_tokens():
    records = [
        rec("a", "sharded", 0, 0.0, labels=("discussion", "answer_attempt"), tokens=30, context=100),
        rec("b", "sharded", 0, 1.0, labels=("answer_attempt",), tokens=10, context=40),
        rec("c", "sharded", 0, 1.0, labels=("clarification", "discussion", "answer_attempt"), tokens=20,
            context=160),
    ]
    row = summarize(records)["tasks"]["math"]["sharded"]
    assert row["conversations_by_turn"] == [3, 2, 1]
    assert row["answer_attempt_rate_by_turn"] == pytest.approx([1 / 3, 1 / 2, 1.0])
    assert row["first_answer_share_by_turn"] == pytest.approx([1 / 3, 1 / 3, 1 / 3])
    assert row["generated_tokens_per_conversation"] == 20.0 and row["context_tokens_per_conversation"] == 100.0
    assert row["turns_per_conversation"] == 2.0
    assert row["labels"] == {"answer_attempt": 3, "clarification": 1, "discussion": 2}


def test_ratios_are_none_without_a_usable_denominator():
    assert ratio(50.0, 0.0) is None and ratio(None, 10.0) is None and ratio(5.0, None) is None
    only_sharded = summarize([rec("a", "sharded", 0, 1.0)])
    assert only_sharded["recovery_rate"] is None and only_sharded["retention"] is None
    full_zero = summarize([rec("a", "full", 0, 0.0), rec("a", "sharded", 0, 1.0)])
    assert full_zero["recovery_rate"] is None
