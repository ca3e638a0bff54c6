"""The evaluation report: `report.md` plus two PNG plots, all written atomically.

- `scores_by_view.png`: P per view and task (bars), with A90 as a marker and the U90_10
  spread as a line from A90 down (when there are at least 2 runs per instance).
- `answer_timing.png`: for each multi-turn view, the answer-attempt rate per turn position
  (of the conversations still going at turn k, the share that attempted an answer).

matplotlib runs with the Agg backend (no display needed).
"""

from __future__ import annotations

import io
from pathlib import Path

from fic.core.files import atomic_open, write_text
from fic.data.views import SINGLE_TURN_VIEWS
from fic.evaluation.metrics import TIMING_BINS

SCORES_PNG, TIMING_PNG = "scores_by_view.png", "answer_timing.png"


def _fmt(value: float | None, digits: int = 1, percent: bool = False) -> str:
    if value is None:
        return "n/a"
    return f"{100 * value:.{digits}f}%" if percent else f"{value:.{digits}f}"


def _save(fig, path: Path) -> None:
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", dpi=110, bbox_inches="tight")
    with atomic_open(path, "wb") as handle:
        handle.write(buffer.getvalue())


def plot_scores(metrics: dict, path: Path) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    tasks = list(metrics["tasks"])
    views = list(metrics["views"])
    fig, ax = plt.subplots(figsize=(max(4.0, 1.3 * len(views) * max(1, len(tasks))), 3.6))
    width = 0.8 / max(1, len(tasks))
    for t, task in enumerate(tasks):
        xs, ps, spread = [], [], []
        for v, view in enumerate(views):
            row = metrics["tasks"][task].get(view)
            if row is None or row["P"] is None:
                continue
            xs.append(v + (t - (len(tasks) - 1) / 2) * width)
            ps.append(row["P"])
            if row["A90"] is not None:
                spread.append((xs[-1], row["A90"], row["U90_10"]))
        bars = ax.bar(xs, ps, width=width * 0.9, label=f"{task} P")
        if spread:
            x, a90, u = zip(*spread)
            ax.scatter(x, a90, marker="_", s=200, color="black", zorder=3)
            ax.vlines(x, [a - s for a, s in zip(a90, u)], a90, color="black", linewidth=1, zorder=3)
        ax.bar_label(bars, fmt="%.0f", fontsize=8)
    ax.set_xticks(range(len(views)), views)
    ax.set_ylim(0, 105)
    ax.set_ylabel("score (0-100)")
    ax.set_title("P per view (marker: A90, line: U90_10 below A90)" if metrics.get("reliability_note") is None
                 else "P per view (A90, U90_10: n/a with one run)")
    ax.legend(fontsize=8)
    _save(fig, path)
    plt.close(fig)


def plot_timing(metrics: dict, path: Path) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(5.5, 3.6))
    drawn = False
    for task, views in metrics["tasks"].items():
        for view, row in views.items():
            rates = row["answer_attempt_rate_by_turn"]
            if view in SINGLE_TURN_VIEWS or not rates:
                continue
            turns = [k + 1 for k, r in enumerate(rates) if r is not None]
            ax.plot(turns, [100 * r for r in rates if r is not None], marker="o", label=f"{task} / {view}")
            drawn = True
    if not drawn:
        ax.text(0.5, 0.5, "no multi-turn view evaluated", ha="center", va="center", transform=ax.transAxes)
    else:
        ax.legend(fontsize=8)
    ax.set_xlabel("turn")
    ax.set_ylabel("answer attempts (% of conversations at that turn)")
    ax.set_ylim(0, 105)
    ax.set_title("When does the assistant answer?")
    _save(fig, path)
    plt.close(fig)


def _sandbox_lines(sandbox: dict) -> list[str]:
    """Where model-written code ran (runs with the code task), and the rlimits fallback's warning."""
    lines = [f"- sandbox: {sandbox['isolation']}"] if sandbox.get("isolation") else []
    return lines + (["", f"**{sandbox['warning']}**"] if sandbox.get("warning") else [])


def render_markdown(metrics: dict) -> str:
    s = metrics.get("settings", {})
    lines = [
        "# FiC evaluation report", "",
        f"- model: `{s.get('model', '?')}`",
        f"- data: `{s.get('source', '?')}` (task {s.get('task', '?')}), views {', '.join(s.get('views', []))}",
        f"- runs per instance: {s.get('runs', '?')} at temperature {s.get('temperature', '?')}, "
        f"max {s.get('max_new_tokens', '?')} new tokens; user `{s.get('user', '?')}`, "
        f"classifier `{s.get('classifier', '?')}`, stop at first correct answer: {s.get('stop_at_correct', '?')}",
        f"- conversations: {metrics['conversations']}",
        *_sandbox_lines(metrics.get("sandbox") or {}),
        "",
        "## Headline", "",
        *_headline(metrics),
        "",
        "## Scores (0-100; mean over instances, then over tasks)", "",
        *([f"A90 and U90_10: n/a. {metrics['reliability_note']}.", ""] if metrics.get("reliability_note") else []),
        "| task | view | P | A90 | U90_10 | instances | conversations | turns/conv | generated tokens/conv "
        "| context tokens/conv | premature answers |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for task, views in metrics["tasks"].items():
        for view, r in views.items():
            lines.append(f"| {task} | {view} | {_fmt(r['P'])} | {_fmt(r['A90'])} | {_fmt(r['U90_10'])} | "
                         f"{r['instances']} | {r['conversations']} | {_fmt(r['turns_per_conversation'])} | "
                         f"{_fmt(r['generated_tokens_per_conversation'], 0)} | "
                         f"{_fmt(r['context_tokens_per_conversation'], 0)} | "
                         f"{_fmt(r['premature_answer_rate'], 0, percent=True)} |")
    if len(metrics["tasks"]) > 1:
        for view, r in metrics["views"].items():
            lines.append(f"| **all** | {view} | {_fmt(r['P'])} | {_fmt(r['A90'])} | {_fmt(r['U90_10'])} | | "
                         f"{r['conversations']} | {_fmt(r['turns_per_conversation'])} | "
                         f"{_fmt(r['generated_tokens_per_conversation'], 0)} | "
                         f"{_fmt(r['context_tokens_per_conversation'], 0)} | "
                         f"{_fmt(r['premature_answer_rate'], 0, percent=True)} |")
    lines += ["", f"![scores per view]({SCORES_PNG})", "", "## Answer timing", ""]
    timing_rows = [(task, view, r) for task, views in metrics["tasks"].items() for view, r in views.items()
                   if view not in SINGLE_TURN_VIEWS]
    if len(metrics["tasks"]) > 1:
        timing_rows += [("**all**", view, r) for view, r in metrics["views"].items() if view not in SINGLE_TURN_VIEWS]
    if timing_rows:
        lines += ["Premature answers: share of conversations whose first answer attempt came before the user had "
                  "revealed every shard. Timing bins (Lost in Conversation): conversations by the share of their "
                  "shards revealed at the first answer attempt (first: at most 1/3, middle: at most 2/3, last: "
                  "more), with the share of conversations and their P in each bin.", "",
                  "| task | view | premature answers | " + " | ".join(TIMING_BINS) + " |",
                  "|---|---|---|" + "---|" * len(TIMING_BINS)]
        for task, view, r in timing_rows:
            bins = r["answer_timing"]
            cells = [f"{_fmt(bins[name]['share'], 0, percent=True)} (P {_fmt(bins[name]['P'])})"
                     for name in TIMING_BINS]
            lines.append(f"| {task} | {view} | {_fmt(r['premature_answer_rate'], 0, percent=True)} | "
                         + " | ".join(cells) + " |")
        lines += ["", "Share of conversations still going at turn k whose reply at turn k is an answer attempt.", ""]
        timing_rows = [row for row in timing_rows if row[0] != "**all**"]
        longest = max(len(r["answer_attempt_rate_by_turn"]) for _, _, r in timing_rows)
        lines.append("| task | view | " + " | ".join(f"turn {k + 1}" for k in range(longest)) + " |")
        lines.append("|---|---|" + "---|" * longest)
        for task, view, r in timing_rows:
            cells = [_fmt(x, 0, percent=True) for x in r["answer_attempt_rate_by_turn"]]
            cells += [""] * (longest - len(cells))
            lines.append(f"| {task} | {view} | " + " | ".join(cells) + " |")
        lines += ["", f"![answer timing]({TIMING_PNG})"]
    else:
        lines.append("(no multi-turn view evaluated)")
    labels = [(task, view, r["labels"]) for task, views in metrics["tasks"].items() for view, r in views.items()]
    lines += ["", "## Reply labels", ""]
    for task, view, counts in labels:
        lines.append(f"- {task} / {view}: " + ", ".join(f"{k} {v}" for k, v in counts.items()))
    if metrics.get("skipped_instances"):
        lines += ["", "## Skipped instances", ""]
        lines += [f"- {n} x {reason}" for reason, n in metrics["skipped_instances"].items()]
    lines += ["", "Per-conversation traces: `conversations.jsonl`; all figures: `metrics.json`.", ""]
    return "\n".join(lines)


def _headline(metrics: dict) -> list[str]:
    if metrics.get("baseline_source"):
        lines = [f"- **Recovery rate** R = P(model; sharded) / P(baseline; full) = "
                 f"**{_fmt(metrics['recovery_rate'], 3)}**",
                 f"- Single-turn retention P(model; full) / P(baseline; full) = **{_fmt(metrics['retention'], 3)}**",
                 f"- Baseline: `{metrics['baseline_source']}` (full-view P = {_fmt(metrics.get('baseline_full_P'))}, "
                 "same instances and scoring settings)"]
        if len(metrics["by_task"]) > 1:
            lines += [f"- {task}: R = {_fmt(r['recovery_rate'], 3)}, retention = {_fmt(r['retention'], 3)}"
                      for task, r in metrics["by_task"].items()]
        return lines
    return [f"- P(sharded) / P(full) of this run = **{_fmt(metrics['sharded_over_full'], 3)}**. This is not the "
            "recovery rate, which divides a trained model's sharded P by the *base* model's full P: pass "
            "`baseline=<the base model's run folder>`."]


def write_report(out: str | Path, metrics: dict) -> Path:
    out = Path(out)
    plot_scores(metrics, out / SCORES_PNG)
    plot_timing(metrics, out / TIMING_PNG)
    path = out / "report.md"
    write_text(path, render_markdown(metrics))
    return path
