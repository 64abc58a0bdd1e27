"""Notebook 05's verdict rules: the posts' KV-cache arithmetic against the formula and real caches.

The harness that measures is `nb05_kv_budget`; this module only judges (rules tested on hand-made data).
"""
from __future__ import annotations

import pandas as pd

from .claim import Claim
from .nb05_kv_budget import weights_gb

NB = "05_kv_cache_budget"


# --- claims -------------------------------------------------------------------------------------------------
def worked_example_claim(worked: pd.DataFrame, needed: int, assumed_gb: float) -> Claim:
    """The seed's 21.5 GB at 32K (`assumed_gb`: the formula on the config the post assumes, 40 x 32 x 128; `worked`:
    published 27B configs). Partly supported when the arithmetic is right for the assumed config but no published
    27B config needs it; supported if a published one does too; not supported if the arithmetic itself is off."""
    w = worked.set_index("model")
    right = abs(assumed_gb - 21.5) / 21.5 < 0.02
    published = bool((abs(w["formula, all layers full (GB)"] - 21.5) / 21.5 < 0.05).any())
    verdict = "supported" if right and published else "partly supported" if right else "not supported"
    full, slid = "formula, all layers full (GB)", "with sliding windows (GB)"
    g2, g3 = w.loc["Gemma 2 27B"], w.loc["Gemma 3 27B"]
    return Claim(claim="27B model, 32K context: KV cache ~21.5 GB (bf16)", seed_section="seed 2, KV formula",
                 seed_value="21.5 GB", n="- (exact arithmetic)",
                 measured=f"Gemma 2 27B {g2[full]:.1f} GB, Gemma 3 27B {g3[full]:.1f} GB (all-full formula); "
                          f"{g2[slid]:.1f} / {g3[slid]:.1f} GB with sliding windows; the post's assumed 40 x 32 x 128 "
                          f"gives {assumed_gb:.2f} GB (right); 21.5 GB needs L*H_kv*D={needed:,}",
                 setup="fl.kv.budget on published configs, batch 1, bf16", verdict=verdict, claim_id="C58", notebook=NB)


def formula_claim(real: pd.DataFrame) -> Claim:
    """`measure_real` rows: supported iff the formula equals the measured cache bytes on every real cache."""
    exact = bool(real["formula_equals_measured"].all())
    return Claim(claim="KV bytes = 2*b*T*L*H_kv*D*bytes", seed_section="seed 2, KV formula", seed_value="formula",
                 measured=f"equal to the byte on {int(real['formula_equals_measured'].sum())}/{len(real)} real caches "
                          "(sliding layers hold window-1 tokens)",
                 n=f"n={len(real)} ({real['model'].nunique()} models x {real['seq_len'].nunique()} lengths)",
                 setup="CPU fp32 DynamicCache, transformers 5", verdict="supported" if exact else "not supported",
                 claim_id="C57", notebook=NB)


def hybrid_claim(ratio_32k: float, ratio_4k: float) -> Claim:
    """Supported iff a 3:1 linear hybrid's cache is within 3 points of 25% of the dense one at 32K."""
    return Claim(claim="75% non-attention layers cut the KV cache to ~25%", seed_section="seed 2, hybrids",
                 seed_value="~25%",
                 measured=f"{ratio_32k:.1%} at 32K, {ratio_4k:.1%} at 4K (linear-attention state is constant, so short "
                          "contexts pay more)",
                 n="- (exact arithmetic)",
                 setup="Gemma 3 27B geometry, 3:1 linear:full, Qwen3-Next linear state sizes, bf16",
                 verdict="supported" if abs(ratio_32k - 0.25) < 0.03 else "partly supported", claim_id="C67",
                 notebook=NB)


def stitched_fit_claim() -> Claim:
    """Not testable here (no GPU, no 9B weights); the arithmetic of the weights alone is shown."""
    w = {bits: weights_gb(2 * 9e9, bits) for bits in (16, 8, 4)}
    return Claim(claim="stitched 9B+9B fits a 24 GB card at 19.7 GB", seed_section="seed 1", seed_value="19.7 GB",
                 measured=f"weights alone: {w[16]:.0f} GB bf16, {w[8]:.0f} GB int8, {w[4]:.0f} GB int4; 19.7 GB needs "
                          "<= 8-bit weights",
                 n="-", setup="arithmetic; no GPU or 9B weights here", verdict="not testable here", claim_id="C32",
                 notebook=NB)


def prealloc_claim() -> Claim:
    return Claim(claim="pre-allocating the cache lowers peak memory by 3.2 GB", seed_section="seed 1",
                 seed_value="-3.2 GB",
                 measured="needs a GPU allocator; FusionLab pre-allocates the fused slots (one buffer per layer, "
                          "filled once)",
                 n="-", setup="not run", verdict="not testable here", claim_id="C29", notebook=NB)
