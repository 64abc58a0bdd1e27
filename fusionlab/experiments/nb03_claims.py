"""Notebook 03's verdict rule: is attention on instruction keywords 2.3x higher in the stitched model (C35).

The harness that measures is `nb03_keywords`; this module only judges (rules tested on hand-made data).
"""
from __future__ import annotations


import pandas as pd

from ..analysis.stats import interval
from .claim import Claim


def _kinds(summary: pd.DataFrame) -> tuple[pd.DataFrame, pd.DataFrame]:
    """(keyword rows, control rows) of a ratio summary, indexed by setting."""
    return tuple(summary[summary["tokens"] == t].set_index("setting") for t in ("keyword", "control"))  # type: ignore[return-value]


def _reaches_claim(summary: pd.DataFrame) -> list[str]:
    """Settings whose keyword ratio CI reaches 2.3x *and* whose keyword ratio exceeds the control's CI (a rise
    that all prompt tokens share is not attention on keywords)."""
    k, c = _kinds(summary)
    return [s for s in k.index if k.loc[s, "ci_high"] >= 2.3 and k.loc[s, "mean_ratio"] > c.loc[s, "ci_high"]]


def _best(summary: pd.DataFrame, label: str) -> str:
    k, c = _kinds(summary)
    b = k["mean_ratio"].idxmax()
    specific = "" if k.loc[b, "mean_ratio"] > c.loc[b, "ci_high"] else " (not keyword-specific)"
    return (f"{label}, best '{b}': {k.loc[b, 'mean_ratio']:.2f}x "
            f"(95% CI {interval(k.loc[b, 'ci_low'], k.loc[b, 'ci_high'], '.2f')}), control tokens "
            f"{c.loc[b, 'mean_ratio']:.2f}x (CI {interval(c.loc[b, 'ci_low'], c.loc[b, 'ci_high'], '.2f')}){specific}; "
            f"all settings {k['mean_ratio'].min():.2f}-{k['mean_ratio'].max():.2f}x")


def keyword_claim(last: pd.DataFrame, answer: pd.DataFrame | None = None, n_answer: int = 0) -> Claim:
    """The seed-claim row from the ratio summaries (last prompt token; answer tokens when measured).
    Supported iff some setting's keyword CI reaches 2.3x and the rise is keyword-specific (beats the control)."""
    frames = {"last prompt token": last} | ({f"{n_answer} answer tokens": answer} if answer is not None else {})
    specific = {lab: _reaches_claim(f) for lab, f in frames.items()}
    n = int(last[last["tokens"] == "keyword"]["n_prompts"].max())
    return Claim(claim="attention on instruction keywords is 2.3x higher in the stitched model", seed_section="4.2",
                 seed_value="2.3x", measured="; ".join(_best(f, lab) for lab, f in frames.items()), n=f"n={n} prompts",
                 setup="Qwen 0.5B + lstsq slaves (concat, blend), mean over layers/heads",
                 verdict="supported" if any(specific.values()) else "not supported", claim_id="C35",
                 notebook="03_instruction_keyword_attention")
