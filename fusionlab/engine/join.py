"""Rows that join a running batch, and the batch kept short as rows leave (continuous batching's state surgery).

A batch's rows share one entry count E (they are left padded). A new group of rows, prefilled on its own with E'
entries, joins by left-padding the side with fewer entries:

    running rows  [pad .. pad | e_0 ...... e_{E-1}]          entries right-aligned to max(E, E')
    joining rows  [pad ...... pad | e'_0 .. e'_{E'-1}]

Padded entries take PAD_POSITION: no real query ever sees them (the one rule in `batch_attention.row_mask`, and the
padding mask transformers' own layers get), so a row's attention is unchanged by the join. Per-layer slot buffers
(`Injection`, `JointBuffer`) are stacked by row, each slave region and capacity grown to the larger side's.

`compact` drops leading entries that are pads in every row (rows that joined late no longer carry the padding of
rows that have left), so E stays about the longest live row, not the whole run's length.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from transformers.cache_utils import DynamicSlidingWindowLayer

from .attention_core import LayerRuntime
from .joint_cache import JointLayer
from .placement import SequenceState
from .slot_buffer import FAR, NO_SLOT, PAD_POSITION, Injection, JointBuffer


@dataclass
class LayerSlots:
    """One layer's slot buffers, as a batch left them on its LayerRuntime (stashed while another group prefills)."""

    injections: list[Injection]
    joint: JointBuffer | None


def stash(runtimes: dict[int, LayerRuntime]) -> dict[int, LayerSlots]:
    """The running batch's slot buffers, before a prefill of new rows replaces them on the runtimes."""
    return {i: LayerSlots(rt.injections, rt.joint) for i, rt in runtimes.items()}


def _left_pad(x: torch.Tensor, n: int, dim: int, fill: float | int) -> torch.Tensor:
    """`x` with `n` entries of `fill` before its first along `dim`."""
    if n == 0:
        return x
    shape = list(x.shape)
    shape[dim] = n
    return torch.cat([torch.full(shape, fill, dtype=x.dtype, device=x.device), x], dim=dim)


def _right_pad(x: torch.Tensor, size: int, dim: int, fill: float | int) -> torch.Tensor:
    """`x` grown to `size` along `dim` with `fill` after its last entry."""
    n = size - x.shape[dim]
    if n <= 0:
        return x
    shape = list(x.shape)
    shape[dim] = n
    return torch.cat([x, torch.full(shape, fill, dtype=x.dtype, device=x.device)], dim=dim)


def _join_cache(a: object, ea: int, b: object, eb: int) -> None:
    """Stack b's master cache rows under a's (in a), both right-aligned to max(ea, eb) entries. A sliding layer
    keeps only its last window - 1 entries; those are right-aligned the same way."""
    e = max(ea, eb)
    for la, lb in zip(a.layers, b.layers):
        if isinstance(la, JointLayer):  # its entries are the joined JointBuffer's (`_join_joint`)
            la.entries = e
            continue
        if not (la.is_initialized and lb.is_initialized):
            continue
        if isinstance(la, DynamicSlidingWindowLayer):
            keep = min(e, la.sliding_window - 1)
            pa, pb = keep - la.keys.shape[2], keep - lb.keys.shape[2]
            la.cumulative_length = e
        else:
            pa, pb = e - ea, e - eb
        la.keys = torch.cat([_left_pad(la.keys, pa, 2, 0), _left_pad(lb.keys, pb, 2, 0)])
        la.values = torch.cat([_left_pad(la.values, pa, 2, 0), _left_pad(lb.values, pb, 2, 0)])


def _join_table(a: torch.Tensor, ea: int, b: torch.Tensor, eb: int, room: int) -> torch.Tensor:
    """Entry positions (B, E + room): each side's entries right-aligned to E = max(ea, eb), PAD_POSITION before."""
    e = max(ea, eb)
    rows = [_right_pad(_left_pad(t[:, :n], e - n, 1, PAD_POSITION), e + room, 1, FAR) for t, n in ((a, ea), (b, eb))]
    return torch.cat(rows)


def _join_joint(a: JointBuffer, ea: int, b: JointBuffer, eb: int, room: int) -> tuple[JointBuffer, list[tuple]]:
    """One buffer for both sides' rows: each slave region as large as the larger side's, own entries right-aligned
    to max(ea, eb) with `room` entries after. Also the (start, size) of each region in the new buffer, by slave."""
    e = max(ea, eb)
    sizes = [max(ra[1], rb[1]) for ra, rb in zip(a.regions, b.regions)]
    ba, bb = a.k.shape[0], b.k.shape[0]
    out = JointBuffer.allocate(ba + bb, a.k.shape[1], a.k.shape[3], sum(sizes), e + room, a.k.dtype, a.k.device)
    start, placed = 0, []
    for (sa, na, gate, slave, windowed), (sb, nb, *_), size in zip(a.regions, b.regions, sizes):
        k, v, pos = out.region(start, size, slave, gate, windowed)
        for rows, buf, s0, n in ((slice(0, ba), a, sa, na), (slice(ba, ba + bb), b, sb, nb)):
            k[rows, :, :n], v[rows, :, :n], pos[rows, :n] = buf.k[:, :, s0:s0 + n], buf.v[:, :, s0:s0 + n], \
                buf.pos[:, s0:s0 + n]
        placed.append((start, size))
        start += size
    for rows, buf, n in ((slice(0, ba), a, ea), (slice(ba, ba + bb), b, eb)):
        o = out.own_offset + e - n
        out.k[rows, :, o:o + n] = buf.k[:, :, buf.own_offset:buf.own_offset + n]
        out.v[rows, :, o:o + n] = buf.v[:, :, buf.own_offset:buf.own_offset + n]
        out.pos[rows, out.own_offset:o] = PAD_POSITION
        out.pos[rows, o:o + n] = buf.pos[:, buf.own_offset:buf.own_offset + n]
    return out, placed


def _join_injection(a: Injection, b: Injection, joint: JointBuffer | None, region: tuple[int, int] | None
                    ) -> Injection:
    """Both sides' rows of one slave's slots; a concat slave's are views into the joined JointBuffer."""
    width = max(a.lookup.shape[1], b.lookup.shape[1])
    lookup = torch.cat([_right_pad(a.lookup, width, 1, NO_SLOT), _right_pad(b.lookup, width, 1, NO_SLOT)])
    n = torch.cat([a.n, b.n])
    if joint is not None and region is not None:
        inj = Injection(a.slave, a.mode, a.gate, a.k, a.v, a.pos, lookup, n, region)
        inj.view_into(joint)  # k, v, pos: views of its region in the joined buffer
        return inj
    cap = max(a.k.shape[2], b.k.shape[2])
    k = torch.cat([_right_pad(a.k, cap, 2, 0), _right_pad(b.k, cap, 2, 0)])
    v = torch.cat([_right_pad(a.v, cap, 2, 0), _right_pad(b.v, cap, 2, 0)])
    pos = torch.cat([_right_pad(a.pos, cap, 1, FAR), _right_pad(b.pos, cap, 1, FAR)])
    return Injection(a.slave, a.mode, a.gate, k, v, pos, lookup, n)


def join(runtimes: dict[int, LayerRuntime], a: SequenceState, a_slots: dict[int, LayerSlots],
         b: SequenceState) -> SequenceState:
    """The running batch `a` (its slot buffers stashed in `a_slots`) with the just-prefilled rows `b` (whose
    buffers are on the runtimes) as one batch: a's rows first. The runtimes then hold the joined buffers."""
    ea, eb = a.entries, b.entries
    room = max(a.pos.shape[1] - ea, b.pos.shape[1] - eb)
    for i, rt in runtimes.items():
        sa, joint, placed = a_slots[i], None, {}
        if sa.joint is not None:
            joint, regions = _join_joint(sa.joint, ea, rt.joint, eb, room)
            placed = {slave: r for (_, _, _, slave, _), r in zip(sa.joint.regions, regions)}
        rt.injections = [_join_injection(x, y, joint, placed.get(x.slave) if x.mode == "concat" else None)
                         for x, y in zip(sa.injections, rt.injections)]
        rt.joint = joint
    _join_cache(a.master_cache, ea, b.master_cache, eb)
    caches = [xa + xb for xa, xb in zip(a.slave_caches, b.slave_caches)]
    return SequenceState(a.master_cache, caches, torch.cat([a.next_pos, b.next_pos]), max(ea, eb),
                         _join_table(a.pos, ea, b.pos, eb, room), runtimes)


def compact(seq: SequenceState) -> int:
    """Drop the leading entries that are pads in every row (left by rows that have left); returns how many."""
    e = seq.entries
    pads = (seq.pos[:, :e] == PAD_POSITION).int().cumprod(1).sum(1)  # (B,) leading pads per row
    k = int(pads.min()) if e else 0
    if k == 0:
        return 0
    for layer in seq.master_cache.layers:
        if not layer.is_initialized:
            continue
        if isinstance(layer, JointLayer):  # its buffer drops them below (`drop_own`)
            layer.entries -= k
        elif isinstance(layer, DynamicSlidingWindowLayer):
            layer.cumulative_length -= k
            drop = layer.keys.shape[2] - min(e - k, layer.sliding_window - 1)
            layer.keys, layer.values = layer.keys[:, :, drop:], layer.values[:, :, drop:]
        else:
            layer.keys, layer.values = layer.keys[:, :, k:], layer.values[:, :, k:]
    seq.pos = F.pad(seq.pos[:, k:], (0, k), value=FAR)
    for rt in (seq.runtimes or {}).values():
        if rt.joint is not None:
            rt.joint.drop_own(k, e)
    seq.entries = e - k
    return k


__all__ = ["LayerSlots", "compact", "join", "stash"]
