"""Projectors: slave K/V geometry (H_s, D_s) -> master geometry (H_m, D_m), per mapped master layer.

identity: shapes must match. heads: same head_dim, repeat or average KV heads. lstsq: a training-free
ridge regression per mapped layer from slave pre-RoPE K (and V) to master pre-RoPE K (and V), fitted on
calibration text through both models (`fit_lstsq`, in fit.py), saved with the pair's fingerprints.
"""
from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import torch
from safetensors import SafetensorError, safe_open
from safetensors.torch import load_file, save_file

from ..errors import FusionLabError
from .layermap import LayerMap
from .spec import ModelSpec


def _geometry(s: ModelSpec) -> str:
    return f"(H_kv={s.kv_heads}, head_dim={s.head_dim})"


class Projector:
    kind = "base"

    def prepare(self, master: Any, slave: Any, layer_map: LayerMap) -> None:
        """Raise a clear error if this projector cannot serve this (master, slave, map)."""

    def __call__(self, master_layer: int, k: torch.Tensor, v: torch.Tensor,
                 positions: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """Slave K/V (B, H_s, S, D_s) at master `positions` (S,) -> master geometry (B, H_m, S, D_m)."""
        raise NotImplementedError

    def describe(self) -> str:
        return self.kind

    def learned_gates(self) -> dict[int, float] | None:
        """Per-layer gates the projector carries (a trained fuser's: fusionlab.training); they multiply the Slave's
        gates. None: it carries none."""
        return None

    def fingerprint(self) -> str:
        """What identifies this projector's function (for cache keys): its kind, plus its weights where it has any."""
        h = hashlib.sha256(self.kind.encode())
        state = self.state_dict() if hasattr(self, "state_dict") else getattr(self, "weights", {})
        for name in sorted(state):
            h.update(name.encode())
            h.update(state[name].detach().float().cpu().numpy().tobytes())
        return h.hexdigest()


class IdentityProjector(Projector):
    kind = "identity"

    def prepare(self, master, slave, layer_map) -> None:
        m, s = master.spec, slave.spec
        if (m.kv_heads, m.head_dim) != (s.kv_heads, s.head_dim):
            fix = "projector='heads'" if m.head_dim == s.head_dim and _heads_compatible(m, s) else "fl.fit_lstsq(...)"
            raise FusionLabError(f"identity projector cannot map slave {slave.name} {_geometry(s)} to master "
                                 f"{master.name} {_geometry(m)}; use {fix}.")

    def __call__(self, master_layer, k, v, positions=None):
        return k, v


def _heads_compatible(m: ModelSpec, s: ModelSpec) -> bool:
    return m.kv_heads % s.kv_heads == 0 or s.kv_heads % m.kv_heads == 0


@dataclass
class HeadsProjector(Projector):
    """Same head_dim, different KV-head count: repeat slave heads, or average groups of them."""

    kind = "heads"
    h_master: int = 0
    h_slave: int = 0

    def prepare(self, master, slave, layer_map) -> None:
        m, s = master.spec, slave.spec
        if m.head_dim != s.head_dim or not _heads_compatible(m, s):
            raise FusionLabError(f"heads projector needs equal head_dim and KV-head counts that divide each other; "
                                 f"slave {slave.name} {_geometry(s)} vs master {master.name} {_geometry(m)}: "
                                 "use fl.fit_lstsq(...).")
        self.h_master, self.h_slave = m.kv_heads, s.kv_heads

    def _map(self, x: torch.Tensor) -> torch.Tensor:  # (B, H_s, T, D) -> (B, H_m, T, D)
        if self.h_master >= self.h_slave:
            return x.repeat_interleave(self.h_master // self.h_slave, dim=1)
        b, _, t, d = x.shape
        return x.view(b, self.h_master, self.h_slave // self.h_master, t, d).mean(dim=2)

    def __call__(self, master_layer, k, v, positions=None):
        return self._map(k), self._map(v)


@dataclass
class LstsqProjector(Projector):
    """Per master layer: X (T, H_s D_s) [1] @ W -> (T, H_m D_m), for keys and values separately."""

    kind = "lstsq"
    weights: dict[str, torch.Tensor] = field(default_factory=dict)
    """'k.{layer}' / 'v.{layer}' -> (F_s + 1, F_m), last row the bias."""
    meta: dict[str, Any] = field(default_factory=dict)
    """master/slave name + fingerprint + geometry, layer_map, ridge, n_tokens, r2 per layer."""

    def prepare(self, master, slave, layer_map) -> None:
        want = (self.meta["master"]["fingerprint"], self.meta["slave"]["fingerprint"])
        if (master.fingerprint, slave.fingerprint) != want:
            raise FusionLabError(
                f"this projector was fitted for master {self.meta['master']['name']} + slave "
                f"{self.meta['slave']['name']}, not for master {master.name} + slave {slave.name} "
                "(weights fingerprints differ); fit one for this pair with fl.fit_lstsq(master, slave, ...).")
        fitted = {int(i): j for i, j in self.meta["layer_map"]["pairs"].items()}
        missing = {i: j for i, j in layer_map.pairs.items() if fitted.get(i) != j}
        if missing:
            raise FusionLabError(f"projector has no fit for layer-map entries {missing} (it was fitted for "
                                 f"{fitted}); use the projector's layer map: projector.layer_map.")

    @property
    def layer_map(self) -> LayerMap:
        return LayerMap.from_dict(self.meta["layer_map"])

    def _apply(self, w: torch.Tensor, x: torch.Tensor, h_out: int, d_out: int) -> torch.Tensor:
        b, h, t, d = x.shape
        flat = x.transpose(1, 2).reshape(b, t, h * d)  # (B, T, F_s)
        w = w.to(device=x.device, dtype=x.dtype)
        y = flat @ w[:-1] + w[-1]  # (B, T, F_m)
        return y.view(b, t, h_out, d_out).transpose(1, 2)  # (B, H_m, T, D_m)

    def __call__(self, master_layer, k, v, positions=None):
        h, d = self.meta["master"]["kv_heads"], self.meta["master"]["head_dim"]
        return (self._apply(self.weights[f"k.{master_layer}"], k, h, d),
                self._apply(self.weights[f"v.{master_layer}"], v, h, d))

    def describe(self) -> str:
        r2 = self.meta.get("r2", {})
        if not r2:
            return "lstsq"
        mean = lambda key: sum(x[key] for x in r2.values()) / len(r2)  # noqa: E731
        return f"lstsq (held-out R² keys {mean('k'):.2f}, values {mean('v'):.2f})"

    def save(self, path: str | Path) -> Path:
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        save_file({k: w.contiguous().float() for k, w in self.weights.items()}, str(path),
                  metadata={"fusionlab": json.dumps(self.meta)})
        return path

    @classmethod
    def load(cls, path: str | Path) -> "LstsqProjector":
        meta, weights = read_safetensors(path)
        if meta.get("kind", "lstsq") != "lstsq" or "layer_map" not in meta:
            raise FusionLabError(f"{path} is not an lstsq projector (kind {meta.get('kind')!r}); use "
                                 "LearnedFuser.load for a trained fuser, or refit with fl.fit_lstsq.")
        return cls(weights=weights, meta=meta)


def make_projector(p: str | Projector | None) -> Projector:
    if p is None or p == "identity":
        return IdentityProjector()
    if p == "heads":
        return HeadsProjector()
    if isinstance(p, Projector):
        return p
    if isinstance(p, (str, Path)) and Path(p).exists():
        kind = read_safetensors(p)[0].get("kind", "lstsq")
        if kind not in LOADERS:
            raise FusionLabError(f"{p} holds a projector of kind {kind!r}, which no loaded module can read (known: "
                                 f"{sorted(LOADERS)}); import the module that defines it (fusionlab does at import).")
        return LOADERS[kind](p)
    raise FusionLabError(f"unknown projector {p!r}; use 'identity', 'heads', a fitted LstsqProjector, "
                         "or the path of a saved one.")


LOADERS: dict[str, Callable[[str | Path], Projector]] = {"lstsq": LstsqProjector.load}
"""Saved-projector kind (the file's metadata "kind") -> its loader. A module defining a new kind registers it
(`fusionlab/training/fuser.py` adds "learned" at import), so this file needs to know nothing about training."""


def register_loader(kind: str, load: Callable[[str | Path], Projector]) -> None:
    LOADERS[kind] = load


def read_safetensors(path: str | Path) -> tuple[dict[str, Any], dict[str, torch.Tensor]]:
    """(FusionLab metadata, tensors) of a projector or fuser file; a clear error for anything else."""
    path = Path(path)
    if not path.is_file():
        raise FusionLabError(f"no projector or fuser file at {path}.")
    try:
        with safe_open(str(path), framework="pt") as f:
            raw = (f.metadata() or {}).get("fusionlab")
        tensors = load_file(str(path))
    except (SafetensorError, OSError, ValueError) as e:
        raise FusionLabError(f"{path} is not a readable safetensors file ({e.__class__.__name__}): it is truncated "
                             "or not a FusionLab file. Refit (fl.fit_lstsq) or retrain (train_fuser), then save.") from e
    if raw is None:
        raise FusionLabError(f"{path} has no FusionLab metadata: it was not written by FusionLab.")
    return json.loads(raw), tensors
