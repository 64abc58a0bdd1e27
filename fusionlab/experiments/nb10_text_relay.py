"""The text relay (notebook 10): the baseline every KV-communication paper compares with. The slave reads part A and
*writes* a short note about it; the master reads the note, then predicts part B. Is sending K/V better than talking?

    relay     the master reads the slave's note on this document's part A, then B
    control   the master reads the slave's note on a *different document's* part A (the pair's `other_a`; the same
              derangement as the offload control), then B: what a note that knows nothing about B is worth

Both are scored as `nb10_nll_transfer` scores every setting (B's tokens after its first), so a relay row joins the
transfer table beside the offload row of the same slave: transfer, its control and `vs_relay` (relay NLL - offload
NLL per document, bootstrap CI). The note is greedy, at most `tokens` tokens, in the slave's own tokenizer and chat
template, decoded to text: a relay crosses tokenizers for free, which K/V cannot.
"""
from __future__ import annotations

import hashlib
import time
from contextlib import closing
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import pandas as pd

from ..cells import Cell, CellCache, cell_key, run_cells
from ..engine.continuous import GROUP_SEATS, ContinuousBatcher, records_as_rows_end
from ..engine.fuse import FusedModel, fuse
from ..engine.lm import LM
from .nb10_nll_transfer import Pair, default_cache, nll_after

NOTE_PROMPT = ("Read the text below. Then write short notes on it: its topic and the names, numbers and terms it "
               "uses, so that someone who has not read it can follow how it continues.\n\n{text}")
NOTE_HEAD = "Notes on the text so far: "
"""What the master reads before the note (then a blank line, then B)."""


@dataclass(frozen=True)
class Relay:
    """One slave on the ladder as a writer: `label` names its rung (the offload rows' `slaves`)."""

    label: str
    writer: LM
    tokens: int = 48


def _digest(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def reads(note: str) -> str:
    """The text the master reads before B: the note under its head, then a blank line."""
    return NOTE_HEAD + note + "\n\n"


def notes(relay: Relay, prompts: list[str], cache: CellCache) -> dict[str, dict[str, Any]]:
    """The writer's note for each distinct prompt (cached by writer, the whole prompt it answers, and budget), with
    its cost, keyed by the prompt."""
    def write(fused: FusedModel, cs: list[Cell],
              emit: Callable[[int, dict[str, Any]], None] | None = None) -> list[dict[str, Any]]:
        return records_as_rows_end(  # note_seconds: since the previous note ended, so sums are wall time
            ContinuousBatcher(fused, min(4, len(cs))), [c.item for c in cs],
            lambda j, note, cost: {"note": note, "note_seconds": round(cost.seconds, 3)}, emit,
            max_new_tokens=relay.tokens, chat=True)

    distinct = list(dict.fromkeys(prompts))
    cells = [Cell(cell_key("relay-note", relay.writer.fingerprint[:12], _digest(q), relay.tokens), {}, q)
             for q in distinct]
    recs = run_cells(cache, cells, lambda: closing(fuse(relay.writer, [])), lambda f, c: write(f, [c])[0],
                     desc=f"{relay.label} notes", compute_batch=write, batch_size=GROUP_SEATS * 4, streams=True)
    return dict(zip(distinct, recs))


def run(master: LM, items: list[Pair], relays: list[Relay], cache: Path | None = None) -> pd.DataFrame:
    """Relay and control cells for every writer, resumable; rows shaped like `nb10_nll_transfer.run`'s (setting,
    doc, domain, nll, seconds, role, control_of, slaves) plus the note and its length in the master's tokens."""
    store = CellCache(cache or default_cache())

    def score(fused: FusedModel, c: Cell) -> dict[str, Any]:
        pair, note = c.item
        t0 = time.perf_counter()
        nll = nll_after(fused, reads(note["note"]), pair.part_b)
        length = int(master.encode(note["note"], special_tokens=False).shape[1])
        return {"nll": nll, "note": note["note"], "note_tokens": length,
                "seconds": round(time.perf_counter() - t0 + note["note_seconds"], 3)}

    rows = []
    for relay in relays:
        written = notes(relay, [NOTE_PROMPT.format(text=p.part_a) for p in items] +
                        [NOTE_PROMPT.format(text=p.other_a) for p in items], store)
        name = f"{relay.label} text relay"
        for setting, role, control_of, source in ((name, "relay", None, "part_a"),
                                                  (f"{name}, other doc's note", "control", name, "other_a")):
            cells = []
            for p in items:
                note = written[NOTE_PROMPT.format(text=getattr(p, source))]
                key = cell_key("relay-nll", master.fingerprint[:12], _digest(reads(note["note"]) + "\x00" + p.part_b))
                cells.append(Cell(key, {"setting": setting, "doc": p.doc, "domain": p.domain}, (p, note)))
            for rec in run_cells(store, cells, lambda: closing(fuse(master, [])), score, desc=setting):
                rows.append({**rec, "role": role, "control_of": control_of, "slaves": relay.label})
    return pd.DataFrame(rows).drop(columns=["key"]) if rows else pd.DataFrame()
