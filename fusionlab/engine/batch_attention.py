"""Fused attention for a batch of left-padded rows: the same rules (`attention_core.py`) as one sequence, per
row.

Each row has its own query positions (B, Q), own-key positions (B, N) and slots; a key at position p is visible to a
real query at q iff 0 <= p <= q (and q - p < window where windowed). Left-pad queries see only pad keys (PAD_POSITION), so their
outputs stay finite and no real query ever sees a pad. Unfused layers never come here: transformers' own batched
attention, with its padding mask, runs them. One row with no pads takes `attention.py`'s exact fast paths instead.
"""
from __future__ import annotations

from typing import Any

import torch

from .attention_core import (LayerRuntime, apply_edits, attend, attention_scale, base_attention, record, step_bias,
                             visible)
from .slot_buffer import PAD_POSITION


def row_mask(q_pos: torch.Tensor, k_pos: torch.Tensor, window: int | None, windowed: torch.Tensor) -> torch.Tensor:
    """(B, Q, N) bool from q_pos (B, Q), k_pos (B, N), windowed (N,): `visible` for real keys (p >= 0); a pad
    query (q < 0) sees only pad keys."""
    qp, kp = q_pos[:, :, None], k_pos[:, None, :]
    real = visible(q_pos, k_pos, window, windowed) & (kp >= 0)
    return torch.where(qp < 0, kp == PAD_POSITION, real)


def batched_attention(rt: LayerRuntime, module: Any, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                      attention_mask: torch.Tensor | None, scaling: float | None, dropout: float, inject: bool,
                      kw: dict[str, Any]) -> tuple[torch.Tensor, None]:
    """query (B, H, Q, D); key/value (B, H_kv, K, D) after RoPE and cache update. Returns (B, Q, H, D)."""
    b, h, q, _ = query.shape
    pos = kw.get("position_ids")
    q_pos = (pos.to(key.device) if pos is not None else
             (rt.past + torch.arange(q, device=key.device)).expand(b, q)).clone()
    if rt.q_real is not None:
        q_pos[~rt.q_real] = PAD_POSITION
    if inject:
        apply_edits(rt, key, value, q_pos)
    joint = rt.joint if inject else None
    base = lambda: base_attention(module, rt.base)(module, query, key, value, attention_mask, scaling=scaling,  # noqa: E731
                                                   dropout=dropout, **kw)[0]
    if joint is None and rt.recorder is None:
        return base(), None
    if joint is not None:
        n = joint.own_written(rt.past, q_pos)
        k_all, v_all, k_pos = joint.k[:, :, :n], joint.v[:, :, :n], joint.pos[:, :n]
        k_src, bias, windowed = joint.src[:n], joint.bias[:n], joint.windowed[:n]
    else:  # recording an unfused layer: its keys are the cache's (a sliding layer keeps only its last entries)
        total, n = rt.past + q, key.shape[2]
        k_all, v_all, k_pos = key, value, rt.seq_pos[:, total - n:total]
        k_src = torch.full((n,), -1, device=key.device)
        bias, windowed = torch.zeros(n, device=key.device), torch.ones(n, dtype=torch.bool, device=key.device)
    scale, window = attention_scale(query, scaling), kw.get("sliding_window")

    def build() -> torch.Tensor:  # (B, Q, N): bias where visible, -inf elsewhere
        mask = row_mask(q_pos, k_pos, window, windowed)
        return torch.where(mask, bias[None, None, :], float("-inf")).to(query.dtype)

    sbias = step_bias(rt, joint, window, k_pos.shape[1], build)
    if joint is None:
        out = base()
    else:
        out = attend(rt.base, query, k_all, v_all, sbias[:, None], scale, kw.get("softcap"))
    if rt.recorder is not None:  # per row, real queries only; the output above stays the fast one
        for r in range(b):
            real = (q_pos[r] >= 0).nonzero().flatten()
            if real.numel():
                record(rt.recorder, rt.layer, query[r:r + 1, :, real], k_all[r:r + 1], v_all[r:r + 1], k_pos[r],
                        k_src, q_pos[r, real], sbias[r, real], scale, kw.get("softcap"), with_output=False, row=r)
    return out, None
