"""Which slave layer feeds which master layer: the strategies from the literature, validated.

A LayerMap is {master_layer: slave_layer}; one slave layer may feed several master layers (interpolate),
each master layer takes at most one slave layer per slave.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import pandas as pd

from ..errors import FusionLabError


def _layers(x: Any) -> int:
    """Layer count of an LM, a ModelSpec, or an int (>= 1)."""
    if isinstance(x, int) and not isinstance(x, bool):
        n = x
    elif hasattr(getattr(x, "spec", x), "layers"):
        n = int(getattr(x, "spec", x).layers)
    else:
        raise FusionLabError(f"a layer count must be an fl.LM, a ModelSpec or an int, got {type(x).__name__} {x!r}.")
    if n < 1:
        raise FusionLabError(f"a model has at least one layer; got a layer count of {n}.")
    return n


@dataclass
class LayerMap:
    pairs: dict[int, int]
    """master layer -> slave layer."""
    strategy: str = "explicit"
    master_layers: int | None = None
    slave_layers: int | None = None
    params: dict[str, Any] = field(default_factory=dict)
    first_slots: dict[int, int] = field(default_factory=dict)
    """master layer -> how many of the slave's first slots it takes (unlisted mapped layers take all). A map that
    feeds only some layers leaves the others' queries without the slave's first position, the attention sink they
    would have had, and the master's own first token, which has read slots at the fed layers, is no sink: keeping
    one slot there (`restrict(..., sink=1)`) gives them the sink back and nothing of the text beyond its first token."""

    def __post_init__(self) -> None:
        if not isinstance(self.pairs, dict):
            raise FusionLabError(f"LayerMap(pairs) needs a dict {{master_layer: slave_layer}}, got "
                                 f"{type(self.pairs).__name__}.")
        for i, j in self.pairs.items():
            for what, x in (("master", i), ("slave", j)):
                if isinstance(x, bool) or not isinstance(x, int) and not (isinstance(x, str) and x.isdigit()):
                    raise FusionLabError(f"layer map entry {i!r}->{j!r}: the {what} layer must be an int, got {x!r}.")
        for name in ("master_layers", "slave_layers"):
            n = getattr(self, name)
            if n is not None and (isinstance(n, bool) or not isinstance(n, int) or n < 1):
                raise FusionLabError(f"LayerMap {name} must be a positive int (or None), got {n!r}.")
        self.pairs = {int(i): int(j) for i, j in sorted(self.pairs.items(), key=lambda kv: int(kv[0]))}
        for i, j in self.pairs.items():
            if i < 0 or j < 0:
                raise FusionLabError(f"layer map entry {i}->{j}: layer indices must be >= 0.")
            if self.master_layers is not None and i >= self.master_layers:
                raise FusionLabError(f"layer map entry {i}->{j}: master layer {i} is out of range "
                                     f"(master has {self.master_layers} layers, 0..{self.master_layers - 1}).")
            if self.slave_layers is not None and j >= self.slave_layers:
                raise FusionLabError(f"layer map entry {i}->{j}: slave layer {j} is out of range "
                                     f"(slave has {self.slave_layers} layers, 0..{self.slave_layers - 1}).")
        self.first_slots = self._checked_first_slots()

    def _checked_first_slots(self) -> dict[int, int]:
        if not isinstance(self.first_slots, dict):
            raise FusionLabError(f"LayerMap(first_slots) needs a dict {{master_layer: n}}, got "
                                 f"{type(self.first_slots).__name__}.")
        out = {}
        for i, n in self.first_slots.items():
            if isinstance(n, bool) or not isinstance(n, int) or n < 1:
                raise FusionLabError(f"first_slots[{i!r}] = {n!r}: a layer takes at least 1 slot (an int); to feed "
                                     "it nothing, leave it out of the layer map.")
            if isinstance(i, bool) or not isinstance(i, int) or i not in self.pairs:
                raise FusionLabError(f"first_slots names master layer {i!r}, which the layer map does not map "
                                     f"(mapped: {sorted(self.pairs)}); map it first.")
            out[int(i)] = n
        return dict(sorted(out.items()))

    # --- strategies -------------------------------------------------------------------------------
    @classmethod
    def identity(cls, master: Any, slave: Any) -> "LayerMap":
        """Layer i -> layer i, for the layers both models have."""
        lm, ls = _layers(master), _layers(slave)
        return cls({i: i for i in range(min(lm, ls))}, "identity", lm, ls)

    @classmethod
    def stride(cls, master: Any, slave: Any, step: int = 2) -> "LayerMap":
        """The blog's mapping: slave layer j -> master layer step*j (while it exists)."""
        if isinstance(step, bool) or not isinstance(step, int) or step < 1:
            raise FusionLabError(f"stride step must be >= 1 (an int), got {step!r}.")
        lm, ls = _layers(master), _layers(slave)
        return cls({step * j: j for j in range(ls) if step * j < lm}, "stride", lm, ls, {"step": step})

    @classmethod
    def proportional(cls, master: Any, slave: Any) -> "LayerMap":
        """KVComm: slave j -> master round((j + .5) L_m / L_s - .5); from the deeper side when L_s > L_m."""
        lm, ls = _layers(master), _layers(slave)
        if ls <= lm:
            pairs = {round((j + 0.5) * lm / ls - 0.5): j for j in range(ls)}
        else:
            pairs = {i: round((i + 0.5) * ls / lm - 0.5) for i in range(lm)}
        return cls(pairs, "proportional", lm, ls)

    @classmethod
    def last_aligned(cls, master: Any, slave: Any) -> "LayerMap":
        """C2C: align the last layers and walk back until one model runs out."""
        lm, ls = _layers(master), _layers(slave)
        return cls({lm - 1 - k: ls - 1 - k for k in range(min(lm, ls))}, "last_aligned", lm, ls)

    @classmethod
    def interpolate(cls, master: Any, slave: Any) -> "LayerMap":
        """The blog's fill-in variant: every master layer gets the proportionally placed slave layer (first to first,
        last to last; a one-layer master takes the slave's first layer)."""
        lm, ls = _layers(master), _layers(slave)
        if lm == 1:
            return cls({0: 0}, "interpolate", lm, ls)
        return cls({i: round(i * (ls - 1) / (lm - 1)) for i in range(lm)}, "interpolate", lm, ls)

    STRATEGIES = ("identity", "stride", "proportional", "last_aligned", "interpolate")

    @classmethod
    def build(cls, strategy: str, master: Any, slave: Any, **kw: Any) -> "LayerMap":
        if strategy not in cls.STRATEGIES:
            raise FusionLabError(f"unknown layer-map strategy {strategy!r}; use one of {cls.STRATEGIES}.")
        extra = set(kw) - ({"step"} if strategy == "stride" else set())
        if extra:
            raise FusionLabError(f"layer-map strategy {strategy!r} takes no {sorted(extra)} (only 'stride' takes step).")
        return getattr(cls, strategy)(master, slave, **kw)

    # --- use ----------------------------------------------------------------------------------------
    def validate_for(self, master: Any, slave: Any) -> "LayerMap":
        """Re-check against real models (a map saved for other models fails here, clearly)."""
        return LayerMap(self.pairs, self.strategy, _layers(master), _layers(slave), self.params, self.first_slots)

    def require_unique_slave_layers(self, why: str) -> None:
        seen: dict[int, int] = {}
        for i, j in self.pairs.items():
            if j in seen:
                raise FusionLabError(f"slave layer {j} feeds master layers {seen[j]} and {i}, not allowed for {why}.")
            seen[j] = i

    def __len__(self) -> int:
        return len(self.pairs)

    def to_dict(self) -> dict[str, Any]:
        d = {"pairs": {str(i): j for i, j in self.pairs.items()}, "strategy": self.strategy,
             "master_layers": self.master_layers, "slave_layers": self.slave_layers, "params": self.params}
        if self.first_slots:  # only where set: a map without them keeps the dict (and the fit keys) it always had
            d["first_slots"] = {str(i): n for i, n in self.first_slots.items()}
        return d

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "LayerMap":
        """The inverse of to_dict(); a dict without 'pairs' ({master: slave}) is refused, naming what it has."""
        if not isinstance(d, dict) or not isinstance(d.get("pairs"), dict):
            keys = sorted(d) if isinstance(d, dict) else type(d).__name__
            raise FusionLabError(f"LayerMap.from_dict needs {{'pairs': {{master: slave}}, ...}} (as to_dict() writes); "
                                 f"got {keys}.")
        return cls(dict(d["pairs"]), d.get("strategy", "explicit"), d.get("master_layers"), d.get("slave_layers"),
                   d.get("params", {}), {int(i): n for i, n in d.get("first_slots", {}).items()})

    def to_frame(self) -> pd.DataFrame:
        return pd.DataFrame({"master_layer": list(self.pairs), "slave_layer": list(self.pairs.values())})

    def grid(self) -> pd.DataFrame:
        """master layer x slave layer, 1 where mapped (for drawing the map)."""
        lm = self.master_layers or (max(self.pairs) + 1 if self.pairs else 0)
        ls = self.slave_layers or (max(self.pairs.values()) + 1 if self.pairs else 0)
        g = pd.DataFrame(0, index=pd.RangeIndex(lm, name="master"), columns=pd.RangeIndex(ls, name="slave"))
        for i, j in self.pairs.items():
            g.loc[i, j] = 1
        return g

    def __repr__(self) -> str:
        body = ", ".join(f"{i}<-{j}" + (f"[:{self.first_slots[i]}]" if i in self.first_slots else "")
                         for i, j in self.pairs.items())
        return f"LayerMap[{self.strategy}, {self.master_layers}x{self.slave_layers}]({body})"

    def _repr_html_(self) -> str:
        return (f"<b>LayerMap</b> {self.strategy} (master {self.master_layers} layers, slave "
                f"{self.slave_layers}): " + self.to_frame().T.to_html(header=False))
