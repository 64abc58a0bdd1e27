"""FusionLab: stitch causal LMs at inference time through their KV caches, and measure it honestly.

Layers (imports run one way, enforced by tests/test_layers.py):
    errors, paths, files, cells, runsize   foundation: no torch, no other fusionlab module above them
    engine/        the fusion itself: models as fl.LM, capture, layer maps, projectors, attention, fuse
    models/        where models come from: embedded wheels, tiny test models, RoPE variants
    analysis/      measuring tools: attention capture and views, KV budget, NLL, statistics, widgets
    experiments/   each notebook's logic and its claims' verdict rules
    lab/           results on disk, README tables, figures, notebook runner, CLI
"""
import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")  # no model hub at run time; set HF_HUB_OFFLINE=0 to allow it

from ._version import __version__
from .errors import ContextTooLong, FusionLabError
from .analysis import evaluate, kv, stats
from .analysis.attention_capture import capture_attention
from .engine import fit
from .engine.fit import fit_lstsq
from .engine.fuse import FusedModel, fuse
from .engine.layermap import LayerMap
from .engine.lm import LM
from .engine.preflight import AlignmentReport, check_alignment
from .engine.projector import HeadsProjector, IdentityProjector, LstsqProjector
from .engine.slave import Slave
from .engine.spec import ModelSpec, RopeSpec
from .training import FuserConfig, LearnedFuser, TrainChunk, TrainConfig, TrainResult, train_fuser
from . import models
from .models.zoo import load, short_name
from .lab import results, viz
from .lab import ray_cells  # registers the 'ray' back end of run_cells; Ray itself is imported only on use

__all__ = ["AlignmentReport", "ContextTooLong", "FuserConfig", "FusionLabError", "FusedModel", "HeadsProjector",
           "IdentityProjector", "LM", "LayerMap", "LearnedFuser", "LstsqProjector", "ModelSpec", "RopeSpec", "Slave",
           "TrainChunk", "TrainConfig", "TrainResult", "__version__", "capture_attention", "check_alignment",
           "evaluate", "fit", "fit_lstsq", "fuse", "kv", "load", "models", "ray_cells", "results", "short_name",
           "stats", "train_fuser", "viz"]
