"""The transfer map's ladder (built on notebook 06's offload grid): siblings of the master from an exact copy
outwards, each with its divergence from the master, as offload slaves beside their own ceilings.

The rungs are recipes for `fusionlab.models.siblings` (foreign families are appended by the caller); the rules that
judge each rung and where the ladder breaks are `nb06_claims.rung_verdict` / `ladder_verdict`.
"""
from __future__ import annotations

import pandas as pd

from ..analysis.divergence import divergence
from ..engine.layermap import LayerMap
from ..engine.lm import LM
from ..engine.projector import IdentityProjector
from ..models.siblings import sibling, sibling_layer_map
from . import nb06_offload as off

LADDER = ("noise:0", "noise:0.003", "noise:0.01", "noise:0.03", "noise:0.1", "int8", "int4", "prune:4")
"""Default rungs, nearest first: noise:0 is the exact copy (the positive control every null needs)."""


def measure_divergence(master: LM, recipes: list[str] | tuple[str, ...], texts: list[str],
                       lstsq: bool = True) -> pd.DataFrame:
    """One row per rung: next-token KL(master ‖ sibling) with its bootstrap-over-texts CI, layer-mean K/V R²."""
    rows = []
    for recipe in recipes:
        sib = sibling(master, recipe)
        rows.append({"recipe": recipe, **divergence(master, sib, texts, sibling_layer_map(master, sib), lstsq).row()})
        del sib  # one sibling in memory at a time: the next deepcopy would otherwise sit beside this one
    return pd.DataFrame(rows)


def ladder_settings(master: LM, recipes: list[str] | tuple[str, ...]) -> tuple[list[off.Setting], dict[str, LM]]:
    """Offload settings for every rung through the identity projector (same geometry), with each rung's ceiling and
    different-document control; the floor and skyline come once. Returns the settings and the siblings built."""
    sibs = {recipe: sibling(master, recipe) for recipe in recipes}
    maps: dict[str, LayerMap] = {r: sibling_layer_map(master, s) for r, s in sibs.items()}
    grid = off.settings(master, {r: (s, IdentityProjector()) for r, s in sibs.items()}, bus=False, self_copy=False,
                        ceilings=True, layer_maps=maps)
    return grid, sibs
