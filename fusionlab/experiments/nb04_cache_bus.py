"""The three-model cache bus: one master, several slaves through the one engine (`fuse` with N slaves).

Helpers for notebook 04: build the bus and its single-slave sub-settings, projector fit quality per layer,
and a diagram of which slave layers feed which master layers.
"""
from __future__ import annotations

from typing import Any, Callable

import pandas as pd

from ..engine.fuse import FusedModel, fuse
from ..engine.lm import LM
from ..engine.projector import LstsqProjector
from ..engine.slave import Slave


def slaves_for(parts: dict[str, tuple[LM, LstsqProjector]], mode: str = "concat", gate: float = 1.0) -> list[Slave]:
    return [Slave(lm, layer_map=p.layer_map, projector=p, mode=mode, gate=gate, align="mean")
            for lm, p in parts.values()]


def settings(master: LM, parts: dict[str, tuple[LM, LstsqProjector]], mode: str = "concat",
             gate: float = 1.0) -> dict[str, tuple[str, Callable[[], FusedModel]]]:
    """name -> (cache key, builder): master alone, master + each slave, master + all slaves."""
    fp = master.fingerprint[:12]
    out: dict[str, tuple[str, Callable[[], FusedModel]]] = {"master alone": (f"{fp}|alone", lambda: fuse(master, []))}
    for label, part in parts.items():
        key = f"{fp}|{part[0].fingerprint[:12]}|{mode}|{gate}"
        out[f"+{label}"] = (key, lambda part=part, label=label: fuse(master, slaves_for({label: part}, mode, gate)))
    if len(parts) > 1:
        key = f"{fp}|" + "|".join(p[0].fingerprint[:12] for p in parts.values()) + f"|{mode}|{gate}"
        out["+" + " +".join(parts)] = (key, lambda: fuse(master, slaves_for(parts, mode, gate)))
    return out


def r2_frame(projectors: dict[str, LstsqProjector]) -> pd.DataFrame:
    """Held-out R² per mapped master layer, keys and values, per slave."""
    rows = [{"slave": name, "master_layer": int(layer), "slave_layer": p.layer_map.pairs[int(layer)],
             "r2_keys": r["k"], "r2_values": r["v"]}
            for name, p in projectors.items() for layer, r in p.meta["r2"].items()]
    return pd.DataFrame(rows)


def diagram(master: LM, parts: dict[str, tuple[LM, LstsqProjector]]) -> Any:
    """Master layers (middle column) fed by each slave's layers (outer columns)."""
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 4))
    lm = master.spec.layers
    xs = {name: x for name, x in zip(parts, (-1.0, 1.0, -2.0, 2.0))}
    ax.scatter([0] * lm, range(lm), s=25, color="k", zorder=3)
    ax.text(0, lm + 0.8, master.name, ha="center", fontsize=7)
    for (name, (slave, proj)), colour in zip(parts.items(), ("C0", "C1", "C2", "C3")):
        ls, x = slave.spec.layers, xs[name]
        ys = [j * (lm - 1) / max(ls - 1, 1) for j in range(ls)]  # slave layers drawn on the master's scale
        ax.scatter([x] * ls, ys, s=12, color=colour, zorder=3)
        ax.text(x, lm + 0.8, f"{slave.name}\n{proj.describe()}", ha="center", fontsize=6, color=colour)
        for i, j in proj.layer_map.pairs.items():
            ax.plot([x, 0], [ys[j], i], color=colour, lw=0.6, alpha=0.7)
    ax.set_axis_off()
    ax.set_title("KV cache bus: slave layers -> master layers (projected, re-rotated)", fontsize=8)
    fig.tight_layout()
    return fig


def memory_probe(master: LM, parts: dict[str, tuple[LM, LstsqProjector]], prompts: list[str],
                 max_new_tokens: int = 32) -> float:
    """The process's peak RSS (GB) after the whole bus generates for `prompts` as one batch. The HumanEval grid may
    come wholly from the cell cache (then it generates nothing), so the memory figure comes from this probe, which
    always runs."""
    import resource

    with fuse(master, slaves_for(parts)) as bus:
        bus.generate(prompts, max_new_tokens=max_new_tokens)
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20


