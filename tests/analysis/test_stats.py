"""Intervals: Wilson for proportions, percentile bootstrap for the rest."""
from __future__ import annotations

import math

import pytest

from fusionlab import stats
from fusionlab.errors import FusionLabError


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


def test_a_cluster_bootstrap_resamples_documents_not_chunks():
    """Two documents, twenty identical chunks each: the chunks say nothing the documents do not, so the interval
    spans both documents' means; a chunk bootstrap would pretend 40 independent draws."""
    from fusionlab.analysis.stats import bootstrap_ci, cluster_bootstrap_ci

    values, docs = [0.0] * 20 + [1.0] * 20, ["a"] * 20 + ["b"] * 20
    lo, hi = cluster_bootstrap_ci(values, docs)
    assert lo == 0.0 and hi == 1.0
    c_lo, c_hi = bootstrap_ci(values)
    assert c_lo > 0.25 and c_hi < 0.75  # the too-narrow interval notebook 07 used to report
    same = cluster_bootstrap_ci(values, [f"c{i}" for i in range(40)])  # one document per chunk: the chunk bootstrap
    assert same[0] > 0.25 and same[1] < 0.75
    assert all(map(math.isnan, cluster_bootstrap_ci([], [])))
    with pytest.raises(FusionLabError, match="one document label per value"):
        cluster_bootstrap_ci([1.0, 2.0], ["a"])


def test_paired_gain_counts_documents():
    import pandas as pd
    from fusionlab.experiments.nb07_fusers import paired_gain

    rows = [{"setting": s, "role": "x", "domain": "en", "chunk": k, "doc": f"d{k // 5}", "nll": v + (k // 5) * 0.5}
            for s, v in (("master", 1.0), ("fuser", 0.9)) for k in range(10)]
    g = paired_gain(pd.DataFrame(rows), "master").set_index("domain")
    assert g.loc["en", "n"] == 10 and g.loc["en", "docs"] == 2
    assert g.loc["en", "delta"] == pytest.approx(-0.1) and g.loc["en", "lo"] == pytest.approx(-0.1)
    assert g.loc["all", "pooled"] == "en"  # no domain has MIN_DOCS documents: every domain pools, named


def test_a_thin_domain_stays_out_of_the_pooled_gain():
    import pandas as pd
    from fusionlab.experiments.nb07_curve_stats import MIN_DOCS
    from fusionlab.experiments.nb07_fusers import paired_gain

    rows = []
    for dom, docs, gain in (("code", MIN_DOCS, -0.1), ("zh", 2, +0.5)):
        for k in range(2 * docs):
            rows += [{"setting": "master", "domain": dom, "chunk": f"{dom}{k}", "doc": f"{dom}/{k // 2}", "nll": 2.0},
                     {"setting": "fuser", "domain": dom, "chunk": f"{dom}{k}", "doc": f"{dom}/{k // 2}",
                      "nll": 2.0 + gain}]
    g = paired_gain(pd.DataFrame(rows), "master").set_index("domain")
    assert g.loc["all", "pooled"] == "code" and g.loc["all", "delta"] == pytest.approx(-0.1)
    assert g.loc["zh", "delta"] == pytest.approx(0.5) and g.loc["all", "docs"] == MIN_DOCS
