"""Fused attention for a batch of left-padded rows: the same rules as `attention.py`, per row.

Each row has its own query positions (B, Q), own-key positions (B, N) and slots; a key at position p is visible to a
real query at q iff 0 <= p <= q (and q - p < window where windowed). Left-pad queries see only pad keys (PAD), so their
outputs stay finite and no real query ever sees a pad. Unfused layers never come here: transformers' own batched
attention, with its padding mask, runs them. One row with no pads takes `attention.py`'s exact fast paths instead.
"""
from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F

from .attention import LayerRuntime, _decode_packed, _probs, _record, base_attention, repeat_kv
from .slot_buffer import NO_SLOT, PAD


def row_mask(q_pos: torch.Tensor, k_pos: torch.Tensor, window: int | None, windowed: torch.Tensor) -> torch.Tensor:
    """(B, Q, N) bool from q_pos (B, Q), k_pos (B, N), windowed (N,)."""
    qp, kp = q_pos[:, :, None], k_pos[:, None, :]
    real = (kp <= qp) & (kp >= 0)
    if window is not None:
        real = real & (((qp - kp) < window) | ~windowed[None, None, :])
    return torch.where(qp < 0, kp == PAD, real)


def apply_edits(rt: LayerRuntime, key: torch.Tensor, value: torch.Tensor, q_pos: torch.Tensor) -> None:
    """replace / blend on each row's new own K/V, in place (the cache holds these tensors)."""
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


def batched_attention(rt: LayerRuntime, module: Any, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                      attention_mask: torch.Tensor | None, scaling: float | None, dropout: float, inject: bool,
                      kw: dict[str, Any]) -> tuple[torch.Tensor, None]:
    """query (B, H, Q, D); key/value (B, H_kv, K, D) after RoPE and cache update. Returns (B, Q, H, D)."""
    b, h, q, _ = query.shape
    pos = kw.get("position_ids")
    q_pos = (pos.to(key.device) if pos is not None else
             (rt.past + torch.arange(q, device=key.device)).expand(b, q)).clone()
    if rt.q_real is not None:
        q_pos[~rt.q_real] = PAD
    if inject:
        apply_edits(rt, key, value, q_pos)
    joint = rt.joint if inject else None
    base = lambda: base_attention(module, rt.base)(module, query, key, value, attention_mask, scaling=scaling,  # noqa: E731
                                                   dropout=dropout, **kw)[0]
    if joint is None and rt.recorder is None:
        return base(), None
    if joint is not None:
        n = joint.write_own(key, value, rt.past, q_pos)
        k_all, v_all, k_pos = joint.k[:, :, :n], joint.v[:, :, :n], joint.pos[:, :n]
        k_src, bias, windowed = joint.src[:n], joint.bias[:n], joint.windowed[:n]
    else:  # recording an unfused layer: its keys are the cache's (a sliding layer keeps only its last entries)
        total, n = rt.past + q, key.shape[2]
        k_all, v_all, k_pos = key, value, rt.seq_pos[:, total - n:total]
        k_src = torch.full((n,), -1, device=key.device)
        bias, windowed = torch.zeros(n, device=key.device), torch.ones(n, dtype=torch.bool, device=key.device)
    scale = scaling if scaling is not None else query.shape[-1] ** -0.5
    mask = row_mask(q_pos, k_pos, kw.get("sliding_window"), windowed)
    sbias = torch.where(mask, bias[None, None, :], float("-inf")).to(query.dtype)  # (B, Q, N)
    if joint is None:
        out = base()
    elif rt.base != "eager" and kw.get("softcap") is None:
        if q == 1:
            out = _decode_packed(query, k_all, v_all, sbias[:, None], scale)
        else:
            out = F.scaled_dot_product_attention(query, k_all, v_all, attn_mask=sbias[:, None], scale=scale,
                                                 enable_gqa=h != k_all.shape[1]).transpose(1, 2).contiguous()
    else:
        n_rep = h // k_all.shape[1]
        probs = _probs(query, repeat_kv(k_all, n_rep), sbias[:, None], scale, kw.get("softcap"))
        out = (probs.to(query.dtype) @ repeat_kv(v_all, n_rep)).transpose(1, 2).contiguous()
    if rt.recorder is not None:  # per row, real queries only; the output above stays the fast one
        for r in range(b):
            real = (q_pos[r] >= 0).nonzero().flatten()
            if real.numel():
                _record(rt.recorder, rt.layer, query[r:r + 1, :, real], k_all[r:r + 1], v_all[r:r + 1], k_pos[r],
                        k_src, q_pos[r, real], sbias[r, real], scale, kw.get("softcap"), with_output=False, row=r)
    return out, None
