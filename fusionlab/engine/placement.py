"""Run the slaves on a prompt and place their slots into the master's per-layer buffers, once per sequence.

    slaves read the prompt -> master-frame slots per mapped layer (ResolvedSlave.to_master)
    -> concat slots: one JointBuffer per layer [slots of every concat slave | own keys], pre-allocated
    -> replace / blend slots: an Injection with a position lookup (edits the master's own K/V in place)

Live timing allocates room for every generated token too, and `live_step` appends one slot per slave per step.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from transformers import DynamicCache

from .attention import LayerRuntime
from .context import ContextLayout
from .lm import LM
from .slave import ResolvedSlave
from .slot_buffer import NO_SLOT, Injection, JointBuffer
from .token_align import identity_alignment


@dataclass
class SequenceState:
    """Per-sequence state: the master's cache, each slave's cache (live timing), tokens read so far."""

    master_cache: Any
    slave_caches: list[Any]
    length: int


@dataclass
class SlaveSlots:
    """One slave's slots for one master layer, before they are written into a buffer."""

    slave_index: int
    slave: ResolvedSlave
    layer: int
    """The master layer these slots feed."""
    k: torch.Tensor
    """(1, H_kv_m, S, D_m), in the master's frame (or naive, on purpose)."""
    v: torch.Tensor
    pos: torch.Tensor
    """(S,) master position of each slot."""
    room: int
    """Entries to allocate: S, plus every future token under live timing."""

    @property
    def mode(self) -> str:
        return self.slave.slave.mode

    @property
    def gate(self) -> float:
        return self.slave.gates[self.layer]


@dataclass(frozen=True)
class Reading:
    """What one slave reads: the text as master ids (1, T), the text itself, and the master position it starts at."""

    master_ids: torch.Tensor
    text: str | None
    start: int = 0
    special_tokens: bool = True
    """Whether `master_ids` carry the master tokenizer's special tokens (a context after another does not)."""


def _slots_of(master: LM, slaves: list[ResolvedSlave], readings: list[Reading], timing: str,
              extra: int) -> tuple[dict[int, list[SlaveSlots]], list[Any]]:
    """Each slave reads its text; its slots per mapped master layer (zero gates place nothing)."""
    per_layer: dict[int, list[SlaveSlots]] = {}
    caches = []
    for si, (s, r) in enumerate(zip(slaves, readings)):
        s_ids, al = s.slave_inputs(master, r.master_ids, r.text, r.special_tokens)
        cache = DynamicCache(config=s.lm.model.config) if timing == "live" else None
        cap = s.capture_kv(s_ids, cache=cache)
        pos = al.master_index.to(master.device) + r.start  # (S,) master positions
        room = pos.numel() + (extra if timing == "live" else 0)
        for i in s.layer_map.pairs:
            if s.gates[i] > 0:  # a zero gate contributes nothing: no slots, no cost
                k, v = s.to_master(master, cap, al, i, pos)
                per_layer.setdefault(i, []).append(SlaveSlots(si, s, i, k, v, pos, room))
        caches.append(cache)
    return per_layer, caches


def _fill_layer(rt: LayerRuntime, items: list[SlaveSlots], capacity: int, master: LM, timing: str,
                own_base: int) -> None:
    """Allocate this layer's buffers (own keys from position `own_base`) and write every slave's slots into them."""
    rt.injections, rt.joint = [], None
    concat_room = sum(x.room for x in items if x.mode == "concat")
    if concat_room:
        like = items[0].k
        rt.joint = JointBuffer.allocate(like.shape[1], like.shape[3], concat_room, capacity, master.dtype,
                                        master.device, own_base)
    offset = 0
    for x in items:
        if x.mode == "concat":
            kb, vb, pb = rt.joint.region(offset, x.room, x.slave_index, x.gate, x.slave.slave.window_slots)
            offset += x.room
        else:
            kb = torch.empty(1, x.k.shape[1], x.room, x.k.shape[3], dtype=x.k.dtype, device=x.k.device)
            vb, pb = torch.empty_like(kb), torch.empty(x.room, dtype=torch.long, device=x.k.device)
        lookup = torch.full((own_base + capacity,), NO_SLOT, dtype=torch.long, device=x.k.device)
        inj = Injection(x.slave_index, x.mode, x.gate, kb, vb, pb, lookup)
        inj.append(x.k, x.v, x.pos)
        rt.injections.append(inj)
    if rt.joint is not None:
        rt.joint.dense = timing == "prefix" and all(g == 1.0 for _, _, g in rt.joint.regions)


def place_slots(runtimes: dict[int, LayerRuntime], master: LM, slaves: list[ResolvedSlave], ids: torch.Tensor,
                text: str | None, prompt_len: int, capacity: int, timing: str,
                context: ContextLayout | None = None) -> SequenceState:
    """Run every slave on the first `prompt_len` ids (or on its context) and place its slots, pre-allocated for
    `capacity` own tokens of the master. With a context the master's own tokens start after it."""
    if context is None:
        text = text if prompt_len == ids.shape[1] else None  # slaves read the first prompt_len tokens only
        readings, base = [Reading(ids[:, :prompt_len], text)] * len(slaves), 0
    else:
        readings = [Reading(sp.master_ids, sp.text, sp.start, sp.start == 0) for sp in context.spans]
        base = context.length
    per_layer, caches = _slots_of(master, slaves, readings, timing, capacity - prompt_len)
    for i, rt in runtimes.items():
        _fill_layer(rt, per_layer.get(i, []), capacity, master, timing, base)
    return SequenceState(DynamicCache(config=master.model.config), caches, base)


def live_step(runtimes: dict[int, LayerRuntime], master: LM, slaves: list[ResolvedSlave], seq: SequenceState,
              token: torch.Tensor, pos: int) -> None:
    """Live timing: each slave reads the new token (1, 1); its slot at `pos` exists before the master reads it."""
    p = torch.tensor([pos], device=master.device)
    one = identity_alignment(1, p.device)  # live slaves share the master's tokens
    for si, s in enumerate(slaves):
        cap = s.capture_kv(token.to(s.lm.device), cache=seq.slave_caches[si], positions=p.to(s.lm.device))
        for i in s.layer_map.pairs:
            inj = next((x for x in runtimes[i].injections if x.slave == si), None)
            if inj is not None:
                inj.append(*s.to_master(master, cap, one, i, p), p)
