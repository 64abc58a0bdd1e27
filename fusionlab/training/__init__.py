"""Learned fusers, trained between two frozen models: beside the engine, not inside it.

The engine knows nothing about training. This package plugs in through two small, documented hooks:

- `FusedModel.attention_overrides({layer: fn})` (engine/fuse.py): inside the block, a layer's attention is `fn`
  (here `train_attention`, the inference rules as differentiable math); removed on exit;
- `projector.register_loader("learned", LearnedFuser.load)` (at import of fuser.py): `fl.load_projector` reads a
  saved fuser through the engine's kind -> loader table.

    fuser.py      LearnedFuser, FuserConfig, match_table (the constant control's size)
    attention.py  TrainSlots, train_attention, fused_logits (the training forward)
    chunks.py     TrainChunk, prepare (capture once), slots_of, loss_of
    loop.py       the optimisation loop: AdamW, clipping, budgets, checkpoints, resume, TrainingDiverged
    train.py      train_fuser, TrainConfig, TrainResult
"""
from __future__ import annotations

from .chunks import TrainChunk
from .fuser import FuserConfig, LearnedFuser
from .loop import TrainingDiverged
from .train import TrainConfig, TrainResult, train_fuser

__all__ = ["FuserConfig", "LearnedFuser", "TrainChunk", "TrainConfig", "TrainResult", "TrainingDiverged",
           "train_fuser"]
