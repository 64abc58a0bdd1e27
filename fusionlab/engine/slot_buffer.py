"""Where injected slots live: per-slave Injection records and the per-layer JointBuffer.

Pre-allocated once per sequence; slots are written once (prefix) or appended (live) through views, and
each forward writes only its new own keys, so decode steps never re-concatenate the cache.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field

import torch

from ..errors import FusionLabError

NO_SLOT = -1


@dataclass
class Injection:
    """Slots one slave contributes at one master layer; pre-allocated, filled once (prefix) or grown (live)."""

    slave: int
    mode: str
    gate: float
    k: torch.Tensor
    """(1, H_kv_m, capacity, D_m), already in the master's frame (or naive, on purpose)."""
    v: torch.Tensor
    pos: torch.Tensor
    """(capacity,) master position of each slot."""
    lookup: torch.Tensor
    """(max_pos,) master position -> slot index, NO_SLOT where none (used by replace/blend)."""
    n: int = 0

    def append(self, k: torch.Tensor, v: torch.Tensor, pos: torch.Tensor) -> None:
        """k, v (1, H, S, D); pos (S,). Writes into the pre-allocated buffers."""
        s = pos.numel()
        if self.n + s > self.k.shape[2] or int(pos.max()) >= self.lookup.numel():
            raise FusionLabError("injection buffer full: raise max_new_tokens / capacity for this sequence.")
        self.k[:, :, self.n:self.n + s] = k
        self.v[:, :, self.n:self.n + s] = v
        self.pos[self.n:self.n + s] = pos
        self.lookup[pos] = torch.arange(self.n, self.n + s, device=pos.device)
        self.n += s

    @property
    def nbytes(self) -> int:
        return 2 * self.n * self.k.shape[1] * self.k.shape[3] * self.k.element_size()


FAR = 2**62  # position of an unfilled buffer entry: never visible


@dataclass
class JointBuffer:
    """[slots of every concat slave | own keys] for one layer, pre-allocated once per sequence.

    Slots are written once (prefix) or appended (live) through views into this buffer; each forward writes
    only its new own keys, so a decode step copies O(1) rows instead of re-concatenating the whole cache.
    """

    k: torch.Tensor
    """(1, H_kv, N_cap, D)."""
    v: torch.Tensor
    pos: torch.Tensor
    """(N_cap,) position of each entry; FAR where unfilled."""
    bias: torch.Tensor
    """(N_cap,) score bias: log(gate) for slots, 0 for own keys."""
    windowed: torch.Tensor
    """(N_cap,) bool: entry obeys the sliding window."""
    src: torch.Tensor
    """(N_cap,) -1 for own keys, else the slave index."""
    own_offset: int
    own_base: int = 0
    """Master position of the first own key (context offload: the context's length; else 0)."""
    regions: list[tuple[int, int, float]] = field(default_factory=list)
    """(start, size, gate) of each slave's slot region."""
    dense: bool = False
    """Every slot region is full and every gate is 1: a decode query sees all entries, no mask needed."""

    @classmethod
    def allocate(cls, h: int, d: int, slots: int, tokens: int, dtype: torch.dtype,
                 device: torch.device, own_base: int = 0) -> "JointBuffer":
        """Room for `slots` injected entries (all concat slaves) and `tokens` own keys from position `own_base`."""
        n = slots + tokens
        return cls(torch.zeros(1, h, n, d, dtype=dtype, device=device),
                  torch.zeros(1, h, n, d, dtype=dtype, device=device),
                  torch.full((n,), FAR, dtype=torch.long, device=device),
                  torch.zeros(n, dtype=torch.float32, device=device),
                  torch.ones(n, dtype=torch.bool, device=device),
                  torch.full((n,), -1, dtype=torch.long, device=device), slots, own_base)

    def region(self, start: int, size: int, slave: int, gate: float, window_slots: bool):
        """Views (k, v, pos) of one slave's slot region; sets its bias, window flag and source."""
        sl = slice(start, start + size)
        self.regions.append((start, size, gate))
        self.bias[sl] = math.log(gate) if gate > 0 else float("-inf")
        self.windowed[sl] = window_slots
        self.src[sl] = slave
        return self.k[:, :, sl], self.v[:, :, sl], self.pos[sl]

    def write_own(self, key: torch.Tensor, value: torch.Tensor, q_pos: torch.Tensor) -> int:
        """Store the new tokens' own K/V (the last Q of `key`) at their positions; returns entries in use."""
        q = q_pos.numel()
        idx = self.own_offset + q_pos - self.own_base
        self.k[:, :, idx] = key[:, :, -q:]
        self.v[:, :, idx] = value[:, :, -q:]
        self.pos[idx] = q_pos
        return self.own_offset + int(q_pos[-1]) - self.own_base + 1
