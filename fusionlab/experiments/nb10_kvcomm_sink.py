"""Why KVComm's layers made the master worse than reading nothing, and whether an attention sink mends it.

On the exact copy, feeding the slave's slots only to KVComm's selected layers (the top 30 % of master layers by slot
attention, layer 0 always) raised the master's loss on part B above its floor (NLL transfer -1.11 on the full plan),
although the same layers beat the slave reading a different document. The suspects are the layers left out: there the
master's queries see only its own tokens, and its first own token, which has read the slots at the fed layers, is not
the attention sink a sequence's first token is. A sink is one slot: the slave's first position on every layer left
out (`restrict(..., sink=1)`) gives those layers the sink back and nothing of the document beyond its first token.

Per slave, on the NLL plan's documents (notebook 10's measure, its cells shared with the stage's):

    KVComm layers               the rule as published (the map table's `kvcomm_*` columns)
    KVComm layers + sink        the same layers, every other layer keeps the slave's first slot
    ..., shuffled doc           its control: the slave reads part A of a different document
    sink only                   every layer takes the first slot and nothing more: what the sink alone gives
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import numpy as np
import pandas as pd

from ..analysis.layer_selection import restrict
from ..analysis.stats import bootstrap_ci
from ..engine.fit import fit_lstsq
from ..engine.fuse import fuse
from ..engine.layermap import LayerMap
from ..engine.lm import LM
from ..engine.projector import IdentityProjector
from ..engine.slave import Slave
from ..models.siblings import KINDS as SIBLING_KINDS, sibling, sibling_layer_map
from ..models.zoo import load, short_name
from . import nb06_offload as off
from . import nb07_corpora as corpora
from . import nb10_nll_transfer as nll
from . import nb10_transfer_map as tm

SINK = 1
"""Slots a layer left out keeps: the slave's first position (the sink StreamingLLM keeps)."""
KVCOMM, WITH_SINK, SINK_ONLY = "KVComm layers", "KVComm layers + sink", "sink only"


def table_name(kind: str, size: str = "full") -> str:
    """`10_kvcomm_sink.<size>` (kind 'table': one row per slave) or `10_kvcomm_sink_cells.<size>`."""
    return f"10_kvcomm_sink{'' if kind == 'table' else '_' + kind}.{size}"


@dataclass(frozen=True)
class Channel:
    """One slave as the study feeds it: its model, projector and home layer map (every layer it may feed)."""

    label: str
    lm: LM
    projector: Any
    home: LayerMap


def settings(master: LM, ch: Channel, samples: list[tuple[str, str]], sink: int = SINK) -> list[off.Setting]:
    """Floor, skyline and the four ways above for one slave; KVComm's layers are selected once, on `samples`."""
    published = tm.kvcomm_layers(master, ch.lm, ch.projector, ch.home, samples)
    sel = sorted(published.pairs)
    maps = {KVCOMM: published,
            WITH_SINK: restrict(ch.home, sel, f"kvcomm top 30% + sink {sink}", sink),
            SINK_ONLY: restrict(ch.home, [], f"sink {sink} only", sink)}
    key = off.slave_key(master, ch.lm, ch.projector)
    keys = {KVCOMM: f"{key}|kvcomm{sel}",  # notebook 06's key for KVComm's layers: the stage's cells are reused
            WITH_SINK: f"{key}|kvcomm{sel}|sink{sink}", SINK_ONLY: f"{key}|sink{sink}"}
    out = off.bounds(master)
    for way, lmap in maps.items():
        mk = lambda lmap=lmap: fuse(master, [Slave(ch.lm, layer_map=lmap, projector=ch.projector,  # noqa: E731
                                                   align="mean")])
        name = f"+{ch.label}, {way}"
        out.append(off.Setting(name, keys[way], mk, "document", "cross", slaves=[ch.label]))
        if way == WITH_SINK:
            out.append(off.Setting(f"{name}, shuffled doc", keys[way], mk, "decoy", "control", name, [ch.label]))
    return out


def channel(master: LM, name: str, load_slave: Callable[[str], LM] = load) -> Channel:
    """A sibling recipe through the identity on its home map, or a foreign model (by its short name) through its
    `lstsq` fit (our calibration text, never the documents) on the fit's map: each slave as the map table feeds it."""
    if name.split(":")[0] in SIBLING_KINDS:
        sib = sibling(master, name)
        return Channel(name, sib, IdentityProjector(), sibling_layer_map(master, sib))
    lm = load_slave(name)
    proj = fit_lstsq(master, lm)
    return Channel(short_name(name), lm, proj, proj.layer_map)


def run(master: LM, slaves: list[str], plan: tm.Plan | None = None, docs: list[corpora.Doc] | None = None,
        cache: Path | None = None, on_slave: Callable[[pd.DataFrame], Any] | None = None,
        load_slave: Callable[[str], LM] = load, texts: list[str] | None = None) -> pd.DataFrame:
    """Every slave's cells on `plan`'s (default: the full plan's) NLL documents, KVComm's layers selected on the plan's
    held-out samples; one slave built at a time, `on_slave(cells so far)` after each. One row per (setting, doc)."""
    plan = plan or tm.plan("full")
    docs = corpora.documents() if docs is None else docs
    items = nll.pairs(master.tokenizer, docs, plan.a_tokens, plan.b_tokens, plan.per_domain)
    samples = tm.kvcomm_samples(tm.divergence_texts(plan, texts))
    parts: list[pd.DataFrame] = []
    for name in slaves:
        ch = channel(master, name, load_slave)
        parts.append(nll.run(items, settings(master, ch, samples), cache).assign(slave=ch.label))
        del ch  # one slave in memory at a time
        if on_slave is not None:
            on_slave(_once(parts))
    return _once(parts)


def with_earlier(cells: pd.DataFrame, earlier: pd.DataFrame | None) -> pd.DataFrame:
    """This call's cells after the ones an earlier call saved (a call for some slaves keeps the others' rows)."""
    return cells if earlier is None else _once([earlier, cells], keep="last")


def _once(parts: list[pd.DataFrame], keep: str = "first") -> pd.DataFrame:
    """Floor and skyline cells once (every slave's grid has them), the slave column on its own settings only."""
    df = pd.concat(parts, ignore_index=True).drop_duplicates(["setting", "doc"], keep=keep).reset_index(drop=True)
    return df.assign(slave=df["slave"].where(df["role"].isin(["cross", "control"])))


def _paired(by: dict[str, pd.Series], worse: str, better: str, seed: int) -> tuple[float, float, float]:
    """Mean per-document NLL of `worse` minus `better` (nats/token; > 0: `better` predicts B better), bootstrap CI."""
    docs = by[worse].index.intersection(by[better].index)
    d = by[worse][docs].to_numpy() - by[better][docs].to_numpy()
    return (float(d.mean()), *bootstrap_ci(d, seed=seed)) if len(d) else (float("nan"),) * 3


def table(cells: pd.DataFrame, seed: int = 0) -> pd.DataFrame:
    """One row per slave: each way's NLL transfer with its CI, the sink's gain over KVComm as published and over the
    sink alone, the sink version's advantage over its control (all nats/token, paired by document), and `verdict`."""
    tr = nll.transfer(cells, seed=seed).set_index("setting")
    rows = []
    for slave in cells["slave"].dropna().unique():
        name = {w: f"+{slave}, {w}" for w in (KVCOMM, WITH_SINK, SINK_ONLY)}
        by = {w: cells[cells["setting"] == n].set_index("doc")["nll"] for w, n in name.items()}
        row: dict[str, Any] = {"slave": slave, "n": int(tr.loc[name[WITH_SINK], "n"]),
                               "gap": float(tr.loc[name[WITH_SINK], "gap"])}
        for w, prefix in ((KVCOMM, "kvcomm"), (WITH_SINK, "sink"), (SINK_ONLY, "sink_only")):
            r = tr.loc[name[w]]
            row |= {f"{prefix}_transfer": r["transfer"], f"{prefix}_lo": r["lo"], f"{prefix}_hi": r["hi"]}
        for col, (worse, better) in {"sink_gain": (KVCOMM, WITH_SINK), "vs_sink_only": (SINK_ONLY, WITH_SINK)}.items():
            row |= dict(zip((col, f"{col}_low", f"{col}_high"), _paired(by, worse, better, seed)))
        r = tr.loc[name[WITH_SINK]]
        row |= {"vs_control": r.get("vs_control", np.nan), "vs_control_low": r.get("vs_control_low", np.nan),
                "vs_control_high": r.get("vs_control_high", np.nan)}
        rows.append({**row, "verdict": verdict(row)})
    return pd.DataFrame(rows)


def verdict(row: dict[str, Any]) -> str:
    """The rule: 'the sink mends it' when KVComm's layers + sink beat KVComm's layers as published, the sink alone
    and a different document (each paired CI above 0); 'no effect' when the sink's gain has a CI around 0;
    'a sink only' when it gains but carries no more of the document than the sink alone or a different document;
    'inconclusive' without a floor-to-skyline gap or with a CI not computed (fewer than 2 documents)."""
    if not row.get("gap", 0) > 0 or row.get("n", 0) < 2:
        return "inconclusive"
    lows = [row.get(c, np.nan) for c in ("sink_gain_low", "vs_sink_only_low", "vs_control_low")]
    if any(np.isnan(x) for x in lows):
        return "inconclusive"
    if row["sink_gain_low"] <= 0:
        return "no effect" if row["sink_gain_high"] >= 0 else "the sink hurts"
    return "the sink mends it" if min(lows) > 0 else "a sink only"
