"""Notebook 06's numbers from the offload cells: accuracy (Wilson), transfer rate (paired bootstrap), each setting
against its shuffled-document control (exact McNemar), and the two seed claims with their rules.

transfer rate = (acc(setting) - acc(floor)) / (acc(skyline) - acc(floor)), on the items all three answered; the
bootstrap resamples items (the same draw for the three), and draws where skyline = floor are dropped (their share is
reported). 1 = the master uses the document as if it had read it; 0 = nothing reached it.
"""
from __future__ import annotations

from typing import Any

import numpy as np
import pandas as pd

from ..analysis.stats import mcnemar, wilson


def answered(df: pd.DataFrame) -> pd.DataFrame:
    """Cells that ran (skipped ones, e.g. a document a slave cannot hold, are listed apart by the notebook)."""
    return df[df["label"].notna()] if "label" in df else df.iloc[0:0]


def accuracy(df: pd.DataFrame, by: list[str] | None = None) -> pd.DataFrame:
    by = by or ["setting"]
    rows = []
    for keys, g in answered(df).groupby(by, sort=False):
        k, n = int((g["label"] == "correct").sum()), len(g)
        lo, hi = wilson(k, n)
        rows.append(dict(zip(by, keys if isinstance(keys, tuple) else (keys,)), role=g["role"].iloc[0], n=n,
                         correct=k, accuracy=k / n, lo=lo, hi=hi, partial=int((g["label"] == "partial").sum()),
                         distractor=int(g["distractor"].fillna(False).astype(bool).sum())))
    return pd.DataFrame(rows)


def _paired(df: pd.DataFrame, setting: str, role: str) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Correctness of `setting`, the floor and the skyline on the items all three answered."""
    ok = answered(df).assign(ok=lambda d: d["label"] == "correct")
    col = {name: ok[sel].set_index("item")["ok"] for name, sel in
           (("s", ok["setting"] == setting), ("f", ok["role"] == "floor"), ("k", ok["role"] == "skyline"))}
    items = col["s"].index.intersection(col["f"].index).intersection(col["k"].index)
    return tuple(col[c].reindex(items).to_numpy(bool) for c in ("s", "f", "k"))  # type: ignore[return-value]


def transfer_rate(s: np.ndarray, f: np.ndarray, k: np.ndarray, n_boot: int = 2000, seed: int = 0) -> dict[str, Any]:
    """Point estimate and paired percentile-bootstrap 95% CI of (s - f) / (k - f) over items."""
    def rate(idx: np.ndarray) -> float:
        gap = k[idx].mean() - f[idx].mean()
        return float("nan") if gap == 0 else (s[idx].mean() - f[idx].mean()) / gap

    n = len(s)
    point = rate(np.arange(n)) if n else float("nan")
    rng = np.random.default_rng(seed)
    draws = np.array([rate(rng.integers(0, n, n)) for _ in range(n_boot)]) if n else np.array([])
    ok = draws[np.isfinite(draws)]
    lo, hi = (np.quantile(ok, [0.025, 0.975]).tolist() if len(ok) else [float("nan")] * 2)
    return {"n": n, "transfer": point, "lo": lo, "hi": hi, "defined_share": len(ok) / max(n_boot, 1)}


def transfer(df: pd.DataFrame, by_length: bool = False) -> pd.DataFrame:
    """Transfer rate per offload setting (and per document length)."""
    rows = []
    parts = [(None, df)] if not by_length else list(df.groupby("length"))
    for length, part in parts:
        for setting, g in part.groupby("setting", sort=False):
            role = g["role"].iloc[0]
            if role in ("floor", "skyline"):
                continue
            r = transfer_rate(*_paired(part, setting, role))
            rows.append({"setting": setting, "role": role, **({"length": length} if by_length else {}), **r})
    return pd.DataFrame(rows)


def versus(df: pd.DataFrame, setting: str, baseline: str) -> dict[str, Any]:
    """`setting` against `baseline` on the items both answered, paired by item (exact McNemar)."""
    ok = answered(df).assign(ok=lambda d: d["label"] == "correct")
    a = ok[ok["setting"] == setting].set_index("item")["ok"]
    b = ok[ok["setting"] == baseline].set_index("item")["ok"]
    items = a.index.intersection(b.index)
    t = mcnemar(b.reindex(items), a.reindex(items))
    return {"n": len(items), "acc_setting": a[items].mean(), "acc_baseline": b[items].mean(), **t}


def versus_control(df: pd.DataFrame) -> pd.DataFrame:
    """Each setting against its shuffled-document control, paired by item (exact McNemar)."""
    rows = []
    for control, g in answered(df)[lambda d: d["role"] == "control"].groupby("setting", sort=False):
        target = g["control_of"].iloc[0]
        t = versus(df, target, control)
        rows.append({"setting": target, "control": control, "n": t["n"], "acc_setting": t["acc_setting"],
                     "acc_control": t["acc_baseline"], "p_value": t["p_value"], "only_setting": t["only_setting"],
                     "only_control": t["only_baseline"]})
    return pd.DataFrame(rows)


def self_agreement(df: pd.DataFrame) -> tuple[int, int]:
    """How many items the self-offload answered exactly as the skyline did (the engine's anchor, on text)."""
    a = df[df["role"] == "self"].set_index("item")["answer"]
    b = df[df["role"] == "skyline"].set_index("item")["answer"]
    items = a.index.intersection(b.index)
    return int((a[items] == b[items]).sum()), len(items)


# --- figures -------------------------------------------------------------------------------------------------
def plot_accuracy(acc: pd.DataFrame) -> Any:
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6.5, 0.28 * len(acc) + 1.2))
    y = np.arange(len(acc))
    colours = {"floor": "grey", "skyline": "black", "self": "C2", "cross": "C0", "bus": "C1", "control": "C3"}
    ax.errorbar(acc["accuracy"], y, xerr=[acc["accuracy"] - acc["lo"], acc["hi"] - acc["accuracy"]], fmt="none",
                ecolor="0.4", capsize=2)
    ax.scatter(acc["accuracy"], y, c=[colours.get(r, "C4") for r in acc["role"]], zorder=3)
    ax.set_yticks(y, acc["setting"], fontsize=7)
    ax.invert_yaxis()
    ax.set_xlim(-0.02, 1.02)
    ax.set_xlabel(f"accuracy (Wilson 95% CI), n = {int(acc['n'].max())} items")
    fig.tight_layout()
    return fig


def plot_transfer(tr_by_length: pd.DataFrame) -> Any:
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(5.5, 3.2))
    for setting, g in tr_by_length[tr_by_length["role"] != "control"].groupby("setting", sort=False):
        ax.errorbar(g["length"], g["transfer"], yerr=[g["transfer"] - g["lo"], g["hi"] - g["transfer"]],
                    marker="o", capsize=3, label=setting)
    ax.axhline(0, color="grey", lw=0.8)
    ax.axhline(1, color="black", lw=0.8, ls="--")
    ax.set_xscale("log", base=2)
    ax.set_xlabel("document length (master tokens)")
    ax.set_ylabel("transfer rate\n(fused - floor) / (skyline - floor)")
    ax.legend(fontsize=6)
    fig.tight_layout()
    return fig


def plot_slot_mass(mass: pd.DataFrame) -> Any:
    """mass: setting, layer, mass (mean over samples) -> one line per setting over master layers."""
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(5.5, 3.2))
    for setting, g in mass.groupby("setting", sort=False):
        g = g.groupby("layer", as_index=False)["mass"].mean()
        ax.plot(g["layer"], g["mass"], marker=".", label=setting)
    ax.set_xlabel("master layer")
    ax.set_ylabel("attention mass on the slots\n(question tokens, mean over heads)")
    ax.legend(fontsize=6)
    fig.tight_layout()
    return fig
