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


def setting_reads(master: LM, parts: dict[str, tuple[LM, LstsqProjector]], mode: str = "concat",
                  gate: float = 1.0) -> dict[str, tuple[str, list[int] | None]]:
    """name -> (cache key, which of the bus's slaves the setting reads): master alone [], master + each slave [i],
    master + all slaves None. Every setting is the bus reading some of its slaves (`slaves_for` maps each slave the
    same way alone or with the others), so the settings can share one model and its seats (`shared_run`)."""
    fp = master.fingerprint[:12]
    out: dict[str, tuple[str, list[int] | None]] = {"master alone": (f"{fp}|alone", [])}
    for i, (label, (lm, _)) in enumerate(parts.items()):
        out[f"+{label}"] = (f"{fp}|{lm.fingerprint[:12]}|{mode}|{gate}", [i])
    if len(parts) > 1:
        key = f"{fp}|" + "|".join(p[0].fingerprint[:12] for p in parts.values()) + f"|{mode}|{gate}"
        out["+" + " +".join(parts)] = (key, None)
    return out


def settings(master: LM, parts: dict[str, tuple[LM, LstsqProjector]], mode: str = "concat",
             gate: float = 1.0) -> dict[str, tuple[str, Callable[[], FusedModel]]]:
    """name -> (cache key, builder): master alone, master + each slave, master + all slaves, each its own model."""
    labels = list(parts)

    def build(reads: list[int] | None) -> Callable[[], FusedModel]:
        chosen = parts if reads is None else {labels[i]: parts[labels[i]] for i in reads}
        return lambda: fuse(master, slaves_for(chosen, mode, gate))

    return {name: (key, build(reads)) for name, (key, reads) in setting_reads(master, parts, mode, gate).items()}


def shared_run(master: LM, parts: dict[str, tuple[LM, LstsqProjector]], mode: str = "concat", gate: float = 1.0
               ) -> tuple[dict[str, tuple[str, list[int] | None]], Callable[[], FusedModel]]:
    """The settings as reads of one bus, and that bus's builder: a grid's settings then share one scheduler run."""
    return setting_reads(master, parts, mode, gate), lambda: fuse(master, slaves_for(parts, mode, gate))


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


