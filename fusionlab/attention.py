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
from dataclasses import dataclass, field
from typing import Any, Callable

import torch
import torch.nn.functional as F
from transformers import AttentionInterface
from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS, AttentionMaskInterface
from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

from .errors import FusionLabError

NO_SLOT = -1


@dataclass
class Injection:
    """Slots one slave contributes at one master layer; pre-allocated, filled once (prefix) or grown (live)."""

    slave: int
    mode: str
    gate: float
    k: torch.Tensor
    """(1, H_kv_m, capacity, D_m), already in the master's frame (or naive, on purpose)."""
    v: torch.Tensor
    pos: torch.Tensor
    """(capacity,) master position of each slot."""
    lookup: torch.Tensor
    """(max_pos,) master position -> slot index, NO_SLOT where none (used by replace/blend)."""
    n: int = 0

    def append(self, k: torch.Tensor, v: torch.Tensor, pos: torch.Tensor) -> None:
        """k, v (1, H, S, D); pos (S,). Writes into the pre-allocated buffers."""
        s = pos.numel()
        if self.n + s > self.k.shape[2] or int(pos.max()) >= self.lookup.numel():
            raise FusionLabError("injection buffer full: raise max_new_tokens / capacity for this sequence.")
        self.k[:, :, self.n:self.n + s] = k
        self.v[:, :, self.n:self.n + s] = v
        self.pos[self.n:self.n + s] = pos
        self.lookup[pos] = torch.arange(self.n, self.n + s, device=pos.device)
        self.n += s

    @property
    def nbytes(self) -> int:
        return 2 * self.n * self.k.shape[1] * self.k.shape[3] * self.k.element_size()


FAR = 2**62  # position of an unfilled buffer entry: never visible


@dataclass
class JointBuffer:
    """[slots of every concat slave | own keys] for one layer, pre-allocated once per sequence.

    Slots are written once (prefix) or appended (live) through views into this buffer; each forward writes
    only its new own keys, so a decode step copies O(1) rows instead of re-concatenating the whole cache.
    """

    k: torch.Tensor
    """(1, H_kv, N_cap, D)."""
    v: torch.Tensor
    pos: torch.Tensor
    """(N_cap,) position of each entry; FAR where unfilled."""
    bias: torch.Tensor
    """(N_cap,) score bias: log(gate) for slots, 0 for own keys."""
    windowed: torch.Tensor
    """(N_cap,) bool: entry obeys the sliding window."""
    src: torch.Tensor
    """(N_cap,) -1 for own keys, else the slave index."""
    own_offset: int
    regions: list[tuple[int, int, float]] = field(default_factory=list)
    """(start, size, gate) of each slave's slot region."""
    dense: bool = False
    """Every slot region is full and every gate is 1: a decode query sees all entries, no mask needed."""

    @classmethod
    def allocate(cls, h: int, d: int, slots: int, tokens: int, dtype: torch.dtype,
                 device: torch.device) -> "JointBuffer":
        """Room for `slots` injected entries (all concat slaves) and `tokens` own keys."""
        n = slots + tokens
        return cls(torch.zeros(1, h, n, d, dtype=dtype, device=device),
                  torch.zeros(1, h, n, d, dtype=dtype, device=device),
                  torch.full((n,), FAR, dtype=torch.long, device=device),
                  torch.zeros(n, dtype=torch.float32, device=device),
                  torch.ones(n, dtype=torch.bool, device=device),
                  torch.full((n,), -1, dtype=torch.long, device=device), slots)

    def region(self, start: int, size: int, slave: int, gate: float, window_slots: bool):
        """Views (k, v, pos) of one slave's slot region; sets its bias, window flag and source."""
        sl = slice(start, start + size)
        self.regions.append((start, size, gate))
        self.bias[sl] = math.log(gate) if gate > 0 else float("-inf")
        self.windowed[sl] = window_slots
        self.src[sl] = slave
        return self.k[:, :, sl], self.v[:, :, sl], self.pos[sl]

    def write_own(self, key: torch.Tensor, value: torch.Tensor, q_pos: torch.Tensor) -> int:
        """Store the new tokens' own K/V (the last Q of `key`) at their positions; returns entries in use."""
        q = q_pos.numel()
        idx = self.own_offset + q_pos
        self.k[:, :, idx] = key[:, :, -q:]
        self.v[:, :, idx] = value[:, :, -q:]
        self.pos[idx] = q_pos
        return self.own_offset + int(q_pos[-1]) + 1


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
    recorder: Callable[..., None] | None = None
    """Called as recorder(layer, probs (B, H, Q, N), key_pos (N,), key_src (N,)); src -1 = master's own keys."""


_RUNTIMES: dict[int, LayerRuntime] = {}


def register(module: Any, runtime: LayerRuntime) -> None:
    _RUNTIMES[id(module)] = runtime


def unregister(module: Any) -> None:
    _RUNTIMES.pop(id(module), None)


def impl_name(base: str) -> str:
    return f"fusionlab_{base}"


def install_interface(base: str) -> str:
    """Register our function (and the base's mask builder) under one name per base backend."""
    name = impl_name(base)
    AttentionInterface.register(name, fusion_attention)
    AttentionMaskInterface.register(name, ALL_MASK_ATTENTION_FUNCTIONS[base])
    return name


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
        idx = inj.lookup[q_pos.clamp(max=inj.lookup.numel() - 1)]
        idx = torch.where(q_pos < inj.lookup.numel(), idx, NO_SLOT)
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


def _joint(rt: LayerRuntime, key: torch.Tensor, value: torch.Tensor, q_pos: torch.Tensor):
    """K, V, positions, sources, score biases, windowed flags of every key this layer's queries may see."""
    if rt.joint is not None:
        j = rt.joint
        n = j.write_own(key, value, q_pos)
        return j.k[:, :, :n], j.v[:, :, :n], j.pos[:n], j.src[:n], j.bias[:n], j.windowed[:n]
    own_pos = q_pos[-1] - key.shape[2] + 1 + torch.arange(key.shape[2], device=key.device)
    n = key.shape[2]
    return (key, value, own_pos, torch.full((n,), -1, device=key.device),
            torch.zeros(n, device=key.device), torch.ones(n, dtype=torch.bool, device=key.device))


_FLASH_CPU = getattr(torch.ops.aten, "_scaled_dot_product_flash_attention_for_cpu", None)


def _prefill_split(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, joint: JointBuffer,
                   q_pos: torch.Tensor, scale: float) -> torch.Tensor | None:
    """Prefill from scratch when every slot region sits exactly at the queries' positions: each part
    (own keys, each slave's slots) is plain causal attention, so run causal flash per part and merge the
    parts exactly by their log-sum-exp (+ log gate). Skips the masked upper triangle; None if it doesn't apply."""
    q = query.shape[2]
    if _FLASH_CPU is None or query.device.type != "cpu" or key.shape[2] != q or int(q_pos[0]) != 0:
        return None
    parts = [(key, value, 0.0)]
    for start, size, gate in joint.regions:
        pos = joint.pos[start:start + size]
        if not torch.equal(pos[:q], q_pos) or (size > q and bool((pos[q:] != FAR).any())):
            return None
        parts.append((joint.k[:, :, start:start + q], joint.v[:, :, start:start + q], math.log(gate)))
    n_rep = query.shape[1] // key.shape[1]
    outs, lses = [], []
    for k, v, bias in parts:
        o, lse = _FLASH_CPU(query, repeat_kv(k, n_rep), repeat_kv(v, n_rep), 0.0, True, attn_mask=None, scale=scale)
        outs.append(o)
        lses.append(lse.float() + bias)  # (B, H, Q)
    m = torch.stack(lses).amax(0)
    w = [torch.exp(l - m) for l in lses]
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


def fusion_attention(module: Any, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                     attention_mask: torch.Tensor | None, scaling: float | None = None, dropout: float = 0.0,
                     **kw: Any) -> tuple[torch.Tensor, torch.Tensor | None]:
    """query (B, H, Q, D); key/value (B, H_kv, K, D) after RoPE and cache update. Returns (B, Q, H, D)."""
    rt = _RUNTIMES.get(id(module))
    if rt is None:
        raise FusionLabError("a FusionLab attention function ran on a model that is not fused (closed?); "
                             "call model.set_attn_implementation('sdpa') or fuse() again.")
    if not rt.active or (not rt.injections and rt.recorder is None):
        return ALL_ATTENTION_FUNCTIONS[rt.base](module, query, key, value, attention_mask, scaling=scaling,
                                                dropout=dropout, **kw)
    if "position_ids" not in kw or kw["position_ids"] is None:
        raise FusionLabError("injection needs position_ids in the attention call; run through FusedModel.")
    if query.shape[0] != 1:
        raise FusionLabError(f"fused attention supports batch size 1, got {query.shape[0]}.")
    q_pos = kw["position_ids"][0].to(key.device)  # (Q,)
    _apply_edits(rt, key, value, q_pos)
    if rt.recorder is None and rt.joint is None:
        return ALL_ATTENTION_FUNCTIONS[rt.base](module, query, key, value, attention_mask, scaling=scaling,
                                                dropout=dropout, **kw)
    k_all, v_all, k_pos, k_src, bias, windowed = _joint(rt, key, value, q_pos)
    scale = scaling if scaling is not None else query.shape[-1] ** -0.5
    fast = rt.recorder is None and rt.base == "sdpa" and kw.get("softcap") is None and rt.joint is not None \
        and kw.get("sliding_window") is None
    if fast and query.shape[2] > 1:
        out = _prefill_split(query, key, value, rt.joint, q_pos, scale)
        if out is not None:
            return out.transpose(1, 2).contiguous(), None
    if fast and query.shape[2] == 1 and rt.joint.dense:  # every entry visible, no bias: no mask at all
        return _decode_packed(query, k_all, v_all, None, scale), None
    mask = position_mask(q_pos, k_pos, kw.get("sliding_window"), windowed)  # (Q, N)
    scores_bias = torch.where(mask, bias[None, :], float("-inf")).to(query.dtype)  # (Q, N)
    softcap = kw.get("softcap")
    if rt.recorder is None and rt.base != "eager" and softcap is None and query.shape[2] == 1:
        return _decode_packed(query, k_all, v_all, scores_bias, scale), None
    if rt.recorder is None and rt.base != "eager" and softcap is None:  # GQA without copying K/V
        out = F.scaled_dot_product_attention(query, k_all, v_all, attn_mask=scores_bias, scale=scale,
                                             enable_gqa=query.shape[1] != k_all.shape[1])
        return out.transpose(1, 2).contiguous(), None
    n_rep = query.shape[1] // k_all.shape[1]
    k_all, v_all = repeat_kv(k_all, n_rep), repeat_kv(v_all, n_rep)
    scores = (query @ k_all.transpose(-1, -2)) * scale  # (B, H, Q, N)
    if softcap is not None:
        scores = torch.tanh(scores / softcap) * softcap
    probs = torch.softmax(scores.float() + scores_bias.float(), dim=-1).to(query.dtype)
    if rt.recorder is not None:
        rt.recorder(rt.layer, probs, k_pos, k_src)
    return (probs @ v_all).transpose(1, 2).contiguous(), probs

