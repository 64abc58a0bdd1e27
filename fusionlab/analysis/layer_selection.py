"""Which master layers should receive a slave's slots? KVComm's rule, measured with our own attention capture.

KVComm (ICLR 2026) scores each receiver layer by the attention mass its query tokens put on the sender's context
positions (the first context position, an attention sink, left out), averages the score over calibration samples,
min-max normalises it across layers (optionally mixed with a Gaussian prior over depth), and keeps the top ⌈k·L⌉
layers; layer 0 is always sent. Here the scores come from `capture_attention` on a fused model whose slave is mapped
on all its layers, reading calibration documents through `context=`, so the same rule works for any pair.
"""
from __future__ import annotations

import math
from typing import Any

import numpy as np
import pandas as pd

from ..engine.fuse import FusedModel
from ..engine.layermap import LayerMap
from ..errors import FusionLabError
from .attention_capture import capture_attention


def slot_mass_by_layer(fused: FusedModel, samples: list[tuple[str, str]], skip_first: bool = True) -> pd.DataFrame:
    """Per sample, master layer and slave: the mean (over heads and query tokens) attention mass the prompt puts on
    that slave's slots. samples: (prompt, context) pairs; every slave reads the context (one shared string, so every
    slave's slots start at position 0, the sink KVComm leaves out when `skip_first`)."""
    rows = []
    for n, (prompt, context) in enumerate(samples):
        with capture_attention(fused) as cap:
            fused(prompt, context=context)
        for layer in cap.layers:
            q = cap.n_queries.get(layer, 0)
            for s, mass in cap.slots.get(layer, {}).items():  # (heads, P) summed over queries, by position
                kept = mass.clone()
                if skip_first:
                    kept[:, 0] = 0.0  # KVComm: the first context token is an attention sink
                rows.append({"sample": n, "layer": layer, "slave": s, "mass": float(kept.sum(1).mean()) / max(q, 1)})
    return pd.DataFrame(rows)


def kvcomm_rank(scores: pd.Series, top: float = 0.3, always: tuple[int, ...] = (0,), alpha: float = 1.0,
                mu: float = 0.5, sigma: float = 10.0) -> list[int]:
    """scores: layer -> mean mass. Min-max normalise, mix with a Gaussian prior (weight 1 - alpha, centred at
    mu·(L-1)), keep the top ⌈top·L⌉ layers plus `always` (those that are scored). Returns sorted layers."""
    if not 0 < top <= 1:
        raise FusionLabError(f"top must be a fraction in (0, 1], got {top!r}.")
    if not 0 <= alpha <= 1:
        raise FusionLabError(f"alpha must be in [0, 1], got {alpha!r}.")
    if scores.empty:
        raise FusionLabError("no layer scores: the slave has no slots on any captured layer.")
    layers = np.array(sorted(scores.index))
    x = scores.loc[layers].to_numpy(dtype=float)

    def norm(v: np.ndarray) -> np.ndarray:
        span = v.max() - v.min()
        return np.zeros_like(v) if span < 1e-12 else (v - v.min()) / span

    prior = np.exp(-0.5 * ((layers - mu * (layers.max())) / sigma) ** 2)
    mixed = alpha * norm(x) + (1 - alpha) * norm(prior)
    k = max(1, math.ceil(top * len(layers)))
    order = layers[np.lexsort((layers, -mixed))]  # highest score first; ties: lower layer first
    chosen = set(order[:k].tolist()) | {a for a in always if a in set(layers.tolist())}
    return sorted(int(c) for c in chosen)


def restrict(layer_map: LayerMap, layers: list[int], label: str, sink: int = 0) -> LayerMap:
    """The map with only `layers` (master side) fed the slave's slots; `sink` > 0: every other mapped layer still
    takes the slave's first `sink` slots (its attention sink; see LayerMap.first_slots)."""
    missing = sorted(set(layers) - set(layer_map.pairs))
    if missing:
        raise FusionLabError(f"layers {missing} are not in the layer map {layer_map!r}.")
    if isinstance(sink, bool) or not isinstance(sink, int) or sink < 0:
        raise FusionLabError(f"sink must be an int >= 0 (slots kept on the layers left out; 0: none), got {sink!r}.")
    kept = layer_map.pairs if sink else {i: layer_map.pairs[i] for i in layers}
    first = {i: sink for i in kept if i not in layers}
    return LayerMap(dict(kept), label, layer_map.master_layers, layer_map.slave_layers,
                    dict(layer_map.params, selected=list(layers), **({"sink": sink} if sink else {})), first)


def kvcomm_select(fused: FusedModel, samples: list[tuple[str, str]], top: float = 0.3,
                  **rank: Any) -> tuple[dict[int, LayerMap], pd.DataFrame]:
    """Per slave index: its layer map cut to KVComm's top layers, scored on `samples` with this fused model (each
    slave mapped on every layer it should be considered for); and the scores (`slot_mass_by_layer`)."""
    df = slot_mass_by_layer(fused, samples)
    out = {}
    for s, rs in enumerate(fused.slaves):
        per = df[df["slave"] == s].groupby("layer")["mass"].mean()
        out[s] = restrict(rs.layer_map, kvcomm_rank(per, top, **rank), f"kvcomm top {top:.0%}")
    return out, df
