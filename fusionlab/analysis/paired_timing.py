"""Side-by-side timing that a noisy shared machine cannot fool: A and B alternate (ABAB...), each pair gives one
ratio B/A, and repetitions continue until the bootstrap 95% CI of the median ratio is narrower than ±halfwidth (or the
repetition budget ends). Drift then hits both sides of every pair alike."""
from __future__ import annotations

import time
from typing import Any, Callable

import numpy as np


def timed(fn: Callable[[], Any]) -> float:
    """Seconds `fn` took, or the seconds it returns itself (to time only part of its work, e.g. decode not prefill)."""
    t = time.perf_counter()
    out = fn()
    return float(out) if isinstance(out, float) else time.perf_counter() - t


def ratio_ci(ratios: list[float], n_boot: int = 2000, seed: int = 0) -> tuple[float, float, float]:
    r = np.asarray(ratios)
    rng = np.random.default_rng(seed)
    meds = np.median(r[rng.integers(0, len(r), (n_boot, len(r)))], axis=1)
    lo, hi = np.quantile(meds, [0.025, 0.975])
    return float(np.median(r)), float(lo), float(hi)


def paired_ratio(a: Callable[[], Any], b: Callable[[], Any], min_reps: int = 5, max_reps: int = 30,
                 halfwidth: float = 0.03, warmup: int = 1) -> dict[str, Any]:
    """Median of per-pair ratios time(b) / time(a), its bootstrap CI, and the raw times."""
    for _ in range(warmup):
        a(), b()
    ta, tb = [], []
    while len(ta) < max_reps:
        ta.append(timed(a))
        tb.append(timed(b))
        if len(ta) >= min_reps:
            med, lo, hi = ratio_ci([y / x for x, y in zip(ta, tb)])
            if hi - lo <= 2 * halfwidth:
                break
    med, lo, hi = ratio_ci([y / x for x, y in zip(ta, tb)])
    return {"ratio": med, "ci_low": lo, "ci_high": hi, "reps": len(ta), "a_median_s": float(np.median(ta)),
            "b_median_s": float(np.median(tb)), "converged": hi - lo <= 2 * halfwidth}
