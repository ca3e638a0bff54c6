"""Figures and the report of `fic probe`: rates with intervals, paired differences, plots.

Statistics (stated in every report):

- A rate (genuine follow-ups among generated user turns, task accuracy) gets a 95% Wilson
  score interval. The samples of one instance are not independent (at a low temperature
  they often agree), so with several samples per instance the interval uses the effective
  sample size n / deff, where deff is Kish's design effect of the instance clusters
  estimated from the data, kept between 1 and the mean samples per instance, and taken as
  the samples per instance when every generation agrees (p = 0 or 1). One sample per
  instance is the plain Wilson interval.
- Two checkpoints are compared on the same instances, conditions, temperatures and sample
  indices: per instance, the rate over its samples; the difference is the mean of the
  per-instance differences, and the test is the exact two-sided sign test on them (ties
  dropped), which with one sample per instance is McNemar's exact test.

matplotlib runs with the Agg backend (no display needed); every file is written atomically.
"""

from __future__ import annotations

import io
from collections import Counter, defaultdict
from pathlib import Path
from typing import Iterable

from fic.core.files import atomic_open, write_text
from fic.core.stats import sign_test, wilson_interval
from fic.probe.judge import LABELS

FOLLOW_UP = "genuine_follow_up"
FOLLOW_UP_PNG, LABELS_PNG, REPORT_NAME = "followup_vs_temperature.png", "labels.png", "report.md"
CI_METHOD = ("95% Wilson score interval; with several samples per instance at the effective sample size "
             "n / deff (Kish design effect of the instance clusters, between 1 and the samples per instance)")
PAIRED_METHOD = ("mean of per-instance differences over the same instances and sample indices; exact two-sided "
                 "sign test on the per-instance rates (ties dropped; McNemar's exact test at one sample per instance)")


# --------------------------------------------------------------------------- statistics

def clustered_rate(groups: Iterable[Iterable[bool | int]]) -> dict:
    """Rate of successes over every item of every group (an instance's samples), with its
    interval at the effective sample size (see the module docstring)."""
    groups = [g for g in (list(map(int, g)) for g in groups) if g]
    sizes = [len(g) for g in groups]
    n, k = sum(sizes), len(groups)
    if n == 0:
        return {"rate": None, "low": None, "high": None, "n": 0, "instances": 0, "design_effect": None}
    hits = sum(map(sum, groups))
    p, mean_size = hits / n, n / k
    if mean_size == 1:
        deff = 1.0
    elif hits in (0, n) or k < 2:
        deff = mean_size  # no variation to estimate from: count each instance once
    else:
        # Variance of the ratio estimator over clusters vs. that of n independent draws.
        cluster_var = sum((sum(g) - p * len(g)) ** 2 for g in groups) / (k * (k - 1) * mean_size ** 2)
        deff = min(mean_size, max(1.0, cluster_var / (p * (1 - p) / n)))
    low, high = wilson_interval(p * n / deff, n / deff)
    return {"rate": p, "low": low, "high": high, "n": n, "instances": k, "design_effect": deff}


# --------------------------------------------------------------------------- metrics

def _by_instance(records: Iterable[dict], key) -> dict:
    out: dict = defaultdict(lambda: defaultdict(list))
    for r in records:
        out[key(r)][r["task_id"]].append(r)
    return out


def summarize(replies: list[dict], generations: list[dict]) -> dict:
    """Per dataset: task accuracy of the single-turn replies, and per (condition, temperature)
    the genuine follow-up rate, label counts and the share changed vs the unperturbed turn."""
    datasets: dict = {}
    for dataset in dict.fromkeys(r["dataset"] for r in replies):
        mine = [r for r in replies if r["dataset"] == dataset]
        accuracy = clustered_rate([[r["score"] >= 1.0] for r in mine])
        accuracy["mean_score"] = sum(r["score"] for r in mine) / len(mine)
        accuracy["cut_off"] = sum(r.get("finish_reason") == "length" for r in mine)
        datasets[dataset] = {"accuracy": accuracy, "cells": []}
    cells = _by_instance(generations, lambda r: (r["dataset"], r["condition"], r["temperature"]))
    for (dataset, condition, temperature), per_instance in cells.items():
        flat = [g for gs in per_instance.values() for g in gs]
        rate = clustered_rate([[g["label"] == FOLLOW_UP for g in gs] for gs in per_instance.values()])
        changed = [g["changed"] for g in flat if g.get("changed") is not None]
        datasets[dataset]["cells"].append({
            "condition": condition, "temperature": temperature, "follow_up": rate,
            "labels": {label: n for label, n in Counter(g["label"] for g in flat).most_common()},
            "changed": sum(changed) / len(changed) if changed else None,
            "cut_off": sum(g.get("finish_reason") == "length" for g in flat),
        })
    return {"datasets": datasets, "ci_method": CI_METHOD}


def compare(baseline: list[dict], current: list[dict], baseline_replies: list[dict],
            current_replies: list[dict]) -> dict:
    """Paired differences (current - baseline) on what both runs hold."""
    def keyed(records: list[dict]) -> dict:
        return {(r["dataset"], r["condition"], r["temperature"], r["task_id"], r["sample"]): r for r in records}

    base, cur = keyed(baseline), keyed(current)
    pairs: dict = defaultdict(lambda: defaultdict(list))
    for key in base.keys() & cur.keys():
        dataset, condition, temperature, task_id, _ = key
        pairs[(dataset, condition, temperature)][task_id].append(
            (base[key]["label"] == FOLLOW_UP, cur[key]["label"] == FOLLOW_UP))
    order = list(dict.fromkeys((r["dataset"], r["condition"], r["temperature"]) for r in current))
    rows = []
    for (dataset, condition, temperature), per_instance in sorted(pairs.items(), key=lambda kv: order.index(kv[0])):
        rows.append({"dataset": dataset, "condition": condition, "temperature": temperature,
                     **_paired([list(zip(*samples)) for samples in per_instance.values()])})
    base_acc = {(r["dataset"], r["task_id"]): r["score"] >= 1.0 for r in baseline_replies}
    accuracy = []
    for dataset in dict.fromkeys(r["dataset"] for r in current_replies):
        both = [([base_acc[(dataset, r["task_id"])]], [r["score"] >= 1.0]) for r in current_replies
                if r["dataset"] == dataset and (dataset, r["task_id"]) in base_acc]
        if both:
            accuracy.append({"dataset": dataset, **_paired(both)})
    return {"follow_up": rows, "accuracy": accuracy, "method": PAIRED_METHOD}


def _paired(per_instance: list[tuple[list, list]]) -> dict:
    """Rates of both sides over paired instances and the sign test on per-instance differences."""
    base = [sum(a) / len(a) for a, _ in per_instance]
    cur = [sum(b) / len(b) for _, b in per_instance]
    k = len(per_instance)
    return {"instances": k, "baseline": sum(base) / k, "current": sum(cur) / k,
            "difference": sum(c - b for b, c in zip(base, cur)) / k,
            **sign_test([c - b for b, c in zip(base, cur)])}


# --------------------------------------------------------------------------- plots

def _save(fig, path: Path) -> None:
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", dpi=110, bbox_inches="tight")
    with atomic_open(path, "wb") as handle:
        handle.write(buffer.getvalue())


def _pyplot():
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    return plt


def plot_follow_up(metrics: dict, path: Path, baseline: dict | None = None) -> None:
    """Genuine follow-up rate against temperature, one line per dataset and condition, with
    95% intervals; the baseline run dashed."""
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(6.0, 3.8))
    runs = [("", metrics, "-")] + ([("baseline ", baseline, "--")] if baseline else [])
    colours = {}
    for prefix, run, style in runs:
        for dataset, figures in run["datasets"].items():
            lines = defaultdict(list)
            for cell in figures["cells"]:
                lines[cell["condition"]].append(cell)
            for condition, cells in lines.items():
                cells = sorted(cells, key=lambda c: c["temperature"])
                name = f"{dataset} / {condition}" if len(run["datasets"]) > 1 else condition
                colour = colours.setdefault(name, f"C{len(colours) % 10}")
                # A small sideways shift per line keeps overlapping intervals apart.
                shift = 0.012 * (int(colour[1:]) - 1) + (0.004 if prefix else 0.0)
                xs = [c["temperature"] + shift for c in cells]
                ys = [100 * c["follow_up"]["rate"] for c in cells]
                err = [[y - 100 * c["follow_up"]["low"] for y, c in zip(ys, cells)],
                       [100 * c["follow_up"]["high"] - y for y, c in zip(ys, cells)]]
                ax.errorbar(xs, ys, yerr=err, marker="o", linestyle=style, color=colour, capsize=3,
                            label=prefix + name)
    ax.set_xlabel("temperature")
    ax.set_ylabel("genuine follow-ups (% of user turns)")
    ax.set_ylim(-2, 102)
    ax.set_title("Genuine follow-up rate (bars: 95% CI)")
    ax.legend(fontsize=7)
    _save(fig, path)
    plt.close(fig)


def plot_labels(metrics: dict, path: Path) -> None:
    """Share of each label per dataset, condition and temperature (stacked bars)."""
    plt = _pyplot()
    rows = [(dataset, cell) for dataset, figures in metrics["datasets"].items() for cell in figures["cells"]]
    names = [(f"{d} / " if len(metrics["datasets"]) > 1 else "") + f"{c['condition']} T={c['temperature']:g}"
             for d, c in rows]
    fig, ax = plt.subplots(figsize=(7.0, 0.45 * len(rows) + 1.6))
    left = [0.0] * len(rows)
    for index, label in enumerate(LABELS):
        shares = [100 * c["labels"].get(label, 0) / max(1, sum(c["labels"].values())) for _, c in rows]
        ax.barh(names, shares, left=left, color=f"C{index}", label=label)
        left = [a + b for a, b in zip(left, shares)]
    ax.set_xlim(0, 100)
    ax.set_xlabel("% of generated user turns")
    ax.invert_yaxis()
    ax.legend(fontsize=7, ncol=4, loc="upper center", bbox_to_anchor=(0.5, -0.18))
    ax.set_title("What the model writes as the user")
    _save(fig, path)
    plt.close(fig)


# --------------------------------------------------------------------------- markdown

def _pct(value: float | None) -> str:
    return "n/a" if value is None else f"{100 * value:.1f}%"


def _ci(figure: dict) -> str:
    if figure is None or figure.get("rate") is None:
        return "n/a"
    return f"{_pct(figure['rate'])} [{100 * figure['low']:.1f}, {100 * figure['high']:.1f}]"


def _p(value: float) -> str:
    return f"{value:.3f}" if value >= 0.001 else "<0.001"


def follow_up_table(metrics: dict) -> list[str]:
    """The headline table (also what the README quotes)."""
    lines = ["| dataset | perturbation | temperature | user turns (instances) | genuine follow-ups [95% CI] "
             "| changed vs unperturbed | most common label |", "|---|---|---|---|---|---|---|"]
    for dataset, figures in metrics["datasets"].items():
        for cell in figures["cells"]:
            top = next(iter(cell["labels"]), "n/a")
            share = cell["labels"].get(top, 0) / max(1, sum(cell["labels"].values()))
            lines.append(f"| {dataset} | {cell['condition']} | {cell['temperature']:g} | "
                         f"{cell['follow_up']['n']} ({cell['follow_up']['instances']}) | {_ci(cell['follow_up'])} | "
                         f"{_pct(cell['changed']) if cell['changed'] is not None else '-'} | "
                         f"{top} ({100 * share:.0f}%) |")
    return lines


def render_markdown(metrics: dict, examples: dict) -> str:
    s = metrics["settings"]
    lines = ["# FiC interaction-awareness probe", "",
             "Given `[user question; assistant reply]`, the model writes the next **user** turn; a judge labels it. "
             "A genuine follow-up reacts to the reply (asks about a step, questions the result, asks to finish a "
             "cut-off answer).", "",
             f"- model: `{s['model']}`; single-turn replies: {s['replies']}",
             f"- data: {', '.join(f'`{d}`' for d in s['data'])} (task {s['task']}, {s['instances']} instances)",
             f"- role switch: `{s['switch']}`; temperatures: {', '.join(f'{t:g}' for t in s['temperatures'])} "
             f"({s['samples']} samples per instance at each temperature above 0, one greedy); at most "
             f"{s['max_new_tokens']} tokens per user turn",
             f"- perturbations: {', '.join(s['perturbations']) or 'none'} (truncate keeps the first "
             f"{100 * s['truncate_fraction']:.0f}% of the reply's {s['truncate_unit']}; explicit_question appends one of: "
             f"{'; '.join(repr(q) for q in s['explicit_questions'])})",
             f"- **judge: {metrics['judge']['description']}**; {metrics['judge']['fallbacks']} of "
             f"{metrics['judge']['labelled']} labels fell back to the rule judge",
             f"- intervals: {metrics['ci_method']}",
             f"- wall time: {metrics['elapsed_s']:.0f} s ("
             + ", ".join(f"{name.replace('_', ' ')} {seconds:.0f} s" for name, seconds in metrics["phases_s"].items())
             + f"; {metrics['cpu_s']:.0f} CPU seconds)", "",
             "## Genuine follow-up rate", ""]
    lines += follow_up_table(metrics)
    lines += ["", "`changed vs unperturbed`: share of user turns whose text differs from the turn generated for the "
              "unperturbed reply with the same instance, temperature and sample index (at temperatures above 0 "
              "sampling noise changes text too).", "", f"![genuine follow-up rate vs temperature]({FOLLOW_UP_PNG})", "",
              "## Task accuracy of the single-turn replies", "",
              "Accuracy: the share of replies the task's scorer gives 1.0 (for math: the right final number).", "",
              "| dataset | instances | accuracy [95% CI] | mean task score | replies cut at max_new_tokens |",
              "|---|---|---|---|---|"]
    for dataset, figures in metrics["datasets"].items():
        acc = figures["accuracy"]
        lines.append(f"| {dataset} | {acc['n']} | {_ci(acc)} | {acc['mean_score']:.3f} | {acc['cut_off']} |")
    lines += ["", "## Label distribution", "", "| dataset | perturbation | temperature | " + " | ".join(LABELS) + " |",
              "|---|---|---|" + "---|" * len(LABELS)]
    for dataset, figures in metrics["datasets"].items():
        for cell in figures["cells"]:
            total = max(1, sum(cell["labels"].values()))
            lines.append(f"| {dataset} | {cell['condition']} | {cell['temperature']:g} | "
                         + " | ".join(f"{100 * cell['labels'].get(label, 0) / total:.0f}%" for label in LABELS) + " |")
    lines += ["", f"![label distribution]({LABELS_PNG})", ""]
    comparison = metrics.get("comparison")
    if comparison:
        lines += ["## Against the baseline checkpoint", "",
                  f"Baseline run: `{metrics['baseline']['out']}` (model `{metrics['baseline']['model']}`). "
                  f"Paired: {comparison['method']}.", "",
                  "| dataset | perturbation | temperature | instances | baseline | this model | difference "
                  "| instances better / worse / tied | sign test p |", "|---|---|---|---|---|---|---|---|---|"]
        for r in comparison["follow_up"]:
            lines.append(f"| {r['dataset']} | {r['condition']} | {r['temperature']:g} | {r['instances']} | "
                         f"{_pct(r['baseline'])} | {_pct(r['current'])} | {100 * r['difference']:+.1f} pts | "
                         f"{r['better']} / {r['worse']} / {r['tied']} | {_p(r['p_value'])} |")
        for r in comparison["accuracy"]:
            lines.append(f"| {r['dataset']} | task accuracy | - | {r['instances']} | {_pct(r['baseline'])} | "
                         f"{_pct(r['current'])} | {100 * r['difference']:+.1f} pts | "
                         f"{r['better']} / {r['worse']} / {r['tied']} | {_p(r['p_value'])} |")
        lines.append("")
    if examples:
        lines += ["## One example per label", ""]
        for label, example in examples.items():
            text = " ".join(example["user_turn"].split())
            lines.append(f"- **{label}** ({example['condition']}, T={example['temperature']:g}, "
                         f"`{example['task_id']}`): {text[:240]!r}")
        lines.append("")
    lines += ["Every generated user turn with its label: `generations.jsonl`; replies and their scores: "
              "`replies.jsonl`; all figures: `metrics.json`.", ""]
    return "\n".join(lines)


def write_report(out: Path, metrics: dict, examples: dict, baseline: dict | None = None) -> Path:
    plot_follow_up(metrics, out / FOLLOW_UP_PNG, baseline)
    plot_labels(metrics, out / LABELS_PNG)
    path = out / REPORT_NAME
    write_text(path, render_markdown(metrics, examples))
    return path
