"""The full plan's NLL transfer map, rung by rung: a run that takes more sittings than one.

Notebook 10's full NLL plan (every rung and both foreign families on up to 60 documents per domain, part A of 256 and
part B of 128 master tokens, each slave also through `lstsq`, KVComm's layers and a 64-token text relay) is about
half a day of fp32 on a 2-core CPU. A *stage* computes it one rung at a time in `stage_rungs` (the exact copy, the
foreign families, then the rungs where the default map breaks), the bus last, and after each rung hands the cells,
the divergence rows and the map over the rungs finished so far to `on_rung` (`fusionlab nll-stage` saves them as
`10_nll_stage_<kind>.full`). It makes the notebook's own calls with the notebook's own arguments, so its cells are
the notebook's (same cache keys): a stage resumes from the cell cache, and the notebook's full run reads them back.
"""
from __future__ import annotations

import time
from pathlib import Path
from typing import Any, Callable

import pandas as pd

from ..engine.fit import fit_lstsq
from ..engine.lm import LM
from ..engine.projector import LstsqProjector
from ..models.zoo import load
from . import nb07_corpora as corpora
from . import nb10_finetune as finetune
from . import nb10_nll_transfer as nll
from . import nb10_transfer_map as tm
from .nb10_crossing import as_row, crossing
from .nb10_offload_stage import BUS, chosen_rungs, stage_labels, stage_rungs


def table_name(kind: str, size: str = "full") -> str:
    """`10_nll_stage_<kind>.<size>`: kind 'cells', 'divergence', 'map' (the ladder table over the rungs done) or
    'crossing' (`stage_crossing`)."""
    return f"10_nll_stage_{kind}.{size}"


def stage_crossing(cells: pd.DataFrame, divergence: pd.DataFrame) -> pd.DataFrame:
    """The weight-noise rungs done so far as one curve of KL (`nb10_crossing.crossing`, bootstrap over the stage's
    documents), one row as notebook 10 saves `10_crossing`: where the full plan's transfer halves."""
    return pd.DataFrame([as_row(crossing(cells, divergence))])


def run_nll_stage(master: LM, rungs: list[str] | None = None, plan: tm.Plan | None = None,
                  docs: list[corpora.Doc] | None = None, cache: Path | None = None,
                  divergence_cache: Path | None = None,
                  on_rung: Callable[[pd.DataFrame, pd.DataFrame, pd.DataFrame], Any] | None = None,
                  load_slave: Callable[[str], LM] = load, texts: list[str] | None = None,
                  earlier: tuple[pd.DataFrame, pd.DataFrame] | None = None) -> pd.DataFrame:
    """Compute `plan`'s (default: the full plan's) NLL cells and divergence for `rungs` (default: all, in
    `stage_rungs`; fine-tuned siblings are trained first where their weights are missing), calling
    `on_rung(cells, divergence, table)` after each rung. `earlier`: the (cells, divergence) a previous call saved,
    kept in the map (a call for some rungs must not drop the others). Returns the map over those and this call's."""
    plan = plan or tm.plan("full")
    rungs = chosen_rungs(stage_rungs(plan), rungs)
    label = stage_labels(plan)
    docs = corpora.documents() if docs is None else docs
    items = nll.pairs(master.tokenizer, docs, plan.a_tokens, plan.b_tokens, plan.per_domain)
    texts = tm.divergence_texts(plan, texts)
    kvcomm = tm.kvcomm_samples(texts) if plan.kvcomm else None
    pairs: dict[str, tuple[LM, LstsqProjector]] = {}  # foreign slaves with their fits, kept for the bus

    def foreign(name: str) -> tuple[LM, LstsqProjector]:
        if name not in pairs:
            lm = load_slave(name)
            pairs[name] = (lm, fit_lstsq(master, lm))  # our calibration text, never the documents
        return pairs[name]

    def measure(rung: str) -> tuple[pd.DataFrame, pd.DataFrame]:
        if rung == BUS:
            together = {label[n]: foreign(n) for n in plan.foreign}
            return tm.bus_rung(master, together, items, cache), pd.DataFrame([tm.bus_divergence(together)])
        if rung in plan.foreign:
            cells = tm.nll_ladder(master, [], {label[rung]: foreign(rung)}, items, cache, plan.relay_tokens,
                                  plan.lstsq, kvcomm)
            return cells, pd.DataFrame([tm.foreign_divergence(label[rung], foreign(rung)[1])])
        finetune.ensure(master, [rung], docs)
        div = tm.measure_divergence(master, [rung], texts, lstsq=plan.lstsq, cache=divergence_cache)
        return tm.nll_ladder(master, [rung], {}, items, cache, plan.relay_tokens, plan.lstsq, kvcomm), div

    parts, divs = ([], []) if earlier is None else ([earlier[0]], [earlier[1]])
    table = pd.DataFrame()
    for r in rungs:
        t0 = time.perf_counter()
        cells, div = measure(r)
        parts.append(cells)
        divs.append(div)
        every = (pd.concat(parts, ignore_index=True).drop_duplicates(["setting", "doc"], keep="last")
                 .reset_index(drop=True))
        divergence = pd.concat(divs, ignore_index=True).drop_duplicates("recipe", keep="last")
        table = tm.ladder_table(every, divergence, list(divergence["recipe"]))  # one divergence row per rung
        if on_rung is not None:
            on_rung(every, divergence, table)
        print(f"{r}: {time.perf_counter() - t0:.0f} s, {len(table)} rungs in the map", flush=True)
    return table
