"""The demo's table, `report.md` and plots, from the evaluation runs of each stage.

Per stage (starting point, SFT, VASD, and the equal-compute control: more SFT for VASD's wall
time) and evaluation set (test, test-unseen): P in each view, first-answer accuracy (the
score of a sharded conversation's first answer attempt), the premature-answer rate (with, in
brackets, its part that came before the request was answerable, where the task tells) and the
rate of sharded conversations whose reply to the last shard is no answer attempt
(over-deferral), generated tokens per sharded conversation, and against the starting point's
single-turn score the recovery rate R = P(stage; sharded) / P(start; full) and retention =
P(stage; full) / P(start; full), with 95% paired-bootstrap intervals over the same instances.
VASD against SFT alone and against the control: exact paired sign tests on the per-instance
sharded scores (wins, losses, p-value), stated as not shown when p >= 0.05.

The figure (`demo_scores.png`, `demo_figure`): per evaluation set, each stage's P(full) and
P(sharded) with 95% bootstrap intervals, and beside them the premature-answer rate and
first-answer accuracy.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from fic.core.files import write_text
from fic.core.plots import pyplot, save_png
from fic.core.records import read_json, read_log
from fic.core.stats import paired_bootstrap, sign_test

STAGE_NAMES = {"start": "starting point", "sft": "FiC stage 1 (SFT)", "vasd": "FiC stage 1+2 (SFT + VASD)",
               "control": "control: more SFT for VASD's time"}
# The stages under the figure's bars: short, on two lines, so that four stages' labels never overlap.
TICK_NAMES = {"start": "starting\npoint", "sft": "stage 1\n(SFT)", "vasd": "stage 1+2\n(SFT + VASD)",
              "control": "control\n(more SFT)"}
GOLD_TEACHER = "FiC stage 1+2 (SFT + VASD; its teacher reads the gold answer)"  # teacher.view: gold-hinted
COMPARISONS = (("vasd", "sft", "VASD vs SFT alone"), ("vasd", "control", "VASD vs the equal-compute SFT control"),
               ("control", "sft", "The control vs SFT (the plateau check: a gain here means stage 1 had not stopped "
                                  "improving)"))
PLOT = "demo_scores.png"


def view_scores(run: Path) -> dict[str, dict[str, float]]:
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


def never_answered(views: dict) -> float | None:
    """Share of sharded conversations with no answer attempt at all (LiC's answer timing `never`)."""
    timing = (views.get("sharded") or {}).get("answer_timing") or {}
    return (timing.get("never") or {}).get("share")


def stage_figures(cfg: Any, run: Path, start: dict) -> dict | None:
    if not (run / "metrics.json").is_file():
        return None
    metrics = read_json(run / "metrics.json")
    scores = view_scores(run)
    views = metrics["views"]
    base = start["scores"].get("full", {})
    ids = sorted(base)
    out = {"P": {v: views[v]["P"] for v in views}, "scores": scores, "instances": len(scores.get("full", {})),
           "P_interval": {view: list(paired_bootstrap([[100 * x for x in by_id.values()]], lambda mean: mean,
                                                      resamples=cfg.bootstrap, seed=cfg.data.seed))
                          for view, by_id in scores.items() if by_id},
           "premature_answer_rate": (views.get("sharded") or {}).get("premature_answer_rate"),
           "unanswerable_answer_rate": (views.get("sharded") or {}).get("unanswerable_answer_rate"),
           "first_answer_accuracy": (views.get("sharded") or {}).get("first_answer_accuracy"),
           "final_not_answer_rate": _final_not_answer(run),
           "never_answered_rate": never_answered(views),
           "tokens_per_sharded_conversation": (views.get("sharded") or {}).get("generated_tokens_per_conversation")}
    for name, view in (("recovery_rate", "sharded"), ("retention", "full")):
        mine = scores.get(view, {})
        out[name] = None if not ids or any(i not in mine for i in ids) else _ratio_interval(cfg, mine, base, ids)
    # the model's own multi-turn ratio, beside R (which divides by the starting point's P(full))
    sharded, full = scores.get("sharded", {}), scores.get("full", {})
    own = sorted(set(sharded) & set(full))
    out["own_ratio"] = _ratio_interval(cfg, sharded, full, own) if own else None
    return out


def _ratio_interval(cfg: Any, numerator: dict, denominator: dict, ids: list) -> dict:
    """mean(numerator) / mean(denominator) over `ids`, with its 95% paired-bootstrap interval."""
    columns = [[numerator[i] for i in ids], [denominator[i] for i in ids]]
    value = _ratio(sum(columns[0]) / len(ids), sum(columns[1]) / len(ids))
    low, high = paired_bootstrap(columns, _ratio, resamples=cfg.bootstrap, seed=cfg.data.seed)
    return {"value": value, "low": low, "high": high}


def _ratio(numerator: float, denominator: float) -> float | None:
    return numerator / denominator if denominator else None


def write_demo_report(cfg: Any, runs: dict[str, dict[str, Path]], stages: dict[str, dict], report: Path) -> dict:
    """Write `report` (markdown) and its plot beside it; return the printed table and the figures.

    `runs[split][stage]` is the `fic eval` folder of a stage ("start", "sft", "vasd") on an
    evaluation set; `stages` what each finished stage recorded (its seconds and peak memory)."""
    summary: dict[str, Any] = {"label": cfg.label, "sets": {}}
    for split, by_stage in runs.items():
        start_run = by_stage["start"]
        start = {"scores": view_scores(start_run) if (start_run / "conversations.jsonl").is_file() else {}}
        rows = {}
        for stage in STAGE_NAMES:
            figures = stage_figures(cfg, by_stage[stage], start)
            if figures is not None:
                rows[stage] = figures
        summary["sets"][split] = {"rows": rows, **{f"{a}_vs_{b}": _paired(rows, a, b) for a, b, _ in COMPARISONS}}
    summary["names"] = stage_names(cfg, summary["sets"].get("test"))
    summary["seconds"] = {s: info.get("seconds") for s, info in stages.items() if "seconds" in info}
    summary["peak_rss_mb"] = max((info.get("peak_rss_mb", 0) for info in stages.values()), default=None)
    summary["disk_mb"] = round(_disk_mb(Path(cfg.out)))
    table = render_table(summary, "test")
    write_text(report, render_markdown(cfg, summary, stages))
    plot_demo(summary, report.parent / PLOT)
    return {"table": table, "summary": _without_scores(summary)}


def stage_names(cfg: Any, tests: dict | None = None) -> dict[str, str]:
    """The table's stage names. A stage 2 whose teacher reads the gold answer says so (it is not
    the paper's label-free VASD), and stage 2's name carries its verdict on `tests` (a set's
    paired tests), so that no reader takes its row for a gain the tests do not show."""
    gold = getattr(getattr(getattr(cfg, "vasd", None), "teacher", None), "view", None) == "gold-hinted"
    vasd = GOLD_TEACHER if gold else STAGE_NAMES["vasd"]
    verdict = stage2_verdict(tests)
    return {**STAGE_NAMES, "vasd": f"{vasd}: {verdict}" if verdict else vasd}


def stage2_verdict(tests: dict | None) -> str | None:
    """A gain over stage 1 counts as stage 2's only where it is one over the equal-compute control
    too: otherwise more SFT would have given it."""
    over_sft, over_control = (tests or {}).get("vasd_vs_sft"), (tests or {}).get("vasd_vs_control")
    if over_sft is None:
        return None
    if not over_sft["shown"]:
        return "no reliable gain over stage 1 on this task"
    if over_control is None:
        return "a gain over stage 1 on this run (no equal-compute control)"
    if not over_control["shown"]:
        return "a gain over stage 1, not over the equal-compute control"
    return "a gain over stage 1 and the equal-compute control on this run"


def _paired(rows: dict, stage: str, other: str) -> dict | None:
    """`stage` against `other` on the same instances' sharded scores: an exact sign test."""
    if stage not in rows or other not in rows:
        return None
    mine, theirs = rows[stage]["scores"].get("sharded", {}), rows[other]["scores"].get("sharded", {})
    ids = sorted(set(mine) & set(theirs))
    result = sign_test(mine[i] - theirs[i] for i in ids)
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


def percent_text(value: float | None) -> str:
    return "n/a" if value is None else f"{100 * value:.1f}%"


def _p(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.1f}"


def premature_text(row: dict) -> str:
    """The premature-answer rate, and in brackets its unanswerable part where the task tells it."""
    part = row.get("unanswerable_answer_rate")
    return percent_text(row["premature_answer_rate"]) + ("" if part is None else f" ({percent_text(part)})")


def interval_text(entry: dict | None) -> str:
    if not entry or entry.get("value") is None:
        return "n/a"
    if entry.get("low") is None:
        return f"{entry['value']:.2f}"
    return f"{entry['value']:.2f} [{entry['low']:.2f}, {entry['high']:.2f}]"


def render_table(summary: dict, split: str) -> str:
    rows = summary["sets"][split]["rows"]
    n = next((r["instances"] for r in rows.values()), 0)
    lines = [f"{summary['label']}: {split} set, N = {n} instances (P in %, greedy, LiC's rules)",
             "| stage | P(full) | P(concat) | P(sharded) | first-answer accuracy | premature answers (unanswerable) | "
             "final reply no answer | R [95% CI] | own P(sharded)/P(full) [95% CI] | retention [95% CI] | "
             "tokens / sharded conv. |",
             "|---|---|---|---|---|---|---|---|---|---|---|"]
    for stage, row in rows.items():
        lines.append(f"| {summary.get('names', STAGE_NAMES)[stage]} | {_p(row['P'].get('full'))} | {_p(row['P'].get('concat'))} | "
                     f"{_p(row['P'].get('sharded'))} | {_p(row.get('first_answer_accuracy'))} | "
                     f"{premature_text(row)} | "
                     f"{percent_text(row['final_not_answer_rate'])} | {interval_text(row.get('recovery_rate'))} | "
                     f"{interval_text(row.get('own_ratio'))} | {interval_text(row.get('retention'))} | "
                     f"{_p(row['tokens_per_sharded_conversation'])} |")
    tests = []
    for stage, other, name in COMPARISONS:
        paired = summary["sets"][split][f"{stage}_vs_{other}"]
        if paired is not None:
            verdict = "shown" if paired["shown"] else "NOT shown (p >= 0.05 or no more wins than losses)"
            tests.append(f"- {name} on the same {paired['instances']} instances (sharded): "
                         f"{_count(paired['better'], 'win')}, {_count(paired['worse'], 'loss', 'losses')}, "
                         f"{_count(paired['tied'], 'tie')}, exact sign test p = {paired['p_value']:.3g}: gain {verdict}.")
    # The paired tests are a list after a blank line: a line right under a table is one more row.
    return "\n".join(lines + ([""] + tests if tests else []))


def _count(n: int, one: str, many: str | None = None) -> str:
    return f"{n} {one if n == 1 else many or one + 's'}"


def render_markdown(cfg: Any, summary: dict, stages: dict) -> str:
    parts = [f"# FiC demo: {cfg.label}", "",
             f"Task `{cfg.data.task}` from `{cfg.data.source}` (seed {cfg.data.seed}); the starting point is "
             f"**{cfg.label}** (`{cfg.base_model}` has never seen the task's format, so a short single-turn warm-up "
             "comes first). R = P(stage; sharded) / P(starting point; full); beside it each model's own "
             "P(sharded) / P(full) (a stage that also teaches the task lifts R above its own ratio); retention = "
             "P(stage; full) / P(starting point; full); intervals: 95% paired bootstrap over instances "
             f"({cfg.bootstrap} resamples). Premature answers: an answer attempt before the last shard.", ""]
    if getattr(cfg, "smoke", False):
        parts += [f"**Smoke run** (`fic demo --quick`): {cfg.data.test} test instances, a few steps of every stage. "
                  "The intervals are wide and the figures say nothing about the method: this run shows what the demo "
                  "does and writes. The measured demo is `fic demo`.", ""]
    for split in summary["sets"]:
        parts += [f"## {split}", "", render_table(summary, split), ""]
    plateau = (stages.get("sft", {}).get("figures") or {}).get("plateau")
    if plateau:
        curve = ", ".join(f"{p['value']:.1f} at step {p['step']}" for p in plateau["curve"])
        end = (f"it stopped at step {plateau['stopped_at']} (no gain of {plateau['min_delta']:g} in "
               f"{plateau['patience']} scores)" if plateau["stopped_at"] else
               "it ran to its cap (train.max_steps) without meeting the plateau rule: stage 2 starts before the "
               "plateau")
        parts += ["## Stage 1's dev curve", "", f"`{plateau['metric']}` on {plateau['instances']} dev instances: "
                  f"{curve}; {end}. The curve is drawn in `sft/curves.png`.", ""]
    parts += ["## Time, memory, disk", "", "| stage | minutes | CPU minutes | peak resident memory (MiB) |",
              "|---|---|---|---|"]
    parts += [f"| {s} | {info['seconds'] / 60:.1f} | {info.get('cpu_seconds', 0) / 60:.1f} | "
              f"{info.get('peak_rss_mb', 'n/a')} |" for s, info in stages.items() if "seconds" in info]
    total = sum(info.get("seconds", 0) for info in stages.values())
    parts += ["", f"Total {total / 60:.1f} min; peak resident memory {summary['peak_rss_mb']} MiB; "
              f"{summary['disk_mb']} MiB on disk in `{cfg.out}`.", "", f"![scores]({PLOT})", ""]
    return "\n".join(parts)



def _whiskers(value: float | None, interval: list | None) -> tuple[float, float]:
    """Error-bar lengths below and above `value` for its [low, high] interval (0 when unknown)."""
    if value is None or not interval or None in interval:
        return 0.0, 0.0
    return max(0.0, value - interval[0]), max(0.0, interval[1] - value)


def demo_figure(summary: dict) -> Any:
    """One row per evaluation set (test, test-unseen): every stage's P(full) and P(sharded)
    with their 95% intervals; beside them the premature-answer rate and, where the metrics
    have it, first-answer accuracy. Legends sit under the axes, clear of every bar."""
    plt = pyplot()
    sets = [split for split, data in summary["sets"].items() if data["rows"]]
    fig, axes = plt.subplots(len(sets), 2, figsize=(11, 3.3 * len(sets) + 0.6), squeeze=False,
                             gridspec_kw={"width_ratios": [3, 2]})
    for (scores, timing), split in zip(axes, sets):
        rows = summary["sets"][split]["rows"]
        names = [TICK_NAMES[s] for s in rows]
        x = list(range(len(rows)))
        n = next((r["instances"] for r in rows.values()), 0)
        for k, view in enumerate(("full", "sharded")):
            heights = [r["P"].get(view) for r in rows.values()]
            xs = [i + 0.38 * (k - 0.5) for i in x]
            bars = scores.bar(xs, [h or 0 for h in heights], width=0.36, label=f"P({view})")
            scores.bar_label(bars, labels=[_p(h) for h in heights], fontsize=7, padding=2)
            errors = [_whiskers(h, (r.get("P_interval") or {}).get(view)) for h, r in zip(heights, rows.values())]
            scores.errorbar(xs, [h or 0 for h in heights], yerr=list(zip(*errors)), fmt="none", ecolor="0.2",
                            capsize=3, linewidth=1, label="95% interval" if k else None)
        scores.set_xticks(x, names, fontsize=8)
        scores.set_ylim(0, 110)
        scores.set_ylabel("P (0-100)")
        scores.set_title(f"{split}: P per stage, N = {n}", fontsize=9)
        # (label, key, scale to %): the premature-answer rate is stored 0..1, first-answer accuracy 0..100 like P.
        rates = [("premature answers", "premature_answer_rate", "tab:red", 100.0),
                 ("first-answer accuracy", "first_answer_accuracy", "tab:green", 1.0)]
        shown = [rate for rate in rates if any(r.get(rate[1]) is not None for r in rows.values())]
        width = 0.8 / max(1, len(shown))
        for k, (label, key, color, scale) in enumerate(shown):
            values = [None if r.get(key) is None else scale * r[key] for r in rows.values()]
            xs = [i + width * (k - (len(shown) - 1) / 2) for i in x]
            bars = timing.bar(xs, [v or 0 for v in values], width=width * 0.9, color=color, label=label)
            timing.bar_label(bars, labels=[_p(v) for v in values], fontsize=7, padding=2)
        timing.set_xticks(x, names, fontsize=8)
        timing.set_ylim(0, 110)
        timing.set_ylabel("% of sharded conversations")
        timing.set_title(f"{split}: when and how well it first answers", fontsize=9)
        for ax, ncol in ((scores, 3), (timing, 2)):
            ax.legend(fontsize=7, loc="upper center", bbox_to_anchor=(0.5, -0.12), ncol=ncol, frameon=False)
    fig.suptitle(summary.get("label", ""), fontsize=10)
    fig.tight_layout()
    return fig


def plot_demo(summary: dict, path: Path) -> Path | None:
    """Draw `summary` (what `write_demo_report` returns, also saved in `stages/report.json`)."""
    if not any(data["rows"] for data in summary["sets"].values()):
        return None
    save_png(demo_figure(summary), path)
    return path
