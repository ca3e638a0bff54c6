"""The statistics FiC's reports state beside every figure.

- `wilson_interval`: a 95% interval for a proportion (also with an effective, non-integer n).
- `sign_test`: the exact two-sided sign test on paired differences (ties dropped); with 0/1
  outcomes per instance it is McNemar's exact test.
- `paired_bootstrap`: a percentile interval for any statistic of paired per-instance scores,
  resampling instances (the same draw for every run compared), as the recovery rate and
  retention need: both are ratios of means over the same instances.
"""

from __future__ import annotations

import math
from typing import Callable, Iterable, Sequence

import numpy as np

Z95 = 1.959963984540054

# The per-view figures a training curve keeps of a live evaluation (SFT's dev curve, VASD's
# held-out evaluation): P and first-answer accuracy (0-100), the premature-answer rate (0-1).
CURVE_FIGURES = ("P", "first_answer_accuracy", "premature_answer_rate")


def wilson_interval(successes: float, n: float, z: float = Z95) -> tuple[float, float]:
    """The Wilson score interval of a proportion (successes and n may be effective, non-integer)."""
    if n <= 0:
        raise ValueError("a proportion needs n > 0")
    p = successes / n
    denominator = 1 + z * z / n
    centre = (p + z * z / (2 * n)) / denominator
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / denominator
    # The interval holds p; at p = 0 or 1 rounding would put its end a hair inside (1 - 1e-16), and a
    # plot's error bar would come out negative.
    return max(0.0, min(p, centre - half)), min(1.0, max(p, centre + half))


def sign_test(differences: Iterable[float]) -> dict:
    """Exact two-sided sign test: how often the difference is positive vs negative (ties dropped)."""
    differences = list(differences)
    wins = sum(d > 0 for d in differences)
    losses = sum(d < 0 for d in differences)
    m = wins + losses
    tail = sum(math.comb(m, i) for i in range(min(wins, losses) + 1)) / 2 ** m if m else 1.0
    return {"better": wins, "worse": losses, "tied": len(differences) - m, "p_value": min(1.0, 2 * tail)}


def paired_bootstrap(columns: Sequence[Sequence[float]], statistic: Callable[..., float | None], *,
                     resamples: int = 2000, seed: int = 0, level: float = 0.95) -> tuple[float | None, float | None]:
    """Percentile interval of `statistic(*column_means)` over bootstrap resamples of instances.

    `columns[j][i]` is instance i's score in run j (every column over the same instances, in
    the same order); each resample draws instances with replacement and takes every column's
    mean over the same draw. Resamples where the statistic is undefined (a zero denominator)
    are left out; None when fewer than half are defined."""
    data = np.asarray(columns, dtype=float)
    if data.ndim != 2 or data.shape[1] == 0:
        raise ValueError("paired_bootstrap needs equal-length, non-empty columns")
    rng = np.random.default_rng(seed)
    draws = rng.integers(0, data.shape[1], size=(resamples, data.shape[1]))
    means = data[:, draws].mean(axis=2)  # [columns, resamples]
    values = [statistic(*means[:, r]) for r in range(resamples)]
    values = np.asarray([v for v in values if v is not None and math.isfinite(v)])
    if len(values) < resamples / 2:
        return None, None
    tail = (1 - level) / 2
    return float(np.quantile(values, tail)), float(np.quantile(values, 1 - tail))
