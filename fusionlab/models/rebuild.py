"""Make an LM again from the recipe it recorded (`LM.rebuild_recipe`): how a Ray worker gets the models of a grid
without receiving their weights. Three kinds: {"load": fl.load's arguments}, {"sibling": {"master": <recipe>,
"recipe": "noise:0.01"}} and {"rope_variant": its arguments}; each is rebuilt exactly as the driver built it (seeded,
cached)."""
from __future__ import annotations

from typing import Any

from ..engine.lm import LM
from ..errors import FusionLabError
from .siblings import sibling
from .variants import rope_variant
from .zoo import load

KINDS = ("load", "sibling", "rope_variant")


def rebuild(how: dict[str, Any]) -> LM:
    if not isinstance(how, dict) or len(how) != 1 or next(iter(how)) not in KINDS:
        raise FusionLabError(f"a rebuild recipe is one {{kind: arguments}} with kind in {KINDS}, got {how!r}.")
    kind, args = next(iter(how.items()))
    if kind == "load":
        return load(**args)
    if kind == "rope_variant":
        return rope_variant(**args)
    return sibling(rebuild(args["master"]), args["recipe"])
