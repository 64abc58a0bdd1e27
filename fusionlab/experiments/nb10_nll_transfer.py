"""NLL transfer (notebook 10), the transfer map's high-power measure: a forward pass per document, not a generation.

A slave reads part A of a document; the master predicts part B, which it reads itself.

    floor     the master predicts B alone              skyline   the master reads A, then predicts B
    offload   the slave reads A (its slots at A's master positions), the master reads and predicts B
    control   the slave reads part A of a *different document* of the same domain (a derangement of documents,
              never a neighbouring window of the same file: that window would share B's topic and names)
    ceiling   the slave alone: its own loss on B without A and after A (did reading A help the slave itself?)

transfer = (floor - offload) / (floor - skyline) of the mean NLL on B, with a paired bootstrap over documents: one
(A, B) pair per document, so resampling pairs resamples documents. The scored tokens are B's tokens after its first,
in every setting (the floor has nothing before B's first token).
"""
from __future__ import annotations

import hashlib
import time
from contextlib import closing
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pandas as pd
import torch
import torch.nn.functional as F

from ..analysis.stats import bootstrap_ci
from ..cells import Cell, CellCache, cell_key, run_cells
from ..engine.fuse import FusedModel
from ..errors import FusionLabError
from ..paths import cache_dir
from ..training.chunks import derangement
from .nb06_offload import Setting
from .nb06_offload_stats import transfer_rate
from .nb07_corpora import DOMAINS, Doc


@dataclass(frozen=True)
class Pair:
    """Part A and part B of one document, and the part A of another document (the control reads it)."""

    doc: str
    domain: str
    part_a: str
    part_b: str
    other_doc: str
    other_a: str


def split_ab(tokenizer: Any, text: str, a_tokens: int, b_tokens: int) -> tuple[str, str] | None:
    """The document's first `a_tokens` + `b_tokens` master tokens as two texts (cut at token offsets), or None
    when the document is shorter."""
    offs = tokenizer(text, add_special_tokens=False, return_offsets_mapping=True)["offset_mapping"]
    if len(offs) < a_tokens + b_tokens:
        return None
    cut, end = offs[a_tokens][0], offs[a_tokens + b_tokens - 1][1]
    return text[:cut], text[cut:end]


def pairs(tokenizer: Any, docs: list[Doc], a_tokens: int, b_tokens: int, per_domain: int | None = None,
          seed: int = 0) -> list[Pair]:
    """One pair per long-enough document, at most `per_domain` per domain; each control A comes from another
    document of the same domain. A domain with fewer than 2 usable documents has no control and is left out."""
    out = []
    for domain in DOMAINS:
        usable = []
        for d in (x for x in docs if x.domain == domain):
            ab = split_ab(tokenizer, d.text, a_tokens, b_tokens)
            if ab is not None:
                usable.append((d.name, *ab))
        usable = usable[:per_domain] if per_domain else usable
        if len(usable) < 2:
            continue
        perm = derangement(len(usable), seed)
        out += [Pair(name, domain, a, b, usable[perm[i]][0], usable[perm[i]][1])
                for i, (name, a, b) in enumerate(usable)]
    if not out:
        raise FusionLabError(f"no domain has 2 documents of {a_tokens} + {b_tokens} tokens: lower a_tokens / "
                             "b_tokens or add documents.")
    return out


def b_loss(logits: torch.Tensor, b_ids: torch.Tensor) -> float:
    """Mean NLL of B's tokens after its first, from logits whose last positions are B's (logits (1, T, V),
    b_ids (1, n))."""
    n = b_ids.shape[1]
    pred = logits[0, -n:-1].float()  # (n - 1, V): position t predicts token t + 1
    return float(F.cross_entropy(pred, b_ids[0, 1:].to(pred.device)))


def nll_after(fused: FusedModel, text: str, part_b: str) -> float:
    """B's loss when the model itself reads `text` first ('' : the tokenizer's own start, a BOS where it adds one).
    The floor, the skyline and the text relay all score this way."""
    lm = fused.master
    b_ids = lm.encode(part_b, special_tokens=False)  # (1, n): the tokens every setting scores
    return b_loss(fused(torch.cat([lm.encode(text), b_ids], 1)), b_ids)


def nll_of(fused: FusedModel, pair: Pair, reads: str) -> float:
    """B's loss when the model reads `reads` ('nothing', 'itself', 'document', 'decoy'; see nb06_offload.READS)."""
    if reads in ("nothing", "itself"):
        return nll_after(fused, "" if reads == "nothing" else pair.part_a, pair.part_b)
    b_ids = fused.master.encode(pair.part_b, special_tokens=False)  # (1, n)
    context = pair.part_a if reads == "document" else pair.other_a
    return b_loss(fused(b_ids, context=context), b_ids)


def default_cache() -> Path:
    return cache_dir() / "nll_transfer.jsonl"


def run(items: list[Pair], grid: list[Setting], cache: Path | None = None) -> pd.DataFrame:
    """Every (setting, pair) cell, resumable; one row per cell with B's NLL and its cost. A ceiling cell also holds
    the slave's own floor (`nll_alone`: B without A), so its own gap is paired by document."""
    store = CellCache(cache or default_cache())
    rows = []
    for st in grid:
        def compute(fused: FusedModel, c: Cell, st: Setting = st) -> dict[str, Any]:
            t0 = time.perf_counter()
            rec = {"nll": nll_of(fused, c.item, st.reads)}
            if st.role == "ceiling":
                rec["nll_alone"] = nll_of(fused, c.item, "nothing")
            return {**rec, "seconds": round(time.perf_counter() - t0, 3)}

        cells = []
        for p in items:
            read = {"nothing": "", "itself": p.part_a, "document": p.part_a, "decoy": p.other_a}[st.reads]
            key = cell_key("nll", st.key, st.reads, p.doc, hashlib.sha256((read + "\x00" + p.part_b).encode())
                           .hexdigest()[:16])
            cells.append(Cell(key, {"setting": st.name, "doc": p.doc, "domain": p.domain}, p))
        for rec in run_cells(store, cells, lambda st=st: closing(st.build()), compute, desc=st.name):
            rows.append({**rec, "role": st.role, "control_of": st.control_of, "slaves": ",".join(st.slaves)})
    return pd.DataFrame(rows).drop(columns=["key"])


def _by_doc(df: pd.DataFrame, mask: pd.Series, column: str = "nll") -> pd.Series:
    return df[mask].set_index("doc")[column]


def _advantage(nll: pd.Series, other: pd.Series, name: str, seed: int) -> dict[str, float]:
    """How much lower this setting's NLL is than `other`'s on the same documents (nats/token, bootstrap CI):
    `{name}_nll`, `vs_{name}`, `vs_{name}_low`, `vs_{name}_high`; nothing when `other` has no rows."""
    both = nll.index.intersection(other.index)
    if not len(both):
        return {}
    adv = other[both].to_numpy() - nll[both].to_numpy()
    low, high = bootstrap_ci(adv, seed=seed)
    return {f"{name}_nll": float(other[both].mean()), f"vs_{name}": float(adv.mean()), f"vs_{name}_low": low,
            f"vs_{name}_high": high}


def transfer(df: pd.DataFrame, n_boot: int = 2000, seed: int = 0) -> pd.DataFrame:
    """One row per offload (and text-relay) setting: its NLL transfer (paired bootstrap over documents), its
    advantage over its different-document control (control NLL - its NLL, nats/token, bootstrap CI), an offload's
    advantage over the same slave's text relay (`vs_relay`) where the grid has one, and, where the grid has the
    slave's ceiling, the slave's own gap (its floor - its skyline) as a share of the master's."""
    floor, sky = _by_doc(df, df["role"] == "floor"), _by_doc(df, df["role"] == "skyline")
    rows = []
    for setting, g in df[df["role"].isin(["self", "cross", "bus", "relay"])].groupby("setting", sort=False):
        s = g.set_index("doc")["nll"]
        docs = s.index.intersection(floor.index).intersection(sky.index)
        f, k, v = floor[docs].to_numpy(), sky[docs].to_numpy(), s[docs].to_numpy()
        row = {"setting": setting, "role": g["role"].iloc[0], "slaves": g["slaves"].iloc[0],
               "floor": f.mean(), "skyline": k.mean(), "nll": v.mean(),
               "gap": f.mean() - k.mean(), **dict(zip(("gap_low", "gap_high"), bootstrap_ci(f - k, seed=seed))),
               **transfer_rate(v, f, k, n_boot, seed)}
        row |= _advantage(s[docs], _by_doc(df, df["control_of"] == setting), "control", seed)
        if row["role"] != "relay":
            row |= _advantage(s[docs], _by_doc(df, (df["role"] == "relay") & (df["slaves"] == row["slaves"])),
                              "relay", seed)
        # a bus knows what its most knowing slave knows: its ceiling is the member's whose own gain is largest
        known = [c for c in (_ceiling(df, m, docs, seed) for m in row["slaves"].split(",")) if c]
        if known:
            best = max(known, key=lambda c: c["ceiling_gap"])
            row |= {**best, "ceiling_share": best["ceiling_gap"] / row["gap"] if row["gap"] else float("nan")}
        rows.append(row)
    return pd.DataFrame(rows)


def transfer_by_domain(df: pd.DataFrame, n_boot: int = 2000, seed: int = 0) -> pd.DataFrame:
    """The K/V offloads' transfer per domain (paired bootstrap over that domain's documents): where a pooled
    transfer above 1 comes from (the slave's slots helping more than the master reading A itself)."""
    floor, sky = _by_doc(df, df["role"] == "floor"), _by_doc(df, df["role"] == "skyline")
    domain = df[df["role"] == "floor"].drop_duplicates("doc").set_index("doc")["domain"]
    rows = []
    for setting, g in df[df["role"].isin(["self", "cross", "bus"])].groupby("setting", sort=False):
        s = g.set_index("doc")["nll"]
        for dom, docs in domain[s.index.intersection(floor.index).intersection(sky.index)].groupby(domain):
            d = docs.index
            rows.append({"setting": setting, "slaves": g["slaves"].iloc[0], "domain": dom,
                         **transfer_rate(s[d].to_numpy(), floor[d].to_numpy(), sky[d].to_numpy(), n_boot, seed)})
    return pd.DataFrame(rows)


def _ceiling(df: pd.DataFrame, slave: str, docs: pd.Index, seed: int) -> dict[str, float]:
    """One slave's own gain from reading A (its floor - its skyline on B, per document), where the grid has it."""
    ceil = df[(df["role"] == "ceiling") & (df["slaves"] == slave)]
    if not len(ceil):
        return {}
    c = ceil.drop_duplicates("doc").set_index("doc").reindex(docs)
    own = (c["nll_alone"] - c["nll"]).to_numpy()
    return {"ceiling_gap": float(own.mean()),
            **dict(zip(("ceiling_gap_low", "ceiling_gap_high"), bootstrap_ci(own, seed=seed)))}


def domain_counts(df: pd.DataFrame) -> dict[str, int]:
    """Documents per domain in the grid (the n behind every bootstrap)."""
    fl = df[df["role"] == "floor"]
    return {str(k): int(v) for k, v in fl.groupby("domain")["doc"].nunique().items()}

