"""Context offload (notebook 06): does a slave's memory reach the master?

Only the slave reads a document; the master sees only the question (`fused.generate(question, context=document)`).

    floor      the master, no document              skyline    the master reads document + question itself
    offload    slaves read the document             shuffled   slaves read a *different* document (same length,
                                                               language, depth; it lacks the answer): the control

A self-copy of the master as the slave must equal the skyline (the engine's exact anchor); a real slave's transfer rate
is (fused - floor) / (skyline - floor). Tasks: one fact (our needles, with their distractor, in real prose), and two
facts at once (both needed). Documents come from the NIAH haystacks at a fixed master-token length.
"""
from __future__ import annotations

import hashlib
from contextlib import closing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import pandas as pd
import torch

from ..cells import Cell, CellCache, cell_key, run_cells
from ..engine.continuous import GROUP_SEATS, ContinuousBatcher, RowCost, records_as_rows_end
from ..engine.fuse import FusedModel, fuse
from ..engine.layermap import LayerMap
from ..engine.lm import LM
from ..engine.projector import LstsqProjector
from ..engine.slave import Slave
from ..errors import FusionLabError
from ..paths import cache_dir
from .nb02_niah import ABSTAIN, Needle, build_context, load_haystack, load_needles, score

INSTRUCTION = {"en": "Answer the question briefly, using only the document above.",
               "zh": "请根据上面的文档简短地回答问题。"}
TWO = {"en": "Answer both questions. (1) {a} (2) {b}", "zh": "请回答两个问题：（1）{a}（2）{b}"}
HAYSTACKS = {"en": "paul_graham", "zh": "zh"}


@dataclass(frozen=True)
class Item:
    """One question about one document (and the control's document)."""

    id: str
    task: str
    """'fact' or 'two-fact'."""
    lang: str
    needles: tuple[Needle, ...]
    """The fact(s) the answer needs."""
    length: int
    depth: float
    document: str
    decoy: str
    """A document of the same length, language and depth holding another fact instead: the shuffled control."""

    @property
    def question(self) -> str:
        if self.task == "fact":
            return self.needles[0].question
        return TWO[self.lang].format(a=self.needles[0].question, b=self.needles[1].question)

    def prompt(self, master: LM) -> str:
        return master.chat_prompt(f"{INSTRUCTION[self.lang]}\n\n{self.question}")


def wrap(context: str) -> str:
    return f"<document>\n{context}\n</document>\n"


def document(tokenizer: Any, haystack: str, needles: tuple[Needle, ...], length: int, depth: float) -> str:
    """`length` master tokens of prose holding the fact (and its distractor), or both facts of a two-fact item."""
    nd = needles[0] if len(needles) == 1 else Needle(f"{needles[0].id}+{needles[1].id}", needles[0].lang,
                                                     needles[0].needle, "", (), needles[1].needle, ())
    return wrap(build_context(tokenizer, haystack, nd, length, depth)[0])


def build_items(master: LM, facts: list[str], pairs: list[tuple[str, str]], lengths: list[int], depths: list[float],
                haystacks: dict[str, str] = HAYSTACKS, needles: list[Needle] | None = None) -> list[Item]:
    """Every (task, needle or pair, length, depth) item; each decoy holds the next same-language needle not in it.
    `needles`: the pool the ids name (default: our hand-written needles; notebook 10 passes synthetic facts)."""
    pool = {n.id: n for n in (load_needles() if needles is None else needles)}
    missing = [f for f in [*facts, *(x for pair in pairs for x in pair)] if f not in pool]
    if missing:
        raise FusionLabError(f"build_items: no needle {missing[0]!r} in the pool; use one of {sorted(pool)[:6]}...")
    texts = {lang: load_haystack(name) for lang, name in haystacks.items()}
    same_lang = {lang: [n for n in pool.values() if n.lang == lang] for lang in texts}
    groups = [("fact", (pool[f],)) for f in facts] + [("two-fact", (pool[a], pool[b])) for a, b in pairs]
    items = []
    for task, nds in groups:
        lang = nds[0].lang
        others = [n for n in same_lang[lang] if n not in nds]
        if not others:
            raise FusionLabError(f"no other {lang} needle to build the control document for {[n.id for n in nds]}.")
        for n in lengths:
            for d in depths:
                decoy = others[(len(items)) % len(others)]
                items.append(Item(f"{task}:{'+'.join(x.id for x in nds)}:{n}:{d:g}", task, lang, nds, n, d,
                                  document(master.tokenizer, texts[lang], nds, n, d),
                                  document(master.tokenizer, texts[lang], (decoy,), n, d)))
    return items


def score_item(answer: str, item: Item) -> dict[str, Any]:
    """A fact: niah.score. Two facts: correct iff both answers appear; 'partial' if one does."""
    if item.task == "fact":
        return score(answer, item.needles[0])
    a = answer.lower()
    hits = [any(x.lower() in a for x in nd.answers) for nd in item.needles]
    label = "correct" if all(hits) else ("partial" if any(hits) else ("abstain" if ABSTAIN.search(answer) else "wrong"))
    return {"label": label, "distractor": False}


# --- settings ------------------------------------------------------------------------------------------------
READS = ("nothing", "itself", "document", "decoy")


@dataclass
class Setting:
    """A way to answer. reads: 'nothing' (floor), 'itself' (skyline: the built model's own master reads the document;
    for a slave's ceiling that model is the slave alone), 'document' (offload), 'decoy' (the shuffled control)."""

    name: str
    key: str
    build: Callable[[], FusedModel]
    reads: str
    role: str = "offload"
    """'floor' | 'skyline' | 'ceiling' | 'self' | 'cross' | 'bus' | 'control' (for the analyses)."""
    control_of: str | None = None
    slaves: list[str] = field(default_factory=list)


def answers(fused: FusedModel, items: list[Item], reads: str, max_new_tokens: int, seats: int = 4,
            record: Callable[[int, str, RowCost], Any] = lambda i, answer, cost: answer,
            emit: Callable[[int, Any], None] | None = None) -> list[Any]:
    """Items answered one way (see READS) on `seats` seats of continuous batching; every row equals its item
    answered alone. Returns the answers, or `record(i, answer, cost)` of each, each handed to `emit` as its row ends
    (`records_as_rows_end`)."""
    m = fused.master
    prompts = [it.prompt(m) for it in items]
    batcher = ContinuousBatcher(fused, min(seats, len(items)))
    if reads == "itself":  # the skyline: document ids + prompt ids, as one sequence per row
        rows = [torch.cat([m.encode(it.document), m.encode(p, special_tokens=False)], dim=1)[0]
                for it, p in zip(items, prompts)]
        return records_as_rows_end(batcher, rows, lambda i, out, cost: record(
            i, m.tokenizer.decode(out[0, len(rows[i]):], skip_special_tokens=True), cost), emit,
            max_new_tokens=max_new_tokens)
    docs = None if reads == "nothing" else [it.document if reads == "document" else it.decoy for it in items]
    return records_as_rows_end(batcher, prompts, record, emit, max_new_tokens=max_new_tokens, context=docs)


def slave_key(master: LM, slave: LM, projector: Any) -> str:
    """The cache key of a slave fed through `projector` (each channel on it appends its own suffix)."""
    return f"{master.fingerprint[:12]}|{slave.fingerprint[:12]}|{projector.kind}|{projector.fingerprint()[:12]}"


def bounds(master: LM) -> list[Setting]:
    """Floor and skyline: the master alone without the document and reading it (every grid's two ends)."""
    fp = master.fingerprint[:12]
    none = lambda: fuse(master, [])  # noqa: E731
    return [Setting("floor (no document)", f"floor|{fp}", none, "nothing", "floor"),
            Setting("skyline (master reads it)", f"skyline|{fp}", none, "itself", "skyline")]


def settings(master: LM, slaves: dict[str, tuple[LM, LstsqProjector]], kvcomm: dict[str, LayerMap] | None = None,
             naive: list[str] | tuple[str, ...] = (), bus: bool = True, self_copy: bool = True,
             ceilings: bool = True, layer_maps: dict[str, LayerMap] | None = None) -> list[Setting]:
    """floor, skyline, self-offload (+ its control), each slave re-rotated (+ control, + naive keys, + KVComm's
    layers), and the bus of all slaves (+ control). `ceilings`: each slave alone reading document + question (what it
    knew, the most a transfer of its memory can carry; a null is evidence only where the ceiling beats the floor).
    `layer_maps`: the map of a slave whose projector has none (identity; a pruned sibling's map home)."""
    fp = master.fingerprint[:12]
    out = bounds(master)
    if self_copy:
        mk = lambda: fuse(master, [Slave(master, mode="concat", rope="master")])  # noqa: E731
        out += [Setting("self-offload", f"self|{fp}", mk, "document", "self"),
                Setting("self-offload, shuffled doc", f"self|{fp}", mk, "decoy", "control", "self-offload")]

    def slave(label: str, rope: str = "master", lmap: LayerMap | None = None) -> Slave:
        lm, proj = slaves[label]  # a fitted projector carries its layer map; an identity one takes `layer_maps`
        home = lmap or getattr(proj, "layer_map", None) or (layer_maps or {}).get(label)
        return Slave(lm, layer_map=home, projector=proj, align="mean", rope=rope)

    for label, (lm, proj) in slaves.items():
        key = slave_key(master, lm, proj)
        mk = lambda label=label: fuse(master, [slave(label)])  # noqa: E731
        if ceilings:
            out.append(Setting(f"{label} alone (reads it)", f"ceiling|{lm.fingerprint[:12]}",
                               lambda lm=lm: fuse(lm, []), "itself", "ceiling", slaves=[label]))
        out += [Setting(f"+{label}", key, mk, "document", "cross", slaves=[label]),
                Setting(f"+{label}, shuffled doc", key, mk, "decoy", "control", f"+{label}", [label])]
        if label in naive:
            out.append(Setting(f"+{label}, naive RoPE", key + "|naive",
                               lambda label=label: fuse(master, [slave(label, "slave")]), "document", "cross",
                               slaves=[label]))
        if kvcomm and label in kvcomm:
            sel = kvcomm[label]
            out.append(Setting(f"+{label}, KVComm layers", key + f"|kvcomm{sorted(sel.pairs)}",
                               lambda label=label, sel=sel: fuse(master, [slave(label, lmap=sel)]), "document",
                               "cross", slaves=[label]))
    if bus and len(slaves) > 1:
        key = f"{fp}|bus|" + "|".join(f"{lm.fingerprint[:12]}:{p.fingerprint()[:12]}" for lm, p in slaves.values())
        name = "+" + " +".join(slaves)
        mk = lambda: fuse(master, [slave(label) for label in slaves])  # noqa: E731
        out += [Setting(name, key, mk, "document", "bus", slaves=list(slaves)),
                Setting(f"{name}, shuffled doc", key, mk, "decoy", "control", name, list(slaves))]
    return out


def default_cache() -> Path:
    return cache_dir() / "offload.jsonl"


def run(items: list[Item], grid: list[Setting], max_new_tokens: int = 24, cache: Path | None = None,
        batch_size: int = 4) -> pd.DataFrame:
    """Every (setting, item) cell, resumable, on `batch_size` seats of continuous batching over GROUP_SEATS x that many
    items (similar lengths together); one row per cell with the answer, its label and its cost (`seconds`: the wall
    time since the previous row ended, so sums are wall time). In-process a setting's missing items are one scheduler
    run, each saved as its row ends (`run_cells(streams=True)`)."""
    store = CellCache(cache or default_cache())

    def compute_batch(reads: str) -> Callable[..., list[dict[str, Any]]]:
        def many(fused: FusedModel, cs: list[Cell],
                 emit: Callable[[int, dict[str, Any]], None] | None = None) -> list[dict[str, Any]]:
            return answers(fused, [c.item for c in cs], reads, max_new_tokens, batch_size,
                           lambda j, text, cost: {"answer": text, **score_item(text, cs[j].item),
                                                  "seconds": round(cost.seconds, 2), "batch": min(batch_size, len(cs))},
                           emit)
        return many

    rows = []
    for st in grid:
        cells = []
        for it in items:
            doc = {"nothing": "", "itself": it.document, "document": it.document, "decoy": it.decoy}[st.reads]
            key = cell_key("offload", st.key, st.reads, it.id, hashlib.sha256(doc.encode()).hexdigest()[:16],
                           it.question, max_new_tokens)
            cells.append(Cell(key, {"setting": st.name, "item": it.id, "task": it.task, "lang": it.lang,
                                    "length": it.length, "depth": it.depth}, it))
        many = compute_batch(st.reads)
        for rec in run_cells(store, cells, lambda st=st: closing(st.build()), lambda f, c, many=many: many(f, [c])[0],
                             desc=st.name, compute_batch=many, batch_size=GROUP_SEATS * batch_size,
                             batch_key=lambda c: (c.fields["length"], c.fields["lang"]), streams=True):
            rows.append({**rec, "role": st.role, "control_of": st.control_of})
    return pd.DataFrame(rows).drop(columns=["key"])


@dataclass
class Plan:
    """What one run size measures. Calibration needles (KVComm's layer scores) are never evaluated."""

    facts: list[str]
    pairs: list[tuple[str, str]]
    lengths: list[int]
    depths: list[float]
    slaves: list[str]
    naive: list[str]
    kvcomm: list[str]
    bus: bool
    max_new_tokens: int = 24
    calibration: list[str] = field(default_factory=lambda: ["en-person", "zh-person"])


def plan(size: str) -> Plan:
    slaves = ["smollm2-135m-instruct", "gemma3-270m"]
    if size == "quick":
        return Plan(["en-city", "en-number"], [], [256], [50], slaves[:1], [], slaves[:1], False, 16, ["en-person"])
    if size == "default":
        return Plan(["en-city", "en-number", "zh-city"], [("en-city", "en-number")], [256, 1024, 2048], [50], slaves,
                    slaves[:1], slaves, True, 16)
    if size == "full":
        return Plan(["en-city", "en-number", "en-ingredient", "zh-city", "zh-number", "zh-ingredient"],
                    [("en-city", "en-number"), ("en-ingredient", "en-city"), ("zh-city", "zh-number"),
                     ("zh-ingredient", "zh-city")], [256, 1024, 2048, 4096], [25, 75], slaves, slaves, slaves, True)
    raise FusionLabError(f"unknown run size {size!r}: use 'quick', 'default' or 'full'.")


def calibration_samples(master: LM, p: Plan, haystacks: dict[str, str] = HAYSTACKS) -> list[tuple[str, str]]:
    """(prompt, document) pairs for KVComm's layer scores: calibration needles at the shortest length, never scored."""
    items = build_items(master, p.calibration, [], [min(p.lengths)], [50], haystacks)
    return [(it.prompt(master), it.document) for it in items]
