"""Edit a plain model's K/V (and mask) just before its own attention: the tool behind the claims about what a cache
holds or what a patch to it does (notebook 08: a sliding window's cache, truncating K to q's length, quantized K/V,
global layers limited to a window).

    with edit_attention(lm, fn):          # fn(layer, query, key, value, mask) -> (key, value, mask)
        logits = lm.model(ids).logits

Installed the way `fuse()` installs its function: one attention function registered with transformers by name, the
model switched to it, and its own implementation restored on exit. The edit of each attention module lives in
`EDITS` (a WeakKeyDictionary keyed by the module: the only global state here); a module with no entry never reaches
this function. `key`/`value` arrive after RoPE and the cache update, (B, H_kv, K, D); `mask` is what transformers
built (None where sdpa would use `is_causal`).
"""
from __future__ import annotations

from contextlib import contextmanager
from typing import Any, Callable, Iterator
from weakref import WeakKeyDictionary

import torch
from transformers import AttentionInterface
from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS, AttentionMaskInterface

from ..engine.arch import attn_module, decoder_layers
from ..engine.attention_core import base_attention
from ..engine.lm import LM
from ..errors import FusionLabError

Edit = Callable[[int, torch.Tensor, torch.Tensor, torch.Tensor, "torch.Tensor | None"],
                "tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]"]
EDITS: "WeakKeyDictionary[Any, tuple[Edit, str]]" = WeakKeyDictionary()
"""Attention module -> (its edit, the model's own attention implementation)."""


def _edited(module: Any, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
            attention_mask: torch.Tensor | None, scaling: float | None = None, dropout: float = 0.0,
            **kw: Any) -> tuple[torch.Tensor, torch.Tensor | None]:
    fn, base = EDITS[module]
    key, value, attention_mask = fn(module.layer_idx, query, key, value, attention_mask)
    return base_attention(module, base)(module, query, key, value, attention_mask, scaling=scaling, dropout=dropout,
                                        **kw)


def _interface(base: str) -> str:
    name = f"fusionlab_edit_{base}"
    AttentionInterface.register(name, _edited)
    AttentionMaskInterface.register(name, ALL_MASK_ATTENTION_FUNCTIONS[base])
    return name


@contextmanager
def edit_attention(lm: LM, fn: Edit) -> Iterator[LM]:
    """Run `lm` with `fn` applied to every attention layer's K/V and mask; restored on exit, even after an error."""
    if not isinstance(lm, LM) or not callable(fn):
        raise FusionLabError("edit_attention needs an fl.LM and a function (layer, query, key, value, mask) -> "
                             "(key, value, mask).")
    base = lm.model.config._attn_implementation
    if base not in ALL_MASK_ATTENTION_FUNCTIONS:
        raise FusionLabError(f"edit_attention wraps a registered backend ('sdpa', 'eager', ...); the model runs "
                             f"{base!r}. Load it with attn_implementation='sdpa'.")
    modules = [attn_module(lm.model, i) for i in range(len(decoder_layers(lm.model)))]
    for m in modules:
        EDITS[m] = (fn, base)
    lm.model.set_attn_implementation(_interface(base))
    try:
        yield lm
    finally:
        lm.model.set_attn_implementation(base)
        for m in modules:
            EDITS.pop(m, None)


def causal_band(query: torch.Tensor, key: torch.Tensor, mask: torch.Tensor | None,
                window: int | None = None) -> torch.Tensor:
    """A bool mask (B or 1, 1, Q, K), True = attend: transformers' own mask (or plain causality, the queries being the
    last Q of the K positions) intersected with `q - k < window`."""
    q_len, k_len = query.shape[2], key.shape[2]
    k_idx = torch.arange(k_len, device=key.device)
    q_idx = torch.arange(k_len - q_len, k_len, device=key.device)
    band = k_idx[None, :] <= q_idx[:, None]  # (Q, K)
    if window is not None:
        band = band & (q_idx[:, None] - k_idx[None, :] < window)
    band = band[None, None]
    if mask is None:
        return band
    own = mask if mask.dtype == torch.bool else mask > float("-inf")
    return own[..., -q_len:, -k_len:] & band


def fake_quantize(x: torch.Tensor, bits: int, group: int, axis: int = -1) -> torch.Tensor:
    """Round x to `bits`-bit integers per group of `group` entries along `axis` (-1: channels of one token; -2: one
    channel over tokens, KIVI's choice for keys, whose outliers sit in fixed channels), asymmetric min-max with an
    fp16 scale and zero point as a quantized cache stores them, and back: what attention then reads from it."""
    if axis not in (-1, -2):
        raise FusionLabError(f"axis must be -1 (channels of a token) or -2 (tokens of a channel), got {axis!r}.")
    if axis == -2:  # quantize along tokens: pad T to a multiple of the group, quantize the transpose, cut
        t = x.shape[-2]
        pad = (-t) % group
        xt = x.transpose(-1, -2)  # (..., D, T)
        if pad:  # repeat the last token: it stays inside its group's range
            xt = torch.cat([xt, xt[..., -1:].expand(*xt.shape[:-1], pad)], dim=-1)
        return fake_quantize(xt, bits, group)[..., :t].transpose(-1, -2)
    shape = x.shape
    g = x.reshape(*shape[:-1], shape[-1] // group, group).float()  # (..., D/group, group)
    lo, hi = g.amin(-1, keepdim=True), g.amax(-1, keepdim=True)
    scale = ((hi - lo) / (2**bits - 1)).clamp_min(1e-8).half().float()
    lo = lo.half().float()
    q = ((g - lo) / scale).round().clamp(0, 2**bits - 1)
    return (q * scale + lo).reshape(shape).to(x.dtype)
