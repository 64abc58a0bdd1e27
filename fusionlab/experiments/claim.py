"""A seed claim and what we measured for it: the record every experiment's verdict rule returns.

Verdicts come from rules in the experiment modules (tested on hand-made data), never typed in a notebook.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import pandas as pd

from ..errors import FusionLabError
from ..paths import asset

VERDICTS = ("supported", "not supported", "partly supported", "not testable here", "inconclusive", "not measured yet")
"""`not measured yet` is never saved by a notebook: the ledger gives it to a claim no saved result covers yet."""


@dataclass(kw_only=True)
class Claim:
    """One claim from a seed blog post, and what we measured or computed for it (keyword arguments only: eight
    strings in a row are too easy to swap)."""

    claim: str
    seed_section: str
    seed_value: str
    measured: str
    n: str
    """Sample size and interval, e.g. 'n=164, 95% CI [0.31, 0.46]'; '-' for exact arithmetic."""
    setup: str
    verdict: str
    notebook: str
    claim_id: str = ""
    """C01-C73: the claim's id in data/claims.csv (the posts' checkable claims); X01..: FusionLab's own questions."""

    def __post_init__(self) -> None:
        if self.verdict not in VERDICTS:
            raise FusionLabError(f"verdict must be one of {VERDICTS}, got {self.verdict!r}")


LEGACY_IDS = {
    "warm-up cuts fused time-to-first-token": "C45",
    "mismatched layer counts / shapes fail with a size-mismatch error": "C03",
    "models must share a tokenizer": "C07",
    "RoPE must agree between master and slave (for naive post-RoPE injection)": "C10",
    "overwrite the slave's norm weights with the master's": "C12",
    "map slave layer j to master layer 2j (stride 2)": "C43",
    "RoPE mismatch raises QA hallucination": "C11",
    "fused model remembers longer": "C34",
    "attention on instruction keywords is 2.3x higher in the stitched model": "C35",
    "three-model cache bus raises HumanEval pass@1": "C51",
    "the three-model setup needs 22.1 GB": "C52",
}
"""Claims saved before claims had ids (the committed full runs of notebooks 02-04, hours to recompute) take theirs
from their exact claim text; every claim saved since carries its own."""


def claim_ids(path: Path | None = None) -> pd.DataFrame:
    """data/claims.csv: every checkable claim of both posts (id, claim, post value, where, class at import)."""
    return pd.read_csv(path or asset("claims.csv"))


GPU_PREPARED = ("C14", "C15", "C27", "C28", "C29", "C36", "C47", "C50")
"""Claims benchmarks/gpu_claims.py measures on a lent GPU; once its JSON is in benchmarks/results/gpu_claims.json,
experiments/gpu_claims.py's rules give their ledger rows instead of these."""


def unmeasured(seen: set[str], path: Path | None = None) -> list[Claim]:
    """A ledger row for every claim of data/claims.csv that no saved result covers, so the ledger lists all 73 and says
    why each open one is open: class c cannot be tested here (the reason), class b needs a GPU (what to measure on
    one), class a / covered is not measured yet (the planned measurement)."""
    rows = []
    for r in claim_ids(path).to_dict("records"):
        if r["id"] in seen:
            continue
        status = str(r["status_at_import"])
        plan = status.split(":", 1)[1].strip() if ":" in status else ""
        if r["class"] == "c":
            verdict, measured = "not testable here", plan or "cannot be tested with the models and data here"
        elif r["class"] == "b":
            verdict, measured = "not testable here", "needs a GPU" + (f": {plan}" if plan else "")
            if r["id"] in GPU_PREPARED:
                measured += "; prepared: benchmarks/gpu_claims.py (not run yet: no benchmarks/results/gpu_claims.json)"
        else:
            verdict, measured = "not measured yet", f"planned: {plan}" if plan else "planned (data/claims.csv: status_at_import)"
        rows.append(Claim(claim=r["claim"], seed_section=r["where"], seed_value=str(r["post_value"]), measured=measured,
                          n="-", setup="-", verdict=verdict, notebook="-", claim_id=r["id"]))
    return rows
