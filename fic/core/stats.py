"""The statistics FiC's reports state beside every figure.

- `wilson_interval`: a 95% interval for a proportion (also with an effective, non-integer n).
- `sign_test`: the exact two-sided sign test on paired differences (ties dropped); with 0/1
  outcomes per instance it is McNemar's exact test.
- `paired_difference`: the mean difference of two runs' per-instance scores on the same
  instances, in points, with a 95% t interval of the paired differences and the exact sign test
  (a gate's full-minus-sharded gap, an arm against its comparator).
- `mean_interval`: the 95% t interval of a mean (over seeds: the seed is the unit of replication).
- `sign_test_power`, `detectable_gain`: what a paired comparison of N instances in k seeds can
  detect, under the rule "more wins than losses at p < alpha in every seed".
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


def _log_binomial(n: int, k: int, p: float) -> float:
    if p <= 0.0 or p >= 1.0:
        return 0.0 if (k == 0 and p <= 0.0) or (k == n and p >= 1.0) else -math.inf
    return math.lgamma(n + 1) - math.lgamma(k + 1) - math.lgamma(n - k + 1) + k * math.log(p) + (n - k) * math.log1p(-p)


def sign_test_power(n: int, discordant: float, gain: float, seeds: int = 1, alpha: float = 0.05) -> float:
    """The chance that the exact sign test shows a gain (more wins than losses, p < alpha) in every
    one of `seeds` independent comparisons of `n` paired 0/1 instances, when a share `discordant` of
    instances differ between the two runs and the true gain is `gain` points: wins are then
    (discordant + gain / 100) / 2 of the instances, losses (discordant - gain / 100) / 2."""
    q, g = float(discordant), gain / 100.0
    if not 0.0 < q <= 1.0:
        raise ValueError("discordant must be a share in (0, 1]")
    win = min(1.0, (q + g) / (2 * q))
    power = 0.0
    for d in range(1, n + 1):
        weight = math.exp(_log_binomial(n, d, q))
        if weight < 1e-12:
            continue
        # the fewest wins of d that pass: more wins than losses and a two-sided exact p below alpha
        tail, needed = 0.0, None
        for w in range(d, d // 2, -1):
            tail += math.comb(d, w) / 2 ** d
            if 2 * tail >= alpha:
                break
            needed = w
        if needed is not None:
            power += weight * sum(math.exp(_log_binomial(d, w, win)) for w in range(needed, d + 1))
    return power ** seeds


def detectable_gain(n: int, discordant: float, seeds: int = 1, power: float = 0.8, alpha: float = 0.05) -> float | None:
    """The smallest true gain (points, in steps of 0.5) that `sign_test_power` finds with at least
    `power`; None when no gain the discordance allows reaches it."""
    gain = 0.5
    while gain <= 100.0 * discordant:
        if sign_test_power(n, discordant, gain, seeds, alpha) >= power:
            return gain
        gain += 0.5
    return None


# Student's t, 97.5% quantiles for 1-30 degrees of freedom; above 30, a Cornish-Fisher step from z.
T975 = (12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228, 2.201, 2.179, 2.160, 2.145,
        2.131, 2.120, 2.110, 2.101, 2.093, 2.086, 2.080, 2.074, 2.069, 2.064, 2.060, 2.056, 2.052, 2.048,
        2.045, 2.042)


def t975(df: int) -> float:
    if df < 1:
        raise ValueError("a t interval needs at least 2 values")
    return T975[df - 1] if df <= len(T975) else Z95 + (Z95 ** 3 + Z95) / (4 * df)


def mean_interval(values: Sequence[float]) -> dict:
    """The mean of `values` and its 95% t interval (n >= 2)."""
    values = [float(v) for v in values]
    n = len(values)
    mean = sum(values) / n if n else math.nan
    if n < 2:
        raise ValueError("a t interval needs at least 2 values")
    sd = math.sqrt(sum((v - mean) ** 2 for v in values) / (n - 1))
    half = t975(n - 1) * sd / math.sqrt(n)
    return {"n": n, "mean": mean, "low": mean - half, "high": mean + half}


def paired_difference(first: Sequence[float], second: Sequence[float]) -> dict:
    """mean(first) - mean(second) in points (scores in [0, 1], the same instances in the same
    order), its 95% t interval over the per-instance differences, and the exact sign test
    (McNemar's for 0/1 scores): `better` counts instances where `first` scored higher."""
    if len(first) != len(second) or not first:
        raise ValueError("paired_difference needs two non-empty score lists over the same instances")
    differences = [100.0 * (a - b) for a, b in zip(first, second)]
    interval = mean_interval(differences)
    return {"n": interval["n"], "first": 100.0 * sum(first) / len(first), "second": 100.0 * sum(second) / len(second),
            "difference": interval["mean"], "low": interval["low"], "high": interval["high"],
            **sign_test(differences)}


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
