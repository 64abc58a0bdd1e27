"""RoPE-altered copies of a model: the same weights with θ scaled and/or a RoPE scaling rule applied.

The mismatched slaves of the RoPE experiments (notebooks 01 and 02): injected naively (post-RoPE keys in their own
frame) they show what a RoPE mismatch does; re-rotated in the master's frame they must equal the master's own keys.
"""
from __future__ import annotations

import copy

from ..engine.lm import LM
from .tiny import build_tiny
from .zoo import converted_dir, load


def rope_variant(name: str, theta_factor: float = 1.0, scaling: dict | None = None) -> LM:
    """The same weights as `name` with RoPE altered (θ scaled and/or a scaling dict): the RoPE-mismatched slave."""
    from transformers import AutoModelForCausalLM

    lm = load(name)
    cfg = copy.deepcopy(lm.model.config)
    rp = copy.deepcopy(cfg.rope_parameters)
    for params in (rp.values() if all(isinstance(v, dict) for v in rp.values()) else [rp]):
        params["rope_theta"] = params["rope_theta"] * theta_factor
        if scaling:
            params.update(scaling)
    cfg.rope_parameters = rp
    if lm.source == "embedded":
        model = AutoModelForCausalLM.from_pretrained(converted_dir(name), config=cfg, dtype=lm.dtype,
                                                     attn_implementation="sdpa").eval()
    else:
        model = build_tiny(name, lm.dtype, "sdpa", config=cfg)[0]
    label = f"θ×{theta_factor:g}" + (f", {scaling['rope_type']} ×{scaling['factor']:g}" if scaling else "")
    out = LM(model, lm.tokenizer, f"{name} ({label})", source=lm.source)
    out.remember_rebuild({"rope_variant": {"name": name, "theta_factor": theta_factor, "scaling": scaling}})
    return out
