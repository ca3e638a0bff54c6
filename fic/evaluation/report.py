"""The evaluation report: `report.md` plus three PNG figures, all written atomically.

- `scores_by_view.png`: P per view and task (bars) with its 95% interval (a bootstrap over
  instances: whiskers), A90 as a marker and the U90_10 spread as a line from A90 down (when
  there are at least 2 runs per instance).
- `answer_timing.png`: for each multi-turn view, the histogram of the turn of the first answer
  attempt (share of conversations, "never" last), and the answer-attempt rate per turn
  position (of the conversations still going at turn k, the share that attempted an answer).
- `tokens_per_conversation.png`: tokens the assistant generated, and the context length of
  its last reply, per conversation in each view.

Each figure is built by a function that returns the `Figure` (`scores_figure`, `timing_figure`,
`tokens_figure`); legends sit outside the axes, so they cover no bar. matplotlib runs with the
Agg backend (no display needed). `fic report RUN_DIR` redraws them from a run's folder.
"""

from __future__ import annotations

from collections import defaultdict
from pathlib import Path
from typing import Any

from fic.core.files import write_text
from fic.core.plots import integer_axis, no_data, pyplot, save_png
from fic.core.stats import paired_bootstrap
from fic.data.views import SINGLE_TURN_VIEWS
from fic.evaluation.metrics import TIMING_BINS

SCORES_PNG, TIMING_PNG, TOKENS_PNG = "scores_by_view.png", "answer_timing.png", "tokens_per_conversation.png"
PROMPT_WORDS = {"fic": "FiC's wording", "lic": "Lost in Conversation's prompts, verbatim"}
INTERVAL_RESAMPLES = 1000


def _fmt(value: float | None, digits: int = 1, percent: bool = False) -> str:
    if value is None:
        return "n/a"
    return f"{100 * value:.{digits}f}%" if percent else f"{value:.{digits}f}"


def p_intervals(records: list[dict], *, resamples: int = INTERVAL_RESAMPLES, seed: int = 0) -> dict:
    """task -> view -> [low, high]: the 95% interval of P (0..100), a bootstrap over instances of
    their mean scores (the runs of an instance stay together); [P, P] with one instance."""
    scores: dict = defaultdict(lambda: defaultdict(lambda: defaultdict(list)))
    for record in records:
        scores[record["task"]][record["view"]][record["task_id"]].append(100.0 * float(record["score"]))
    out: dict = {}
    for task, views in scores.items():
        for view, by_instance in views.items():
            column = [sum(v) / len(v) for v in by_instance.values()]
            low, high = paired_bootstrap([column], lambda mean: mean, resamples=resamples, seed=seed)
            out.setdefault(task, {})[view] = [low, high]
    return out


def _legend_below(fig: Any, ax: Any, ncol: int) -> None:
    """A legend under the axes: it covers no bar whatever the heights."""
    handles, labels = ax.get_legend_handles_labels()
    if handles:
        ax.legend(handles, labels, fontsize=8, loc="upper center", bbox_to_anchor=(0.5, -0.16), ncol=ncol,
                  frameon=False)


def scores_figure(metrics: dict, intervals: dict | None = None) -> Any:
    plt = pyplot()
    intervals = intervals or {}
    tasks = list(metrics["tasks"])
    views = list(metrics["views"])
    fig, ax = plt.subplots(figsize=(max(4.5, 1.3 * len(views) * max(1, len(tasks))), 3.8))
    width = 0.8 / max(1, len(tasks))
    for t, task in enumerate(tasks):
        xs, ps, spread, low, high = [], [], [], [], []
        for v, view in enumerate(views):
            row = metrics["tasks"][task].get(view)
            if row is None or row["P"] is None:
                continue
            xs.append(v + (t - (len(tasks) - 1) / 2) * width)
            ps.append(row["P"])
            bounds = (intervals.get(task) or {}).get(view) or [None, None]
            low.append(row["P"] - bounds[0] if bounds[0] is not None else 0.0)
            high.append(bounds[1] - row["P"] if bounds[1] is not None else 0.0)
            if row["A90"] is not None:
                spread.append((xs[-1], row["A90"], row["U90_10"]))
        bars = ax.bar(xs, ps, width=width * 0.9, label=f"{task} P")
        if intervals.get(task):
            ax.errorbar(xs, ps, yerr=[low, high], fmt="none", ecolor="0.25", capsize=3, linewidth=1, zorder=3,
                        label="95% interval" if t == 0 else None)
        if spread:
            x, a90, u = zip(*spread)
            ax.scatter(x, a90, marker="_", s=200, color="black", zorder=4, label="A90" if t == 0 else None)
            ax.vlines(x, [a - s for a, s in zip(a90, u)], a90, color="black", linewidth=1, zorder=4)
        ax.bar_label(bars, fmt="%.0f", fontsize=8, padding=2)
    ax.set_xticks(range(len(views)), views)
    ax.set_ylim(0, 110)
    ax.set_xlabel("view")
    ax.set_ylabel("P, score (0-100)")
    ax.set_title("P per view, 95% interval over instances" + (" (A90, U90_10: n/a with one run)"
                                                              if metrics.get("reliability_note") else
                                                              "; marker: A90, line: U90_10 below A90"), fontsize=9)
    _legend_below(fig, ax, ncol=min(4, len(tasks) + 2))
    return fig


def _multi_turn_rows(metrics: dict) -> list[tuple[str, str, dict]]:
    return [(task, view, row) for task, views in metrics["tasks"].items() for view, row in views.items()
            if view not in SINGLE_TURN_VIEWS]


def timing_figure(metrics: dict) -> Any:
    plt = pyplot()
    rows = _multi_turn_rows(metrics)
    fig, (hist, rate) = plt.subplots(1, 2, figsize=(10, 3.8))
    longest = max((len(r["first_answer_share_by_turn"] or []) for _, _, r in rows), default=0)
    width = 0.8 / max(1, len(rows))
    for k, (task, view, row) in enumerate(rows):
        shares = [s or 0.0 for s in row["first_answer_share_by_turn"]] + [0.0] * (longest -
                                                                               len(row["first_answer_share_by_turn"]))
        never = (row.get("answer_timing") or {}).get("never", {}).get("share") or 0.0
        xs = [i + (k - (len(rows) - 1) / 2) * width for i in range(longest + 1)]
        hist.bar(xs, [100 * s for s in shares] + [100 * never], width=width * 0.9, label=f"{task} / {view}")
        rates = row["answer_attempt_rate_by_turn"]
        turns = [i + 1 for i, r in enumerate(rates) if r is not None]
        rate.plot(turns, [100 * r for r in rates if r is not None], marker="o", label=f"{task} / {view}")
    if rows:
        hist.set_xticks(range(longest + 1), [str(i + 1) for i in range(longest)] + ["never"])
        _legend_below(fig, hist, ncol=min(3, len(rows)))
        _legend_below(fig, rate, ncol=min(3, len(rows)))
    else:
        no_data(hist, "no multi-turn view evaluated")
        no_data(rate, "no multi-turn view evaluated")
    hist.set_xlabel("turn of the first answer attempt")
    hist.set_ylabel("conversations (%)")
    hist.set_title("When is the first answer given?", fontsize=9)
    rate.set_xlabel("turn")
    integer_axis(rate)
    rate.set_ylabel("answer attempts (% of conversations at that turn)", fontsize=8)
    rate.set_ylim(0, 105)
    rate.set_title("Answer attempts per turn", fontsize=9)
    fig.tight_layout()
    return fig


def _sandbox_lines(sandbox: dict) -> list[str]:
    """Where model-written code ran (runs with the code task), and the rlimits fallback's warning."""
    lines = [f"- sandbox: {sandbox['isolation']}"] if sandbox.get("isolation") else []
    return lines + (["", f"**{sandbox['warning']}**"] if sandbox.get("warning") else [])


def tokens_figure(metrics: dict) -> Any:
    plt = pyplot()
    tasks = list(metrics["tasks"])
    views = list(metrics["views"])
    fig, axes = plt.subplots(1, 2, figsize=(max(7.0, 2.2 * len(views) * max(1, len(tasks))), 3.6))
    width = 0.8 / max(1, len(tasks))
    for ax, key, title in ((axes[0], "generated_tokens_per_conversation", "generated by the assistant"),
                           (axes[1], "context_tokens_per_conversation", "context of its last reply")):
        for t, task in enumerate(tasks):
            xs, values = [], []
            for v, view in enumerate(views):
                value = (metrics["tasks"][task].get(view) or {}).get(key)
                if value is not None:
                    xs.append(v + (t - (len(tasks) - 1) / 2) * width)
                    values.append(value)
            bars = ax.bar(xs, values, width=width * 0.9, label=task)
            ax.bar_label(bars, fmt="%.0f", fontsize=7, padding=2)
        ax.set_xticks(range(len(views)), views)
        ax.set_xlabel("view")
        ax.set_ylabel("tokens per conversation")
        ax.set_title(f"Tokens {title}", fontsize=9)
        ax.margins(y=0.15)
        if len(tasks) > 1:
            _legend_below(fig, ax, ncol=min(4, len(tasks)))
    fig.tight_layout()
    return fig


def render_markdown(metrics: dict, intervals: dict | None = None) -> str:
    s = metrics.get("settings", {})
    intervals = intervals or {}
    lines = [
        "# FiC evaluation report", "",
        f"- model: `{s.get('model', '?')}`",
        f"- data: `{s.get('source', '?')}` (task {s.get('task', '?')}), views {', '.join(s.get('views', []))}",
        f"- runs per instance: {s.get('runs', '?')} at temperature {s.get('temperature', '?')}, "
        f"max {s.get('max_new_tokens', '?')} new tokens; user `{s.get('user', '?')}`, "
        f"classifier `{s.get('classifier', '?')}`, stop at first correct answer: {s.get('stop_at_correct', '?')}",
        f"- prompts: `{s.get('prompts', 'fic')}` ({PROMPT_WORDS.get(s.get('prompts', 'fic'), '?')})",
        f"- conversations: {metrics['conversations']}",
        *[f"- **Scoring caveat, {task}**: {caveat}." for task, caveats in (metrics.get("scoring_caveats") or {}).items()
          for caveat in caveats],
        *_sandbox_lines(metrics.get("sandbox") or {}),
        "",
        "## Headline", "",
        *_headline(metrics),
        "",
        "## Scores (0-100; mean over instances, then over tasks)", "",
        *([f"A90 and U90_10: n/a. {metrics['reliability_note']}.", ""] if metrics.get("reliability_note") else []),
        "| task | view | P | P 95% interval | A90 | U90_10 | instances | conversations | turns/conv "
        "| generated tokens/conv | context tokens/conv | premature answers |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for task, views in metrics["tasks"].items():
        for view, r in views.items():
            low, high = (intervals.get(task) or {}).get(view) or (None, None)
            interval = f"[{_fmt(low)}, {_fmt(high)}]" if low is not None else "n/a"
            lines.append(f"| {task} | {view} | {_fmt(r['P'])} | {interval} | {_fmt(r['A90'])} | {_fmt(r['U90_10'])} | "
                         f"{r['instances']} | {r['conversations']} | {_fmt(r['turns_per_conversation'])} | "
                         f"{_fmt(r['generated_tokens_per_conversation'], 0)} | "
                         f"{_fmt(r['context_tokens_per_conversation'], 0)} | "
                         f"{_fmt(r['premature_answer_rate'], 0, percent=True)} |")
    if len(metrics["tasks"]) > 1:
        for view, r in metrics["views"].items():
            lines.append(f"| **all** | {view} | {_fmt(r['P'])} | | {_fmt(r['A90'])} | {_fmt(r['U90_10'])} | | "
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
    lines += ["", "## Tokens per conversation", "", f"![tokens per conversation]({TOKENS_PNG})"]
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


def write_report(out: str | Path, metrics: dict, records: list[dict] | None = None) -> Path:
    """`report.md` and its figures in `out`; `records` (the conversations) give P's intervals."""
    out = Path(out)
    intervals = p_intervals(records) if records else {}
    save_png(scores_figure(metrics, intervals), out / SCORES_PNG)
    save_png(timing_figure(metrics), out / TIMING_PNG)
    save_png(tokens_figure(metrics), out / TOKENS_PNG)
    path = out / "report.md"
    write_text(path, render_markdown(metrics, intervals))
    return path
