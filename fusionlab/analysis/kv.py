"""KV-cache budget: the seed's formula, per layer type, checked against real caches.

    full attention      2 · B · T · H_kv · D · bytes
    sliding attention   2 · B · min(T, W - 1) · H_kv · D · bytes   (transformers' DynamicCache keeps W - 1
                        past tokens; the token being processed is the W-th)
    linear attention    B · (H_v · D_k · D_v + conv_dim · (K_conv - 1)) · bytes   (constant in T)
    mamba (SSM)         B · (d_inner · d_state + d_inner · (d_conv - 1)) · bytes   (constant in T)

Quantised KV (int8 / int4) stores 1 or 0.5 bytes per element plus one fp16 scale and zero point per
group of `group_size` elements (the layout of HF's quantized caches).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import pandas as pd

from ..errors import FusionLabError

KNOWN_LAYER_TYPES = ("full_attention", "sliding_attention", "linear_attention", "mamba")
BYTES = {"float32": 4, "fp32": 4, "bfloat16": 2, "bf16": 2, "float16": 2, "fp16": 2, "int8": 1, "int4": 0.5}
QUANT_GROUP = 64


@dataclass(frozen=True)
class Budget:
    """Per-layer breakdown and total of one model's cache at one length."""

    layers: pd.DataFrame
    """One row per layer: layer, type, tokens held, elements, bytes."""
    total_bytes: int
    seq_len: int
    batch: int

    @property
    def total_gib(self) -> float:
        return self.total_bytes / 2**30

    def by_type(self) -> pd.DataFrame:
        return self.layers.groupby("type", as_index=False)[["bytes"]].sum()


def _cfg(x: Any) -> dict[str, Any]:
    """A config dict from an fl.LM, a transformers config, a ModelSpec, or a plain dict."""
    if hasattr(x, "model") and hasattr(x.model, "config"):
        x = x.model.config
    if hasattr(x, "to_dict") and not isinstance(x, dict):
        d = x.to_dict()
        if hasattr(x, "layer_types"):  # the config object resolves defaults (e.g. Gemma 3's pattern)
            d["layer_types"] = list(x.layer_types) if x.layer_types else None
        return d
    if hasattr(x, "layer_types") and hasattr(x, "kv_heads"):  # ModelSpec
        return {"num_hidden_layers": x.layers, "num_attention_heads": x.heads, "num_key_value_heads": x.kv_heads,
                "head_dim": x.head_dim, "hidden_size": x.hidden_size, "layer_types": list(x.layer_types),
                "sliding_window": x.sliding_window}
    if isinstance(x, dict):
        return dict(x.get("text_config", x))
    raise FusionLabError(f"kv.budget expects an fl.LM, a transformers config, a ModelSpec or a dict, "
                         f"got {type(x).__name__}.")


def _need(cfg: dict[str, Any], *fields: str) -> None:
    missing = [f for f in fields if cfg.get(f) is None]
    if missing:
        raise FusionLabError(f"config lacks {missing}, needed for the KV budget; add them to the dict.")


def _head_dim(cfg: dict[str, Any]) -> int:
    if cfg.get("head_dim"):
        return int(cfg["head_dim"])
    _need(cfg, "hidden_size", "num_attention_heads")
    return int(cfg["hidden_size"]) // int(cfg["num_attention_heads"])


def _bytes(dtype: str) -> float:
    if dtype not in BYTES:
        raise FusionLabError(f"unknown dtype {dtype!r} for the KV budget; use one of {sorted(BYTES)}.")
    return BYTES[dtype]


def _kv_bytes(elements: int, dtype: str, kv_dtype: str | None) -> float:
    if kv_dtype in ("int8", "int4"):
        groups = -(-elements // QUANT_GROUP)
        return elements * _bytes(kv_dtype) + groups * 2 * 2  # fp16 scale + zero point per group
    return elements * _bytes(kv_dtype or dtype)


def layer_types(cfg: dict[str, Any]) -> list[str]:
    _need(cfg, "num_hidden_layers")
    n = int(cfg["num_hidden_layers"])
    types = cfg.get("layer_types") or ["full_attention"] * n
    if len(types) != n:
        raise FusionLabError(f"layer_types has {len(types)} entries but num_hidden_layers is {n}.")
    for t in types:
        if t not in KNOWN_LAYER_TYPES:
            raise FusionLabError(f"unknown layer type {t!r}; known: {KNOWN_LAYER_TYPES}.")
    return list(types)


def _state_elements(cfg: dict[str, Any], kind: str) -> int:
    """Constant per-sequence state of a linear-attention or mamba layer (elements)."""
    if kind == "linear_attention":
        _need(cfg, "linear_num_key_heads", "linear_key_head_dim", "linear_num_value_heads",
              "linear_value_head_dim", "linear_conv_kernel_dim")
        hk, dk = cfg["linear_num_key_heads"], cfg["linear_key_head_dim"]
        hv, dv = cfg["linear_num_value_heads"], cfg["linear_value_head_dim"]
        conv_dim = 2 * hk * dk + hv * dv
        return hv * dk * dv + conv_dim * (cfg["linear_conv_kernel_dim"] - 1)
    _need(cfg, "hidden_size", "mamba_d_state", "mamba_d_conv")
    d_inner = int(cfg.get("mamba_expand", 2) * cfg["hidden_size"])
    return d_inner * cfg["mamba_d_state"] + d_inner * (cfg["mamba_d_conv"] - 1)


def budget(model: Any, seq_len: int, batch: int = 1, dtype: str = "bfloat16", kv_dtype: str | None = None) -> Budget:
    """Cache bytes of `model` holding `seq_len` tokens for `batch` sequences, per layer."""
    for name, v in (("seq_len", seq_len), ("batch", batch)):
        if isinstance(v, bool) or not isinstance(v, int):
            raise FusionLabError(f"{name} must be an int (tokens / sequences), got {type(v).__name__} {v!r}.")
    if seq_len <= 0 or batch <= 0:
        raise FusionLabError(f"seq_len and batch must be positive, got seq_len={seq_len}, batch={batch}.")
    cfg = _cfg(model)
    _need(cfg, "num_hidden_layers", "num_attention_heads")
    kv_heads = int(cfg.get("num_key_value_heads") or cfg["num_attention_heads"])
    d = _head_dim(cfg)
    rows = []
    for i, t in enumerate(layer_types(cfg)):
        if t in ("full_attention", "sliding_attention"):
            tokens = seq_len
            if t == "sliding_attention":
                _need(cfg, "sliding_window")
                tokens = min(seq_len, int(cfg["sliding_window"]) - 1)
            elements = 2 * batch * tokens * kv_heads * d
            b = _kv_bytes(elements, dtype, kv_dtype)
        else:
            tokens, elements = 0, batch * _state_elements(cfg, t)
            b = elements * _bytes(dtype)
        rows.append({"layer": i, "type": t, "tokens": tokens, "elements": elements, "bytes": int(b)})
    df = pd.DataFrame(rows)
    return Budget(df, int(df["bytes"].sum()), seq_len, batch)


def fused_budget(master: Any, slaves: list[tuple[int, int]], prompt_len: int, new_tokens: int = 0,
                 timing: str = "prefix", dtype: str = "float32") -> pd.DataFrame:
    """Master cache + injected slots. `slaves`: (mapped master layers, slots per prompt token ~ alignment
    coverage, usually 1) per slave; slots use the master's geometry (after projection)."""
    cfg = _cfg(master)
    kv_heads = int(cfg.get("num_key_value_heads") or cfg["num_attention_heads"])
    per_slot_layer = 2 * kv_heads * _head_dim(cfg) * _bytes(dtype)
    seq = prompt_len + new_tokens
    rows = [{"part": "master cache", "bytes": budget(master, seq, dtype=dtype).total_bytes}]
    for n, (layers, per_token) in enumerate(slaves):
        slot_tokens = (prompt_len + (new_tokens if timing == "live" else 0)) * per_token
        rows.append({"part": f"slave {n} slots", "bytes": int(layers * slot_tokens * per_slot_layer)})
    df = pd.DataFrame(rows)
    df.loc[len(df)] = {"part": "total", "bytes": int(df["bytes"].sum())}
    return df


def measured_cache_bytes(cache: Any) -> pd.DataFrame:
    """Tensor bytes actually held by a transformers Cache, per layer (keys + values)."""
    rows = []
    for i, layer in enumerate(cache.layers):
        k, v = getattr(layer, "keys", None), getattr(layer, "values", None)
        nbytes = sum(t.numel() * t.element_size() for t in (k, v) if t is not None and hasattr(t, "numel"))
        rows.append({"layer": i, "tokens": 0 if k is None or not hasattr(k, "shape") or k.dim() < 3 else k.shape[-2],
                     "bytes": nbytes})
    return pd.DataFrame(rows)
