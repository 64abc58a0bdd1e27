"""FusionLab: stitch causal LMs at inference time through their KV caches, and measure it honestly."""
import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")  # no model hub at run time; set HF_HUB_OFFLINE=0 to allow it
__version__ = "0.1.0"

from . import results, stats, viz
from .errors import FusionLabError
from . import evaluate, fit, kv, models
from .alignment import AlignmentReport, check_alignment
from .attention_capture import capture_attention
from .fit import fit_lstsq
from .fuse import FusedModel, fuse
from .layermap import LayerMap
from .lm import LM
from .projector import HeadsProjector, IdentityProjector, LstsqProjector
from .slots import Slave
from .spec import ModelSpec, RopeSpec
from .zoo import load

__all__ = ["AlignmentReport", "FusionLabError", "FusedModel", "HeadsProjector", "IdentityProjector", "LM",
           "LayerMap", "LstsqProjector", "ModelSpec", "RopeSpec", "Slave", "capture_attention", "check_alignment",
           "evaluate", "fit", "fit_lstsq", "fuse", "kv", "load", "models", "results", "stats", "viz"]
