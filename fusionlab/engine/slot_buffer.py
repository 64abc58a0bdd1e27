"""Where injected slots live: per-slave Injection records and the per-layer JointBuffer, one row per sequence.

Pre-allocated once per batch; slots are written once (prefix) or appended (live) through views, and each forward
writes only its new own keys (the master's cache writes them here: `joint_cache.JointLayer`), so decode steps never
re-concatenate the cache. Rows are sequences of a batch: left padded, so every row's cache has the same number of
entries; entry positions are per row:

    FAR           an unfilled entry (a row with fewer slots than the longest, or room not used yet): never visible
    PAD_POSITION  a left-pad entry: visible only to pad queries (which must see something to stay finite), never
                  to real ones
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field

import torch

from ..errors import FusionLabError

NO_SLOT = -2
"""A slot *index*: no slot at this master position (the replace / blend lookup tables)."""
FAR = 2**62
"""An entry *position*: unfilled, never visible."""
PAD_POSITION = -1
"""An entry or query *position*: a left pad (negative, so `position >= 0` means a real token)."""


@dataclass
class Injection:
    """Slots one slave contributes at one master layer; pre-allocated, filled once (prefix) or grown (live)."""

    slave: int
    mode: str
    gate: float
    k: torch.Tensor
    """(B, H_kv_m, capacity, D_m), already in the master's frame (or naive, on purpose)."""
    v: torch.Tensor
    pos: torch.Tensor
    """(B, capacity) master position of each slot; FAR where unfilled."""
    lookup: torch.Tensor
    """(B, max_pos) master position -> slot index, NO_SLOT where none (used by replace/blend)."""
    n: torch.Tensor
    """(B,) slots written per row."""
    region: tuple[int, int] | None = None
    """A concat slave's (start, size) in its layer's JointBuffer: k, v, pos are views into it, and must stay so
    when rows leave or join (live timing appends through them)."""

    def write(self, row: int, k: torch.Tensor, v: torch.Tensor, pos: torch.Tensor) -> None:
        """One row's slots: k, v (1, H, S, D); pos (S,)."""
        s, start = pos.numel(), int(self.n[row])
        if start + s > self.k.shape[2] or (s and int(pos.max()) >= self.lookup.shape[1]):
            raise FusionLabError("injection buffer full: raise max_new_tokens / capacity for this sequence.")
        self.k[row, :, start:start + s] = k[0]
        self.v[row, :, start:start + s] = v[0]
        self.pos[row, start:start + s] = pos
        self.lookup[row, pos] = torch.arange(start, start + s, device=pos.device)
        self.n[row] += s

    def append_all(self, k: torch.Tensor, v: torch.Tensor, pos: torch.Tensor) -> None:
        """Live timing: one new slot per row, k, v (B, H, 1, D) at positions pos (B,)."""
        rows = torch.arange(pos.numel(), device=pos.device)
        if int(self.n.max()) >= self.k.shape[2] or int(pos.max()) >= self.lookup.shape[1]:
            raise FusionLabError("injection buffer full: raise max_new_tokens / capacity for this sequence.")
        self.k[rows, :, self.n] = k[:, :, 0]
        self.v[rows, :, self.n] = v[:, :, 0]
        self.pos[rows, self.n] = pos
        self.lookup[rows, pos] = self.n
        self.n += 1

    def select(self, idx: torch.Tensor, joint: "JointBuffer | None" = None) -> None:
        """Keep rows `idx` (finished rows leave the batch); a concat slave's slots then view the already selected
        `joint` again (a copy would no longer see live timing's appended slots)."""
        if self.region is not None and joint is not None:
            self.view_into(joint)
        else:
            self.k, self.v, self.pos = self.k[idx], self.v[idx], self.pos[idx]
        self.lookup, self.n = self.lookup[idx], self.n[idx]

    def view_into(self, joint: "JointBuffer") -> None:
        """k, v, pos as views of this slave's region of `joint`."""
        start, size = self.region
        sl = slice(start, start + size)
        self.k, self.v, self.pos = joint.k[:, :, sl], joint.v[:, :, sl], joint.pos[:, sl]

    @property
    def nbytes(self) -> int:
        return 2 * int(self.n.sum()) * self.k.shape[1] * self.k.shape[3] * self.k.element_size()


@dataclass
class JointBuffer:
    """[slots of every concat slave | own keys] for one layer, pre-allocated once per batch.

    Own keys are stored by cache entry (entry e of every row at own_offset + e), with the row's position of that
    entry; slots by slave region. A decode step writes one entry per row, never re-concatenating the cache.
    """

    k: torch.Tensor
    """(B, H_kv, N_cap, D)."""
    v: torch.Tensor
    pos: torch.Tensor
    """(B, N_cap) position of each entry; FAR where unfilled, PAD_POSITION for left-pad entries."""
    bias: torch.Tensor
    """(N_cap,) score bias: log(gate) for slots, 0 for own keys."""
    windowed: torch.Tensor
    """(N_cap,) bool: entry obeys the sliding window."""
    src: torch.Tensor
    """(N_cap,) -1 for own keys, else the slave index."""
    own_offset: int
    regions: list[tuple[int, int, float, int, bool]] = field(default_factory=list)
    """(start, size, gate, slave, windowed) of each slave's slot region."""
    dense: bool = False
    """One row, every slot region full and every gate 1: a decode query sees all entries, no mask needed."""
    @property
    def layout(self) -> tuple:
        """Two layers with equal layouts hold equal positions, biases and window flags (a slave's slots sit at the
        same positions at every layer it reaches, and every layer writes the same own entries), so one step's score
        bias serves both (`attention_core.step_bias`)."""
        return (self.own_offset, *self.regions)

    @classmethod
    def allocate(cls, b: int, h: int, d: int, slots: int, tokens: int, dtype: torch.dtype,
                 device: torch.device) -> "JointBuffer":
        """Room for `slots` injected entries (all concat slaves) and `tokens` own cache entries per row."""
        n = slots + tokens
        return cls(torch.zeros(b, h, n, d, dtype=dtype, device=device),
                   torch.zeros(b, h, n, d, dtype=dtype, device=device),
                   torch.full((b, n), FAR, dtype=torch.long, device=device),
                   torch.zeros(n, dtype=torch.float32, device=device),
                   torch.ones(n, dtype=torch.bool, device=device),
                   torch.full((n,), -1, dtype=torch.long, device=device), slots)

    def region(self, start: int, size: int, slave: int, gate: float, window_slots: bool):
        """Views (k, v, pos) of one slave's slot region; sets its bias, window flag and source."""
        sl = slice(start, start + size)
        self.regions.append((start, size, gate, slave, window_slots))
        self.bias[sl] = math.log(gate) if gate > 0 else float("-inf")
        self.windowed[sl] = window_slots
        self.src[sl] = slave
        return self.k[:, :, sl], self.v[:, :, sl], self.pos[:, sl]

    def own_written(self, past: int, q_pos: torch.Tensor) -> int:
        """The master's cache (`joint_cache.JointLayer`) has just written the new tokens' own K/V as entries
        past..past+Q-1: record their positions q_pos (B, Q) (PAD_POSITION for pads); returns the entries in use."""
        q = q_pos.shape[1]
        start = self.own_offset + past
        self.pos[:, start:start + q] = q_pos
        return start + q

    def drop_own(self, k: int, entries: int) -> None:
        """Forget the first k of `entries` own cache entries (pads in every row): the rest move k entries left, as
        the master's cache does (`join.compact`)."""
        o, e = self.own_offset, entries
        self.k[:, :, o:o + e - k] = self.k[:, :, o + k:o + e].clone()
        self.v[:, :, o:o + e - k] = self.v[:, :, o + k:o + e].clone()
        self.pos[:, o:o + e - k] = self.pos[:, o + k:o + e].clone()
        self.pos[:, o + e - k:o + e] = FAR

    def select(self, idx: torch.Tensor) -> None:
        self.k, self.v, self.pos = self.k[idx], self.v[idx], self.pos[idx]
