"""Training data: chunks, what is captured once per chunk, the slots built from it, and the differentiable loss.

`prepare` tokenizes each chunk for the master and captures the slave's K/V of the text it reads (its own, or another
chunk's for the shuffled control); `slots_of` builds every mapped layer's slots with the engine's own code
(`ResolvedSlave.to_master`: alignment, projection, master-frame RoPE); `loss_of` runs the master with them through
`fused_logits` (training/attention.py), so the trained fuser behaves the same at inference.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F

from ..engine.fuse import FusedModel
from ..errors import FusionLabError
from .attention import TrainSlots, fused_logits
from .fuser import LearnedFuser


@dataclass(frozen=True)
class TrainChunk:
    """One training example: `text` the master reads; `context` the slave reads first (task='offload' only);
    `doc` names the document it was cut from (None: a document of its own), so a control never reads its own file."""

    text: str
    context: str | None = None
    doc: str | None = None


@dataclass
class Prepared:
    """A chunk ready to train on: master ids and start, the slave's captured K/V, alignment and slot positions."""

    ids: torch.Tensor
    start: int
    cap: Any
    al: Any
    pos: torch.Tensor


def prepare(fused: FusedModel, chunks: list[TrainChunk], task: str, reads: list[int]) -> list[Prepared]:
    """Tokenize each chunk for the master; capture the slave's K/V of chunk reads[i] (a derangement: shuffled)."""
    master, rs = fused.master, fused.slaves[0]
    out = []
    for i, ch in enumerate(chunks):
        other = chunks[reads[i]]
        if task == "offload":
            ctx = master.encode(ch.context)
            ids, start = master.encode(ch.text, special_tokens=False), ctx.shape[1]
            read_text, read_ids = other.context, master.encode(other.context)
        else:
            ids, start = master.encode(ch.text), 0
            read_text, read_ids = other.text, master.encode(other.text)
        s_ids, al = rs.slave_inputs(master, read_ids, read_text)
        cap = rs.capture_kv(s_ids)
        cap.keys = {j: t.clone() for j, t in cap.keys.items()}  # out of inference mode: autograd may save them
        cap.values = {j: t.clone() for j, t in cap.values.items()}
        limit = start if task == "offload" else ids.shape[1]  # another text may be longer: keep what fits
        keep = al.master_index < limit
        if not bool(keep.all()):
            al = type(al)(al.master_index[keep], [g for g, k in zip(al.groups, keep.tolist()) if k], al.strategy,
                          al.n_master, al.n_slave)
        out.append(Prepared(ids, start, cap, al, al.master_index.to(master.device)))
    return out


def check_chunks(chunks: list[TrainChunk], task: str) -> None:
    if not chunks:
        raise FusionLabError("train_fuser needs training chunks; got none (see experiments.nb07_corpora).")
    for n, ch in enumerate(chunks):
        if not isinstance(ch, TrainChunk) or len(ch.text.strip()) < 16:
            raise FusionLabError(f"training chunk {n} is empty or too short (< 16 characters); give real text.")
        if task == "offload" and not (ch.context and ch.context.strip()):
            raise FusionLabError(f"task='offload' needs a context in every chunk; chunk {n} has none.")


def slots_of(fused: FusedModel, fuser: LearnedFuser | None, p: Prepared) -> dict[int, list[TrainSlots]]:
    """Slots for every mapped layer, built by the engine's own code; gates from the fuser (learnable) or, for any
    other projector, the resolved slave's fixed gates."""
    rs = fused.slaves[0]
    slots = {}
    for i in rs.layer_map.pairs:
        gate = fuser.gate_tensor(i) if fuser is not None else torch.tensor(rs.gates[i])
        if fuser is None and rs.gates[i] == 0:
            continue
        k, v = rs.to_master(fused.master, p.cap, p.al, i, p.pos)
        slots[i] = [TrainSlots(k, v, p.pos, gate, rs.slave.mode, rs.slave.window_slots)]
    return slots


def loss_of(fused: FusedModel, fuser: LearnedFuser | None, p: Prepared) -> torch.Tensor:
    """The master's mean next-token loss on the chunk with the slave's slots injected (differentiable through a
    fuser; `fuser=None` scores any other projector the same way)."""
    logits = fused_logits(fused, p.ids, slots_of(fused, fuser, p), p.start)
    return F.cross_entropy(logits[0, :-1].float(), p.ids[0, 1:])


def document_derangement(chunks: list[TrainChunk], seed: int) -> list[int]:
    """For each chunk, the index of a chunk of *another document* for a control to read. Chunk-level derangements
    leak: the next window of the same file is the master's own continuation (an offload chunk's context is the window
    before its text). A permutation where one exists (no document holds more than half the chunks: chunks grouped by
    document in a seeded order, each reads the one `largest group` places on); otherwise each chunk reads a seeded
    random chunk of another document. A chunk without `doc` is its own document."""
    docs = [c.doc if c.doc is not None else f"\x00chunk{i}" for i, c in enumerate(chunks)]
    groups: dict[str, list[int]] = {}
    for i, d in enumerate(docs):
        groups.setdefault(d, []).append(i)
    if len(groups) < 2:
        raise FusionLabError(f"a control that reads another document needs chunks from at least 2 documents; all "
                             f"{len(chunks)} chunks come from {next(iter(groups), 'none')!r}: add documents.")
    rng = np.random.default_rng(seed + 11)
    names = sorted(groups)
    order = [i for k in rng.permutation(len(names)) for i in rng.permutation(groups[names[k]]).tolist()]
    n, m = len(order), max(len(g) for g in groups.values())
    if 2 * m <= n:
        reads = [0] * n
        for k, i in enumerate(order):
            reads[i] = order[(k + m) % n]
        return reads
    return [int(rng.choice([j for j in range(n) if docs[j] != docs[i]])) for i in range(n)]


def derangement(n: int, seed: int) -> list[int]:
    if n < 2:
        raise FusionLabError("a shuffled control needs at least 2 training chunks.")
    rng = np.random.default_rng(seed + 7)
    while True:
        perm = rng.permutation(n)
        if not (perm == np.arange(n)).any():
            return perm.tolist()
