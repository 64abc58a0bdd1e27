"""The learning curve's numbers and verdicts (notebook 07), from `nb07_learning_curve.measure`'s per-chunk rows; the
rules are tested on hand-made frames, degenerate ones included.

    curve_table   per (variant, budget, domain): held-out NLL change vs the master, the constant control, the
                  shuffled-pairing control and (largest fuser) itself reading another document; CIs resample
                  documents (cluster bootstrap)
    trend         fuser - constant against log2(budget): the slope (nats per doubling), its CI over documents, and the
                  budget at which the fitted line would cross 0 (the fuser catching the constant control)
    curve_verdict one rule per fuser (X08, `nb07_claims.curve_claim`, is judged from these)
    seed_table    the same pooled rows per training seed, at the budgets every seed reached: the curve is the first
                  seed's runs, and a gain the verdict reads must hold in every seed (`verdicts`)
"""
from __future__ import annotations

from typing import Any

import numpy as np
import pandas as pd

from ..analysis.stats import cluster_bootstrap_ci

MASTER, CONSTANT, OTHER = "master alone", "constant", "other document"
MIN_DOCS = 5
"""A domain pools into the verdict only with this many held-out documents (fewer: reported, not pooled)."""
MIN_BUDGETS = 3
"""A trend needs at least this many budgets."""
REACH = 16
"""A trend counts only if its line reaches the constant control within this multiple of the largest budget (four
more doublings): a significant but tiny slope that crosses at 10^9 tokens is no trend a CPU can follow."""
CURVE_VERDICTS = ("beats the constant control", "trends toward the constant control", "does not trend there",
                  "inconclusive")


def first_seed(nll: pd.DataFrame) -> pd.DataFrame:
    """The curve's rows: the first seed's runs (the master alone is seed 0). Further seeds repeat only some runs at
    some budgets; pooling them into the curve would average unlike things, so they go to `seed_table` alone."""
    if "seed" not in nll:
        return nll
    return nll[(nll["seed"] == nll["seed"].min()) | (nll["variant"] == MASTER)]


def _wide(nll: pd.DataFrame) -> pd.DataFrame:
    return first_seed(nll).pivot_table(index=["domain", "doc", "chunk"], columns=["variant", "budget"], values="nll")


def pooled_domains(nll: pd.DataFrame) -> list[str]:
    docs = nll.groupby("domain")["doc"].nunique()
    return sorted(docs[docs >= MIN_DOCS].index)


def _against(variant: str, variants: set[str]) -> list[tuple[str, str | None]]:
    """(label, variant to compare with; None = the master at budget 0)."""
    out: list[tuple[str, str | None]] = [(MASTER, None)]
    if variant != CONSTANT and CONSTANT in variants:
        out.append((CONSTANT, CONSTANT))
    shuffled = variant.replace("fuser", "shuffled", 1)  # the control of the same width, never another's
    if variant.startswith("fuser") and shuffled in variants:
        out.append(("shuffled", shuffled))
    if f"{variant}, {OTHER}" in variants:
        out.append((OTHER, f"{variant}, {OTHER}"))
    return out


def curve_table(nll: pd.DataFrame) -> pd.DataFrame:
    """One row per (variant, budget, domain | 'pooled', against): n chunks, documents, mean change, 95 % CI."""
    nll = first_seed(nll)
    wide = _wide(nll)
    variants = set(nll["variant"]) - {MASTER}
    pooled = pooled_domains(nll)
    rows = []
    for v in sorted(variants):
        for b in sorted(nll.loc[nll["variant"] == v, "budget"].unique()):
            for label, other in _against(v, variants):
                ref = wide[(MASTER, 0)] if other is None else wide.get((other, b))
                if ref is None:
                    continue
                d = (wide[(v, b)] - ref).dropna()
                parts = [(dom, g) for dom, g in d.groupby(level="domain")]
                parts.append(("pooled", d[d.index.get_level_values("domain").isin(pooled)]))
                for dom, g in parts:
                    docs = g.index.get_level_values("doc")
                    lo, hi = cluster_bootstrap_ci(g.to_numpy(), docs) if len(g) else (np.nan, np.nan)
                    rows.append({"variant": v, "budget": int(b), "domain": dom, "against": label, "n": len(g),
                                 "docs": int(docs.nunique()), "delta": float(g.mean()) if len(g) else np.nan,
                                 "lo": lo, "hi": hi})
    return pd.DataFrame(rows)


def _fit(x: np.ndarray, y: np.ndarray) -> tuple[float, float]:
    slope, intercept = np.polyfit(x, y, 1)
    return float(slope), float(intercept)


def _crossing(slope: float, intercept: float) -> float:
    """The budget where intercept + slope * log2(b) = 0, approached from above (inf: the line never gets there)."""
    if slope >= 0 or -intercept / slope > 60:
        return float("inf")
    return float(2 ** (-intercept / slope))


def trend(nll: pd.DataFrame, variant: str, against: str = CONSTANT, n_boot: int = 2000, seed: int = 0) -> dict[str, Any]:
    """Least-squares line of the pooled mean (variant - against) over log2(budget), with a bootstrap over documents
    (each draw resamples whole files, the same files at every budget): slope, its CI, and the crossing budget."""
    wide = _wide(nll)
    wide = wide[wide.index.get_level_values("domain").isin(pooled_domains(nll))]
    budgets = sorted(b for (v, b) in wide.columns if v == variant and (against, b) in wide.columns)
    out: dict[str, Any] = {"variant": variant, "against": against, "budgets": len(budgets)}
    if len(budgets) < 2 or wide.empty:
        return {**out, "slope": np.nan, "lo": np.nan, "hi": np.nan, "crossing": np.nan, "crossing_lo": np.nan,
                "crossing_hi": np.nan, "last": np.nan, "docs": 0}
    diff = np.stack([(wide[(variant, b)] - wide[(against, b)]).to_numpy() for b in budgets], 1)  # (chunks, budgets)
    docs = wide.index.get_level_values("doc").to_numpy()
    x = np.log2(np.asarray(budgets, dtype=float))
    slope, intercept = _fit(x, diff.mean(0))
    names, inv = np.unique(docs, return_inverse=True)
    sums = np.stack([np.bincount(inv, weights=diff[:, j]) for j in range(len(budgets))], 1)  # (docs, budgets)
    counts = np.bincount(inv).astype(float)
    rng = np.random.default_rng(seed)
    draws = rng.integers(0, len(names), (n_boot, len(names)))
    means = sums[draws].sum(1) / counts[draws].sum(1)[:, None]  # (n_boot, budgets)
    fits = np.array([_fit(x, m) for m in means])
    cross = np.array([_crossing(s, i) for s, i in fits])
    return {**out, "slope": slope, "lo": float(np.quantile(fits[:, 0], 0.025)),
            "hi": float(np.quantile(fits[:, 0], 0.975)), "crossing": _crossing(slope, intercept),
            "crossing_lo": float(np.quantile(cross, 0.025)), "crossing_hi": float(np.quantile(cross, 0.975)),
            "last": float(diff[:, -1].mean()), "docs": len(names)}


def curve_verdict(table: pd.DataFrame, tr: dict[str, Any]) -> str:
    """One fuser's verdict from its pooled rows and its trend against the constant control:

    beats the constant control   at some budget the CI of fuser - constant, of fuser - shuffled (its own width)
                                 *and* of fuser - itself reading another document lies below 0
    ahead of the constant, not of its controls
                                 ahead of the constant at some budget, both controls measured there, but at no such
                                 budget does it beat both: what it gains over the constant, a fuser fed another
                                 document's K/V gains too (the architecture's, not the slave's); a control missing:
                                 inconclusive
    trends toward ...            not yet, but the slope's CI lies below 0 (it gains on the constant per doubling) and
                                 the line reaches 0 within REACH x the largest budget
    does not trend there         the slope's CI reaches 0 or above, or the line gets there only beyond that reach
    inconclusive                 fewer than 2 documents, or nothing moved (an all-zero grid); short of a gain, fewer
                                 than MIN_BUDGETS budgets (no trend from two points)
    """
    rows = table[(table["variant"] == tr["variant"]) & (table["domain"] == "pooled")]
    if tr.get("docs", 0) < 2 or rows.empty:
        return "inconclusive"
    moved = rows[rows["against"] == MASTER]
    if not ((moved["lo"] != 0) | (moved["hi"] != 0)).any():
        return "inconclusive"
    by_budget = rows.pivot_table(index="budget", columns="against", values="hi")
    ahead = by_budget.get(CONSTANT, pd.Series(dtype=float)) < 0
    if bool(ahead.any()):  # a gain counts only against a control that removes the slave's information as well
        if not {"shuffled", OTHER} <= set(by_budget) or by_budget.loc[ahead, ["shuffled", OTHER]].isna().any().any():
            return "inconclusive"
        if bool((ahead & (by_budget["shuffled"] < 0) & (by_budget[OTHER] < 0)).any()):
            return "beats the constant control"
        return "ahead of the constant, not of its controls"
    if tr["budgets"] < MIN_BUDGETS or not np.isfinite(tr["slope"]):
        return "inconclusive"
    if tr["hi"] < 0 and tr["crossing"] <= REACH * max(table["budget"]):
        return "trends toward the constant control"
    return "does not trend there"


def seed_table(nll: pd.DataFrame) -> pd.DataFrame:
    """`curve_table`'s pooled rows once per training seed, for the runs and budgets every seed has (the master alone,
    scored once, is every seed's baseline). Empty with fewer than two seeds."""
    if "seed" not in nll or nll["seed"].nunique() < 2:
        return pd.DataFrame(columns=["variant", "budget", "domain", "against", "n", "docs", "delta", "lo", "hi", "seed"])
    runs = nll[nll["variant"] != MASTER]
    seeds = sorted(runs["seed"].unique())
    shared = set.intersection(*(set(map(tuple, g[["variant", "budget"]].drop_duplicates().to_numpy()))
                                for _, g in runs.groupby("seed")))
    keep = runs[[(v, b) in shared for v, b in zip(runs["variant"], runs["budget"])]]
    master = nll[nll["variant"] == MASTER]
    parts = [curve_table(pd.concat([master, keep[keep["seed"] == s]]).assign(seed=s)).assign(seed=s) for s in seeds]
    out = pd.concat(parts, ignore_index=True)
    return out[out["domain"] == "pooled"].reset_index(drop=True)


def _beats_in_every_seed(seeds: pd.DataFrame, variant: str) -> bool:
    """At some budget every seed's fuser lies below the constant and both of its own controls (CI highs < 0)."""
    rows = seeds[seeds["variant"] == variant]
    if rows.empty:
        return True  # no further seed ran this fuser: nothing to contradict the first
    hi = rows.pivot_table(index=["seed", "budget"], columns="against", values="hi")
    if not {CONSTANT, "shuffled", OTHER} <= set(hi):
        return False
    beats = ((hi[CONSTANT] < 0) & (hi["shuffled"] < 0) & (hi[OTHER] < 0)).groupby(level="budget").all()
    return bool(beats.any())


def verdicts(nll: pd.DataFrame, table: pd.DataFrame | None = None) -> pd.DataFrame:
    """Each fuser's trend against the constant control, with its verdict. A fuser whose first seed beats the
    constant control, but not in every further seed at one shared budget, is inconclusive (a seed's luck)."""
    table = curve_table(nll) if table is None else table
    seeds = seed_table(nll)
    fusers = sorted({v for v in first_seed(nll)["variant"] if v.startswith("fuser") and OTHER not in v})
    out = []
    for r in (trend(nll, v) for v in fusers):
        v = curve_verdict(table, r)
        if v == "beats the constant control" and not seeds.empty and not _beats_in_every_seed(seeds, r["variant"]):
            v = "inconclusive"
        out.append({**r, "verdict": v})
    return pd.DataFrame(out)
