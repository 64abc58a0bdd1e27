"""`fl.capture_attention`: attention probabilities recorded from inside the attention computation.

The model keeps its normal backend (sdpa) for its outputs; probabilities are computed only for the
captured layers, heads and query rows, in chunks. `keep="aggregate"` stores, per layer and head, the mass
each key position receives from the selected queries (the master's own keys and each slave's slots
apart); `keep="full"` stores full maps, within a memory budget.
"""
from __future__ import annotations

from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, Iterator, Sequence

import pandas as pd
import torch

from ..engine.attention_core import Recorder
from ..engine.slot_buffer import FAR
from ..errors import FusionLabError
from ..engine.fuse import FusedModel, fuse, open_fusion
from ..engine.lm import LM

KEEP = ("aggregate", "full")


def _grow_add(acc: torch.Tensor | None, pos: torch.Tensor, vals: torch.Tensor) -> torch.Tensor:
    """acc (h, P) += vals (h, n) at key positions pos (n,), growing P as needed."""
    need = int(pos.max()) + 1 if pos.numel() else 0
    if acc is None:
        acc = torch.zeros(vals.shape[0], need, dtype=torch.float64)
    elif acc.shape[1] < need:
        acc = torch.cat([acc, torch.zeros(acc.shape[0], need - acc.shape[1], dtype=acc.dtype)], dim=1)
    return acc.index_add_(1, pos.cpu(), vals.double().cpu())


@dataclass
class AttentionCapture:
    layers: list[int]
    heads: list[int]
    keep: str
    max_full_bytes: int
    own: dict[int, torch.Tensor] = field(default_factory=dict)
    """layer -> (heads, P): attention mass on the master's own key at each position, summed over queries."""
    slots: dict[int, dict[int, torch.Tensor]] = field(default_factory=dict)
    """layer -> slave index -> (heads, P): mass on that slave's slot at each master position."""
    n_queries: dict[int, int] = field(default_factory=dict)
    maps: list[dict[str, Any]] = field(default_factory=list)
    """keep='full': {layer, query_pos (q,), key_pos (N,), key_src (N,), probs (heads, q, N)} per forward."""
    full_bytes: int = 0
    per_row: dict[int, "AttentionCapture"] = field(default_factory=dict)
    """A batch's records, row by row (each as a single sequence's capture); empty for a single sequence."""

    def row(self, b: int) -> "AttentionCapture":
        """Row b of a batched run, recorded exactly as that prompt run alone would be."""
        if b not in self.per_row:
            self.per_row[b] = AttentionCapture(self.layers, self.heads, self.keep, self.max_full_bytes)
        return self.per_row[b]

    def _on(self, layer: int, probs: torch.Tensor, k_pos: torch.Tensor, k_src: torch.Tensor,
            q_pos: torch.Tensor, heads: list[int], row: int | None = None) -> None:
        if row is not None:
            return self.row(row)._on(layer, probs, k_pos, k_src, q_pos, heads)
        p = probs[0].detach()  # (h, q, N)
        sel = [heads.index(h) for h in self.heads] if heads != self.heads else slice(None)
        p = p[sel]
        self.n_queries[layer] = self.n_queries.get(layer, 0) + p.shape[1]
        if self.keep == "full":
            self.full_bytes += p.numel() * 4
            if self.full_bytes > self.max_full_bytes:
                raise FusionLabError(f"keep='full' would hold more than {self.max_full_bytes / 2**20:.0f} MiB of "
                                     f"attention maps (now {self.full_bytes / 2**20:.0f} MiB); use keep='aggregate', "
                                     "fewer layers/heads/queries, or a larger max_full_bytes.")
            self.maps.append({"layer": layer, "query_pos": q_pos.cpu(), "key_pos": k_pos.cpu(),
                              "key_src": k_src.cpu(), "probs": p.float().cpu()})
        mass = p.sum(1)  # (h, N'): a trimmed recorder computed only the first N' keys, the rest are 0
        mass = torch.nn.functional.pad(mass, (0, k_pos.numel() - mass.shape[1]))  # (h, N)
        filled = (k_pos < FAR) & (k_pos >= 0)  # unfilled slots and a batch's left pads are never attended
        mass, k_pos, k_src = mass[:, filled], k_pos[filled], k_src[filled]
        own = k_src == -1
        self.own[layer] = _grow_add(self.own.get(layer), k_pos[own], mass[:, own])
        for s in k_src[~own].unique().tolist():
            m = k_src == s
            self.slots.setdefault(layer, {})[s] = _grow_add(self.slots.get(layer, {}).get(s), k_pos[m], mass[:, m])

    # --- views ----------------------------------------------------------------------------------------
    def mass(self, layer: int, source: str = "own") -> torch.Tensor:
        """(heads, P) mass per key position from the selected queries: 'own', 'slots' (all slaves) or 'all'."""
        own = self.own[layer]
        if source == "own":
            return own
        slot = torch.zeros_like(own)
        for t in self.slots.get(layer, {}).values():
            slot[:, : t.shape[1]] += t[:, : own.shape[1]]
        return slot if source == "slots" else own + slot

    def source_split(self) -> pd.DataFrame:
        """Per layer and head: share of attention on the master's own keys vs each slave's slots."""
        rows = []
        for layer in self.layers:
            total = self.n_queries.get(layer, 0)
            if not total:
                continue
            for hi, h in enumerate(self.heads):
                row = {"layer": layer, "head": h, "own": float(self.own[layer][hi].sum()) / total}
                for s, t in self.slots.get(layer, {}).items():
                    row[f"slave{s}"] = float(t[hi].sum()) / total
                rows.append(row)
        return pd.DataFrame(rows)


def token_labels(lm: LM, text: str) -> pd.DataFrame:
    """Readable key labels: position, id, decoded piece, character offsets (as the master tokenizes `text`)."""
    enc = lm.tokenizer(text, return_offsets_mapping=True)
    return pd.DataFrame([{"pos": i, "id": t, "piece": lm.tokenizer.decode([t]), "start": a, "end": b}
                         for i, (t, (a, b)) in enumerate(zip(enc["input_ids"], enc["offset_mapping"]))])


def _rows(queries: Any) -> Any:
    if queries is None:
        return lambda q_pos: None
    if queries == "last":
        return lambda q_pos: torch.tensor([q_pos.numel() - 1], device=q_pos.device)
    if isinstance(queries, (str, bytes)) or not hasattr(queries, "__iter__"):
        raise FusionLabError(f"queries must be None (every query), 'last', or a list of query positions; got "
                             f"{queries!r}.")
    qs = list(queries)
    if not qs or any(isinstance(q, bool) or not isinstance(q, int) or q < 0 for q in qs):
        raise FusionLabError(f"queries must be non-negative int positions; got {qs[:8]!r}.")
    wanted = torch.tensor(sorted(set(qs)))

    def pick(q_pos: torch.Tensor) -> torch.Tensor:
        return torch.isin(q_pos, wanted.to(q_pos.device)).nonzero().flatten()

    return pick


@contextmanager
def capture_attention(target: LM | FusedModel, layers: Sequence[int] | None = None,
                      heads: Sequence[int] | None = None, queries: Any = None, keep: str = "aggregate",
                      max_full_bytes: int = 512 * 2**20) -> Iterator[AttentionCapture]:
    """Record attention while `target` runs (an fl.LM: call lm.model(...) or generate; a FusedModel: call it).

    queries: None (every query row), 'last' (the last row of each forward pass), or absolute positions.
    """
    if not isinstance(target, (LM, FusedModel)):
        raise FusionLabError(f"capture_attention expects an fl.LM or a FusedModel, got {type(target).__name__}.")
    # a plain LM that is some fusion's master: direct calls run it plain, so borrow that fusion's hooks
    fused = target if isinstance(target, FusedModel) else open_fusion(target)
    owned = fused is None
    if owned:
        fused = fuse(target, [])
    spec = fused.master.spec
    try:
        layers = list(range(spec.layers)) if layers is None else list(layers)
        heads = list(range(spec.heads)) if heads is None else list(heads)
        if any(isinstance(x, bool) or not isinstance(x, int) for x in layers + heads):
            raise FusionLabError(f"layers and heads must be lists of ints; got layers={layers!r} heads={heads!r}.")
        if not layers or not heads:
            raise FusionLabError("capture_attention needs at least one layer and one head (None: all of them).")
        if isinstance(max_full_bytes, bool) or not isinstance(max_full_bytes, int) or max_full_bytes < 1:
            raise FusionLabError(f"max_full_bytes must be a positive int, got {max_full_bytes!r}.")
        bad_l = [i for i in layers if not 0 <= i < spec.layers]
        bad_h = [h for h in heads if not 0 <= h < spec.heads]
        if bad_l or bad_h:
            raise FusionLabError(f"layers {bad_l} / heads {bad_h} out of range: {fused.master.name} has "
                                 f"{spec.layers} layers (0..{spec.layers - 1}) and {spec.heads} heads (0..{spec.heads - 1}).")
        if keep not in KEEP:
            raise FusionLabError(f"keep must be one of {KEEP}, got {keep!r}.")
        cap = AttentionCapture(layers, heads, keep, max_full_bytes)
        with fused.recording(Recorder(cap._on, rows=_rows(queries), heads=heads, trim=keep == "aggregate"), layers):
            yield cap
    finally:
        if owned:
            fused.close()
