"""Views of captured attention: layer x head heatmaps, query x key maps, token strips, an offline widget.

Everything renders without internet (matplotlib/seaborn figures, inline HTML, ipywidgets); figures go
through `viz.save_figure` like any other.
"""
from __future__ import annotations

import html
from typing import Any

import numpy as np
import pandas as pd

from .attention_capture import AttentionCapture


def layer_head_heatmap(df: pd.DataFrame, value: str = "mass", title: str = "") -> Any:
    """df with columns layer, head, `value` -> a layer x head heatmap."""
    import matplotlib.pyplot as plt
    import seaborn as sns

    grid = df.pivot_table(index="layer", columns="head", values=value, aggfunc="mean")
    fig, ax = plt.subplots(figsize=(0.35 * grid.shape[1] + 2, 0.22 * grid.shape[0] + 1.5))
    sns.heatmap(grid, cmap="viridis", ax=ax, cbar_kws={"label": value})
    ax.set_title(title)
    fig.tight_layout()
    return fig


def query_key_map(cap: AttentionCapture, layer: int, head: int, labels: pd.DataFrame | None = None) -> Any:
    """One head's full map (needs keep='full'): rows queries, columns keys (own keys, then each slave's slots)."""
    import matplotlib.pyplot as plt

    m = next(x for x in cap.maps if x["layer"] == layer)
    probs = m["probs"][cap.heads.index(head)].numpy()  # (q, N)
    fig, ax = plt.subplots(figsize=(6, 4.5))
    ax.imshow(probs, cmap="magma", aspect="auto", interpolation="nearest")
    ax.set_xlabel("key (own keys, then slots)")
    ax.set_ylabel("query position")
    n_own = int((m["key_src"] == -1).sum())
    if n_own < probs.shape[1]:
        ax.axvline(probs.shape[1] - n_own - 0.5, color="white", lw=0.8)
    if labels is not None and probs.shape[0] <= 40:
        ax.set_yticks(range(probs.shape[0]), [labels.set_index("pos").loc[int(p), "piece"] for p in m["query_pos"]],
                      fontsize=6)
    ax.set_title(f"layer {layer}, head {head}")
    fig.tight_layout()
    return fig


def token_strip_html(labels: pd.DataFrame, weights: np.ndarray, highlight: set[int] | None = None) -> str:
    """Tokens coloured by attention weight (inline HTML; keyword tokens underlined)."""
    w = np.asarray(weights, dtype=float)
    top = w.max() if w.size and w.max() > 0 else 1.0
    spans = []
    for (_, row), x in zip(labels.iterrows(), w):
        alpha = min(1.0, x / top)
        deco = "text-decoration:underline;" if highlight and int(row["pos"]) in highlight else ""
        piece = html.escape(row["piece"]).replace("\n", "⏎")
        spans.append(f"<span title='{x:.4f}' style='background:rgba(220,60,40,{alpha:.3f});{deco}'>{piece}</span>")
    return "<div style='font-family:monospace;line-height:1.8'>" + "".join(spans) + "</div>"


def interactive_view(cap: AttentionCapture, labels: pd.DataFrame, highlight: set[int] | None = None) -> Any:
    """Layer / head pickers over the token strip; offline (ipywidgets, no CDN)."""
    import ipywidgets as W

    layer = W.Dropdown(options=cap.layers, description="layer")
    head = W.Dropdown(options=["mean"] + list(cap.heads), description="head")
    out = W.HTML()

    def draw(*_: Any) -> None:
        m = cap.mass(layer.value, "own") / cap.n_queries[layer.value]  # (heads, P)
        w = m.mean(0) if head.value == "mean" else m[cap.heads.index(head.value)]
        out.value = token_strip_html(labels.iloc[: w.shape[0]], w.numpy(), highlight)

    layer.observe(draw, names="value")
    head.observe(draw, names="value")
    draw()
    return W.VBox([W.HBox([layer, head]), out])
