"""`curves.png` beside a training run's `metrics.jsonl`: the figures of every step, drawn.

- SFT: loss, learning rate, gradient norm, tokens per second, the peak memory so far, and the
  dev curve (`dev_*`) when the run scores itself on dev instances as it trains.
- VASD: the divergence per answer token, the regulariser terms (anchor cross-entropy and
  reference divergence), rollout accuracy, premature-answer and final-not-answer rates,
  tokens per rollout, the peak memory so far, and the held-out dev figures (`dev_*`) when the
  run scores itself as it trains.

`RunLog` (fic.training.loop) redraws it every few minutes and at the end; `fic report RUN_DIR`
redraws it from the file at any time, also while the run is writing it (a line being written
is passed over, and the file is only read). This module does not import torch.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from fic.core.plots import integer_axis, no_data, pyplot, save_png
from fic.core.records import read_growing_log

CURVES_PNG = "curves.png"
# (title, y label, metric keys drawn on the panel, or the prefix of the keys it draws)
SFT_PANELS = [
    ("loss", "cross-entropy per target token", ["loss"]),
    ("learning rate", "learning rate", ["lr"]),
    ("gradient norm", "gradient norm (before clipping)", ["grad_norm"]),
    ("throughput", "target tokens / s", ["target_tokens_per_s"]),
    ("memory", "peak memory of the process (MiB)", ["peak_memory_mb"]),
    ("dev curve", "points (rates: share)", "dev_"),  # every dev_* key (dev.every: the plateau rule reads it)
]
VASD_PANELS = [
    ("divergence (distillation term)", "divergence per answer token", ["divergence_per_token", "loss"]),
    ("regulariser terms", "per token", ["anchor_ce", "reference_divergence"]),
    ("rollout accuracy", "share of rollouts correct", ["rollout_accuracy"]),
    ("premature answers", "share of rollouts", ["premature_answer_rate", "final_not_answer_rate"]),
    ("tokens", "generated tokens per rollout", ["rollout_tokens"]),
    ("memory", "peak memory of the process (MiB)", ["peak_memory_mb"]),
    ("held-out dev tasks", "value", "dev_"),  # every dev_* key (dev.every)
]


def read_metrics(path: str | Path) -> list[dict]:
    """The step records of a `metrics.jsonl`, read only (`fic.core.records.read_growing_log`: the
    last line, the one a running job is writing, is passed over when torn, not repaired; a broken
    line elsewhere is a one-line error); a record without a numeric step is no step record."""
    return [record for _, record in read_growing_log(path, "a metrics.jsonl log")
            if isinstance(record, dict) and isinstance(record.get("step"), (int, float))
            and not isinstance(record.get("step"), bool)]


def run_kind(records: list[dict]) -> str:
    """"vasd" when the records carry rollout figures, else "sft"."""
    return "vasd" if any("rollout_accuracy" in r or "divergence_per_token" in r for r in records) else "sft"


def _series(records: list[dict], key: str) -> tuple[list[float], list[float]]:
    points = [(r["step"], r[key]) for r in records
              if isinstance(r.get(key), (int, float)) and not isinstance(r.get(key), bool)]
    return [p[0] for p in points], [float(p[1]) for p in points]


def curves_figure(records: list[dict], *, kind: str | None = None, title: str = "") -> Any:
    """The run's figure: one panel per quantity, each with its title and axis labels."""
    plt = pyplot()
    kind = kind or run_kind(records)
    panels = SFT_PANELS if kind == "sft" else VASD_PANELS
    columns = 2 if len(panels) <= 4 else 3
    rows = -(-len(panels) // columns)
    fig, axes = plt.subplots(rows, columns, figsize=(4.2 * columns, 2.9 * rows), squeeze=False)
    for ax, (name, ylabel, keys) in zip(axes.flat, panels):
        if isinstance(keys, str):
            keys = sorted({k for r in records for k in r if k.startswith(keys)})
        drawn = False
        for key in keys:
            steps, values = _series(records, key)
            if key == "loss" and kind == "vasd" and _series(records, "divergence_per_token")[0]:
                continue  # VASD's loss is the divergence plus weighted terms: shown through its parts
            if steps:
                ax.plot(steps, values, marker="." if len(steps) < 40 else None, linewidth=1.2, label=key)
                drawn = True
        if not drawn:
            no_data(ax, "not logged in this run")
        elif len(keys) > 1:
            ax.legend(fontsize=7, loc="best")
        ax.set_title(name, fontsize=9)
        ax.set_xlabel("optimizer step", fontsize=8)
        ax.set_ylabel(ylabel, fontsize=8)
        ax.tick_params(labelsize=7)
        integer_axis(ax)
        if name == "learning rate":
            ax.ticklabel_format(axis="y", style="sci", scilimits=(-3, 3))
    for ax in list(axes.flat)[len(panels):]:
        ax.remove()
    last = max((r["step"] for r in records), default=0)
    fig.suptitle(f"{title or kind.upper()}: {len(records)} logged steps, last step {last}", fontsize=10)
    fig.tight_layout()
    return fig


def write_curves(run_dir: str | Path, out: str | Path | None = None) -> Path | None:
    """Draw `run_dir/metrics.jsonl` into `out` (default `run_dir/curves.png`); None when the
    run has logged no step yet."""
    run_dir = Path(run_dir)
    records = read_metrics(run_dir / "metrics.jsonl")
    if not records:
        return None
    path = Path(out) if out is not None else run_dir / CURVES_PNG
    save_png(curves_figure(records, title=f"{run_kind(records).upper()} run {run_dir.name}"), path)
    return path
