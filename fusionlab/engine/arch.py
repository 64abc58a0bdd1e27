"""One small adapter per architecture: where pre-RoPE keys/values come from, and which RoPE a layer uses.

The base case (Llama, Qwen2, Mistral) reads keys from `k_proj` and values from `v_proj`; the others state
only their difference: Gemma 3 / Qwen 3 normalise keys (`k_norm`) before RoPE, Phi-3 fuses q/k/v into one
`qkv_proj`, Gemma 3 has a RoPE per layer type.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from ..errors import FusionLabError


@dataclass(frozen=True)
class Adapter:
    key_module: str = "k_proj"
    """Submodule of self_attn whose *output* is the pre-RoPE key."""
    value_module: str = "v_proj"
    key_layout: str = "flat"
    """'flat' (B, T, H*D); 'bthd' (B, T, H, D); 'bhtd' (B, H, T, D)."""
    fused_qkv: bool = False
    """Phi-3: one `qkv_proj` output holds [q | k | v]."""
    rope_by_layer_type: bool = False
    """Gemma 3: `rotary_emb(x, pos, layer_type)`."""


BASE = Adapter()
ADAPTERS: dict[str, Adapter] = {
    "llama": BASE,
    "qwen2": BASE,
    "mistral": BASE,
    "phi3": Adapter(key_module="qkv_proj", value_module="qkv_proj", fused_qkv=True),
    "qwen3": Adapter(key_module="k_norm", key_layout="bthd"),
    "gemma3_text": Adapter(key_module="k_norm", key_layout="bhtd", rope_by_layer_type=True),
}


def adapter_for(model: Any) -> Adapter:
    mt = model.config.model_type
    if mt not in ADAPTERS:
        raise FusionLabError(f"architecture {mt!r} has no FusionLab adapter yet; supported: {sorted(ADAPTERS)}. "
                             "Add a 3-line Adapter in fusionlab/engine/arch.py stating where its pre-RoPE keys come from.")
    return ADAPTERS[mt]


def decoder_layers(model: Any) -> list[Any]:
    return list(model.model.layers)


def attn_module(model: Any, layer: int) -> Any:
    return decoder_layers(model)[layer].self_attn


def to_bhtd(x: torch.Tensor, layout: str, heads: int, head_dim: int) -> torch.Tensor:
    """Any captured layout -> (B, H, T, D)."""
    if layout == "bhtd":
        return x
    if layout == "flat":
        x = x.view(x.shape[0], x.shape[1], heads, head_dim)
    return x.transpose(1, 2)


def split_qkv(out: torch.Tensor, heads: int, kv_heads: int, head_dim: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Phi-3 fused projection (B, T, (H + 2 H_kv) D) -> key, value, each (B, T, H_kv*D)."""
    q_end = heads * head_dim
    k_end = q_end + kv_heads * head_dim
    return out[..., q_end:k_end], out[..., k_end:]


def rope_cos_sin(model: Any, layer: int, positions: torch.Tensor, like: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(cos, sin), each (1, T, R) (or (B, T, R)), of `model`'s RoPE for `layer` at integer `positions` (T,) (or
    (B, T), one row per sequence)."""
    pos = positions.to(like.device)
    pos = pos.view(1, -1) if pos.dim() == 1 else pos
    rotary = model.model.rotary_emb
    if adapter_for(model).rope_by_layer_type:
        return rotary(like, pos, model.config.layer_types[layer])
    return rotary(like, pos)
