"""The demo's table, `report.md` and plots, from the evaluation runs of each stage.

Per stage (starting point, SFT, VASD) and evaluation set (test, test-unseen): P in each view,
the premature-answer rate and the rate of sharded conversations whose reply to the last shard
is no answer attempt (over-deferral), generated tokens per sharded conversation, and against
the starting point's single-turn score the recovery rate R = P(stage; sharded) / P(start; full)
and retention = P(stage; full) / P(start; full), with 95% paired-bootstrap intervals over the
same instances. VASD against SFT alone: an exact paired sign test on the per-instance sharded
scores (wins, losses, p-value), stated as not shown when p >= 0.05.
"""

from __future__ import annotations

import io
import json
from pathlib import Path
from typing import Any

from fic.core.files import atomic_open, read_json, read_log, write_text
from fic.core.stats import paired_bootstrap, sign_test

STAGE_NAMES = {"start": "starting point", "sft": "FiC stage 1 (SFT)", "vasd": "FiC stage 1+2 (SFT + VASD)"}
PLOT = "demo_scores.png"


def _scores(run: Path) -> dict[str, dict[str, float]]:
    """view -> task id -> score (the mean over runs)."""
    by_view: dict[str, dict[str, list[float]]] = {}
    for record in read_log(run / "conversations.jsonl"):
        by_view.setdefault(record["view"], {}).setdefault(record["task_id"], []).append(float(record["score"]))
    return {view: {k: sum(v) / len(v) for k, v in ids.items()} for view, ids in by_view.items()}


def _final_not_answer(run: Path) -> float | None:
    """Share of sharded conversations whose last reply is no answer attempt: they heard every
    shard and still did not answer (a conversation stopped by a correct answer ends on one)."""
    records = [r for r in read_log(run / "conversations.jsonl") if r["view"] == "sharded" and r["turns"]]
    if not records:
        return None
    return sum(r["turns"][-1].get("label") != "answer_attempt" for r in records) / len(records)


def stage_figures(cfg: Any, run: Path, start: dict) -> dict | None:
    if not (run / "metrics.json").is_file():
        return None
    metrics = read_json(run / "metrics.json")
    scores = _scores(run)
    views = metrics["views"]
    base = start["scores"].get("full", {})
    ids = sorted(base)
    out = {"P": {v: views[v]["P"] for v in views}, "scores": scores, "instances": len(scores.get("full", {})),
           "premature_answer_rate": (views.get("sharded") or {}).get("premature_answer_rate"),
           "final_not_answer_rate": _final_not_answer(run),
           "tokens_per_sharded_conversation": (views.get("sharded") or {}).get("generated_tokens_per_conversation")}
    for name, view in (("recovery_rate", "sharded"), ("retention", "full")):
        mine = scores.get(view, {})
        if not ids or any(i not in mine for i in ids):
            out[name] = None
            continue
        columns = [[mine[i] for i in ids], [base[i] for i in ids]]
        value = _ratio(sum(columns[0]) / len(ids), sum(columns[1]) / len(ids))
        low, high = paired_bootstrap(columns, _ratio, resamples=cfg.bootstrap, seed=cfg.data.seed)
        out[name] = {"value": value, "low": low, "high": high}
    return out


def _ratio(numerator: float, denominator: float) -> float | None:
    return numerator / denominator if denominator else None


def write_demo_report(cfg: Any, runs: dict[str, dict[str, Path]], stages: dict[str, dict], report: Path) -> dict:
    """Write `report` (markdown) and its plot beside it; return the printed table and the figures.

    `runs[split][stage]` is the `fic eval` folder of a stage ("start", "sft", "vasd") on an
    evaluation set; `stages` what each finished stage recorded (its seconds and peak memory)."""
    summary: dict[str, Any] = {"label": cfg.label, "sets": {}}
    for split, by_stage in runs.items():
        start_run = by_stage["start"]
        start = {"scores": _scores(start_run) if (start_run / "conversations.jsonl").is_file() else {}}
        rows = {}
        for stage in STAGE_NAMES:
            figures = stage_figures(cfg, by_stage[stage], start)
            if figures is not None:
                rows[stage] = figures
        summary["sets"][split] = {"rows": rows, "vasd_vs_sft": _paired(rows)}
    summary["seconds"] = {s: info.get("seconds") for s, info in stages.items() if "seconds" in info}
    summary["peak_rss_mb"] = max((info.get("peak_rss_mb_so_far", 0) for info in stages.values()), default=None)
    summary["disk_mb"] = round(_disk_mb(Path(cfg.out)))
    table = render_table(summary, "test")
    write_text(report, render_markdown(cfg, summary, stages))
    _plot(summary, report.parent / PLOT)
    return {"table": table, "summary": _without_scores(summary)}


def _paired(rows: dict) -> dict | None:
    if "vasd" not in rows or "sft" not in rows:
        return None
    vasd, sft = rows["vasd"]["scores"].get("sharded", {}), rows["sft"]["scores"].get("sharded", {})
    ids = sorted(set(vasd) & set(sft))
    result = sign_test(vasd[i] - sft[i] for i in ids)
    result["instances"] = len(ids)
    result["shown"] = result["p_value"] < 0.05 and result["better"] > result["worse"]
    return result


def _disk_mb(folder: Path) -> float:
    return sum(p.stat().st_size for p in folder.rglob("*") if p.is_file()) / 2**20 if folder.exists() else 0.0


def _without_scores(summary: dict) -> dict:
    out = json.loads(json.dumps(summary, default=str))
    for split in out["sets"].values():
        for row in split["rows"].values():
            row.pop("scores", None)
    return out


def _pct(value: float | None) -> str:
    return "n/a" if value is None else f"{100 * value:.1f}%"


def _p(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.1f}"


def _interval(entry: dict | None) -> str:
    if not entry or entry.get("value") is None:
        return "n/a"
    if entry.get("low") is None:
        return f"{entry['value']:.2f}"
    return f"{entry['value']:.2f} [{entry['low']:.2f}, {entry['high']:.2f}]"


def render_table(summary: dict, split: str) -> str:
    rows = summary["sets"][split]["rows"]
    n = next((r["instances"] for r in rows.values()), 0)
    lines = [f"{summary['label']}: {split} set, N = {n} instances (P in %, greedy, LiC's rules)",
             "| stage | P(full) | P(concat) | P(sharded) | premature answers | final reply no answer | "
             "R [95% CI] | retention [95% CI] | tokens / sharded conv. |",
             "|---|---|---|---|---|---|---|---|---|"]
    for stage, row in rows.items():
        lines.append(f"| {STAGE_NAMES[stage]} | {_p(row['P'].get('full'))} | {_p(row['P'].get('concat'))} | "
                     f"{_p(row['P'].get('sharded'))} | {_pct(row['premature_answer_rate'])} | "
                     f"{_pct(row['final_not_answer_rate'])} | {_interval(row.get('recovery_rate'))} | "
                     f"{_interval(row.get('retention'))} | {_p(row['tokens_per_sharded_conversation'])} |")
    paired = summary["sets"][split]["vasd_vs_sft"]
    if paired is not None:
        verdict = "shown" if paired["shown"] else "NOT shown (p >= 0.05 or no more wins than losses)"
        lines.append(f"VASD vs SFT alone on the same {paired['instances']} instances (sharded): {paired['better']} wins, "
                     f"{paired['worse']} losses, {paired['tied']} ties, exact sign test p = {paired['p_value']:.3g}: "
                     f"gain {verdict}")
    return "\n".join(lines)


def render_markdown(cfg: Any, summary: dict, stages: dict) -> str:
    parts = [f"# FiC demo: {cfg.label}", "",
             f"Task `{cfg.data.task}` from `{cfg.data.source}` (seed {cfg.data.seed}); the starting point is "
             f"**{cfg.label}** (`{cfg.base_model}` has never seen the task's format, so a short single-turn warm-up "
             "comes first). R = P(stage; sharded) / P(starting point; full); retention = P(stage; full) / "
             "P(starting point; full); intervals: 95% paired bootstrap over instances "
             f"({cfg.bootstrap} resamples). Premature answers: an answer attempt before the last shard.", ""]
    for split in summary["sets"]:
        parts += [f"## {split}", "", render_table(summary, split), ""]
    parts += ["## Time, memory, disk", "", "| stage | minutes |", "|---|---|"]
    parts += [f"| {s} | {info['seconds'] / 60:.1f} |" for s, info in stages.items() if "seconds" in info]
    total = sum(info.get("seconds", 0) for info in stages.values())
    parts += ["", f"Total {total / 60:.1f} min; peak resident memory {summary['peak_rss_mb']} MB; "
              f"{summary['disk_mb']} MB on disk in `{cfg.out}`.", "", f"![scores]({PLOT})", ""]
    return "\n".join(parts)


def _plot(summary: dict, path: Path) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = summary["sets"]["test"]["rows"]
    if not rows:
        return
    fig, (left, right) = plt.subplots(1, 2, figsize=(10, 3.6))
    names = [STAGE_NAMES[s].split(" (")[0] for s in rows]
    x = range(len(rows))
    for k, view in enumerate(("full", "sharded")):
        left.bar([i + 0.38 * k for i in x], [r["P"].get(view) or 0 for r in rows.values()], width=0.38, label=view)
    left.set_xticks([i + 0.19 for i in x], names, fontsize=8)
    left.set_ylabel("P (test)")
    left.legend()
    right.bar(list(x), [100 * (r["premature_answer_rate"] or 0) for r in rows.values()], color="tab:red")
    right.set_xticks(list(x), names, fontsize=8)
    right.set_ylabel("premature answers, % (sharded)")
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", dpi=110, bbox_inches="tight")
    plt.close(fig)
    with atomic_open(path, "wb") as handle:
        handle.write(buffer.getvalue())
