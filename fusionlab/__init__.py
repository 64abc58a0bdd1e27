"""FusionLab: stitch causal LMs at inference time through their KV caches, and measure it honestly."""
from .errors import FusionLabError
from .lm import LM
from .spec import ModelSpec, RopeSpec
from .zoo import load

__version__ = "0.1.0"
from .layermap import LayerMap
from .projector import HeadsProjector, IdentityProjector, LstsqProjector
from .slots import Slave
from .fuse import FusedModel, fuse
from .fit import fit_lstsq
