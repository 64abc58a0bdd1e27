"""A learned fuser: a small trainable map of a slave's K/V into the master's geometry that starts equal to the master.

Per mapped master layer, the slave's pre-RoPE K (and V) go through the fitted `lstsq` map z = lstsq(x) (frozen: the
warm start, in the master's geometry), then a trainable residual r = B·act(A·z/σ) (rank-`width` linear, or a GELU
FFN of hidden `width`) whose output layer B starts at zero, scaled per KV head (C2C's per-head weights):

    blend    the master's own K/V at that position += r                     (C2C's residual; r = 0 at the start)
    concat   slots: keys s * (z + r), values z + r, with a gate g >= 0 per layer, starting at 0 (g = 0 hides the
             slots exactly), and a key scale s per layer, starting at 0 (flat slots: lstsq keys can score tens of
             nats above the master's own, and then any opening of the gate floods the attention; its gradient at
             g = 0 overflowed float32 in the first offload run)

Either way the fused model starts *equal to the master*, so training moves it away only if the loss says so. (A concat
gate at exactly 0 gets a gradient, but the projection does not until the gate opens: if opening hurts at first
order, it stays closed. Blend has no such trap: B learns from the first step.)

Controls share the architecture (`input`): 'shuffled' (the trainer pairs the master's text with another text's slave
K/V), 'noise' (fresh Gaussian noise with the slave's per-feature mean and std instead of its K/V), 'constant' (no slave
at all: a learned table of K/V offsets indexed by position mod P, P set to match a fuser's parameter count).
Saved as safetensors with both models' fingerprints, the layer map, the config and the training manifest.
"""
from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import save_file
from torch import nn

from ..engine import checks
from ..engine.layermap import LayerMap
from ..engine.projector import LstsqProjector, Projector, read_safetensors, register_loader
from ..errors import FusionLabError

MODES, KINDS, INPUTS = ("blend", "concat"), ("linear", "mlp"), ("slave", "shuffled", "noise", "constant")
OPENINGS = ("zero", "log")
"""How a concat fuser's gate g and key scale s are parametrised (see `FuserConfig.opening`)."""


@dataclass(frozen=True)
class FuserConfig:
    mode: str = "blend"
    kind: str = "linear"
    width: int = 32
    """Rank of the linear residual, or hidden width of the FFN."""
    input: str = "slave"
    table: int = 0
    """input='constant': positions in the learned table (0: chosen by `match_table`); with `constant_term`, the
    positions of the fuser's own slave-free table."""
    constant_term: bool = False
    """A slave-fed fuser with a learned slave-free term too (a table of K/V offsets by position mod `table`, added
    to the slave-dependent residual, starting at 0): the adapter the constant control learns, inside the fuser, so
    that fuser against the constant control isolates what the slave adds rather than what any adapter buys."""
    per_head: bool = True
    seed: int = 0
    dropout: float = 0.0
    """Dropout on the residual's input while training (a regulariser; inference never drops)."""
    opening: str = "zero"
    """concat only. 'zero': g >= 0 and s start at exactly 0, so the start *is* the master; but s gets no gradient
    until g opens, and g opens only if flat slots help at first order (notebook 07's offload fusers ended at
    g <= 0.06, |s| <= 0.07: slots that cannot carry content). 'log': g = exp(a), s = s0 * exp(b), a starting at
    `log_gate`, b at 0, s0 calibrated per layer so the slots' keys have the RMS of the master's own keys on the
    training contexts (an exact copy's slots then score like the master's own keys). Adam moves a and b by about lr
    per step whatever the gradient's size, so both learn from step one; the start is *not* the master: its distance
    is the first validation pass's gain, reported."""
    log_gate: float = -2.0
    """opening='log': the gate's start, log g (-2: g = 0.14; 0: the warm start's slots at full weight)."""
    calibrate_keys: bool = True
    """opening='log': s0 from the master's key RMS (True), or 1 (False: the warm start's keys as they are; a
    sibling's identity warm start at log_gate=0 then *is* its training-free channel, exactly)."""

    def __post_init__(self) -> None:
        for name, value, allowed in (("mode", self.mode, MODES), ("kind", self.kind, KINDS),
                                     ("input", self.input, INPUTS)):
            if value not in allowed:
                raise FusionLabError(f"FuserConfig {name}={value!r}; use one of {allowed}.")
        if not isinstance(self.width, int) or self.width < 1:
            raise FusionLabError(f"FuserConfig width must be a positive int, got {self.width!r}.")
        checks.integer("FuserConfig table", self.table, 0)
        checks.flag("FuserConfig constant_term", self.constant_term)
        if self.constant_term and (self.input == "constant" or self.table < 1):
            raise FusionLabError(f"FuserConfig constant_term=True needs a slave-fed input (got {self.input!r}) and "
                                 f"table >= 1 positions (got {self.table}); e.g. table=64.")
        checks.flag("FuserConfig per_head", self.per_head)
        checks.integer("FuserConfig seed", self.seed, 0)
        checks.number("FuserConfig dropout", self.dropout, 0, 0.9)
        checks.choice("FuserConfig opening", self.opening, OPENINGS)
        checks.number("FuserConfig log_gate", self.log_gate, -20.0, 5.0)
        checks.flag("FuserConfig calibrate_keys", self.calibrate_keys)
        if self.opening == "log" and self.mode != "concat":
            raise FusionLabError("FuserConfig opening='log' parametrises a concat gate; blend has none: use "
                                 "mode='concat' or opening='zero'.")


class Residual(nn.Module):
    """z (..., F) -> B act(A z): zero at the start (B = 0)."""

    def __init__(self, features: int, width: int, kind: str, generator: torch.Generator, dropout: float = 0.0):
        super().__init__()
        self.a = nn.Parameter(torch.randn(features, width, generator=generator) / features ** 0.5)
        self.b = nn.Parameter(torch.zeros(width, features))
        self.act = nn.GELU() if kind == "mlp" else nn.Identity()
        self.drop = nn.Dropout(dropout)

    def forward(self, z: torch.Tensor) -> torch.Tensor:
        return self.act(self.drop(z) @ self.a) @ self.b


class LearnedFuser(nn.Module, Projector):
    kind = "learned"

    def __init__(self, base: LstsqProjector, config: FuserConfig):
        super().__init__()
        self.config, self.meta = config, {k: v for k, v in base.meta.items() if k != "r2"}
        self.layers = sorted(int(i) for i in base.meta["layer_map"]["pairs"])
        h, d = base.meta["master"]["kv_heads"], base.meta["master"]["head_dim"]
        self.heads, self.head_dim, feats = h, d, h * d
        g = torch.Generator().manual_seed(config.seed)
        for i in self.layers:  # frozen warm start, rounded to fp16 so the saved file reproduces it exactly
            for kind in "kv":
                self.register_buffer(f"base_{kind}{i}", base.weights[f"{kind}.{i}"].half().float())
                self.register_buffer(f"scale_{kind}{i}", torch.ones(feats))
                self.register_buffer(f"noise_mu_{kind}{i}", torch.zeros(base.weights[f"{kind}.{i}"].shape[0] - 1))
                self.register_buffer(f"noise_sd_{kind}{i}", torch.ones(base.weights[f"{kind}.{i}"].shape[0] - 1))
        n = len(self.layers)
        if config.input == "constant" or config.constant_term:
            p = config.table or 1
            self.table_k = nn.Parameter(torch.zeros(n, p, h, d))
            self.table_v = nn.Parameter(torch.zeros(n, p, h, d))
        if config.input != "constant":
            self.res = nn.ModuleDict({f"{kind}{i}": Residual(feats, config.width, config.kind, g, config.dropout)
                                      for i in self.layers for kind in "kv"})
        self.head_w = nn.Parameter(torch.ones(n, 2, h), requires_grad=config.per_head and config.input != "constant")
        log = config.opening == "log"
        self.gate = nn.Parameter(torch.full((n,), config.log_gate) if log else torch.zeros(n),
                                 requires_grad=config.mode == "concat")
        if config.mode == "concat":
            self.key_scale = nn.Parameter(torch.zeros(n))  # 'log': b in s = s0 * exp(b)
            if log:  # s0, set by the training loop's calibration ('zero' files have none: fingerprints unchanged)
                self.register_buffer("key_scale0", torch.ones(n))
        self._noise = torch.Generator().manual_seed(config.seed + 1)
        self.eval()  # inference mode by default (no dropout); the training loop switches it while it steps

    # --- use as a projector ----------------------------------------------------------------------------------
    @property
    def layer_map(self) -> LayerMap:
        return LayerMap.from_dict(self.meta["layer_map"])

    def prepare(self, master: Any, slave: Any, layer_map: LayerMap) -> None:
        LstsqProjector.prepare(self, master, slave, layer_map)  # same fingerprint and layer-map checks

    def learned_gates(self) -> dict[int, float]:
        """The engine's gate per layer: the learned g (concat), or 1 (blend: the residual carries its own scale)."""
        if self.config.mode == "blend":
            return {i: 1.0 for i in self.layers}
        return {i: float(self.gate_tensor(i).detach()) for i in self.layers}

    def key_scale_mean(self) -> float:
        """The layer-mean key scale s (concat; NaN for blend): with the gate, what shows an offload fuser opening."""
        if self.config.mode != "concat":
            return float("nan")
        return float(torch.stack([self.key_scale_tensor(li) for li in range(len(self.layers))]).mean().detach())

    def gate_tensor(self, layer: int) -> torch.Tensor:
        """The gate g of one master layer (differentiable): a clamped g ('zero') or exp(a) ('log'); 1 for blend."""
        if self.config.mode != "concat":
            return torch.ones((), device=self.gate.device)
        a = self.gate[self.layers.index(layer)]
        return a.exp() if self.config.opening == "log" else a.clamp(min=0)

    def key_scale_tensor(self, li: int) -> torch.Tensor:
        """The key scale s of the li-th mapped layer: b ('zero') or s0 * exp(b) ('log')."""
        b = self.key_scale[li]
        return self.key_scale0[li] * b.exp() if self.config.opening == "log" else b

    def clamp_gates_(self) -> None:
        if self.config.opening == "zero":
            with torch.no_grad():
                self.gate.clamp_(min=0)

    def _flat(self, w: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
        b, h, t, d = x.shape
        return x.transpose(1, 2).reshape(b, t, h * d) @ w[:-1].to(x.dtype) + w[-1].to(x.dtype)  # (B, T, F_m)

    def forward(self, master_layer: int, k: torch.Tensor, v: torch.Tensor,
                positions: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        li, b, t = self.layers.index(master_layer), k.shape[0], k.shape[2]
        out = []
        for j, (kind, x) in enumerate((("k", k), ("v", v))):
            if self.config.input == "constant":
                r = self._table_term(li, kind, positions, b)
                z = torch.zeros_like(r)
            else:
                if self.config.input == "noise":
                    mu, sd = getattr(self, f"noise_mu_{kind}{master_layer}"), getattr(self, f"noise_sd_{kind}{master_layer}")
                    e = torch.randn(b, t, mu.numel(), generator=self._noise).to(x.device, x.dtype)
                    x = (mu + sd * e).view(b, t, x.shape[1], x.shape[3]).transpose(1, 2)
                z = self._flat(getattr(self, f"base_{kind}{master_layer}"), x)  # (B, T, F_m)
                r = self.res[f"{kind}{master_layer}"](z / getattr(self, f"scale_{kind}{master_layer}"))
                z, r = (y.view(b, t, self.heads, self.head_dim) for y in (z, r))
                if self.config.constant_term:
                    r = r + self._table_term(li, kind, positions, b)
            r = r * self.head_w[li, j][None, None, :, None]
            y = r if self.config.mode == "blend" else z + r
            if self.config.mode == "concat" and kind == "k":
                y = self.key_scale_tensor(li) * y
            out.append(y.transpose(1, 2))  # (B, H_m, T, D_m)
        return out[0], out[1]

    def _table_term(self, li: int, kind: str, positions: torch.Tensor | None, b: int) -> torch.Tensor:
        """The slave-free learned offsets at the slots' master positions, (B, T, H, D)."""
        if positions is None:
            raise FusionLabError("a fuser with a constant table needs the slots' master positions.")
        table = self.table_k if kind == "k" else self.table_v
        return table[li, positions.to(table.device) % table.shape[1]].unsqueeze(0).expand(b, -1, -1, -1)

    def describe(self) -> str:
        c = self.config
        what = "constant slots" if c.input == "constant" else f"{c.kind} width {c.width}"
        return f"learned fuser ({c.mode}, {what}, input {c.input}, {self.param_count():,} trainable)"

    def param_count(self) -> int:
        return sum(p.numel() for p in self.parameters() if p.requires_grad)

    # --- files ------------------------------------------------------------------------------------------------
    def save(self, path: str | Path, training: dict[str, Any] | None = None) -> Path:
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        meta = {**self.meta, "kind": "learned", "config": asdict(self.config),
                "training": training or self.meta.get("training", {})}
        tmp = path.with_suffix(".partial")
        save_file({k: t.detach().contiguous() for k, t in self.state_dict().items()}, str(tmp),
                  metadata={"fusionlab": json.dumps(meta)})
        tmp.replace(path)
        return path

    @classmethod
    def load(cls, path: str | Path) -> "LearnedFuser":
        meta, tensors = read_safetensors(path)
        if meta.get("kind") != "learned":
            raise FusionLabError(f"{path} is not a learned fuser (kind {meta.get('kind')!r}); load it with "
                                 "fl.LstsqProjector.load, or retrain with train_fuser.")
        pairs = meta["layer_map"]["pairs"]
        base = LstsqProjector({f"{kind}.{i}": tensors[f"base_{kind}{i}"] for i in pairs for kind in "kv"}, meta)
        cfg = FuserConfig(**meta["config"])
        fuser = cls(base, cfg)
        try:
            fuser.load_state_dict(tensors)
        except RuntimeError as e:
            raise FusionLabError(f"{path} does not match its own config ({str(e).splitlines()[0]}); the file is "
                                 "damaged: retrain with train_fuser.") from e
        fuser.meta = {k: v for k, v in meta.items() if k not in ("kind", "config")}
        return fuser


def match_table(fuser_params: int, layers: int, heads: int, head_dim: int) -> int:
    """Table positions P for a constant-slot control with the parameter count of a fuser (2 tables of P·H·D per layer)."""
    return max(1, round(fuser_params / (2 * layers * heads * head_dim)))


register_loader("learned", LearnedFuser.load)
"""Import-time side effect (README, "Global state"): saved fusers load through `make_projector` by kind."""
