"""Small shared helpers with no torch or transformers dependency."""
from __future__ import annotations

import hashlib
import os
from pathlib import Path


def sha256_file(path: Path, block: int = 1 << 24) -> str:
    h = hashlib.sha256()
    with Path(path).open("rb") as f:
        while chunk := f.read(block):
            h.update(chunk)
    return h.hexdigest()


def quick() -> bool:
    """QUICK mode (CI): small grids, same code."""
    return os.environ.get("FUSIONLAB_QUICK", "0") == "1"


def full() -> bool:
    """Full mode: the largest grids (hours on CPU)."""
    return os.environ.get("FUSIONLAB_FULL", "0") == "1" and not quick()


def run_size() -> str:
    return "quick" if quick() else ("full" if full() else "default")
