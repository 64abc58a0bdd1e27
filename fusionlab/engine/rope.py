"""RoPE as pure functions: rotate pre-RoPE keys into any model's frame at any positions.

Matches transformers' `apply_rotary_pos_emb` (rotate-half convention), including partial rotary
(the first `cos.shape[-1]` dims are rotated, the rest pass through).
"""
from __future__ import annotations

import torch


def rotate_half(x: torch.Tensor) -> torch.Tensor:
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat((-x2, x1), dim=-1)


def apply_rope(k: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """k (B, H, T, D); cos/sin (B, T, R) with R <= D. Returns rotated keys, same shape."""
    cos, sin = cos.unsqueeze(1), sin.unsqueeze(1)  # (B, 1, T, R)
    r = cos.shape[-1]
    k_rot, k_pass = k[..., :r], k[..., r:]
    return torch.cat([k_rot * cos + rotate_half(k_rot) * sin, k_pass], dim=-1)
