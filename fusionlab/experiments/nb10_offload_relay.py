"""The text relay on offload accuracy (notebook 10): is sending K/V better than talking, on the same questions?

The slave reads the document *and the question* and answers it exactly as its ceiling does (the document, then its own
chat turn; greedy, at most the offload answer's budget): that answer is its note. The master reads only the note and
the question, and answers. Scored as every offload setting is (`nb06_offload.score_item`), so its rows join the
rung's K/V cells:

    relay     the master reads the slave's answer on the item's document (the ceiling's own cells, reused)
    control   the master reads the slave's answer on the item's decoy (another fact, the K/V control's document):
              what a note without the answer is worth

Why the ceiling's format: asked in a chat turn after the document to 'write a note' or 'answer in one sentence',
Gemma 270M echoed the document's opening (0 of 120 relayed) or wrote only '<p>' tags (2026-12-07), while after its
ceiling's prompt it answers 44 %. The relay then carries what the slave knows, and its ceiling bounds it. An empty
note is read as it is and scored (usually wrong), never skipped. Each row carries its cost beside the K/V channel's:
the note's length in master tokens and `seconds` = the note's share of its batch's wall time plus the master's answer.
"""
from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pandas as pd

from ..engine.fuse import fuse
from ..engine.lm import LM
from ..errors import FusionLabError
from . import nb06_offload as off

NOTE_HEAD = "Someone who read the full document was asked this question and answered: "
"""What the master reads before the note, inside its document tags."""


def relay_name(label: str) -> str:
    """The relay setting of the rung `label` (its control adds ", other doc's note")."""
    return f"{label} text relay"


def notes(ceiling: off.Setting, items: list[off.Item], which: str, max_new_tokens: int, cache: Path | None,
          batch_size: int) -> dict[str, dict[str, object]]:
    """The slave's answer to each item's question after reading its `which` ('document' or 'decoy'), by item id,
    with its cost: the ceiling's own cells (on the document they are the rung's ceiling, read from the cache)."""
    reading = items if which == "document" else [replace(it, document=it.decoy) for it in items]
    name = ceiling.name if which == "document" else f"{ceiling.name}, on the other doc"
    cells = off.run(reading, [replace(ceiling, name=name)], max_new_tokens, cache, batch_size)
    return {r["item"]: {"note": r["answer"], "note_seconds": float(r["seconds"])} for r in cells.to_dict("records")}


def relay_cells(master: LM, ceiling: off.Setting, items: list[off.Item], max_new_tokens: int = 24,
                cache: Path | None = None, batch_size: int = 4) -> pd.DataFrame:
    """The relay and its control on every item, resumable (notes and answers in the offload cell cache); rows shaped
    like `nb06_offload.run`'s plus `note`, `note_tokens` and `note_seconds`, and column `rung` = the slave's label.
    `ceiling`: the rung's ceiling setting (role 'ceiling', one slave alone reading document + question)."""
    if ceiling.role != "ceiling" or len(ceiling.slaves) != 1:
        raise FusionLabError(f"relay_cells: ceiling={ceiling.name!r} (role {ceiling.role!r}) is not one slave's "
                             "ceiling; pass the rung's setting with role 'ceiling' from rung_settings or "
                             "foreign_settings.")
    label = ceiling.slaves[0]
    name, key = relay_name(label), f"relay-answer|{master.fingerprint[:12]}|{ceiling.key}"
    none = lambda: fuse(master, [])  # noqa: E731  (the master alone, reading the note as its document)
    parts = []
    for which, setting in (("document", off.Setting(name, key, none, "itself", "relay", slaves=[label])),
                           ("decoy", off.Setting(f"{name}, other doc's note", key, none, "itself", "control", name,
                                                 [label]))):
        note = notes(ceiling, items, which, max_new_tokens, cache, batch_size)
        reading = [replace(it, document=off.wrap(NOTE_HEAD + note[it.id]["note"])) for it in items]
        cells = off.run(reading, [setting], max_new_tokens, cache, batch_size)
        by_item = cells["item"].map
        parts.append(cells.assign(
            note=by_item(lambda i: note[i]["note"]),
            note_tokens=by_item(lambda i: int(master.encode(note[i]["note"], special_tokens=False).shape[1])),
            note_seconds=by_item(lambda i: note[i]["note_seconds"]),
            seconds=lambda d: d["seconds"] + d["note_seconds"]))
    return pd.concat(parts, ignore_index=True).assign(rung=label)
