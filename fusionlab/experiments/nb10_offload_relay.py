"""The text relay on offload accuracy (notebook 10): is sending K/V better than talking, on the same questions?

The slave reads the document *and the question* and writes a short greedy note answering it (at most `Relay.tokens`
tokens, in its own tokenizer and chat template); the master reads only that note and the question, and answers.
Scored as every offload setting is (`nb06_offload.score_item`), so its rows join the rung's K/V cells:

    relay     the master reads the slave's note on the item's document
    control   the master reads the slave's note on the item's decoy (another fact, the K/V control's document):
              what a note without the answer is worth

An empty note is read as it is and scored (usually wrong), never skipped. Each row carries its cost beside the K/V
channel's: the note's length in master tokens and `seconds` = the note's share of its batch's wall time plus the
master's answer.
"""
from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pandas as pd

from ..cells import CellCache
from ..engine.fuse import fuse
from ..engine.lm import LM
from . import nb06_offload as off
from .nb10_text_relay import NOTE_HEAD, Relay, notes

QA_NOTE_PROMPT = ("{document}\nSomeone who cannot see the document above has to answer this question: {question}\n"
                  "Answer it for them in one short sentence, with the exact names, numbers or codes the document "
                  "gives.")
"""What the slave is asked: the question's answer, as it would say it. Neither prompt tried so far gives Gemma 270M a
usable note on the 256-token stage (2026-12-07): 'write a short note' made it echo the document's opening (0 of 120
relayed); with this one, 81 of the last 95 notes it wrote before the run was stopped were only '<p>' tags, the rest
'<p>The answer is 1000...' or similar. Not yet measured, and the next thing to try: the note = the slave's answer in
its ceiling's own format (the document before the chat turn), in which it answers 44 %."""


def relay_name(label: str) -> str:
    """The relay setting of the rung `label` (its control adds ", other doc's note")."""
    return f"{label} text relay"


def _note_prompt(item: off.Item, document: str) -> str:
    return QA_NOTE_PROMPT.format(question=item.question, document=document)


def relay_cells(master: LM, relay: Relay, items: list[off.Item], max_new_tokens: int = 24,
                cache: Path | None = None, batch_size: int = 4) -> pd.DataFrame:
    """The relay and its control on every item, resumable (notes and answers in the offload cell cache); rows shaped
    like `nb06_offload.run`'s plus `note`, `note_tokens` and `note_seconds`, and column `rung` = the relay's label."""
    store = CellCache(cache or off.default_cache())
    prompts = {(it.id, which): _note_prompt(it, getattr(it, which)) for it in items for which in ("document", "decoy")}
    written = notes(relay, list(prompts.values()), store)
    name, fp = relay_name(relay.label), master.fingerprint[:12]
    key = f"relay|{fp}|{relay.writer.fingerprint[:12]}|{relay.tokens}"
    none = lambda: fuse(master, [])  # noqa: E731  (the master alone, reading the note as its document)
    parts = []
    for which, setting in (("document", off.Setting(name, key, none, "itself", "relay", slaves=[relay.label])),
                           ("decoy", off.Setting(f"{name}, other doc's note", key, none, "itself", "control", name,
                                                 [relay.label]))):
        note = {it.id: written[prompts[(it.id, which)]] for it in items}
        reading = [replace(it, document=off.wrap(NOTE_HEAD + note[it.id]["note"])) for it in items]
        cells = off.run(reading, [setting], max_new_tokens, cache, batch_size)
        by_item = cells["item"].map
        parts.append(cells.assign(
            note=by_item(lambda i: note[i]["note"]),
            note_tokens=by_item(lambda i: int(master.encode(note[i]["note"], special_tokens=False).shape[1])),
            note_seconds=by_item(lambda i: note[i]["note_seconds"]),
            seconds=lambda d: d["seconds"] + d["note_seconds"]))
    return pd.concat(parts, ignore_index=True).assign(rung=relay.label)
