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
from typing import Any, Callable

import torch
from transformers import AttentionInterface
from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS, AttentionMaskInterface

from ..errors import FusionLabError
from . import registry
from .attention_core import (AttentionOverride, LayerRuntime, Recorder, apply_edits, attend, attention_scale,
                             base_attention, decode_packed, record, repeat_kv, step_bias, visible)
from .batch_attention import batched_attention
from .slot_buffer import FAR, JointBuffer

__all__ = ["AttentionOverride", "LayerRuntime", "Recorder", "fusion_attention", "impl_name", "install_interface"]


def impl_name(base: str) -> str:
    return f"fusionlab_{base}"


def install_interface(base: str) -> str:
    """Register our function (and the base's mask builder) under one name per base backend."""
    name = impl_name(base)
    AttentionInterface.register(name, fusion_attention)
    AttentionMaskInterface.register(name, ALL_MASK_ATTENTION_FUNCTIONS[base])
    return name


def _joint(joint: JointBuffer | None, key: torch.Tensor, value: torch.Tensor, q_pos: torch.Tensor, past: int):
    """One row: K, V, positions, sources, score biases, windowed flags of every key this layer's queries may see."""
    if joint is not None:
        j = joint
        n = j.own_written(past, q_pos[None])
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
    for start, size, gate, _, _ in joint.regions:
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


def _query_positions(kw: dict[str, Any], key: torch.Tensor, query: torch.Tensor) -> torch.Tensor:
    pos = kw.get("position_ids")
    if pos is not None:
        return pos[0].to(key.device)  # (Q,)
    return key.shape[2] - query.shape[2] + torch.arange(query.shape[2], device=key.device)


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
        return decode_packed(query, k_all, v_all, None, scale)
    return attend(rt.base, query, k_all, v_all, scores_bias(), scale, kw.get("softcap"))


def fusion_attention(module: Any, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                     attention_mask: torch.Tensor | None, scaling: float | None = None, dropout: float = 0.0,
                     **kw: Any) -> tuple[torch.Tensor, torch.Tensor | None]:
    """query (B, H, Q, D); key/value (B, H_kv, K, D) after RoPE and cache update. Returns (B, Q, H, D)."""
    rt = registry.runtime(module)
    if rt is None:
        raise FusionLabError("a FusionLab attention function ran on a model that is not fused (closed?); "
                             "call model.set_attn_implementation('sdpa') or fuse() again.")
    if rt.active and rt.override is not None:  # a hook's own attention (fusionlab.training's differentiable slots)
        return rt.override(query, key, value, _query_positions(kw, key, query), attention_scale(query, scaling),
                           kw.get("sliding_window"), kw.get("softcap")), None
    inject = rt.active and bool(rt.injections)  # injections only inside the FusedModel's own passes
    if not inject and rt.recorder is None:
        return base_attention(module, rt.base)(module, query, key, value, attention_mask, scaling=scaling,
                                                dropout=dropout, **kw)
    if query.shape[0] > 1 or rt.q_real is not None:  # a batch: per-row positions and masks (batch_attention.py)
        return batched_attention(rt, module, query, key, value, attention_mask, scaling, dropout, inject, kw)
    q_pos = _query_positions(kw, key, query)
    if inject:
        apply_edits(rt, key, value, q_pos[None])
    joint = rt.joint if inject else None
    if rt.recorder is None and joint is None:
        return base_attention(module, rt.base)(module, query, key, value, attention_mask, scaling=scaling,
                                                dropout=dropout, **kw)
    k_all, v_all, k_pos, k_src, bias, windowed = _joint(joint, key, value, q_pos, rt.past)
    scale = attention_scale(query, scaling)
    cache: dict[str, torch.Tensor] = {}

    def build() -> torch.Tensor:  # (Q, N): bias where visible, -inf elsewhere
        mask = visible(q_pos, k_pos, kw.get("sliding_window"), windowed)
        return torch.where(mask, bias[None, :], float("-inf")).to(query.dtype)

    def scores_bias() -> torch.Tensor:  # built once per layer, if needed; once per step for a shared layout
        if "b" not in cache:
            cache["b"] = step_bias(rt, joint, kw.get("sliding_window"), k_pos.shape[0], build)
        return cache["b"]

    rec = rt.recorder
    if rec is not None:
        every = rec.reference or ((rec.heads is None or len(rec.heads) == query.shape[1])
                                  and rec.rows(q_pos) is None and query.shape[2] > 1)
        if every:  # one pass gives both the probabilities and the output
            return record(rec, rt.layer, query, k_all, v_all, k_pos, k_src, q_pos, scores_bias(), scale,
                          kw.get("softcap"), with_output=True), None
    if joint is None:  # recording an unfused layer: its output is the base backend's own, bit for bit
        out = base_attention(module, rt.base)(module, query, key, value, attention_mask, scaling=scaling,
                                               dropout=dropout, **kw)[0]
    else:
        out = _fast_output(rt, joint, query, key, value, k_all, v_all, q_pos, scores_bias, scale, kw)
    if rec is not None:
        record(rec, rt.layer, query, k_all, v_all, k_pos, k_src, q_pos, scores_bias(), scale, kw.get("softcap"),
               with_output=False)
    return out, None
