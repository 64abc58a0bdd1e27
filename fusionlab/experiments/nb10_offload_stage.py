"""The full plan's offload accuracy, one length at a time: a run that takes more sittings than one.

Notebook 10's full offload plan (every rung, 120 synthetic facts, at 256 / 1K / 2K tokens) is tens of hours of fp32
generation on a 2-core CPU, so it cannot wait for one notebook run. A *stage* computes the full plan's cells at one
length, rung after rung in `stage_rungs` (the positive control, then the foreign families, then the rungs where the
NLL map breaks, the bus last), and after each rung hands the cells and the accuracy table over the rungs finished so
far to `on_rung` (`fusionlab offload-stage` saves them as `10_offload_cells_<length>.full` and
`10_offload_ladder_<length>.full`). Its cells are the notebook's own (same items, decoys and cache keys), so a stage
resumes from the cell cache and the notebook's full run later reads them back instead of recomputing.
"""
from __future__ import annotations

import time
from pathlib import Path
from typing import Any, Callable

import pandas as pd

from ..engine.fit import fit_lstsq
from ..engine.lm import LM
from ..errors import FusionLabError
from ..models.zoo import load, short_name
from . import nb07_corpora as corpora
from . import nb10_finetune as finetune
from . import nb10_offload as offload
from . import nb10_transfer_map as tm
from .nb06_offload import Item

FIRST = ("noise:0", "smollm2-135m-instruct", "gemma3-270m", "int4", "noise:0.1", "noise:0.2", "prune:4")
"""Rungs a partial stage should hold first: the exact copy (the positive control every null needs), the foreign
families (the central null), and the rungs either side of where NLL transfer breaks. The rest follow in ladder order.
The NLL map's stage (`nb10_nll_stage`) walks the same order."""


BUS = "bus"
"""The rung name of the foreign slaves together (the ladder's last rung; its label in the tables is
`nb10_transfer_map.bus_label`)."""


def stage_order(plan: offload.OffloadPlan | Any) -> list[str]:
    """Every rung and foreign slave of `plan` (an offload plan or the NLL map's `nb10_transfer_map.Plan`: both have
    `.rungs` and `.foreign`), the `FIRST` ones first."""
    every = [*plan.rungs, *plan.foreign]
    return [r for r in FIRST if r in every] + [r for r in every if r not in FIRST]


def stage_rungs(plan: offload.OffloadPlan | Any) -> list[str]:
    """Every rung of `plan` in stage order, the bus last where the plan has one."""
    return stage_order(plan) + ([BUS] if plan.bus and len(plan.foreign) > 1 else [])


def chosen_rungs(order: list[str], rungs: list[str] | None) -> list[str]:
    """`rungs` (None: all of `order`), each checked against the plan's `order`."""
    unknown = [r for r in rungs or [] if r not in order]
    if unknown:
        raise FusionLabError(f"rungs={unknown} are not in the plan; use some of {order}.")
    return order if rungs is None else rungs


def stage_labels(plan: offload.OffloadPlan | Any) -> dict[str, str]:
    """Each rung's name in the cells' settings and the tables: a sibling by its recipe, a foreign slave by its short
    name (`fl.short_name`), which must tell the plan's slaves apart; the bus by its members' names."""
    label = {r: short_name(r) if r in plan.foreign else r for r in stage_order(plan)}
    seen = pd.Series(list(label.values()))
    if seen.duplicated().any():
        raise FusionLabError(f"the plan's slaves {plan.foreign} share the short name "
                             f"{seen[seen.duplicated()].iloc[0]!r} (the part before the first hyphen), so their cells "
                             "would mix; give the models names that differ before the first hyphen.")
    if BUS in stage_rungs(plan):
        label[BUS] = tm.bus_label({label[n]: None for n in plan.foreign})
    return label


def stage_items(master: LM, plan: offload.OffloadPlan, length: int,
                haystacks: dict[str, str] | None = None) -> list[Item]:
    """The plan's items at one length, built with all its lengths (a decoy depends on the item's place in the whole
    plan, so building one length alone would give other controls and other cache keys)."""
    if length not in plan.lengths:
        raise FusionLabError(f"length={length} is not in the plan's lengths {plan.lengths}; pick one of them.")
    return [it for it in offload.items(master, plan, haystacks) if it.length == length]


def table_name(kind: str, length: int, size: str = "full") -> str:
    """`10_offload_<kind>_<length>.<size>`: kind 'cells' or 'ladder'."""
    return f"10_offload_{kind}_{length}.{size}"


DIVERGENCE = "10_offload_divergence.full"
"""The offload stages' divergence table, one for every length (a sibling's KL does not depend on the document): the x
axis of their weight-noise crossing (`nb10_crossing.accuracy_crossing`). Its cells are the NLL stage's own."""
KNOB = "noise:"
"""The rungs read as one curve of KL: the weight-noise siblings."""


def stage_divergence(master: LM, rungs: list[str], earlier: pd.DataFrame | None = None,
                     texts: list[str] | None = None, cache: Path | None = None) -> pd.DataFrame:
    """`earlier`'s rows, plus the divergence of each of `rungs` they lack: `nb10_transfer_map.measure_divergence` on
    the full NLL plan's held-out texts, so the cells are the ones the NLL stage and the notebook's full run compute
    (and read back from the same cache)."""
    known = set() if earlier is None else set(earlier["recipe"])
    todo = [r for r in rungs if r not in known]
    if not todo:
        return earlier if earlier is not None else pd.DataFrame(columns=["recipe", "kl"])
    full = tm.plan("full")
    new = tm.measure_divergence(master, todo, tm.divergence_texts(full, texts), lstsq=full.lstsq, cache=cache)
    return (pd.concat([d for d in (earlier, new) if d is not None], ignore_index=True)
            .drop_duplicates("recipe", keep="last").reset_index(drop=True))


def run_stage(master: LM, length: int, rungs: list[str] | None = None, plan: offload.OffloadPlan | None = None,
              cache: Path | None = None,
              on_rung: Callable[[pd.DataFrame, pd.DataFrame, pd.DataFrame], Any] | None = None,
              load_slave: Callable[[str], LM] = load, haystacks: dict[str, str] | None = None,
              earlier: pd.DataFrame | None = None, divergence: pd.DataFrame | None = None,
              texts: list[str] | None = None, divergence_cache: Path | None = None) -> pd.DataFrame:
    """Compute `plan`'s (default: the full plan's) cells at `length` for `rungs` (default: all, in `stage_rungs`;
    fine-tuned siblings are trained first where their weights are missing), calling `on_rung(cells, table,
    divergence)` after each rung, `divergence` (`stage_divergence`) holding every `KNOB` rung in the table.
    `earlier` / `divergence`: the cells and divergence a previous call saved, kept (a call for some rungs must not drop
    the others). Returns the accuracy table over every rung this call computed or read back and the earlier ones."""
    plan = plan or offload.offload_plan("full")
    rungs = chosen_rungs(stage_rungs(plan), rungs)
    items = stage_items(master, plan, length, haystacks)
    label = stage_labels(plan)
    parts: list[pd.DataFrame] = [] if earlier is None else [earlier]
    table = pd.DataFrame()
    for r in rungs:
        t0 = time.perf_counter()
        if r == BUS:
            pairs = {label[n]: (lm, fit_lstsq(master, lm)) for n in plan.foreign for lm in [load_slave(n)]}
            parts.append(offload.bus_offload(master, pairs, items, plan.max_new_tokens, cache))
            del pairs
        elif r in plan.foreign:
            lm = load_slave(r)
            pair = {label[r]: (lm, fit_lstsq(master, lm))}
            parts.append(offload.offload_ladder(master, [], pair, items, plan.max_new_tokens, cache,
                                                relay=plan.relay))
            del lm, pair
        else:
            finetune.ensure(master, [r], corpora.documents())
            parts.append(offload.offload_ladder(master, [r], {}, items, plan.max_new_tokens, cache,
                                                relay=plan.relay))
        cells = (pd.concat(parts, ignore_index=True).drop_duplicates(["setting", "item"], keep="last")
                 .reset_index(drop=True))
        table = offload.accuracy_table(cells, list(label.values()))
        knob = [str(s) for s in table["slave"] if str(s).startswith(KNOB)]
        divergence = stage_divergence(master, knob, divergence, texts, divergence_cache)
        if on_rung is not None:
            on_rung(cells, table, divergence)
        print(f"{r}: {time.perf_counter() - t0:.0f} s, {len(table)} rungs in the table", flush=True)
    return table
