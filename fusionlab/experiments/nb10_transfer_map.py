"""The transfer map (notebook 10): siblings of the master from an exact copy outwards, then foreign families, each
with its divergence from the master and the share of what it read that reaches the master.

The rungs are recipes for `fusionlab.models.siblings`; foreign slaves come with their fitted `lstsq` projector.
Each rung is built, measured and dropped before the next (one sibling in memory at a time: a Qwen 0.5B sibling is
2 GB in fp32). The rules that judge each rung and where the ladder breaks are in `nb10_claims`.
"""
from __future__ import annotations

import hashlib
from contextlib import nullcontext
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from ..analysis.divergence import divergence
from ..analysis.evaluate import heldout_paragraphs
from ..analysis.layer_selection import kvcomm_select
from ..cells import Cell, CellCache, cell_key, run_cells
from ..engine.layermap import LayerMap
from ..engine.lm import LM
from ..engine.fit import fit_lstsq
from ..engine.fuse import fuse
from ..engine.projector import IdentityProjector, LstsqProjector
from ..engine.slave import Slave
from ..errors import FusionLabError
from ..models.siblings import KINDS as SIBLING_KINDS, sibling, sibling_layer_map
from ..paths import cache_dir
from . import nb06_offload as off
from . import nb10_nll_transfer as nll
from . import nb10_text_relay as relay
from .nb10_claims import nll_rung_verdict

LADDER = ("noise:0", "noise:0.003", "int8", "noise:0.01", "noise:0.03", "int4", "noise:0.1", "prune:4", "noise:0.2",
          "noise:0.3", "finetune:code:50", "finetune:code:200")
"""Default rungs (the table orders siblings by their measured KL from the master, which the ladder rules read):
noise:0 is the exact copy (the positive control every null needs); the fine-tunes are made by `nb10_finetune`."""
FINER_NOISE = ("noise:0.05", "noise:0.07", "noise:0.085")
"""Rungs only the full plans add: on the ladder above, the offload channel and the slave's own answers both halve
between noise 3 % (KL 0.05) and 10 % (KL 0.98), a factor of 20 in KL with no rung inside, so their crossings were
interpolated; 5 % and 7 % put measured points there, and 8.5 % sits between the two crossings they then bracketed
(KL 0.74 and 0.97), to say which curve halves first."""
BEND_NOISE = ("noise:0.15",)
"""A rung only the full plans add where NLL transfer halves: on the full plan's 106 documents it falls from 0.55 at
noise 10 % (KL 1.14) to -2.38 at 20 % (KL 5.2), a factor of 4.5 in KL with no rung inside, so where the curve bends
there was interpolated."""
FULL_LADDER = (*LADDER[:LADDER.index("noise:0.03") + 1], *FINER_NOISE,
               *LADDER[LADDER.index("noise:0.03") + 1:LADDER.index("noise:0.1") + 1], *BEND_NOISE,
               *LADDER[LADDER.index("noise:0.1") + 1:])
"""The full plans' siblings: the default ladder with `FINER_NOISE` and `BEND_NOISE` in its noise order."""
VIA_LSTSQ = " lstsq"
"""Suffix of a sibling's label when it is fed through its fitted `lstsq` projector (the channel every foreign slave
gets) instead of the identity: on the exact copy this measures what the projector alone costs."""
VIA_KVCOMM = " kvcomm"
"""Suffix of a slave's label when only KVComm's selected layers (top 30 % by slot attention) receive its slots."""
CHANNELS = {VIA_LSTSQ: "lstsq_", VIA_KVCOMM: "kvcomm_"}
"""The other channels a rung is measured through: label suffix -> column prefix in the ladder table."""


@dataclass
class Plan:
    """What one run size measures (documents: one (A, B) pair each, at most `per_domain` per domain)."""

    rungs: list[str]
    foreign: list[str]
    per_domain: int
    a_tokens: int
    b_tokens: int
    divergence_texts: int
    lstsq: bool = True
    relay_tokens: int = 48
    """The text relay's note budget (0: no relay)."""
    kvcomm: bool = True
    """Also measure each slave on KVComm's selected layers."""
    notes: list[str] = field(default_factory=list)
    bus: bool = True
    """With two or more foreign slaves, their bus is the last rung."""


def plan(size: str) -> Plan:
    if size == "quick":
        return Plan(["noise:0", "noise:0.1", "finetune:code:1"], [], 2, 64, 32, 2, lstsq=False, relay_tokens=12,
                    kvcomm=False)
    if size == "default":
        return Plan(list(LADDER), ["smollm2-135m-instruct", "gemma3-270m"], 10, 192, 64, 8)
    if size == "full":
        return Plan([*FULL_LADDER, "finetune:code:800"], ["smollm2-135m-instruct", "gemma3-270m"], 60, 256, 128, 32,
                    relay_tokens=64)
    raise FusionLabError(f"unknown run size {size!r}: use 'quick', 'default' or 'full'.")


def divergence_texts(p: Plan, texts: list[str] | None = None) -> list[str]:
    """The held-out texts `p` measures divergence on (`texts`: another pool, for tests), the same wherever a run of
    that size measures it, so the stages and the notebook share their divergence cells."""
    return (heldout_paragraphs() if texts is None else texts)[:p.divergence_texts]


def measure_divergence(master: LM, recipes: list[str] | tuple[str, ...], texts: list[str], lstsq: bool = True,
                       cache: Path | None = None) -> pd.DataFrame:
    """One row per rung: next-token KL(master ‖ sibling) with its bootstrap-over-texts CI, layer-mean K/V R²
    (cached per rung: a resumed notebook rebuilds no sibling it has measured)."""
    def compute(_: Any, c: Cell) -> dict[str, Any]:
        sib = sibling(master, c.item)  # one sibling in memory at a time: dropped when this returns
        return divergence(master, sib, texts, sibling_layer_map(master, sib), lstsq).row()

    digest = hashlib.sha256("\x00".join(texts).encode()).hexdigest()[:16]
    cells = [Cell(cell_key("divergence", master.fingerprint[:12], r, digest, lstsq), {"recipe": r}, r)
             for r in recipes]
    store = CellCache(cache or cache_dir() / "divergence.jsonl")
    recs = run_cells(store, cells, lambda: nullcontext(None), compute, desc="divergence")
    return pd.DataFrame(recs).drop(columns=["key"])


def foreign_divergence(label: str, proj: LstsqProjector) -> dict[str, Any]:
    """A foreign slave's row: no next-token KL (another tokenizer), the fitted projector's held-out R² per layer."""
    r2 = proj.meta.get("r2", {})
    mean = lambda kind: float(np.mean([v[kind] for v in r2.values()])) if r2 else float("nan")  # noqa: E731
    return {"recipe": label, "kl": float("nan"), "kl_low": float("nan"), "kl_high": float("nan"),
            "k_identity": float("nan"), "v_identity": float("nan"), "k_lstsq": mean("k"), "v_lstsq": mean("v")}


def bus_label(foreign: dict[str, Any]) -> str:
    """The bus rung's name in the ladder: its slaves, as the cells name them."""
    return ",".join(foreign)


def bus_divergence(foreign: dict[str, tuple[LM, LstsqProjector]]) -> dict[str, Any]:
    """The bus's row: no KL and no one distance (each slave has its own; the table lists theirs)."""
    nan = float("nan")
    return {"recipe": bus_label(foreign), "kl": nan, "kl_low": nan, "kl_high": nan, "k_identity": nan,
            "v_identity": nan, "k_lstsq": nan, "v_lstsq": nan}


def kvcomm_samples(paragraphs: list[str], n: int = 4) -> list[tuple[str, str]]:
    """(prompt, context) pairs for KVComm's layer scores: paragraph i + 1 reads paragraph i (held-out text, never
    the documents the transfer is measured on)."""
    if len(paragraphs) < n + 1:
        raise FusionLabError(f"kvcomm_samples needs {n + 1} paragraphs for n={n}, got {len(paragraphs)}.")
    return [(paragraphs[i + 1], paragraphs[i]) for i in range(n)]


def kvcomm_layers(master: LM, slave: LM, proj: Any, home: LayerMap, samples: list[tuple[str, str]],
                  top: float = 0.3) -> LayerMap:
    """KVComm's selection for one slave: `home` cut to the `top` share of master layers whose queries attend most
    to its slots (KVComm's default 30 %; layer 0 always kept)."""
    with fuse(master, [Slave(slave, layer_map=home, projector=proj, align="mean")]) as f:
        maps, _ = kvcomm_select(f, samples, top=top)
    return maps[0]


def _with_kvcomm_control(grid: list[off.Setting], label: str) -> list[off.Setting]:
    """nb06's KVComm setting as its own channel (label + VIA_KVCOMM) with a different-document control."""
    out = []
    for st in grid:
        if st.name == f"+{label}, KVComm layers":
            st = replace(st, slaves=[label + VIA_KVCOMM])
            out += [st, replace(st, name=f"{st.name}, shuffled doc", reads="decoy", role="control", control_of=st.name)]
        else:
            out.append(st)
    return out


def rung_settings(master: LM, recipe: str, sib: LM, lstsq: bool = False,
                  kvcomm: list[tuple[str, str]] | None = None) -> list[off.Setting]:
    """Floor, skyline, the sibling through the identity projector (its layer map home), its ceiling and control;
    `lstsq`: also through its fitted projector (label + VIA_LSTSQ; the fit `measure_divergence` saved is reloaded);
    `kvcomm`: calibration samples for KVComm's layer selection, also measured (label + VIA_KVCOMM)."""
    home = sibling_layer_map(master, sib)
    slaves: dict[str, tuple[LM, Any]] = {recipe: (sib, IdentityProjector())}
    if lstsq:
        slaves[recipe + VIA_LSTSQ] = (sib, fit_lstsq(master, sib, home))
    sel = {recipe: kvcomm_layers(master, sib, IdentityProjector(), home, kvcomm)} if kvcomm else None
    grid = off.settings(master, slaves, kvcomm=sel, bus=False, self_copy=False, ceilings=True,
                        layer_maps={recipe: home})
    return _with_kvcomm_control(grid, recipe)


def foreign_settings(master: LM, label: str, pair: tuple[LM, LstsqProjector],
                     kvcomm: list[tuple[str, str]] | None = None) -> list[off.Setting]:
    """A foreign slave through its lstsq projector, its ceiling and control, and (`kvcomm`) KVComm's layers."""
    lm, proj = pair
    sel = {label: kvcomm_layers(master, lm, proj, proj.layer_map, kvcomm)} if kvcomm else None
    grid = off.settings(master, {label: pair}, kvcomm=sel, bus=False, self_copy=False, ceilings=True)
    return _with_kvcomm_control(grid, label)


def nll_ladder(master: LM, recipes: list[str], foreign: dict[str, tuple[LM, LstsqProjector]], items: list[nll.Pair],
               cache: Path | None = None, relay_tokens: int = 0, lstsq: bool = False,
               kvcomm: list[tuple[str, str]] | None = None, bus: bool = False) -> pd.DataFrame:
    """NLL transfer cells for every rung (sibling recipes, then foreign slaves), one sibling built at a time, with
    each slave's text relay (a note of at most `relay_tokens` tokens; 0: none), with `lstsq` each sibling also
    through its fitted projector, with `kvcomm` (calibration samples) each slave on KVComm's layers too, and with
    `bus` the foreign slaves all at once (notebook 06's bus, its different-document control; the last rung)."""
    def rung(label: str, slave: LM, grid: list[off.Setting]) -> pd.DataFrame:
        cells = [nll.run(items, grid, cache)]
        if relay_tokens:
            cells.append(relay.run(master, items, [relay.Relay(label, slave, relay_tokens)], cache))
        return pd.concat(cells, ignore_index=True).assign(rung=label)

    parts = []
    for recipe in recipes:
        sib = sibling(master, recipe)
        parts.append(rung(recipe, sib, rung_settings(master, recipe, sib, lstsq, kvcomm)))
        del sib
    for label, pair in foreign.items():
        parts.append(rung(label, pair[0], foreign_settings(master, label, pair, kvcomm)))
    if bus and len(foreign) > 1:
        parts.append(bus_rung(master, foreign, items, cache))
    df = pd.concat(parts, ignore_index=True)
    return df.drop_duplicates(["setting", "doc"]).reset_index(drop=True)  # floor / skyline: once


def bus_rung(master: LM, foreign: dict[str, tuple[LM, LstsqProjector]], items: list[nll.Pair],
             cache: Path | None = None) -> pd.DataFrame:
    """The ladder's last rung: the foreign slaves all at once (notebook 06's bus), with floor, skyline and the bus's
    different-document control."""
    grid = off.settings(master, foreign, bus=True, self_copy=False, ceilings=False)
    grid = [st for st in grid if st.role in ("floor", "skyline", "bus") or
            (st.role == "control" and st.control_of == "+" + " +".join(foreign))]
    return nll.run(items, grid, cache).assign(rung=bus_label(foreign))


def ladder_table(cells: pd.DataFrame, div: pd.DataFrame, order: list[str]) -> pd.DataFrame:
    """One row per rung, nearest first: divergence (KL, R²; distance = 1 - layer-mean lstsq R² of K and V, defined for
    every slave), NLL transfer with its CIs, the control and ceiling, the text relay's transfer (`relay_*`) and
    the offload's advantage over it (`vs_relay*`), a sibling's transfer through `lstsq` (`lstsq_*`), the slave on
    KVComm's layers (`kvcomm_*`), and the rung's verdict."""
    tr = nll.transfer(cells)
    talk = tr["role"] == "relay"
    via = {suffix: tr["slaves"].str.endswith(suffix) & ~talk for suffix in CHANNELS}
    out = tr[~talk & ~pd.concat(via.values(), axis=1).any(axis=1)]
    out = (out.assign(slave=out["slaves"]).drop(columns=["slaves", "role"])
           .merge(_beside(tr[talk], "relay_", ""), left_on="slave", right_index=True, how="left"))
    for suffix, prefix in CHANNELS.items():
        out = out.merge(_beside(tr[via[suffix]], prefix, suffix), left_on="slave", right_index=True, how="left")
    tr = out
    d = div.drop(columns=["slave"], errors="ignore").rename(columns={"recipe": "slave"})
    d = d.assign(distance=1 - (d["k_lstsq"] + d["v_lstsq"]) / 2)
    out = d.drop(columns=[c for c in ("texts", "tokens") if c in d]).merge(tr, on="slave", how="inner")
    out = out.set_index("slave").loc[[s for s in order if s in set(out["slave"])]].reset_index()
    out["kind"] = ["sibling" if s.split(":")[0] in SIBLING_KINDS else "foreign" for s in out["slave"]]
    # nearest first: the siblings by their measured KL (the exact copy, KL 0, leads), then the foreign families
    out = pd.concat([out[out["kind"] == "sibling"].sort_values("kl", kind="stable"), out[out["kind"] == "foreign"]],
                    ignore_index=True)
    out["verdict"] = [nll_rung_verdict(r) for r in out.to_dict("records")]
    return out


SUMMARY = ("slave", "kl", "distance", "n", "gap", "transfer", "lo", "hi", "vs_control", "vs_control_low",
           "ceiling_share", "lstsq_transfer", "lstsq_lo", "lstsq_hi", "kvcomm_transfer", "kvcomm_lo", "kvcomm_hi",
           "relay_transfer", "vs_relay", "vs_relay_low", "vs_relay_high", "verdict")


def summary(table: pd.DataFrame) -> pd.DataFrame:
    """The ladder table's headline columns, those this run measured (QUICK fits no lstsq)."""
    return table[[c for c in SUMMARY if c in table]]


def _beside(rows: pd.DataFrame, prefix: str, suffix: str) -> pd.DataFrame:
    """Another channel's transfer, CI and control, keyed by the rung it belongs to (`slaves` without `suffix`)."""
    keep = [c for c in ("transfer", "lo", "hi", "vs_control_low") if c in rows]
    rung = rows["slaves"].str.removesuffix(suffix)
    return rows.assign(rung=rung).set_index("rung")[keep].add_prefix(prefix)


def _draw_rungs(ax: Any, t: pd.DataFrame, x: pd.Series, colour: str, kind: str, near: float) -> None:
    """One family of rungs on one axis: offload with its CI, lstsq (triangle), text relay (cross), the slave's own
    gain (open square); names staggered where rungs lie within `near` decades of each other (a name's width)."""
    ax.errorbar(x, t["transfer"], yerr=[t["transfer"] - t["lo"], t["hi"] - t["transfer"]], fmt="o", color=colour,
                capsize=3, label=f"{kind}: offload")
    for column, marker, what in (("lstsq_transfer", "^", "through lstsq"), ("relay_transfer", "x", "text relay")):
        if column in t and t[column].notna().any():
            ax.scatter(x, t[column], color=colour, marker=marker, label=f"{kind}: {what}")
    if "ceiling_share" in t:
        ax.scatter(x, t["ceiling_share"], facecolors="none", edgecolors=colour, marker="s",
                   label=f"{kind}: slave's own gain (ceiling)")
    crowd, last = 0, None
    for xi, yi, s in sorted((xi, yi, s) for xi, yi, s in zip(x, t["transfer"], t["slave"]) if np.isfinite(xi)):
        here = np.log10(max(xi, 1e-4))
        crowd = crowd + 1 if last is not None and here - last < near else 0
        last = here
        ax.annotate(str(s).split("-")[0], (xi, yi), fontsize=7, xytext=(4, 4 - 9 * crowd), textcoords="offset points")


def plot_transfer_map(table: pd.DataFrame) -> Any:
    """Two views of one ladder. Left: the siblings against next-token KL(master ‖ sibling), the clean distance where
    tokenizers match. Right: every slave against 1 − layer-mean K/V R² after lstsq, the one distance a foreign family
    has too (it carries the ridge's bias: the exact copy does not sit at 0). Transfer = share of the NLL gap closed,
    95 % CI; ceiling, lstsq and text relay marked as in `_draw_rungs`."""
    import matplotlib.pyplot as plt

    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4.0), sharey=True)
    sib = table[(table["kind"] == "sibling") & table["kl"].notna()]
    if len(sib):
        _draw_rungs(left, sib, sib["kl"].clip(lower=0), "tab:blue", "sibling", near=0.8)
    left.set_xscale("symlog", linthresh=1e-4)  # the exact copy sits at KL 0
    left.set_xlabel("KL(master ‖ sibling), nats/token (symlog)")
    left.set_ylabel("NLL transfer (share of gap closed)")
    x = table["distance"].clip(lower=0)  # NaN where lstsq was not fitted (QUICK): those rungs are not drawn
    for kind, colour in (("sibling", "tab:blue"), ("foreign", "tab:red")):
        sel = (table["kind"] == kind) & x.notna()
        if sel.any():
            _draw_rungs(right, table[sel], x[sel], colour, kind, near=0.1)
    right.set_xscale("log")
    right.xaxis.set_minor_formatter(plt.NullFormatter())  # minor labels collide on a one-decade axis
    right.set_xticks([0.1, 0.2, 0.5, 1, 2], ["0.1", "0.2", "0.5", "1", "2"])
    right.set_xlabel("1 − layer-mean R² of K/V after lstsq (log)")
    for ax in (left, right):
        ax.axhline(0, color="grey", lw=0.8)
        ax.axhline(1, color="grey", lw=0.8, ls="--")
    handles, labels = right.get_legend_handles_labels()
    right.legend(handles, labels, fontsize=7, loc="lower left")
    fig.tight_layout()
    return fig
