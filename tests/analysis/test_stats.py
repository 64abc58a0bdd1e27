"""Intervals: Wilson for proportions, percentile bootstrap for the rest."""
from __future__ import annotations

from fusionlab import stats


def test_wilson_and_bootstrap():
    lo, hi = stats.wilson(12, 100)
    assert (round(lo, 3), round(hi, 3)) == (0.070, 0.198)  # 12/100, standard Wilson 95% interval
    assert stats.wilson(0, 0) == (0.0, 1.0)
    for n in range(1, 60):  # the interval always contains the observed rate, even at 0 and 1
        for k in (0, n // 2, n):
            lo, hi = stats.wilson(k, n)
            assert lo <= k / n <= hi
    lo, hi = stats.bootstrap_ci([1.0] * 10)
    assert lo == hi == 1.0
