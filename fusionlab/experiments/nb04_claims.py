"""Notebook 04's verdict rules: does the three-model cache bus raise HumanEval pass@1 (C51), and what it costs in memory (C52).

The harness that measures is `nb04_cache_bus`; this module only judges (rules tested on hand-made data).
"""
from __future__ import annotations

import pandas as pd

from ..analysis.stats import interval
from .claim import Claim

NB = "04_three_model_cache_bus"


# --- claims -------------------------------------------------------------------------------------------------
def humaneval_claim(table: pd.DataFrame, pairs: pd.DataFrame, kinds: pd.DataFrame, n_tasks: int, label: str = "",
                    setup: str = "Qwen 0.5B master, SmolLM2 + Gemma 270M slaves, lstsq, concat, greedy",
                    notebook: str = NB) -> Claim:
    """`humaneval.pass_at_1` / `paired` / `failure_kinds` tables; the bus is the last setting. Supported iff the bus
    beats the master with McNemar p < 0.05; not supported iff it is significantly worse, or no better on >= 100
    problems; inconclusive otherwise."""
    t = table.set_index("setting")
    bus = t.index[-1]
    fmt = lambda s: f"{t.loc[s, 'pass@1']:.0%} {interval(t.loc[s, 'ci_low'], t.loc[s, 'ci_high'], '.0%')}"  # noqa: E731
    p = pairs.set_index("setting").loc[bus, "p_value"]
    diff = t.loc[bus, "pass@1"] - t.loc["master alone", "pass@1"]
    better, worse = diff > 0 and p < 0.05, diff < 0 and p < 0.05
    return Claim(claim="three-model cache bus raises HumanEval pass@1" + label, seed_section="last section",
                 seed_value="42% -> 58%",
                 measured=f"master {fmt('master alone')}; {bus} {fmt(bus)}; McNemar p={p:.2g}; "
                          + ", ".join(f"{s} {fmt(s)}" for s in t.index if s not in ("master alone", bus))
                          + f"; syntax errors: master {kinds.loc['master alone', 'syntax error']}, "
                          f"{bus} {kinds.loc[bus, 'syntax error']} of {n_tasks}",
                 n=f"n={int(t.loc['master alone', 'n'])} problems", setup=setup,
                 verdict="supported" if better else ("not supported" if worse or n_tasks >= 100 else "inconclusive"),
                 claim_id="C51", notebook=notebook)


def bus_memory_claim(peak_gb: float, slot_bytes: int, batch: int | None = None) -> Claim:
    """Not testable here: the blog's 22.1 GB is for its 7B-class models on a GPU; we report our bus's figures."""
    probe = f", generating a batch of {batch}" if batch else ""
    return Claim(claim="the three-model setup needs 22.1 GB", seed_section="last section", seed_value="22.1 GB",
                 measured=f"not our models; our bus: peak RSS {peak_gb:.1f} GB (fp32 CPU{probe}), slots "
                          f"{slot_bytes / 2**20:.2f} MiB on a short prompt",
                 n="-", setup="needs the blog's 7B-class models and a GPU", verdict="not testable here", claim_id="C52",
                 notebook=NB)
