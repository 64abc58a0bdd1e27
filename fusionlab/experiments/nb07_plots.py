"""Notebook 07's figures: training curves, held-out NLL change per control, edit size per layer (numbers from
`nb07_fusers` and `nb07_claims`; this module only draws)."""
from __future__ import annotations

from typing import Any

import pandas as pd


def plot_curves(histories: dict[str, pd.DataFrame], window: int = 10) -> Any:
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 3.2))
    for k, (name, h) in enumerate(histories.items()):
        if not len(h):
            continue
        steps = h[h["loss"].notna()] if "loss" in h else h
        ax.plot(steps["tokens"], steps["gain"].rolling(window, min_periods=1).mean(), label=name, lw=1, color=f"C{k}")
        if "val_gain" in h and h["val_gain"].notna().any():  # validation passes (other documents), same colour
            v = h.assign(tokens=h["tokens"].ffill().fillna(0))
            v = v[v["val_gain"].notna()]
            ax.plot(v["tokens"], v["val_gain"], ls="--", marker="o", ms=3, lw=0.8, color=f"C{k}")
    ax.axhline(0, color="grey", lw=0.8)
    ax.set_xlabel("training tokens")
    ax.set_ylabel(f"master loss - fused loss\n(training chunks, mean of {window};\n"
                  "dashed: validation documents)")
    ax.legend(fontsize=5)
    fig.tight_layout()
    return fig


def plot_gains(gains: pd.DataFrame) -> Any:
    import matplotlib.pyplot as plt

    g = gains[gains["domain"] != "all"]
    settings, domains = list(dict.fromkeys(g["setting"])), list(dict.fromkeys(g["domain"]))
    fig, ax = plt.subplots(figsize=(6.5, 0.3 * len(settings) * len(domains) / 2 + 1.5))
    y = 0
    ticks = []
    for s in settings:
        for k, d in enumerate(domains):
            r = g[(g["setting"] == s) & (g["domain"] == d)]
            if len(r):
                r = r.iloc[0]
                ax.errorbar(r["delta"], y, xerr=[[r["delta"] - r["lo"]], [r["hi"] - r["delta"]]], fmt="o",
                            color=f"C{k}", capsize=2, label=d if s == settings[0] else None)
                ticks.append((y, f"{s}"))
                y += 1
        y += 0.5
    ax.axvline(0, color="grey", lw=0.8)
    ax.set_yticks([t for t, _ in ticks], [n for _, n in ticks], fontsize=5)
    ax.invert_yaxis()
    ax.set_xlabel("held-out NLL change vs master alone (nats/token, 95% CI); < 0 = better")
    ax.legend(fontsize=6)
    fig.tight_layout()
    return fig


def plot_edits(edits: pd.DataFrame) -> Any:
    """edits: fuser, layer, k_edit, v_edit (and gate) -> heatmap fuser x layer of the value edit size."""
    import matplotlib.pyplot as plt
    import seaborn as sns

    grid = edits.pivot_table(index="fuser", columns="layer", values="v_edit")
    fig, ax = plt.subplots(figsize=(0.3 * grid.shape[1] + 2, 0.35 * grid.shape[0] + 1.5))
    sns.heatmap(grid, cmap="magma", ax=ax, cbar_kws={"label": "RMS(fuser output) / RMS(master V)"})
    ax.set_xlabel("master layer")
    fig.tight_layout()
    return fig


def plot_learning_curve(table: pd.DataFrame) -> Any:
    """Pooled held-out NLL change against the budget: each run vs the master (left) and each fuser vs the constant
    control (right), 95 % CIs over documents (`nb07_curve_stats.curve_table`)."""
    import matplotlib.pyplot as plt

    # pooled when enough documents pool (`MIN_DOCS`), else the domain with the most documents (QUICK's few files)
    # (a "pooled" row always exists; with no domain pooled it is empty: n = 0)
    pooled_rows = (table["domain"] == "pooled") & (table["n"] > 0)
    scope = "pooled" if pooled_rows.any() else table[table["n"] > 0].groupby("domain")["docs"].max().idxmax()
    pooled = table[table["domain"] == scope]
    colour = {v: f"C{k}" for k, v in enumerate(sorted(pooled["variant"].unique()))}  # one colour per run, both panels
    budgets = sorted(pooled["budget"].unique())
    fig, axes = plt.subplots(1, 2, figsize=(7.5, 3.0), sharex=True)
    for ax, against in zip(axes, ("master alone", "constant")):
        rows = pooled[pooled["against"] == against]
        for v, g in rows.groupby("variant", sort=True):
            g = g.sort_values("budget")
            ax.errorbar(g["budget"], g["delta"], yerr=[g["delta"] - g["lo"], g["hi"] - g["delta"]], marker="o",
                        ms=3, lw=1, capsize=2, label=v, color=colour[v])
        ax.axhline(0, color="grey", lw=0.8)
        ax.set_xscale("log", base=2)
        ax.set_xticks(budgets, [f"{b / 1000:g}K" for b in budgets])
        ax.set_xlabel("training tokens")
        ax.set_ylabel(f"held-out NLL - {against}\n(nats/token; below 0: better)")
        ax.legend(fontsize=5)
    fig.suptitle("pooled over domains" if scope == "pooled" else f"{scope} only (too few documents to pool)", fontsize=7)
    fig.tight_layout()
    return fig


def plot_opening(histories: dict[str, pd.DataFrame]) -> Any:
    """The offload (concat) fusers' layer-mean gate g and key scale s per training step: whether they move from
    step one (`FuserConfig.opening`), and where validation stopped them."""
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(7.5, 2.8), sharex=True)
    for name, h in histories.items():
        if "key_scale_mean" not in h or h["key_scale_mean"].isna().all():
            continue  # a blend fuser has neither
        rows = h.dropna(subset=["gate_mean"])
        for ax, col in zip(axes, ("gate_mean", "key_scale_mean")):
            ax.plot(rows["step"], rows[col], lw=1, label=name)
    for ax, what in zip(axes, ("gate g (layer mean)", "key scale s (layer mean)")):
        ax.set_xlabel("training step")
        ax.set_ylabel(what)
        ax.set_yscale("symlog", linthresh=1e-3)
    axes[0].legend(fontsize=5)
    fig.tight_layout()
    return fig
