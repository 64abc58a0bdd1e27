"""Notebook 01's verdict rules: what each misalignment does to a fused model (C03, C07, C10, C12, C43).

The harness that measures is `nb01_misalignment`; this module only judges (rules tested on hand-made data).
"""
from __future__ import annotations

from typing import Any

import numpy as np
import pandas as pd

from ..analysis.stats import bootstrap_ci, interval
from .claim import Claim

# --- claims: each rule reads the tables above (tested on hand-made frames) -------------------------------
NB = "01_misalignment_failures"


def _ci(x: Any) -> str:
    lo, hi = bootstrap_ci(list(x))
    return f"95% CI {interval(lo, hi, '.2f')}"


def size_mismatch_claim(merge_error: str) -> Claim:
    """Supported iff loading the slave's weights into the master's architecture raised a size mismatch."""
    first = next((ln.strip() for ln in merge_error.splitlines() if "size mismatch" in ln), merge_error.splitlines()[0])
    return Claim(claim="mismatched layer counts / shapes fail with a size-mismatch error", seed_section="5.1",
                 seed_value="size mismatch error", measured=first[:110] + " ...",
                 n="reproduced on Qwen <- SmolLM2 weights", setup="load_state_dict(strict=False) into a fresh Qwen",
                 verdict="supported" if "size mismatch" in first else "not supported", claim_id="C03", notebook=NB)


def tokenizer_claim(wrong: pd.DataFrame) -> Claim:
    """`wrong_ids_nll` rows: supported iff the NLL rise on foreign ids has a bootstrap CI above 0."""
    own = wrong[wrong["ids"] == "own ids"]["nll"].values
    bad = wrong[wrong["ids"] != "own ids"]["nll"].values
    gap = bad - own
    return Claim(claim="models must share a tokenizer", seed_section="2", seed_value="required",
                 measured=f"Qwen NLL {own.mean():.2f} on its own ids vs {bad.mean():.2f} on SmolLM2's ids "
                          f"(+{gap.mean():.2f}, {_ci(gap)}); (id-level mixing; FusionLab aligns by characters instead)",
                 n=f"n={len(own)} texts", setup="Qwen 0.5B fp32, held-out text",
                 verdict="supported" if bootstrap_ci(gap)[0] > 0 else "inconclusive", claim_id="C07", notebook=NB)


def rope_claim(rope_nll: pd.DataFrame) -> Claim:
    """`rope_mismatch_nll` rows: supported iff naive keys raise NLL (CI > 0) and re-rotated keys stay below that."""
    by = rope_nll.pivot_table(index=["slave", "text"], columns="setting", values="nll")
    naive = (by["fused, naive post-RoPE"] - by["master alone"]).values
    fixed = (by["fused, re-rotated"] - by["master alone"]).values
    ok = bootstrap_ci(naive)[0] > 0 and bootstrap_ci(fixed)[1] < bootstrap_ci(naive)[0]
    return Claim(claim="RoPE must agree between master and slave (for naive post-RoPE injection)", seed_section="2",
                 seed_value="required",
                 measured=f"naive post-RoPE keys: NLL +{naive.mean():.2f} ({_ci(naive)}); "
                          f"re-rotated: {fixed.mean():+.2f} ({_ci(fixed)})",
                 n=f"n={len(naive)} (variant x text)", setup="Qwen + RoPE-altered Qwen, concat all layers",
                 verdict="supported" if ok else "inconclusive", claim_id="C10", notebook=NB)


def norm_claim(real_pair: str, norm: pd.DataFrame) -> Claim:
    """`norm_overwrite` rows (tiny pair): not supported if the slave's NLL rises (CI > 0), supported if it falls."""
    d = norm.pivot_table(index="text", columns="setting", values="nll")
    delta = (d["slave, master's norms"] - d["slave, own norms"]).values
    lo, hi = bootstrap_ci(delta)
    return Claim(claim="overwrite the slave's norm weights with the master's", seed_section="2",
                 seed_value="fixes norm mismatch",
                 measured=f"real pair: impossible ({real_pair[:60]}...); tiny pair: slave NLL {delta.mean():+.2f} "
                          f"({_ci(delta)})",
                 n=f"n={len(delta)} texts (tiny models, random weights)", setup="tiny-qwen2 norms into tiny-phi3",
                 verdict="not supported" if lo > 0 else "supported" if hi < 0 else "inconclusive", claim_id="C12",
                 notebook=NB)


def stride_claim(maps: pd.DataFrame, master_nll: list[float]) -> Claim:
    """`layer_map_comparison` rows (with `nll_per_text`) and the master alone's NLL per text. The post's map is worth
    using only if the fused model is no worse than the master alone: supported iff stride 2 gives the lowest fused
    NLL of the maps *and* its paired CI against the master alone reaches 0 or below; not supported if it raises
    the master's NLL (CI above 0) or another map is better; inconclusive otherwise."""
    best = maps.loc[maps["nll"].idxmin(), "strategy"]
    stride = maps.set_index("strategy").loc["stride 2 (blog)"]
    gap = np.asarray(stride["nll_per_text"]) - np.asarray(master_nll)
    lo, hi = bootstrap_ci(gap)
    verdict = ("not supported" if lo > 0 or not best.startswith("stride") else
               "supported" if lo <= 0 else "inconclusive")
    return Claim(claim="map slave layer j to master layer 2j (stride 2)", seed_section="5.1",
                 seed_value="stride-2 mapping",
                 measured=f"NLL stride-2 {stride['nll']:.2f} vs master alone {np.mean(master_nll):.2f} "
                          f"(+{gap.mean():.2f}, {_ci(gap)}); best map {best} {maps['nll'].min():.2f}; "
                          f"R² keys {stride['r2_keys']:.2f}",
                 n=f"n={len(gap)} texts", setup="Qwen <- SmolLM2, lstsq per map, concat", verdict=verdict,
                 claim_id="C43", notebook=NB)
