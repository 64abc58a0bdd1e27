"""The whole ledger on one screen: how many of the posts' claims got each verdict, and a figure of every claim by
verdict (notebook 00 shows it first; the README ledger's first line uses the same counts)."""
from __future__ import annotations

from typing import Any

import pandas as pd

from .results import VERDICTS

COLOURS = {"supported": "#2b8a3e", "partly supported": "#94d82d", "not supported": "#c92a2a",
           "inconclusive": "#f59f00", "not testable here": "#adb5bd", "not measured yet": "#ffffff"}


def posts_claims(df: pd.DataFrame) -> pd.DataFrame:
    """One row per claim of the posts (C01-C73): a claim with several rows counts by its first row."""
    return df[df["claim_id"].astype(str).str.startswith("C")].drop_duplicates("claim_id", keep="first")


def verdict_counts(df: pd.DataFrame) -> pd.Series:
    """Claims per verdict, in VERDICTS order (zeros kept)."""
    return posts_claims(df)["verdict"].value_counts().reindex(list(VERDICTS), fill_value=0)


def figure(df: pd.DataFrame, columns: int = 10) -> Any:
    """Every claim as a tile, coloured by its verdict, in id order; the legend gives the counts."""
    import matplotlib.pyplot as plt
    from matplotlib.patches import Patch, Rectangle

    posts = posts_claims(df).sort_values("claim_id")
    rows = -(-len(posts) // columns)
    fig, ax = plt.subplots(figsize=(columns * 0.62, rows * 0.42 + 0.9))
    for k, r in enumerate(posts.itertuples()):
        x, y = k % columns, rows - 1 - k // columns
        ax.add_patch(Rectangle((x, y), 0.92, 0.85, facecolor=COLOURS[r.verdict], edgecolor="#495057", lw=0.4))
        ax.text(x + 0.46, y + 0.42, r.claim_id, ha="center", va="center", fontsize=6,
                color="white" if r.verdict in ("supported", "not supported") else "black")
    ax.set(xlim=(0, columns), ylim=(0, rows), aspect="equal")
    ax.axis("off")
    counts = verdict_counts(df)
    ax.legend(handles=[Patch(facecolor=COLOURS[v], edgecolor="#495057", label=f"{v} ({counts[v]})")
                       for v in VERDICTS if counts[v]], loc="upper center", bbox_to_anchor=(0.5, 0.0), ncol=3,
              frameon=False, fontsize=6)
    ax.set_title(f"The posts' {len(posts)} checkable claims, by verdict", fontsize=8)
    return fig
