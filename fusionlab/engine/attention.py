"""The attention function FusionLab registers with transformers (no edits to model files).

Layers without injection call the master's own backend unchanged (bit-exact). Injected layers:
- replace / blend edit the master's own K/V of the *new* tokens in place (so the cache keeps the edit and
  decode steps cost nothing extra);
- concat attends over [slots of each slave | own keys] with an explicit mask built from positions:
  a key at position p is visible to a query at position q iff p <= q (and q - p < window on sliding
  layers). Top-left `is_causal` is never used when key length != query length.
A concat gate g adds log(g) to the slots' scores (g = 0 hides them: the master is recovered exactly).
"""
from __future__ import annotations

import math
import sys
from dataclasses import dataclass, field
from typing import Any, Callable

import torch
import torch.nn.functional as F
from transformers import AttentionInterface
from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS, AttentionMaskInterface
from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

from ..errors import FusionLabError
from . import registry
from .slot_buffer import FAR, NO_SLOT, PAD, Injection, JointBuffer


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
    recorder: "Recorder | None" = None
    """Set by FusedModel.recording(); key_src is -1 for the master's own keys, else the slave index."""
    train: "list[Any] | None" = None
    """Set by FusedModel.train_logits(): this layer's TrainSlots (differentiable path, train_attention.py)."""
    past: int = 0
    """Cache entries before this forward (set by FusedModel._forward): where the new own keys go."""
    q_real: torch.Tensor | None = None
    """(B, Q) bool for a batch with left pads: which queries are real tokens (None: all)."""
    seq_pos: torch.Tensor | None = None
    """(B, E) position of every cache entry of the batch (PAD for pads): the own keys of an unfused layer."""


def impl_name(base: str) -> str:
    return f"fusionlab_{base}"


def install_interface(base: str) -> str:
    """Register our function (and the base's mask builder) under one name per base backend."""
    name = impl_name(base)
    AttentionInterface.register(name, fusion_attention)
    AttentionMaskInterface.register(name, ALL_MASK_ATTENTION_FUNCTIONS[base])
    return name


def base_attention(module: Any, name: str) -> Callable[..., Any]:
    """The master's own attention function: registered ones by name; 'eager' is each model file's own
    `eager_attention_forward` (transformers registers no 'eager' entry)."""
    if name in ALL_ATTENTION_FUNCTIONS:
        return ALL_ATTENTION_FUNCTIONS[name]
    return sys.modules[type(module).__module__].eager_attention_forward


def repeat_kv(x: torch.Tensor, n_rep: int) -> torch.Tensor:
    """(B, H_kv, N, D) -> (B, H_kv * n_rep, N, D)."""
    return x if n_rep == 1 else x.repeat_interleave(n_rep, dim=1)


def _apply_edits(rt: LayerRuntime, key: torch.Tensor, value: torch.Tensor, q_pos: torch.Tensor) -> None:
    """replace / blend on the new tokens' own K/V, in place (the cache holds these tensors)."""
    q = q_pos.numel()
    new_k, new_v = key[:, :, -q:], value[:, :, -q:]  # views into the cache's storage
    for inj in rt.injections:
        if inj.mode == "concat":
            continue
        lookup = inj.lookup[0]
        idx = lookup[q_pos.clamp(max=lookup.numel() - 1)]
        idx = torch.where(q_pos < lookup.numel(), idx, NO_SLOT)
        sel = (idx != NO_SLOT).nonzero().flatten()
        if sel.numel() == 0:
            continue
        sk, sv = inj.k[:, :, idx[sel]], inj.v[:, :, idx[sel]]
        g = inj.gate
        if inj.mode == "replace":  # gate 1: exact replacement; 0 < g < 1 interpolates
            new_k[:, :, sel] = sk if g == 1.0 else (1 - g) * new_k[:, :, sel] + g * sk
            new_v[:, :, sel] = sv if g == 1.0 else (1 - g) * new_v[:, :, sel] + g * sv
        else:  # blend: C2C-style residual add
            new_k[:, :, sel] += g * sk
            new_v[:, :, sel] += g * sv


def _joint(joint: JointBuffer | None, key: torch.Tensor, value: torch.Tensor, q_pos: torch.Tensor, past: int):
    """One row: K, V, positions, sources, score biases, windowed flags of every key this layer's queries may see."""
    if joint is not None:
        j = joint
        n = j.write_own(key, value, past, q_pos[None])
        return j.k[:, :, :n], j.v[:, :, :n], j.pos[0, :n], j.src[:n], j.bias[:n], j.windowed[:n]
    own_pos = q_pos[-1] - key.shape[2] + 1 + torch.arange(key.shape[2], device=key.device)
    n = key.shape[2]
    return (key, value, own_pos, torch.full((n,), -1, device=key.device),
            torch.zeros(n, device=key.device), torch.ones(n, dtype=torch.bool, device=key.device))


_FLASH_CPU = getattr(torch.ops.aten, "_scaled_dot_product_flash_attention_for_cpu", None)


def _prefill_split(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, joint: JointBuffer,
                   q_pos: torch.Tensor, scale: float) -> torch.Tensor | None:
    """Prefill from scratch (no earlier own keys) when every slot region is plain attention: slots exactly at the
    queries' positions (a causal part, the prompt's own slaves) or wholly before them (a non-causal part: a context
    every query sees). Run flash per part and merge the parts exactly by their log-sum-exp (+ log gate); skips the
    masked upper triangle. None if it doesn't apply."""
    q = query.shape[2]
    if _FLASH_CPU is None or query.device.type != "cpu" or key.shape[2] != q:
        return None
    parts = [(key, value, 0.0, True)]
    for start, size, gate in joint.regions:
        pos = joint.pos[0, start:start + size]
        n = int((pos != FAR).sum())
        if n == 0 or bool((pos[n:] != FAR).any()):  # filled entries must be a prefix of the region
            return None
        if n == q and torch.equal(pos[:n], q_pos):
            causal = True
        elif int(pos[:n].max()) < int(q_pos[0]):
            causal = False
        else:
            return None
        parts.append((joint.k[:, :, start:start + n], joint.v[:, :, start:start + n], math.log(gate), causal))
    n_rep = query.shape[1] // key.shape[1]
    outs, lses = [], []
    for k, v, bias, causal in parts:
        o, lse = _FLASH_CPU(query, repeat_kv(k, n_rep), repeat_kv(v, n_rep), 0.0, causal, attn_mask=None,
                            scale=scale)
        outs.append(o)
        lses.append(lse.float() + bias)  # (B, H, Q)
    m = torch.stack(lses).amax(0)
    w = [torch.exp(lse - m) for lse in lses]
    total = sum(wi[..., None] * oi.float() for wi, oi in zip(w, outs)) / sum(w)[..., None]
    return total.to(query.dtype)


def _decode_packed(query: torch.Tensor, k: torch.Tensor, v: torch.Tensor, bias: torch.Tensor | None,
                   scale: float) -> torch.Tensor:
    """One query token: fold the query heads of each KV group into the query axis (B, H_kv, n_rep, D), so
    attention runs on the KV heads directly (3x faster on CPU than enable_gqa). Returns (B, 1, H, D)."""
    b, h, _, d = query.shape
    qp = query.reshape(b, k.shape[1], h // k.shape[1], d)
    out = F.scaled_dot_product_attention(qp, k, v, attn_mask=bias, scale=scale)  # bias (1, N) broadcasts
    return out.reshape(b, h, 1, d).transpose(1, 2).contiguous()


def position_mask(q_pos: torch.Tensor, k_pos: torch.Tensor, window: int | None,
                  k_windowed: torch.Tensor | None = None) -> torch.Tensor:
    """(Q, N) bool: key at position p visible to query at q iff p <= q (and q - p < window where windowed)."""
    visible = k_pos[None, :] <= q_pos[:, None]
    if window is not None:
        in_window = (q_pos[:, None] - k_pos[None, :]) < window
        if k_windowed is not None:
            in_window = in_window | ~k_windowed[None, :]
        visible = visible & in_window
    return visible


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


def _query_positions(kw: dict[str, Any], key: torch.Tensor, query: torch.Tensor) -> torch.Tensor:
    pos = kw.get("position_ids")
    if pos is not None:
        return pos[0].to(key.device)  # (Q,)
    return key.shape[2] - query.shape[2] + torch.arange(query.shape[2], device=key.device)


def _probs(query: torch.Tensor, k: torch.Tensor, bias: torch.Tensor, scale: float,
           softcap: float | None) -> torch.Tensor:
    """softmax(q k^T * scale + bias) in float32. query (B, h, q, D); k (B, h, N, D); bias (q, N)."""
    scores = torch.matmul(query.float(), k.float().transpose(-1, -2))  # (B, h, q, N), one allocation
    if softcap is not None:
        scores.mul_(scale / softcap).tanh_().mul_(softcap)
    else:
        scores.mul_(scale)
    scores.add_(bias.float())  # scale and bias in place: one (q x N) buffer besides softmax's own
    return torch.softmax(scores, dim=-1)


def _fast_output(rt: LayerRuntime, joint: JointBuffer | None, query: torch.Tensor, key: torch.Tensor,
                 value: torch.Tensor, k_all: torch.Tensor, v_all: torch.Tensor, q_pos: torch.Tensor,
                 scores_bias: Callable[[], torch.Tensor], scale: float, kw: dict[str, Any]) -> torch.Tensor:
    """The layer output without probabilities, by the fastest exact path that applies. (B, Q, H, D)"""
    plain = rt.base == "sdpa" and kw.get("softcap") is None and kw.get("sliding_window") is None
    if plain and joint is not None and query.shape[2] > 1:
        out = _prefill_split(query, key, value, joint, q_pos, scale)
        if out is not None:
            return out.transpose(1, 2).contiguous()
    if plain and joint is not None and query.shape[2] == 1 and joint.dense:  # all visible, no bias: no mask
        return _decode_packed(query, k_all, v_all, None, scale)
    if rt.base != "eager" and kw.get("softcap") is None:
        if query.shape[2] == 1:
            return _decode_packed(query, k_all, v_all, scores_bias(), scale)
        out = F.scaled_dot_product_attention(query, k_all, v_all, attn_mask=scores_bias(), scale=scale,
                                             enable_gqa=query.shape[1] != k_all.shape[1])
        return out.transpose(1, 2).contiguous()
    n_rep = query.shape[1] // k_all.shape[1]
    probs = _probs(query, repeat_kv(k_all, n_rep), scores_bias(), scale, kw.get("softcap"))
    return (probs.to(query.dtype) @ repeat_kv(v_all, n_rep)).transpose(1, 2).contiguous()


def _visible_prefix(k_pos: torch.Tensor, q_last: int) -> int:
    """Keys [0, n) that a query at position q_last may see, for own keys in position order (an unfused
    layer); later keys are causally masked."""
    return int(torch.searchsorted(k_pos, torch.tensor([q_last], device=k_pos.device), right=True))


def _record(rec: Recorder, layer: int, query: torch.Tensor, k_all: torch.Tensor, v_all: torch.Tensor,
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
        n = _visible_prefix(k_pos, int(q_pos[r].max())) if trim else k_pos.numel()
        probs = _probs(q_sel[:, :, r], k_sel[:, :, :n], bias[r, :n], scale, softcap)  # (B, h, q, n)
        rec.fn(layer, probs, k_pos, k_src, q_pos[r], heads, *(() if row is None else (row,)))
        if out is not None:
            out[:, :, r] = probs.to(query.dtype) @ v_sel[:, :, :n]
    return None if out is None else out.transpose(1, 2).contiguous()


def fusion_attention(module: Any, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                     attention_mask: torch.Tensor | None, scaling: float | None = None, dropout: float = 0.0,
                     **kw: Any) -> tuple[torch.Tensor, torch.Tensor | None]:
    """query (B, H, Q, D); key/value (B, H_kv, K, D) after RoPE and cache update. Returns (B, Q, H, D)."""
    rt = registry.runtime(module)
    if rt is None:
        raise FusionLabError("a FusionLab attention function ran on a model that is not fused (closed?); "
                             "call model.set_attn_implementation('sdpa') or fuse() again.")
    if rt.active and rt.train:  # the training path: differentiable slots, no cache
        from .train_attention import train_attention

        scale = scaling if scaling is not None else query.shape[-1] ** -0.5
        return train_attention(query, key, value, _query_positions(kw, key, query), rt.train, scale,
                               kw.get("sliding_window"), kw.get("softcap")), None
    inject = rt.active and bool(rt.injections)  # injections only inside the FusedModel's own passes
    if not inject and rt.recorder is None:
        return base_attention(module, rt.base)(module, query, key, value, attention_mask, scaling=scaling,
                                                dropout=dropout, **kw)
    if query.shape[0] > 1 or rt.q_real is not None:  # a batch: per-row positions and masks (batch.py)
        from .batch_attention import batched_attention

        return batched_attention(rt, module, query, key, value, attention_mask, scaling, dropout, inject, kw)
    q_pos = _query_positions(kw, key, query)
    if inject:
        _apply_edits(rt, key, value, q_pos)
    joint = rt.joint if inject else None
    if rt.recorder is None and joint is None:
        return base_attention(module, rt.base)(module, query, key, value, attention_mask, scaling=scaling,
                                                dropout=dropout, **kw)
    k_all, v_all, k_pos, k_src, bias, windowed = _joint(joint, key, value, q_pos, rt.past)
    scale = scaling if scaling is not None else query.shape[-1] ** -0.5
    cache: dict[str, torch.Tensor] = {}

    def scores_bias() -> torch.Tensor:  # (Q, N): bias where visible, -inf elsewhere; built once, if needed
        if "b" not in cache:
            mask = position_mask(q_pos, k_pos, kw.get("sliding_window"), windowed)
            cache["b"] = torch.where(mask, bias[None, :], float("-inf")).to(query.dtype)
        return cache["b"]

    rec = rt.recorder
    if rec is not None:
        every = rec.reference or ((rec.heads is None or len(rec.heads) == query.shape[1])
                                  and rec.rows(q_pos) is None and query.shape[2] > 1)
        if every:  # one pass gives both the probabilities and the output
            return _record(rec, rt.layer, query, k_all, v_all, k_pos, k_src, q_pos, scores_bias(), scale,
                           kw.get("softcap"), with_output=True), None
    if joint is None:  # recording an unfused layer: its output is the base backend's own, bit for bit
        out = base_attention(module, rt.base)(module, query, key, value, attention_mask, scaling=scaling,
                                               dropout=dropout, **kw)[0]
    else:
        out = _fast_output(rt, joint, query, key, value, k_all, v_all, q_pos, scores_bias, scale, kw)
    if rec is not None:
        _record(rec, rt.layer, query, k_all, v_all, k_pos, k_src, q_pos, scores_bias(), scale, kw.get("softcap"),
                with_output=False)
    return out, None
