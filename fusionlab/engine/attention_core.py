"""The pieces every fused attention path shares: one place for each rule.

`attention.py` (one sequence, with its exact fast paths) and `batch_attention.py` (left-padded rows) are thin callers
of these; `fusionlab.training.attention` (differentiable slots) uses `visible` and `repeat_kv` and plugs in through
`LayerRuntime.override` (the engine knows nothing about training). This module imports nothing of the engine
except the slot buffer's types, so no attention file needs another's private helpers.

- `visible`: the one visibility rule (a key at position p is seen by a query at q iff p <= q, and q - p < window
  for windowed keys on sliding layers);
- `apply_edits`: the one replace / blend edit of the master's own K/V;
- `attention_scale`, `repeat_kv`, `probs`: the scale default, GQA expansion and reference softmax;
- `attend`: the one backend dispatch (packed decode / sdpa / eager math) for an explicit score bias;
- `LayerRuntime`, `Recorder`, `record`: a layer's fusion state and attention capture;
- `AttentionOverride`: the one hook another package may set on a layer (FusedModel.attention_overrides).
"""
from __future__ import annotations

import sys
from dataclasses import dataclass, field
from typing import Any, Callable

import torch
import torch.nn.functional as F
from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

from .slot_buffer import NO_SLOT, Injection, JointBuffer


@dataclass
class Recorder:
    """What an attention capture wants from inside the attention computation."""

    fn: Callable[..., None]
    """fn(layer, probs (B, H_sel, q, N' <= N), key_pos (N,), key_src (N,), query_pos (q,), heads); keys past N'
    have probability exactly 0 (see `trim`)."""
    rows: Callable[[torch.Tensor], torch.Tensor | None] = lambda q_pos: None
    """Query positions (Q,) -> row indices to record (None = all rows)."""
    heads: list[int] | None = None
    reference: bool = False
    """True: the layer's output is computed from the recorded probabilities (eager math, all rows)."""
    chunk: int = 256
    """Query rows per chunk, bounding memory at chunk x N x H floats."""
    trim: bool = False
    """True: on an unfused layer, compute only the keys a chunk's queries can see (N' <= N): the keys cut are
    exactly zero-probability future positions. For aggregating recorders; full maps keep every key."""


AttentionOverride = Callable[[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, float, "int | None",
                              "float | None"], torch.Tensor]
"""override(query (B, H, Q, D), key, value (B, H_kv, Q, D), q_pos (Q,), scale, sliding_window, softcap) -> (B, Q, H, D):
a layer's whole attention, replacing the fused path (set through FusedModel.attention_overrides, removed on exit)."""


@dataclass
class LayerRuntime:
    layer: int
    base: str
    """The master's own attention implementation ('sdpa', 'eager', ...)."""
    injections: list[Injection] = field(default_factory=list)
    joint: JointBuffer | None = None
    """Set when any injection at this layer is concat."""
    active: bool = False
    """True only inside the FusedModel's own forward passes; otherwise the master runs as itself."""
    recorder: Recorder | None = None
    """Set by FusedModel.recording(); key_src is -1 for the master's own keys, else the slave index."""
    override: AttentionOverride | None = None
    """Set by FusedModel.attention_overrides() (fusionlab.training: differentiable slots, no cache)."""
    past: int = 0
    """Cache entries before this forward (set by FusedModel._forward): where the new own keys go."""
    q_real: torch.Tensor | None = None
    """(B, Q) bool for a batch with left pads: which queries are real tokens (None: all)."""
    seq_pos: torch.Tensor | None = None
    """(B, E) position of every cache entry of the batch (PAD_POSITION for pads): the own keys of an unfused layer."""
    step: dict[tuple, torch.Tensor] | None = None
    """One forward's score biases by (layout, window, entries), shared by all its layers (set by FusedModel._forward,
    dropped after it): layers with the same slot layout build their mask once per step (`step_bias`)."""


def base_attention(module: Any, name: str) -> Callable[..., Any]:
    """The master's own attention function: registered ones by name; 'eager' is each model file's own
    `eager_attention_forward` (transformers registers no 'eager' entry)."""
    if name in ALL_ATTENTION_FUNCTIONS:
        return ALL_ATTENTION_FUNCTIONS[name]
    return sys.modules[type(module).__module__].eager_attention_forward


def attention_scale(query: torch.Tensor, scaling: float | None) -> float:
    """The scale transformers passed, else the standard 1/sqrt(head_dim)."""
    return scaling if scaling is not None else query.shape[-1] ** -0.5


def repeat_kv(x: torch.Tensor, n_rep: int) -> torch.Tensor:
    """(B, H_kv, N, D) -> (B, H_kv * n_rep, N, D)."""
    return x if n_rep == 1 else x.repeat_interleave(n_rep, dim=1)


def visible(q_pos: torch.Tensor, k_pos: torch.Tensor, window: int | None,
            k_windowed: torch.Tensor | None = None) -> torch.Tensor:
    """(..., Q, N) bool from q_pos (..., Q) and k_pos (..., N): the key at p is visible to the query at q iff
    p <= q, and q - p < window where the key is windowed (k_windowed (N,); None: every key is)."""
    qp, kp = q_pos[..., :, None], k_pos[..., None, :]
    ok = kp <= qp
    if window is not None:
        in_window = (qp - kp) < window
        if k_windowed is not None:
            in_window = in_window | ~k_windowed
        ok = ok & in_window
    return ok


def step_bias(rt: LayerRuntime, joint: JointBuffer | None, window: int | None, n: int,
              build: Callable[[], torch.Tensor]) -> torch.Tensor:
    """This layer's score bias over the first n entries of `joint`: built once per forward for every layer with
    the same layout and window (see JointBuffer.layout); `build()` each time outside a FusedModel forward or for an
    unfused layer (no joint: a recorder's own keys)."""
    if rt.step is None or joint is None:
        return build()
    key = (joint.layout, window, n)
    if key not in rt.step:
        rt.step[key] = build()
    return rt.step[key]


def apply_edits(rt: LayerRuntime, key: torch.Tensor, value: torch.Tensor, q_pos: torch.Tensor) -> None:
    """replace / blend on each row's new own K/V, in place (the cache holds these tensors). q_pos (B, Q); a
    negative position (a left pad) or one without a slot is left as it is."""
    q = q_pos.shape[1]
    new_k, new_v = key[:, :, -q:], value[:, :, -q:]  # (B, H, Q, D) views into the cache's storage
    for inj in rt.injections:
        if inj.mode == "concat":
            continue
        size = inj.lookup.shape[1]
        idx = inj.lookup.gather(1, q_pos.clamp(0, size - 1))  # (B, Q)
        ok = (q_pos >= 0) & (q_pos < size) & (idx != NO_SLOT)
        if not bool(ok.any()):
            continue
        at = idx.clamp(min=0)[:, None, :, None].expand(-1, inj.k.shape[1], -1, inj.k.shape[3])
        sk, sv, g, m = inj.k.gather(2, at), inj.v.gather(2, at), inj.gate, ok[:, None, :, None]
        if inj.mode == "replace":  # gate 1: exact replacement; 0 < g < 1 interpolates
            tk, tv = (sk, sv) if g == 1.0 else ((1 - g) * new_k + g * sk, (1 - g) * new_v + g * sv)
        else:  # blend: C2C-style residual add
            tk, tv = new_k + g * sk, new_v + g * sv
        new_k.copy_(torch.where(m, tk, new_k))
        new_v.copy_(torch.where(m, tv, new_v))


def probs(query: torch.Tensor, k: torch.Tensor, bias: torch.Tensor, scale: float,
          softcap: float | None) -> torch.Tensor:
    """softmax(q k^T * scale + bias) in float32. query (B, h, q, D); k (B, h, N, D); bias broadcast to (B, h, q, N)."""
    scores = torch.matmul(query.float(), k.float().transpose(-1, -2))  # (B, h, q, N), one allocation
    if softcap is not None:
        scores.mul_(scale / softcap).tanh_().mul_(softcap)
    else:
        scores.mul_(scale)
    scores.add_(bias.float())  # scale and bias in place: one (q x N) buffer besides softmax's own
    return torch.softmax(scores, dim=-1)


def decode_packed(query: torch.Tensor, k: torch.Tensor, v: torch.Tensor, bias: torch.Tensor | None,
                  scale: float) -> torch.Tensor:
    """One query token: fold the query heads of each KV group into the query axis (B, H_kv, n_rep, D), so
    attention runs on the KV heads directly (3x faster on CPU than enable_gqa). Returns (B, 1, H, D)."""
    b, h, _, d = query.shape
    qp = query.reshape(b, k.shape[1], h // k.shape[1], d)
    out = F.scaled_dot_product_attention(qp, k, v, attn_mask=bias, scale=scale)  # bias broadcasts over heads
    return out.reshape(b, h, 1, d).transpose(1, 2).contiguous()


def attend(base: str, query: torch.Tensor, k: torch.Tensor, v: torch.Tensor, bias: torch.Tensor, scale: float,
           softcap: float | None) -> torch.Tensor:
    """Attention over explicit keys with a score bias (-inf = hidden), by the backend the master uses: packed
    decode or sdpa for any fused backend but eager / a soft cap, else eager math. query (B, H, Q, D); k, v
    (B, H_kv, N, D); bias (Q, N) or (B, 1, Q, N). Returns (B, Q, H, D)."""
    if base != "eager" and softcap is None:
        if query.shape[2] == 1:
            return decode_packed(query, k, v, bias, scale)
        out = F.scaled_dot_product_attention(query, k, v, attn_mask=bias, scale=scale,
                                             enable_gqa=query.shape[1] != k.shape[1])
        return out.transpose(1, 2).contiguous()
    n_rep = query.shape[1] // k.shape[1]
    p = probs(query, repeat_kv(k, n_rep), bias, scale, softcap)
    return (p.to(query.dtype) @ repeat_kv(v, n_rep)).transpose(1, 2).contiguous()


def visible_prefix(k_pos: torch.Tensor, q_last: int) -> int:
    """Keys [0, n) that a query at position q_last may see, for own keys in position order (an unfused
    layer); later keys are causally masked."""
    return int(torch.searchsorted(k_pos, torch.tensor([q_last], device=k_pos.device), right=True))


def record(rec: Recorder, layer: int, query: torch.Tensor, k_all: torch.Tensor, v_all: torch.Tensor,
           k_pos: torch.Tensor, k_src: torch.Tensor, q_pos: torch.Tensor, bias: torch.Tensor, scale: float,
           softcap: float | None, with_output: bool, row: int | None = None) -> torch.Tensor | None:
    """Probabilities for the recorder's rows and heads only, in chunks; with_output (every row and head
    recorded) also returns the layer output probs @ V, so no separate attention call is needed. `row`: the batch
    row these queries belong to (passed to the recorder as a 7th argument; absent for a single sequence)."""
    n_rep = query.shape[1] // k_all.shape[1]
    heads = list(range(query.shape[1])) if with_output or rec.heads is None else rec.heads
    h_idx = torch.tensor(heads, device=query.device)
    k_sel, v_sel = k_all.index_select(1, h_idx // n_rep), v_all.index_select(1, h_idx // n_rep)
    rows = None if with_output else rec.rows(q_pos)
    rows = torch.arange(q_pos.numel(), device=q_pos.device) if rows is None else rows
    out = torch.empty_like(query) if with_output else None
    q_sel = query if len(heads) == query.shape[1] else query[:, h_idx]
    trim = rec.trim and not bool((k_src != -1).any())  # slots break position order: keep every key then
    for start in range(0, rows.numel(), rec.chunk):
        r = rows[start:start + rec.chunk]
        n = visible_prefix(k_pos, int(q_pos[r].max())) if trim else k_pos.numel()
        p = probs(q_sel[:, :, r], k_sel[:, :, :n], bias[r, :n], scale, softcap)  # (B, h, q, n)
        rec.fn(layer, p, k_pos, k_src, q_pos[r], heads, *(() if row is None else (row,)))
        if out is not None:
            out[:, :, r] = p.to(query.dtype) @ v_sel[:, :, :n]
    return None if out is None else out.transpose(1, 2).contiguous()
