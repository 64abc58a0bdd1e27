"""Notebook 00's verdict rule: does a warm-up cut the fused time to first token (C45).

The harness that measures is `nb00_ttft`; this module only judges (rules tested on hand-made data).
"""
from __future__ import annotations

from .claim import Claim


def warmup_claim(ttft: dict) -> Claim:
    """Supported iff the warm median is under half the cold call (the blog: 3.2 s -> 0.78 s, x0.24)."""
    ratio = ttft["warm_median_s"] / ttft["cold_s"]
    return Claim(claim="warm-up cuts fused time-to-first-token", seed_section="seed 1 (blog)",
                 seed_value="3.2 s -> 0.78 s (x0.24)",
                 measured=f"{ttft['cold_s']:.2f} s -> {ttft['warm_median_s']:.2f} s (x{ratio:.2f})",
                 n=f"1 cold call, median of {ttft['warm_runs']} warm",
                 setup="Qwen 0.5B + SmolLM2 (lstsq, concat, prefix), CPU fp32",
                 verdict="supported" if ratio < 0.5 else "not supported", claim_id="C45", notebook="00_quickstart")
