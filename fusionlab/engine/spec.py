"""A model's geometry in one small record: what fusion, alignment and KV budgets need to know."""
from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any


@dataclass(frozen=True)
class RopeSpec:
    """RoPE parameters of one layer type."""

    theta: float
    """Base frequency θ."""
    rope_type: str = "default"
    """'default', 'linear', 'dynamic', 'yarn', ... (transformers' names)."""
    factor: float | None = None
    """Scaling factor for scaled RoPE types; None for default RoPE."""


@dataclass(frozen=True)
class ModelSpec:
    """Geometry of a causal LM, read from its config."""

    model_type: str
    layers: int
    heads: int
    kv_heads: int
    head_dim: int
    hidden_size: int
    vocab_size: int
    max_positions: int
    layer_types: tuple[str, ...]
    """Per layer: 'full_attention', 'sliding_attention', 'linear_attention', ..."""
    rope: dict[str, RopeSpec] = field(default_factory=dict)
    """RoPE per layer type."""
    sliding_window: int | None = None
    norm_eps: float | None = None
    has_chat_template: bool = False

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def _rope_from_params(params: dict[str, Any]) -> RopeSpec:
    return RopeSpec(
        theta=float(params.get("rope_theta", 10000.0)),
        rope_type=str(params.get("rope_type", params.get("type", "default"))),
        factor=params.get("factor"),
    )


def layer_types_of(config: Any) -> tuple[str, ...]:
    n = config.num_hidden_layers
    types = getattr(config, "layer_types", None)
    return tuple(types) if types else ("full_attention",) * n


def rope_of(config: Any) -> dict[str, RopeSpec]:
    """RoPE per layer type; handles the flat and the per-layer-type forms of `rope_parameters`."""
    params = getattr(config, "rope_parameters", None) or {"rope_theta": getattr(config, "rope_theta", 10000.0)}
    types = set(layer_types_of(config))
    if all(t in params for t in types):  # per-layer-type dict (Gemma 3)
        return {t: _rope_from_params(params[t]) for t in types}
    return {t: _rope_from_params(params) for t in types}


def spec_from_config(config: Any, has_chat_template: bool = False) -> ModelSpec:
    heads = config.num_attention_heads
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // heads
    return ModelSpec(
        model_type=config.model_type,
        layers=config.num_hidden_layers,
        heads=heads,
        kv_heads=getattr(config, "num_key_value_heads", None) or heads,
        head_dim=head_dim,
        hidden_size=config.hidden_size,
        vocab_size=config.vocab_size,
        max_positions=config.max_position_embeddings,
        layer_types=layer_types_of(config),
        rope=rope_of(config),
        sliding_window=getattr(config, "sliding_window", None),
        norm_eps=getattr(config, "rms_norm_eps", None),
        has_chat_template=has_chat_template,
    )
