"""The gap between two views of one model on the same instances, and a gate on it.

Self-distillation's gain grows with the gap between what the teacher's view answers and what
the student's view answers on the prompts it trains on (arXiv 2605.30070): before a label-free
stage 2 trains, measure that gap and require a minimum. `view_gap` pairs two evaluation logs
(`conversations.jsonl` of `fic eval`, the same instances, one conversation each) by task id and
returns the teacher view's score minus the student view's, in points, with a 95% t interval and
the exact sign (McNemar) test, and the student view's premature and never-answered rates beside
it. `gate` says whether every named gap reaches its threshold (the point estimate; the interval
is reported, not gated on).
"""

from __future__ import annotations

from fic.core.errors import FicError
from fic.core.stats import paired_difference
from fic.evaluation.metrics import timing_bin


def scores_by_id(records: list[dict], view: str, *, origin: str = "log") -> dict[str, dict]:
    """{task_id: record} of `view`'s conversations (run 0); an error if one id appears twice."""
    found: dict[str, dict] = {}
    for record in records:
        if record.get("view") != view or record.get("run", 0) != 0:
            continue
        if record["task_id"] in found:
            raise FicError(f"{record['task_id']} appears twice in view {view}", path=origin)
        found[record["task_id"]] = record
    if not found:
        raise FicError(f"no conversation of view {view}", path=origin)
    return found


def view_gap(teacher: list[dict], student: list[dict], *, teacher_view: str = "full",
             student_view: str = "sharded", origin: str = "log") -> dict:
    """Teacher view's P minus student view's P on the same instances (in points), paired."""
    first = scores_by_id(teacher, teacher_view, origin=origin)
    second = scores_by_id(student, student_view, origin=origin)
    if set(first) != set(second):
        missing = sorted(set(first) ^ set(second))
        raise FicError(f"the two views cover different instances ({len(missing)} differ, e.g. {missing[0]}): "
                       "a paired gap needs the same ones (finish both evaluations)", path=origin)
    ids = sorted(first)
    gap = paired_difference([first[i]["score"] for i in ids], [second[i]["score"] for i in ids])
    played = [second[i] for i in ids]
    gap["student_premature_rate"] = 100.0 * sum(bool(r.get("premature_answer")) for r in played) / len(ids)
    gap["student_never_answered_rate"] = 100.0 * sum(timing_bin(r) == "never" for r in played) / len(ids)
    gap["views"] = f"{teacher_view} - {student_view}"
    return gap


def gate(gaps: dict[str, dict], thresholds: dict[str, float]) -> dict:
    """Whether each named gap reaches its threshold (points); `passed` when all do."""
    checks = {name: {"difference": gaps[name]["difference"], "threshold": threshold,
                     "passed": gaps[name]["difference"] >= threshold}
              for name, threshold in thresholds.items()}
    return {"checks": checks, "passed": all(c["passed"] for c in checks.values())}
