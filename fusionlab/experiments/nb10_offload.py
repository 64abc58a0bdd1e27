"""Context-offload accuracy over the ladder (notebook 10): the generation measure beside NLL transfer.

Only the slave reads a document of real prose holding one synthetic fact (`nb10_synthetic_facts`: made-up places, codes,
numbers and names, so no model knows the answer in advance) and its distractor; the master answers the question.
Per rung, with notebook 06's settings and scoring:

    floor     the master, no document               skyline   the master reads document + question
    ceiling   the slave alone reads document + question: what it knew, the most its memory can carry
    offload   the slave reads the document          control   the slave reads a *different* document (another
                                                              synthetic fact of the same language, same length)

transfer = (offload - floor) / (skyline - floor), paired bootstrap over items (each item is its own document);
offload vs control: exact McNemar. Each rung is judged by `nb10_claims.rung_verdict`. The bus (every foreign slave at
once, the ladder's last rung) has as its ceiling *any* member answering alone: the most its memories hold together.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from ..analysis.stats import wilson
from ..engine.lm import LM
from ..engine.projector import LstsqProjector
from ..errors import FusionLabError
from ..models.siblings import sibling
from . import nb06_offload as off
from . import nb06_offload_stats as stats
from .nb10_claims import rung_verdict
from .nb10_offload_relay import relay_cells, relay_name
from .nb10_transfer_map import FULL_LADDER, bus_label, foreign_settings, rung_settings
from .nb10_synthetic_facts import LANGS, facts


@dataclass
class OffloadPlan:
    """What one run size asks on the ladder: `per_lang` synthetic facts per language, each at every length."""

    rungs: list[str]
    foreign: list[str]
    per_lang: int
    lengths: list[int]
    depths: list[float] = field(default_factory=lambda: [50.0])
    langs: tuple[str, ...] = LANGS
    max_new_tokens: int = 24
    seed: int = 0
    bus: bool = False
    """With two or more foreign slaves, their bus is the last rung."""
    relay: bool = False
    """Each slave's text relay on the same items (`nb10_offload_relay`: its ceiling's answer as the note)."""


def offload_plan(size: str) -> OffloadPlan:
    """QUICK: the exact copy on 2 English facts. Default: the copy, int4, noise 10 % and 20 % (either side of where
    NLL transfer halves) and both foreign families on 20 facts per language at 256 tokens. Full: every rung, 60 per
    language at 256 / 1K / 2K tokens, each slave's text relay, and the foreign slaves' bus."""
    foreign = ["smollm2-135m-instruct", "gemma3-270m"]
    if size == "quick":
        return OffloadPlan(["noise:0"], [], 2, [160], langs=("en",), max_new_tokens=12)
    if size == "default":
        return OffloadPlan(["noise:0", "int4", "noise:0.1", "noise:0.2"], foreign, 20, [256])
    if size == "full":
        return OffloadPlan(list(FULL_LADDER), foreign, 60, [256, 1024, 2048], bus=True, relay=True)
    raise FusionLabError(f"unknown run size {size!r}: use 'quick', 'default' or 'full'.")


def items(master: LM, p: OffloadPlan, haystacks: dict[str, str] | None = None) -> list[off.Item]:
    """Every synthetic fact of the plan at every length and depth; each decoy is another fact of the same language.
    `haystacks`: prose per language (default notebook 06's: Paul Graham's essays, our Chinese text)."""
    pool = [f for lang in p.langs for f in facts(p.per_lang, lang, p.seed)]
    haystacks = {lang: (haystacks or off.HAYSTACKS)[lang] for lang in p.langs}
    return off.build_items(master, [f.id for f in pool], [], p.lengths, p.depths, haystacks, needles=pool)


def rung_names(rung: str) -> tuple[str, str]:
    """A rung's offload setting and its ceiling setting in the cells: '+s' and 's alone (reads it)' for one slave;
    for the bus (`bus_label`: members joined by ',') nb06's '+a +b' and the members' pooled ceiling (`bus_ceiling`)."""
    return "+" + " +".join(rung.split(",")), f"{rung} alone (reads it)"


def bus_ceiling(cells: pd.DataFrame, members: list[str]) -> pd.DataFrame:
    """The bus's ceiling cells, derived from its members' (no generation): an item is correct where any member alone
    answers it, wrong where all answered and none did; items some member did not answer are left out."""
    alone = stats.answered(cells)
    alone = alone[alone["setting"].isin([rung_names(m)[1] for m in members])]
    done = alone.groupby("item")["setting"].nunique()
    alone = alone[alone["item"].isin(done.index[done == len(members)])]
    hit = alone.groupby("item")["label"].agg(lambda s: "correct" if (s == "correct").any() else "wrong")
    first = alone.drop_duplicates("item").set_index("item")
    return (first.assign(setting=rung_names(",".join(members))[1], label=hit, answer="(any member alone)",
                         seconds=0.0).reset_index()[list(cells.columns)])


def bus_offload(master: LM, foreign: dict[str, tuple[LM, LstsqProjector]], grid_items: list[off.Item],
                max_new_tokens: int = 24, cache: Path | None = None, batch_size: int = 4) -> pd.DataFrame:
    """The ladder's last rung: every foreign slave at once (nb06's bus) and its different-document control, beside
    its members alone (read from the cell cache where their own rungs ran) and the bus's ceiling derived from them."""
    name = rung_names(bus_label(foreign))[0]
    grid = [st for st in off.settings(master, foreign, self_copy=False)
            if st.role in ("floor", "skyline", "ceiling", "bus") or (st.role == "control" and st.control_of == name)]
    cells = off.run(grid_items, grid, max_new_tokens, cache, batch_size)
    return pd.concat([cells, bus_ceiling(cells, list(foreign))], ignore_index=True).assign(rung=bus_label(foreign))


def ladder_order(plan: OffloadPlan, foreign: dict[str, Any]) -> list[str]:
    """The rows of `plan`'s accuracy table with these foreign slaves (by their labels): rungs, slaves, the bus."""
    return [*plan.rungs, *foreign] + ([bus_label(foreign)] if plan.bus and len(foreign) > 1 else [])


def offload_ladder(master: LM, recipes: list[str], foreign: dict[str, tuple[LM, LstsqProjector]],
                   grid_items: list[off.Item], max_new_tokens: int = 24, cache: Path | None = None,
                   batch_size: int = 4, bus: bool = False, relay: bool = False) -> pd.DataFrame:
    """Offload cells for every rung (sibling recipes, then foreign slaves, then with `bus` and two or more of them
    their bus), with `relay` each slave's text relay too, one sibling in memory at a time; floor and skyline
    are computed once (later rungs read them from the cell cache). Column `rung` names the slave."""
    def rung(label: str, grid: list[off.Setting]) -> pd.DataFrame:
        cells = [off.run(grid_items, grid, max_new_tokens, cache, batch_size).assign(rung=label)]
        if relay:
            ceiling = next(st for st in grid if st.role == "ceiling")
            cells.append(relay_cells(master, ceiling, grid_items, max_new_tokens, cache, batch_size))
        return pd.concat(cells, ignore_index=True)

    parts = []
    for recipe in recipes:
        sib = sibling(master, recipe)
        grid = rung_settings(master, recipe, sib)
        parts.append(rung(recipe, grid))
        del sib, grid
    for label, pair in foreign.items():
        parts.append(rung(label, foreign_settings(master, label, pair)))
    if bus and len(foreign) > 1:
        parts.append(bus_offload(master, foreign, grid_items, max_new_tokens, cache, batch_size))
    df = pd.concat(parts, ignore_index=True)
    return df.drop_duplicates(["setting", "item"]).reset_index(drop=True)


def _acc(df: pd.DataFrame, setting: str) -> tuple[int, int]:
    g = stats.answered(df)
    g = g[g["setting"] == setting]
    return int((g["label"] == "correct").sum()), len(g)


def accuracy_table(cells: pd.DataFrame, order: list[str]) -> pd.DataFrame:
    """One row per rung, in `order`: floor, skyline, the slave's ceiling, offload and control accuracy (Wilson CIs),
    the transfer rate with its bootstrap CI, McNemar against the control and against the slave alone (does the
    master read more out of the slave's memory than the slave answers itself?), and the rung's verdict."""
    floor = cells.loc[cells["role"] == "floor", "setting"].iloc[0]
    sky = cells.loc[cells["role"] == "skyline", "setting"].iloc[0]
    tr = stats.transfer(cells).set_index("setting")
    vs = stats.versus_control(cells).set_index("setting")
    rows = []
    for rung in order:
        name, ceiling = rung_names(rung)
        if name not in vs.index:
            continue
        row: dict[str, Any] = {"slave": rung}
        for col, setting in (("floor", floor), ("skyline", sky), ("ceiling", ceiling), ("offload", name),
                             ("control", vs.loc[name, "control"])):
            k, n = _acc(cells, setting)
            lo, hi = wilson(k, n)
            row.update({col: k / n if n else float("nan"), f"{col}_lo": lo, f"{col}_hi": hi})
        t, alone = tr.loc[name], stats.versus(cells, name, ceiling)
        row.update(n=int(t["n"]), transfer=t["transfer"], lo=t["lo"], hi=t["hi"],
                   acc_setting=vs.loc[name, "acc_setting"], acc_control=vs.loc[name, "acc_control"],
                   p_value=vs.loc[name, "p_value"],
                   p_vs_ceiling=alone["p_value"] if alone["n"] else float("nan"))  # more than the slave answers?
        if relay_name(rung) in vs.index:
            row.update(_relay_columns(cells, name, relay_name(rung), tr, vs))
        rows.append(row)
    out = pd.DataFrame(rows)
    if len(out):
        out["verdict"] = [rung_verdict(r) for r in out.to_dict("records")]
    return out


def _relay_columns(cells: pd.DataFrame, name: str, relay: str, tr: pd.DataFrame, vs: pd.DataFrame) -> dict[str, Any]:
    """The rung's text relay beside its K/V offload `name`: accuracy (Wilson), transfer, its other-document control,
    McNemar of K/V against the relay (paired by item), and both costs per item (seconds; the note's master tokens)."""
    k, n = _acc(cells, relay)
    lo, hi = wilson(k, n)
    kv = stats.versus(cells, name, relay)
    done = stats.answered(cells)
    per_item = lambda s: float(done.loc[done["setting"] == s, "seconds"].mean())  # noqa: E731
    return {"relay": k / n if n else float("nan"), "relay_lo": lo, "relay_hi": hi,
            "relay_transfer": tr.loc[relay, "transfer"], "relay_control": vs.loc[relay, "acc_control"],
            "relay_p_value": vs.loc[relay, "p_value"], "p_vs_relay": kv["p_value"] if kv["n"] else float("nan"),
            "note_tokens": float(done.loc[done["setting"] == relay, "note_tokens"].mean()),
            "relay_seconds": per_item(relay), "offload_seconds": per_item(name)}


SUMMARY = ("slave", "n", "floor", "skyline", "ceiling", "ceiling_lo", "offload", "offload_lo", "offload_hi",
           "control", "transfer", "lo", "hi", "p_value", "p_vs_ceiling", "relay", "relay_control", "p_vs_relay",
           "verdict")


def summary(table: pd.DataFrame) -> pd.DataFrame:
    return table[[c for c in SUMMARY if c in table]]


def plot_accuracy_ladder(table: pd.DataFrame) -> Any:
    """Per rung: offload, control and the slave's ceiling (Wilson 95 % CIs), between the master's floor and
    skyline (grey bands: their CIs)."""
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7.0, 3.4))
    x = np.arange(len(table))
    for col, ref in (("floor", "0.6"), ("skyline", "0.2")):
        v, lo, hi = (float(table[c].iloc[0]) for c in (col, f"{col}_lo", f"{col}_hi"))
        ax.axhspan(lo, hi, color=ref, alpha=0.12)
        ax.axhline(v, color=ref, lw=0.9, ls="--", label=f"master {col}")
    for col, dx, style in (("ceiling", -0.2, dict(marker="s", mfc="none")), ("offload", 0.0, dict(marker="o")),
                           ("control", 0.2, dict(marker="x"))):
        y = table[col]
        ax.errorbar(x + dx, y, yerr=[y - table[f"{col}_lo"], table[f"{col}_hi"] - y], fmt="none", ecolor="0.5",
                    capsize=2)
        ax.plot(x + dx, y, ls="none", label=col, **style)
    ax.set_xticks(x, table["slave"], rotation=20, fontsize=7)
    ax.set_ylim(-0.03, 1.03)
    ax.set_ylabel(f"accuracy (Wilson 95 % CI)\nn = {int(table['n'].max())} items per setting")
    ax.legend(fontsize=7, ncol=3, loc="upper right")
    fig.tight_layout()
    return fig
