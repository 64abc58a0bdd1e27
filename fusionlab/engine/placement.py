"""Run the slaves on a batch's prompts (or contexts) and place their slots into the master's per-layer buffers.

    each row's slaves read that row's prompt (or context) -> master-frame slots per mapped layer
    -> concat slots: one JointBuffer per layer [slots of every concat slave | own entries], one row per sequence
    -> replace / blend slots: an Injection with a per-row position lookup (edits the master's own K/V in place)

Rows are left padded to the longest prompt; a slave region is as long as its longest row (shorter rows: FAR entries).
Live timing allocates room for every generated token too, and `live_step` appends one slot per slave per row per
step. A single sequence is a batch of one (and then takes attention.py's exact fast paths).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from transformers import DynamicCache

from .attention_core import LayerRuntime
from .context import ContextLayout
from .joint_cache import joint_cache
from .lm import LM
from .slave import ResolvedSlave
from .slot_buffer import FAR, NO_SLOT, PAD_POSITION, Injection, JointBuffer
from .token_align import identity_alignment


@dataclass
class Row:
    """One sequence of a batch: its own ids, text (None for ids input), slaves' prompt length, and context."""

    ids: torch.Tensor
    """(1, T_r) the master's tokens."""
    text: str | None
    prompt_len: int
    context: ContextLayout | None = None
    slaves: frozenset[int] | None = None
    """The slaves (indices into the FusedModel's) this row reads; None: all. A slave left out places no slots for
    the row, so rows of several settings that share slaves (master alone, + one, + both) can share a batch."""

    def reads(self, slave: int) -> bool:
        return self.slaves is None or slave in self.slaves

    @property
    def base(self) -> int:
        """Master position of the row's first own token (after its context)."""
        return 0 if self.context is None else self.context.length


@dataclass
class SequenceState:
    """Per-batch state: the master's cache, each slave's per-row caches (live timing), and per-row positions."""

    master_cache: Any
    slave_caches: list[list[Any]]
    """[slave][row] a transformers cache (live timing), else None."""
    next_pos: torch.Tensor
    """(B,) the position each row's next own token takes."""
    entries: int
    """Cache entries written (the same for every row: rows are left padded)."""
    pos: torch.Tensor
    """(B, capacity) position of every cache entry: PAD_POSITION for pads, FAR where not written yet."""
    runtimes: dict[int, LayerRuntime] | None = None

    @property
    def length(self) -> int:
        """A single sequence's next position (kept for batch-of-one callers)."""
        return int(self.next_pos[0])

    @property
    def batch(self) -> int:
        return int(self.next_pos.numel())

    def select(self, idx: torch.Tensor) -> None:
        """Keep rows `idx`: finished rows leave the batch and stop costing compute."""
        self.master_cache.batch_select_indices(idx)
        self.slave_caches = [[caches[i] for i in idx.tolist()] for caches in self.slave_caches]
        self.next_pos, self.pos = self.next_pos[idx], self.pos[idx]
        for rt in (self.runtimes or {}).values():
            if rt.joint is not None:
                rt.joint.select(idx)
            for inj in rt.injections:
                inj.select(idx, rt.joint)


@dataclass
class SlaveSlots:
    """One slave's slots for one row at one master layer, before they are written into a buffer."""

    slave_index: int
    slave: ResolvedSlave
    row: int
    layer: int
    k: torch.Tensor
    """(1, H_kv_m, S, D_m), in the master's frame (or naive, on purpose)."""
    v: torch.Tensor
    pos: torch.Tensor
    """(S,) master positions of the slots."""

    @property
    def mode(self) -> str:
        return self.slave.slave.mode

    @property
    def gate(self) -> float:
        return self.slave.gates[self.layer]


def _slots_of(master: LM, slaves: list[ResolvedSlave], rows: list[Row], timing: str
              ) -> tuple[dict[int, list[SlaveSlots]], list[list[Any]]]:
    """Each slave reads each row's text (its context, or the prompt's first prompt_len tokens)."""
    per_layer: dict[int, list[SlaveSlots]] = {}
    caches: list[list[Any]] = [[] for _ in slaves]
    for r, row in enumerate(rows):
        for si, s in enumerate(slaves):
            if not row.reads(si):
                caches[si].append(None)
                continue
            if row.context is not None:
                span = row.context.spans[si]
                s_ids, al = s.slave_inputs(master, span.master_ids, span.text, span.start == 0)
                start = span.start
            else:
                text = row.text if row.prompt_len == row.ids.shape[1] else None  # slaves read prompt_len tokens
                s_ids, al = s.slave_inputs(master, row.ids[:, :row.prompt_len], text)
                start = 0
            cache = DynamicCache(config=s.lm.model.config) if timing == "live" else None
            cap = s.capture_kv(s_ids, cache=cache)
            pos = al.master_index.to(master.device) + start  # (S,) master positions
            for i in s.layer_map.pairs:
                if s.gates[i] > 0:  # a zero gate contributes nothing: no slots, no cost
                    n = s.layer_map.first_slots.get(i, pos.numel())  # a sink-only layer: the first n slots
                    k, v = s.to_master(master, cap, al, i, pos)  # (1, H_m, S, D_m)
                    per_layer.setdefault(i, []).append(SlaveSlots(si, s, r, i, k[:, :, :n], v[:, :, :n], pos[:n]))
            caches[si].append(cache)
    return per_layer, caches


def _fill_layer(rt: LayerRuntime, slaves: list[ResolvedSlave], items: list[SlaveSlots], n_rows: int, entries: int,
                extra: int, max_pos: int, master: LM, timing: str) -> None:
    """Allocate this layer's buffers and write every (row, slave)'s slots into them. Every slave mapped here gets
    its buffer, even if no row read it: a batch's layout is the FusedModel's, whatever its rows read (`join`)."""
    rt.injections, rt.joint = [], None
    mapped = [si for si, s in enumerate(slaves) if rt.layer in s.layer_map.pairs and s.gates[rt.layer] > 0]
    by_slave: dict[int, list[SlaveSlots]] = {si: [] for si in mapped}
    for x in items:
        by_slave[x.slave_index].append(x)
    room = {si: max((x.pos.numel() for x in xs), default=0) + (extra if timing == "live" else 0)
            for si, xs in by_slave.items()}
    concat = [si for si in mapped if slaves[si].slave.mode == "concat"]
    h, d = master.spec.kv_heads, master.spec.head_dim
    if concat:
        rt.joint = JointBuffer.allocate(n_rows, h, d, sum(room[si] for si in concat), entries + extra, master.dtype,
                                        master.device)
    offset = 0
    for si, xs in by_slave.items():
        s, size = slaves[si], room[si]
        mode, gate, region = s.slave.mode, s.gates[rt.layer], None
        if mode == "concat":
            kb, vb, pb = rt.joint.region(offset, size, si, gate, s.slave.window_slots)
            region, offset = (offset, size), offset + size
        else:
            kb = torch.zeros(n_rows, h, size, d, dtype=master.dtype, device=master.device)
            vb, pb = torch.zeros_like(kb), torch.full((n_rows, size), FAR, dtype=torch.long, device=kb.device)
        lookup = torch.full((n_rows, max_pos), NO_SLOT, dtype=torch.long, device=kb.device)
        inj = Injection(si, mode, gate, kb, vb, pb, lookup, torch.zeros(n_rows, dtype=torch.long, device=kb.device),
                        region)
        for x in xs:
            inj.write(x.row, x.k, x.v, x.pos)
        rt.injections.append(inj)
    if rt.joint is not None:
        rt.joint.dense = n_rows == 1 and timing == "prefix" and all(g == 1.0 for _, _, g, _, _ in rt.joint.regions)


def place_slots(runtimes: dict[int, LayerRuntime], master: LM, slaves: list[ResolvedSlave], rows: list[Row],
                width: int, capacity: int, timing: str) -> SequenceState:
    """Run every row's slaves and place their slots, pre-allocated for `width` prompt entries (the longest row)
    plus `capacity` new tokens per row."""
    per_layer, caches = _slots_of(master, slaves, rows, timing)
    max_pos = max(r.base for r in rows) + width + capacity + 1
    for i, rt in runtimes.items():
        _fill_layer(rt, slaves, per_layer.get(i, []), len(rows), width, capacity, max_pos, master, timing)
    next_pos = torch.tensor([r.base for r in rows], dtype=torch.long, device=master.device)
    table = torch.full((len(rows), width + capacity), FAR, dtype=torch.long, device=master.device)
    return SequenceState(joint_cache(master.model.config, runtimes), caches, next_pos, 0, table, runtimes)


def live_step(runtimes: dict[int, LayerRuntime], master: LM, slaves: list[ResolvedSlave], seq: SequenceState,
              token: torch.Tensor, pos: torch.Tensor) -> None:
    """Live timing: each row's slaves read its new token (B, 1) at `pos` (B,); those slots exist before the master
    reads the token."""
    one = identity_alignment(1, pos.device)  # live slaves share the master's tokens
    for si, s in enumerate(slaves):
        for r in range(token.shape[0]):
            p = pos[r:r + 1]
            cap = s.capture_kv(token[r:r + 1].to(s.lm.device), cache=seq.slave_caches[si][r],
                               positions=p.to(s.lm.device))
            for i in s.layer_map.pairs:
                if i in s.layer_map.first_slots:  # a sink-only layer keeps its first slots, never later ones
                    continue
                inj = next((x for x in runtimes[i].injections if x.slave == si), None)
                if inj is not None:
                    inj.write(r, *s.to_master(master, cap, one, i, p), p)


def pad_positions(rows: list[Row], width: int, device: Any) -> tuple[torch.Tensor, torch.Tensor]:
    """(positions (B, width), real (B, width) bool) of the left-padded prompts: pads at PAD_POSITION... their RoPE position 0."""
    pos = torch.zeros(len(rows), width, dtype=torch.long, device=device)
    real = torch.zeros(len(rows), width, dtype=torch.bool, device=device)
    for r, row in enumerate(rows):
        t = row.ids.shape[1]
        pos[r, width - t:] = row.base + torch.arange(t, device=device)
        real[r, width - t:] = True
    return pos, real


__all__ = ["PAD_POSITION", "Row", "SequenceState", "live_step", "pad_positions", "place_slots"]
