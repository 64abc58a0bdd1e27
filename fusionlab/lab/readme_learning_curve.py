"""The README's learning-curve block (notebook 07): pooled held-out NLL change per run and budget, each fuser's trend
against the constant control, the verdicts from `nb07_curve_stats.curve_verdict` on the same saved rows, and the
comparisons once per training seed."""
from __future__ import annotations

import math
from pathlib import Path

import pandas as pd

from ..analysis.stats import interval
from ..experiments.nb07_curve_stats import curve_verdict
from .results import best_table

HEAD = "| run | tokens | vs master | vs constant | vs shuffled | vs itself reading another document |"
NOT_YET = "_Not measured yet: run notebook 07 (or `python -m fusionlab.experiments.nb07_learning_curve`)._"


def _ci(rows: pd.DataFrame, against: str) -> str:
    r = rows[rows["against"] == against]
    if r.empty:
        return "-"
    r = r.iloc[0]
    return f"{r['delta']:+.3f} {interval(r['lo'], r['hi'], '+.3f')}"


def _tokens(b: float) -> str:
    return "never" if not math.isfinite(b) else f"{b / 1000:,.0f}K"


def seeds_markdown(folder: Path | None = None) -> str:
    """Each comparison once per training seed (`nb07_curve_stats.seed_table`), for the runs every seed repeated."""
    got = best_table("07_learning_curve_seeds", folder)
    if got is None or got[0].empty:
        return ""
    table, size = got
    seeds = sorted(table["seed"].unique())
    head = "| run | tokens | against | " + " | ".join(f"seed {s}" for s in seeds) + " |"
    lines = [head, "|" + "---|" * (head.count("|") - 1)]
    for (v, b, a), rows in table.groupby(["variant", "budget", "against"], sort=True):
        if v.endswith("other document"):
            continue
        by_seed = rows.set_index("seed")
        cells = [_ci(by_seed.loc[[s]], a) if s in by_seed.index else "-" for s in seeds]
        lines.append(f"| {v} | {_tokens(b)} | {a} | " + " | ".join(cells) + " |")
    return ("\n\nThe same comparisons once per training seed (initialisation and data order), for the runs every seed "
            f"repeated, from `data/results/07_learning_curve_seeds.{size}.csv`; a gain counts only if it holds in "
            "each seed:\n\n" + "\n".join(lines))


def learning_curve_markdown(folder: Path | None = None) -> str:
    got, trend = best_table("07_learning_curve", folder), best_table("07_learning_curve_trend", folder)
    if got is None or trend is None:
        return NOT_YET
    (table, size), (tr, _) = got, trend
    pooled = table[table["domain"] == "pooled"]
    lines = [HEAD, "|" + "---|" * (HEAD.count("|") - 1)]
    for (v, b), rows in pooled.groupby(["variant", "budget"], sort=True):
        if v.endswith("other document"):
            continue
        lines.append(f"| {v} | {_tokens(b)} | {_ci(rows, 'master alone')} | {_ci(rows, 'constant')} | "
                     f"{_ci(rows, 'shuffled')} | {_ci(rows, 'other document')} |")
    trends = []
    for r in tr.to_dict("records"):
        cross = ("never reaches 0" if not math.isfinite(r["crossing"]) else
                 f"reaches 0 at {_tokens(r['crossing'])} [{_tokens(r['crossing_lo'])}, {_tokens(r['crossing_hi'])}] "
                 "tokens")
        trends.append(f"{r['variant']} − constant: {r['slope']:+.3f} nats per doubling "
                      f"{interval(r['lo'], r['hi'], '+.3f')}, the fitted line {cross}: **{curve_verdict(table, r)}**.")
    n = int(pooled["n"].max())
    docs = int(pooled["docs"].max())
    return "\n".join(lines) + (
        f"\n\nfrom `data/results/07_learning_curve.{size}.csv`: held-out NLL change (nats/token, below 0 = better), "
        f"{n} chunks from {docs} documents pooled (domains with enough held-out files), 95 % CIs resampling "
        "documents; each run is best-by-validation at its budget. " + " ".join(trends)) + seeds_markdown(folder)
