"""Errors of the training loop, apart so that both the loop and `train_fuser` can raise them."""
from __future__ import annotations

from ..errors import FusionLabError


class TrainingDiverged(FusionLabError):
    """The loss (or the gradient norm) became non-finite, or the loss grew past the divergence bound; the last good
    checkpoint is kept."""
