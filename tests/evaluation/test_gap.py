"""The gate's arithmetic (`fic.evaluation.gap`, `fic.core.stats.paired_difference`): a paired
view gap with its t interval and exact sign test, worked by hand, and the refusals."""

import math

import pytest

from fic.core.errors import FicError
from fic.core.stats import mean_interval, paired_difference, t975
from fic.evaluation.gap import gate, view_gap


def log(view, scores, *, premature=(), never=()):
    return [{"task_id": f"t{i}", "view": view, "run": 0, "score": float(s), "premature_answer": i in premature,
             "first_answer_turn": None if i in never else 1, "shards_at_first_answer": 2, "num_shards": 3}
            for i, s in enumerate(scores)]


def test_paired_difference_by_hand():
    # 10 instances: full right on 8, sharded on 3; 5 full-only, 0 sharded-only, 5 ties.
    full, sharded = [1] * 8 + [0] * 2, [1, 1, 1] + [0] * 7
    result = paired_difference(full, sharded)
    assert (result["first"], result["second"], result["difference"]) == (80.0, 30.0, 50.0)
    # differences: five of 100, five of 0: sd = sqrt(5 * 50^2 * 2 / 9), t(9) = 2.262
    half = 2.262 * math.sqrt(5 * 2500 * 2 / 9) / math.sqrt(10)
    assert result["low"] == pytest.approx(50 - half) and result["high"] == pytest.approx(50 + half)
    assert (result["better"], result["worse"], result["tied"]) == (5, 0, 5)
    assert result["p_value"] == pytest.approx(2 / 32)  # McNemar exact: 2 * 0.5^5
    with pytest.raises(ValueError):
        paired_difference([1, 0], [1])


def test_t_quantiles_and_seed_interval():
    assert t975(2) == 4.303 and t975(30) == 2.042
    assert t975(200) == pytest.approx(1.972, abs=0.001)  # the table's tail: 1.9719 exactly
    three_seeds = mean_interval([2.0, 4.0, 6.0])
    assert three_seeds["mean"] == 4.0 and three_seeds["low"] == pytest.approx(4 - 4.303 * 2 / math.sqrt(3))
    with pytest.raises(ValueError):
        mean_interval([1.0])


def test_view_gap_pairs_by_task_id_and_reports_the_students_failure_modes():
    teacher = log("full", [1, 1, 1, 0])
    student = list(reversed(log("sharded", [1, 0, 0, 0], premature={1}, never={3})))  # order does not matter
    gap = view_gap(teacher, student)
    assert gap["difference"] == 50.0 and gap["better"] == 2 and gap["worse"] == 0
    assert gap["student_premature_rate"] == 25.0 and gap["student_never_answered_rate"] == 25.0
    # One log holding both views (fic eval with views [full, sharded]) works the same.
    assert view_gap(teacher + student, teacher + student)["difference"] == 50.0
    with pytest.raises(FicError, match="different instances"):
        view_gap(teacher, student[1:])
    with pytest.raises(FicError, match="no conversation of view sharded"):
        view_gap(teacher, teacher)
    with pytest.raises(FicError, match="appears twice"):
        view_gap(teacher + teacher, student)


def test_gate_passes_only_when_every_gap_reaches_its_threshold():
    gaps = {"own": {"difference": 12.0}, "teacher_student": {"difference": 7.9}}
    verdict = gate(gaps, {"own": 8, "teacher_student": 8})
    assert not verdict["passed"] and verdict["checks"]["own"]["passed"]
    assert not verdict["checks"]["teacher_student"]["passed"]
    assert gate(gaps, {"own": 8, "teacher_student": 7.9})["passed"]


def test_the_sign_tests_power_by_hand_and_the_smallest_gain_it_detects():
    from fic.core.stats import detectable_gain, sign_test_power

    # Six instances that all differ: only 6 wins of 6 pass (p = 2/64; 5 of 6 gives 14/64). A 50-point
    # gain makes a win 3 in 4: power 0.75^6, and in each of two seeds its square.
    assert sign_test_power(6, 1.0, 50.0) == pytest.approx(0.75 ** 6)
    assert sign_test_power(6, 1.0, 50.0, seeds=2) == pytest.approx(0.75 ** 12)
    # No gain: the test's own false-positive rate (one-sided half of alpha at most)
    assert sign_test_power(256, 0.25, 0.0) <= 0.025
    powers = [sign_test_power(256, 0.25, gain, seeds=2) for gain in (4, 6, 10)]
    assert powers == sorted(powers) and sign_test_power(512, 0.25, 6, seeds=2) > powers[1]
    smallest = detectable_gain(256, 0.25, seeds=2)
    assert sign_test_power(256, 0.25, smallest, seeds=2) >= 0.8 > sign_test_power(256, 0.25, smallest - 0.5, seeds=2)
    assert detectable_gain(6, 0.5, seeds=3) is None  # 6 instances, half of them differing: 80% is out of reach
