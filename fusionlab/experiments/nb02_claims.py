"""Notebook 02's seed-claim rows, computed from the NIAH rates by fixed rules (no judgement in the notebook).

Hallucination (blog: 12% -> 39% at 8K under a RoPE mismatch): supported if some naive-injection variant's Wilson
interval lies above the single model's at the longest shared length; not supported if every naive variant's
interval excludes 39% there; inconclusive otherwise. Rates pooled over all shared lengths are shown beside it, not
judged. Effective length (blog: 9.2K vs 7.1K): inconclusive while both reach the grid's top.
"""
from __future__ import annotations

import pandas as pd

from ..analysis.stats import interval, wilson
from .claim import Claim

NB = "02_rope_mismatch_hallucination"


def _fmt(row: pd.Series) -> str:
    return f"{row['wrong']:.0%} {interval(row['wrong_lo'], row['wrong_hi'], '.0%')}"


def _pooled(rates: pd.DataFrame, settings: list[str]) -> str:
    """Wrong answers summed over the lengths every listed setting shares (the verdict stays at the longest one)."""
    shared = set.intersection(*(set(rates[rates["setting"] == s]["length"]) for s in settings))
    if len(shared) < 2:
        return ""
    counts = {}  # setting -> (wrong, n)
    for s in settings:
        g = rates[(rates["setting"] == s) & rates["length"].isin(shared)]
        counts[s] = int(round((g["wrong"] * g["n"]).sum())), int(g["n"].sum())
    ns = {n for _, n in counts.values()}
    items = [f"{s} {k / n:.0%} {interval(*wilson(k, n), '.0%')}" + ("" if len(ns) == 1 else f" (n={n})")
             for s, (k, n) in counts.items()]
    each = f" (n={ns.pop()} each)" if len(ns) == 1 else ""
    return f"; pooled over {min(shared)}-{max(shared)} tokens{each}: " + ", ".join(items)


def hallucination_claim(rates: pd.DataFrame) -> Claim:
    """rates: `niah_grid.rates(df)`; read at the longest length that the single model and the variants share."""
    variants = [s for s in rates["setting"].unique() if s.endswith("naive") and not s.startswith("+")]
    single = set(rates[rates["setting"] == "single"]["length"])
    # the longest length shared by single and some variant (a short-length sweep must not pull it down)
    L = max(n for n in single if any(((rates["setting"] == s) & (rates["length"] == n)).any() for s in variants))
    at = rates[rates["length"] == L].set_index("setting")
    naive = [s for s in variants if s in at.index]
    shown = ["single"] + [x for s in naive for x in (s, s.replace("naive", "re-rotated")) if x in at.index]
    up = [s for s in naive if at.loc[s, "wrong_lo"] > at.loc["single", "wrong_hi"]]
    below = all(at.loc[s, "wrong_hi"] < 0.39 for s in naive)
    return Claim(claim="RoPE mismatch raises QA hallucination", seed_section="2.3", seed_value="12% -> 39% at 8K",
                 measured=f"at {L} tokens: " + ", ".join(f"{s} {_fmt(at.loc[s])}" for s in shown)
                          + _pooled(rates, shown),
                 n=f"n={int(at.loc['single', 'n'])} per setting (needles x depths)",
                 setup=f"Qwen 0.5B, concat all layers, RoPE-altered self-slave, {L} tokens",
                 verdict="supported" if up else ("not supported" if below else "inconclusive"), claim_id="C11",
                 notebook=NB)


def remembers_longer_claim(rates: pd.DataFrame, eff: pd.DataFrame, lengths: list[int]) -> Claim:
    whole = eff[eff["grid_max"] == max(lengths)] if "grid_max" in eff else eff  # sweep-only settings say nothing here
    e = whole.set_index("setting")["effective_length"]
    top = max(lengths)
    both_top = e["single"] == top and e["fused, matched RoPE"] == top
    verdict = ("inconclusive" if both_top or rates["n"].min() < 10 else
               "supported" if e["fused, matched RoPE"] > e["single"] else "not supported")
    others = ", ".join(f"{k} {v}" for k, v in e.items() if k not in ("single", "fused, matched RoPE"))
    return Claim(claim="fused model remembers longer", seed_section="4.2", seed_value="9.2K vs 7.1K tokens",
                 measured=f"effective length (acc >= 80%): single {e['single']}, fused matched "
                          f"{e['fused, matched RoPE']}, {others}",
                 n=f"grid {lengths}", setup="Qwen 0.5B, NIAH on real prose with distractors", verdict=verdict,
                 claim_id="C34", notebook=NB)


def degradation_claim(rates: pd.DataFrame, run_size: str, notebook: str = "08_remaining_claims") -> Claim:
    """C73 'long-context quality degrades even with KV optimisations', read from notebook 02's saved rates (the plain
    model, no KV optimisation): supported if the single model's accuracy at the longest length lies below the
    shortest's (Wilson intervals apart); otherwise inconclusive while the grid stays inside the model's trained range
    (a flat curve up to 8K says nothing about 32K and beyond)."""
    single = rates[rates["setting"] == "single"].sort_values("length")
    a, z = single.iloc[0], single.iloc[-1]
    drop = z["correct_hi"] < a["correct_lo"]
    curve = ", ".join(f"{int(r['length'])}: {r['correct']:.0%} {interval(r['correct_lo'], r['correct_hi'], '.0%')}"
                      for _, r in single.iterrows())
    return Claim(claim="long-context quality degrades even with KV optimisations", seed_section="B§4.4",
                 seed_value="qualitative",
                 measured=f"Qwen 0.5B alone, NIAH accuracy by length: {curve} (no drop inside the grid; its trained range is 32K)"
                          if not drop else f"Qwen 0.5B alone, NIAH accuracy by length: {curve}",
                 n=f"n={int(a['n'])} per length", setup=f"notebook 02's {run_size} run, read from its saved rates",
                 verdict="supported" if drop else "inconclusive", notebook=notebook, claim_id="C73")
