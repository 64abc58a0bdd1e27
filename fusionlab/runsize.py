"""Run sizes, one definition: QUICK (CI), default (the lab), full (hours on CPU). Same code in every size."""
from __future__ import annotations

import os

SIZES = ("full", "default", "quick")
"""Run sizes, largest first: the ledger and README tables show the largest run available."""


def quick() -> bool:
    """QUICK mode (env FUSIONLAB_QUICK=1; CI): small grids."""
    return os.environ.get("FUSIONLAB_QUICK", "0") == "1"


def full() -> bool:
    """Full mode (env FUSIONLAB_FULL=1 or `lab --full`): the largest grids."""
    return os.environ.get("FUSIONLAB_FULL", "0") == "1" and not quick()


def run_size() -> str:
    return "quick" if quick() else ("full" if full() else "default")
