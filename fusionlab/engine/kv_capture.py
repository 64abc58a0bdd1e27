"""Capture a model's per-layer keys *before* RoPE (after k_norm where it exists) and its values.

Forward hooks on the projection modules only (no edits to transformers), removed when the call returns.
Post-RoPE keys, the blog's naive choice, are the same keys rotated in the *slave's own* frame:
`post_rope_keys()` gives exactly what the slave caches (tested against its DynamicCache).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch

from .arch import adapter_for, attn_module, rope_cos_sin, split_qkv, to_bhtd
from .lm import LM
from .rope import apply_rope


@dataclass
class CapturedKV:
    """Per-layer pre-RoPE keys and values of one forward pass."""

    keys: dict[int, torch.Tensor] = field(default_factory=dict)
    """layer -> (B, H_kv, T, D), pre-RoPE."""
    values: dict[int, torch.Tensor] = field(default_factory=dict)
    """layer -> (B, H_kv, T, D)."""
    positions: torch.Tensor | None = None
    """(T,) token positions in the capturing model's own frame; (B, T) for a batch (one row per sequence)."""

    @property
    def length(self) -> int:
        return 0 if self.positions is None else int(self.positions.shape[-1])

    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for d in (self.keys, self.values) for t in d.values())


def _hooks(lm: LM, layers: list[int], out: CapturedKV) -> list[Any]:
    ad, s = adapter_for(lm.model), lm.spec
    handles = []
    for layer in layers:
        attn = attn_module(lm.model, layer)

        def on_key(_m, _inp, y, layer=layer):
            k = split_qkv(y, s.heads, s.kv_heads, s.head_dim)[0] if ad.fused_qkv else y
            out.keys[layer] = to_bhtd(k, "flat" if ad.fused_qkv else ad.key_layout, s.kv_heads, s.head_dim).detach()

        def on_value(_m, _inp, y, layer=layer):
            v = split_qkv(y, s.heads, s.kv_heads, s.head_dim)[1] if ad.fused_qkv else y
            out.values[layer] = to_bhtd(v, "flat", s.kv_heads, s.head_dim).detach()

        handles.append(getattr(attn, ad.key_module).register_forward_hook(on_key))
        handles.append(getattr(attn, ad.value_module).register_forward_hook(on_value))
    return handles


@torch.inference_mode()
def capture_kv(lm: LM, input_ids: torch.Tensor, layers: list[int] | None = None,
               positions: torch.Tensor | None = None, cache: Any = None,
               attention_mask: torch.Tensor | None = None) -> CapturedKV:
    """Run the decoder body (no LM head) on `input_ids` (B, T) and capture K/V at `layers` (default all).

    With `cache` (a transformers Cache) the call is incremental: `positions` continue the sequence. A left-padded
    batch passes per-row `positions` (B, T) and its `attention_mask` (B, cache + T).
    """
    layers = list(range(lm.spec.layers)) if layers is None else sorted(set(layers))
    t = input_ids.shape[1]
    if positions is None:
        start = cache.get_seq_length() if cache is not None else 0
        positions = torch.arange(start, start + t, device=input_ids.device)
    out = CapturedKV(positions=positions)
    handles = _hooks(lm, layers, out)
    try:
        pos = positions.view(1, -1) if positions.dim() == 1 else positions
        lm.model.model(input_ids=input_ids.to(lm.device), position_ids=pos.to(lm.device), cache=cache,
                       use_cache=cache is not None,
                       attention_mask=None if attention_mask is None else attention_mask.to(lm.device))
    finally:
        for h in handles:
            h.remove()
    return out


def post_rope_keys(lm: LM, captured: CapturedKV, layer: int) -> torch.Tensor:
    """Keys of `layer` rotated in the capturing model's own frame: what its KV cache holds. (B, H_kv, T, D)"""
    k = captured.keys[layer]
    cos, sin = rope_cos_sin(lm.model, layer, captured.positions, k)
    return apply_rope(k, cos, sin)
