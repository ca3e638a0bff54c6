"""Metrics against values computed by hand."""

from __future__ import annotations

import pytest

from fic.evaluation.metrics import RELIABILITY_NOTE, instance_stats, ratio, summarize, timing_bin


def rec(task_id, view, run, score, labels=("answer_attempt",), task="math", premature=False, tokens=10,
        context=50, shards=4, revealed=None):
    """A log record; `revealed` is how many shards the user had given at the first answer attempt
    (default: one per turn up to it)."""
    first = next((k for k, label in enumerate(labels) if label == "answer_attempt"), None)
    at_first = None if first is None else (revealed if revealed is not None else min(first + 1, shards))
    return {"task_id": task_id, "task": task, "view": view, "run": run, "score": score, "num_shards": shards,
            "turns": [{"label": label} for label in labels], "first_answer_turn": first,
            "shards_at_first_answer": at_first, "premature_answer": premature, "generated_tokens": tokens,
            "prompt_tokens": context}


def test_instance_stats_percentiles_by_hand():
    # Ten runs, four correct: sorted 0 x6, 100 x4. p90 sits at rank 8.1 -> 100; p10 at rank 0.9 -> 0.
    assert instance_stats([1, 0, 0, 1, 1, 0, 0, 0, 0, 1]) == {"P": 40.0, "A90": 100.0, "U90_10": 100.0}
    # Graded scores 0, 50, 100: p90 at rank 1.8 -> 90, p10 at rank 0.2 -> 10.
    stats = instance_stats([0.5, 0.0, 1.0])
    assert stats["P"] == pytest.approx(50.0) and stats["A90"] == pytest.approx(90.0)
    assert stats["U90_10"] == pytest.approx(80.0)
    # One run has no spread: A90 and U90_10 are not available (they would be P and 0 by construction).
    assert instance_stats([1.0]) == {"P": 100.0, "A90": None, "U90_10": None}
    with pytest.raises(ValueError):
        instance_stats([])


def test_a90_and_u90_10_need_two_runs_per_instance():
    one_run = summarize([rec("a", "full", 0, 1.0), rec("b", "full", 0, 0.0)])
    row = one_run["tasks"]["math"]["full"]
    assert row["P"] == 50.0 and row["A90"] is None and row["U90_10"] is None
    assert one_run["views"]["full"]["A90"] is None and one_run["reliability_note"] == RELIABILITY_NOTE
    # One instance with a single run is enough to make the group's figures unavailable.
    mixed = summarize([rec("a", "full", 0, 1.0), rec("a", "full", 1, 0.0), rec("b", "full", 0, 1.0)])
    assert mixed["tasks"]["math"]["full"]["A90"] is None
    two_runs = summarize([rec("a", "full", 0, 1.0), rec("a", "full", 1, 0.0)])
    assert two_runs["tasks"]["math"]["full"]["U90_10"] == pytest.approx(80.0) and two_runs["reliability_note"] is None


def test_task_and_overall_averages_and_ratios():
    records = []
    # math: instance a full 10 runs with 4 correct, instance b always correct -> P 70, A90 100, U 50.
    records += [rec("a", "full", r, s) for r, s in enumerate([1, 0, 0, 1, 1, 0, 0, 0, 0, 1])]
    records += [rec("b", "full", r, 1.0) for r in range(10)]
    # math sharded: a always wrong, b half -> P (0 + 50)/2 = 25.
    records += [rec("a", "sharded", r, 0.0, labels=("discussion",) * 3, premature=False) for r in range(10)]
    records += [rec("b", "sharded", r, float(r % 2), labels=("answer_attempt",), premature=True) for r in range(10)]
    # code (a second task, one instance, two runs): full 100, sharded 50 -> tasks count equally.
    records += [rec("c", "full", 0, 1.0, task="code"), rec("c", "full", 1, 1.0, task="code"),
                rec("c", "sharded", 0, 1.0, task="code"), rec("c", "sharded", 1, 0.0, task="code")]
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
    # Without a baseline there is no recovery rate: only this run's own ratio, under its own name.
    assert metrics["recovery_rate"] is None and metrics["retention"] is None
    assert metrics["sharded_over_full"] == pytest.approx(37.5 / 85)
    assert metrics["by_task"]["math"]["sharded_over_full"] == pytest.approx(25 / 70)
    assert metrics["by_task"]["math"]["recovery_rate"] is None
    assert metrics["conversations"] == len(records)

    # The base model's run as the baseline: full P 80 on math, 90 on code (and a task not in this run).
    baseline = {"tasks": {"math": {"full": {"P": 80.0}}, "code": {"full": {"P": 90.0}},
                          "database": {"full": {"P": 0.0}}}}
    with_base = summarize(records, baseline)
    assert with_base["baseline_full_P"] == pytest.approx(85.0)  # over this run's tasks only
    assert with_base["recovery_rate"] == pytest.approx(37.5 / 85)
    assert with_base["retention"] == pytest.approx(85 / 85)
    assert with_base["by_task"]["math"]["recovery_rate"] == pytest.approx(25 / 80)
    assert with_base["by_task"]["code"]["recovery_rate"] == pytest.approx(50 / 90)
    assert with_base["by_task"]["code"]["retention"] == pytest.approx(100 / 90)


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


def test_answer_timing_bins_by_the_share_of_shards_revealed():
    # Six shards: first answer after 2 (1/3: first), 3 and 4 (middle), 5 and 6 (last) shards, or never.
    records = [rec("a", "sharded", 0, 0.0, shards=6, revealed=2),
               rec("b", "sharded", 0, 1.0, shards=6, revealed=3),
               rec("c", "sharded", 0, 0.0, shards=6, revealed=4),
               rec("d", "sharded", 0, 1.0, shards=6, revealed=5),
               rec("e", "sharded", 0, 1.0, shards=6, revealed=6),
               rec("f", "sharded", 0, 0.0, shards=6, labels=("discussion",) * 6)]
    assert [timing_bin(r) for r in records] == ["first", "middle", "middle", "last", "last", "never"]
    bins = summarize(records)["tasks"]["math"]["sharded"]["answer_timing"]
    assert {name: b["conversations"] for name, b in bins.items()} == {"first": 1, "middle": 2, "last": 2, "never": 1}
    assert bins["first"]["P"] == 0.0 and bins["middle"]["P"] == 50.0 and bins["last"]["P"] == 100.0
    assert bins["middle"]["share"] == pytest.approx(2 / 6)
    # Across tasks the bins pool conversations; single-turn views have none.
    other = [rec("x", "sharded", 0, 1.0, task="code", shards=3, revealed=1), rec("x", "full", 0, 1.0, task="code")]
    metrics = summarize(records + other)
    assert metrics["views"]["sharded"]["answer_timing"]["first"] == {"conversations": 2, "share": 2 / 7, "P": 50.0}
    assert metrics["tasks"]["code"]["full"]["answer_timing"] is None


def test_ratios_are_none_without_a_usable_denominator():
    assert ratio(50.0, 0.0) is None and ratio(None, 10.0) is None and ratio(5.0, None) is None
    only_sharded = summarize([rec("a", "sharded", 0, 1.0)])
    assert only_sharded["recovery_rate"] is None and only_sharded["sharded_over_full"] is None
    full_zero = summarize([rec("a", "full", 0, 0.0), rec("a", "sharded", 0, 1.0)], {"tasks": {"math": {"full": {"P": 0.0}}}})
    assert full_zero["recovery_rate"] is None and full_zero["sharded_over_full"] is None


def _trace(*turns):
    return {"task": "math", "view": "sharded", "task_id": "t", "run": 0, "num_shards": len(turns),
            "score": next((s for label, s in reversed(turns) if s is not None), 0.0), "generated_tokens": 1,
            "prompt_tokens": 1, "first_answer_turn": None, "shards_at_first_answer": None,
            "turns": [{"label": label, "score": score, "shard_ids": [k + 1]} for k, (label, score) in
                      enumerate(turns)]}


def test_first_answer_accuracy_scores_only_the_first_answer_attempt():
    from fic.evaluation.metrics import first_answer_score

    early_wrong_then_right = _trace(("clarification", None), ("answer_attempt", 0.0), ("answer_attempt", 1.0))
    single_right = _trace(("discussion", None), ("answer_attempt", 1.0))
    never = _trace(("clarification", None), ("discussion", None))
    assert early_wrong_then_right["score"] == 1.0  # LiC's P credits the later answer...
    assert first_answer_score(early_wrong_then_right) == 0.0  # ...the first attempt was wrong
    assert first_answer_score(single_right) == 1.0 and first_answer_score(never) == 0.0
    single_turn = {**_trace(("not_classified", 1.0)), "view": "full"}
    assert first_answer_score(single_turn) == 1.0
    metrics = summarize([early_wrong_then_right, {**single_right, "task_id": "u"}])
    assert metrics["views"]["sharded"]["P"] == 100.0
    assert metrics["views"]["sharded"]["first_answer_accuracy"] == 50.0
    assert metrics["tasks"]["math"]["sharded"]["first_answer_accuracy"] == 50.0


def test_the_unanswerable_part_of_premature_answers_is_counted_only_where_the_task_tells():
    from fic.conversation.simulator import unanswerable_answer_rate

    def record(premature, answerable):
        return {"premature_answer": premature, "answerable_at_first_answer": answerable}

    records = [record(True, False), record(True, True), record(False, True), record(False, None)]
    assert unanswerable_answer_rate(records) == 0.25  # one call before the request was answerable, of 4
    assert unanswerable_answer_rate(records + [record(True, None)]) is None  # a task that cannot tell
    assert unanswerable_answer_rate([]) is None
