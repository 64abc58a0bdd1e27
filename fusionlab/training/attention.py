"""The training path's attention: the same injection rules as the inference path, written as plain differentiable math.

Inference places slots once into pre-allocated buffers under `inference_mode` and takes fused fast paths; training
needs gradients through the slots (and through a concat gate that may start at exactly 0), so here

    concat   softmax over [own keys | slots] with the slots' weights multiplied by g   (= a score bias log g, so
             g = 0 is the master exactly, and d/dg exists at 0)
    blend    own K/V at a slot's position += g * slot K/V                               (C2C's residual)

with the same visibility rule (`attention_core.visible`: a key at position p is seen by a query at q iff p <= q, and q - p < window on sliding
layers for windowed entries). `tests/training/test_fuser.py` checks these logits equal the inference path's.

`fused_logits` runs the master with these as each mapped layer's attention, through the engine's one hook
(`FusedModel.attention_overrides`): the engine knows nothing about training.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from functools import partial

import torch

from ..engine.attention_core import repeat_kv, visible
from ..engine.fuse import FusedModel


@dataclass
class TrainSlots:
    """One slave's slots at one layer, with gradients."""

    k: torch.Tensor
    """(1, H_kv, S, D) in the master's frame (rotated at `pos`)."""
    v: torch.Tensor
    pos: torch.Tensor
    """(S,) master positions."""
    gate: torch.Tensor
    """() the layer's gate (a tensor, so it can learn)."""
    mode: str
    windowed: bool = True


def _scores(query: torch.Tensor, k: torch.Tensor, scale: float, softcap: float | None) -> torch.Tensor:
    s = query @ repeat_kv(k, query.shape[1] // k.shape[1]).transpose(-1, -2) * scale  # (B, H, Q, N)
    return s if softcap is None else softcap * torch.tanh(s / softcap)


def train_attention(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, q_pos: torch.Tensor, scale: float,
                    window: int | None, softcap: float | None, *, slots: list[TrainSlots]) -> torch.Tensor:
    """query (B, H, Q, D); key/value (B, H_kv, Q, D): this forward's own K/V (no cache). Returns (B, Q, H, D)."""
    own_pos = q_pos
    for s in slots:
        if s.mode == "blend":  # add at the own positions that have a slot (out of place: autograd keeps both)
            idx = s.pos - own_pos[0]
            inside = (idx >= 0) & (idx < key.shape[2])
            add_k = torch.zeros_like(key).index_add(2, idx[inside], s.k[:, :, inside])
            add_v = torch.zeros_like(value).index_add(2, idx[inside], s.v[:, :, inside])
            key, value = key + s.gate * add_k, value + s.gate * add_v
    parts = [(_scores(query, key, scale, softcap), visible(q_pos, own_pos, window), value, None)]
    for s in slots:
        if s.mode == "concat":
            vis = visible(q_pos, s.pos, window if s.windowed else None)
            parts.append((_scores(query, s.k, scale, softcap), vis, s.v, s.gate))
    neg = float("-inf")
    # the running max counts only entries that carry weight: slots enter as score + log g (absent when g = 0), so
    # slots that score far above the own keys behind a closed gate cannot underflow everything to 0 / 0
    tops = []
    for sc, vis, _, gate in parts:
        top = torch.where(vis, sc, neg).amax(-1)
        if gate is not None:
            g = float(gate.detach())  # the max is a constant shift: no gradient through it
            top = top + (math.log(g) if g > 0 else neg)
        tops.append(top)
    m = torch.stack(tops).amax(0).detach()  # (B, H, Q): finite (every query sees at least its own key)
    num, den = 0.0, 0.0
    for sc, vis, v, gate in parts:
        d = torch.where(vis, sc - m[..., None], neg)  # masked entries: exp(-inf) = 0
        if gate is not None:  # g * e^d (= e^(d + log g) for g > 0); d is capped so d/dg stays finite at g = 0
            w = gate * torch.exp(d.clamp(max=80.0))
        else:
            w = torch.exp(d)
        num = num + w @ repeat_kv(v, query.shape[1] // v.shape[1])
        den = den + w.sum(-1, keepdim=True)
    return (num / den).transpose(1, 2).contiguous()


def fused_logits(fused: FusedModel, ids: torch.Tensor, slots: dict[int, list[TrainSlots]],
                 start: int = 0) -> torch.Tensor:
    """Logits (1, T, V) of ids (1, T) at positions start.., with gradients through `slots` ({master layer: [slots]});
    layers without slots run as the master. No cache, nothing placed."""
    pos = torch.arange(start, start + ids.shape[1], device=fused.master.device).view(1, -1)  # (1, T)
    overrides = {i: partial(train_attention, slots=s) for i, s in slots.items() if s}
    with fused.attention_overrides(overrides), torch.enable_grad():
        return fused.master.model(input_ids=ids, position_ids=pos, use_cache=False).logits
