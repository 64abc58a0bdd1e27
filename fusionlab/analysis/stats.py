"""Intervals for rates and ratios (Wilson for proportions, percentile bootstrap for anything else) and the exact
McNemar test for paired pass/fail outcomes."""
from __future__ import annotations

import math
from typing import Any, Callable, Sequence

import numpy as np

from ..errors import FusionLabError


def wilson(successes: int, n: int, z: float = 1.96) -> tuple[float, float]:
    """95% Wilson score interval of a proportion; (0, 1) when n == 0."""
    if n == 0:
        return 0.0, 1.0
    p = successes / n
    denom = 1 + z * z / n
    centre = (p + z * z / (2 * n)) / denom
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / denom
    return max(0.0, min(p, centre - half)), min(1.0, max(p, centre + half))  # rounding never excludes p


def bootstrap_ci(values: Sequence[float], stat: Callable[[np.ndarray], float] = np.mean, n_boot: int = 2000,
                 seed: int = 0, level: float = 0.95) -> tuple[float, float]:
    x = np.asarray(values, dtype=float)
    if x.size == 0:
        return float("nan"), float("nan")
    rng = np.random.default_rng(seed)
    stats = [stat(x[rng.integers(0, x.size, x.size)]) for _ in range(n_boot)]
    lo, hi = np.quantile(stats, [(1 - level) / 2, 1 - (1 - level) / 2])
    return float(lo), float(hi)


def cluster_bootstrap_ci(values: Sequence[float], clusters: Sequence[Any], n_boot: int = 2000, seed: int = 0,
                         level: float = 0.95) -> tuple[float, float]:
    """Percentile CI of the mean resampling whole clusters (documents), not the values (chunks): chunks of one file
    are not independent, and a chunk bootstrap over a handful of files is too narrow. The mean of a draw is over
    the chunks it holds (a big document weighs as many chunks as it has)."""
    x = np.asarray(values, dtype=float)
    if x.size == 0:
        return float("nan"), float("nan")
    labels = np.asarray([str(c) for c in clusters])
    if labels.shape != x.shape:
        raise FusionLabError(f"cluster_bootstrap_ci: {x.size} values but {labels.size} cluster labels; give one "
                             "document label per value.")
    names, inverse = np.unique(labels, return_inverse=True)
    sums, counts = np.bincount(inverse, weights=x), np.bincount(inverse).astype(float)
    rng = np.random.default_rng(seed)
    draws = rng.integers(0, len(names), (n_boot, len(names)))
    stats = sums[draws].sum(1) / counts[draws].sum(1)
    lo, hi = np.quantile(stats, [(1 - level) / 2, 1 - (1 - level) / 2])
    return float(lo), float(hi)


def interval(lo: float, hi: float, spec: str = ".3f") -> str:
    """'[lo, hi]', both ends in one format spec: the one way the lab writes an interval ('+.3f', '.0%', ...)."""
    return f"[{lo:{spec}}, {hi:{spec}}]"


def mcnemar(a: Sequence[bool], b: Sequence[bool]) -> dict[str, Any]:
    """Exact McNemar test on paired outcomes (two-sided binomial on the discordant pairs): is b different from a?"""
    x, y = np.asarray(a, dtype=bool), np.asarray(b, dtype=bool)
    only_a, only_b = int((x & ~y).sum()), int((~x & y).sum())
    n, k = only_a + only_b, min(only_a, only_b)
    p = min(1.0, 2 * sum(math.comb(n, i) for i in range(k + 1)) / 2**n) if n else 1.0
    return {"only_baseline": only_a, "only_setting": only_b, "p_value": p}
