"""A seed claim and what we measured for it: the record every experiment's verdict rule returns.

Verdicts come from rules in the experiment modules (tested on hand-made data), never typed in a notebook.
"""
from __future__ import annotations

from dataclasses import dataclass

from ..errors import FusionLabError

VERDICTS = ("supported", "not supported", "partly supported", "not testable here", "inconclusive")


@dataclass
class Claim:
    """One claim from a seed blog post, and what we measured or computed for it."""

    claim: str
    seed_section: str
    seed_value: str
    measured: str
    n: str
    """Sample size and interval, e.g. 'n=164, 95% CI [0.31, 0.46]'; '-' for exact arithmetic."""
    setup: str
    verdict: str
    notebook: str

    def __post_init__(self) -> None:
        if self.verdict not in VERDICTS:
            raise FusionLabError(f"verdict must be one of {VERDICTS}, got {self.verdict!r}")
