"""FusionLab: stitch causal LMs at inference time through their KV caches, and measure it honestly."""
__version__ = "0.1.0"

from . import results, stats, viz
from .errors import FusionLabError
from .fit import fit_lstsq
from .fuse import FusedModel, fuse
from .layermap import LayerMap
from .lm import LM
from .projector import HeadsProjector, IdentityProjector, LstsqProjector
from .slots import Slave
from .spec import ModelSpec, RopeSpec
from .zoo import load

__all__ = ["FusionLabError", "FusedModel", "HeadsProjector", "IdentityProjector", "LM", "LayerMap",
           "LstsqProjector", "ModelSpec", "RopeSpec", "Slave", "fit_lstsq", "fuse", "load", "results",
           "stats", "viz"]
