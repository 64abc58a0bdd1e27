"""Bit-reproducible computation on one machine: a fixed thread count for the duration of a fit or a training run.

torch's CPU kernels (oneDNN / BLAS) split reductions differently for different thread counts, so the same forward pass
in fp32 differs in the last bits between `torch.set_num_threads(1)` and `(2)` (measured here: up to 1.5e-5 on Qwen's
keys). Run-to-run at one thread count it is bit-identical. A fit that must give the same weights whatever the caller's
setting therefore runs with its own fixed count, and restores the caller's afterwards.
"""
from __future__ import annotations

from contextlib import contextmanager
from typing import Iterator

import torch

from ..errors import FusionLabError


@contextmanager
def fixed_threads(n: int | None) -> Iterator[None]:
    """Run the block with `n` intra-op threads (None: leave the current setting alone)."""
    if n is None:
        yield
        return
    if not isinstance(n, int) or isinstance(n, bool) or n < 1:
        raise FusionLabError(f"threads must be a positive int (or None for the current setting), got {n!r}.")
    before = torch.get_num_threads()
    torch.set_num_threads(n)
    try:
        yield
    finally:
        torch.set_num_threads(before)
