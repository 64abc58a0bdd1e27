"""From a slave's forward to master-frame slots: align tokens, map layers, project, rotate.

    slave tokens -> capture pre-RoPE K,V -> (naive: rotate in slave frame) -> gather onto master positions
    -> project into master geometry -> (correct: rotate with the master's RoPE at those positions)
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from . import checks
from .token_align import STRATEGIES as ALIGN_STRATEGIES
from .token_align import TokenAlignment, align_tokens, identity_alignment
from .arch import rope_cos_sin
from .kv_capture import CapturedKV, capture_kv, post_rope_keys
from ..errors import ContextTooLong, FusionLabError
from .layermap import LayerMap
from .lm import LM
from .projector import Projector, make_projector
from .rope import apply_rope

MODES = ("concat", "replace", "blend")
ROPE = ("master", "slave")


@dataclass
class Slave:
    """One slave model and how it is injected into the master."""

    lm: LM
    layer_map: LayerMap | str | dict[int, int] | None = None
    """A LayerMap, a strategy name, an explicit {master: slave} dict; None = identity if the layer counts
    match, else proportional."""
    projector: str | Projector | None = None
    """'identity' (default), 'heads', a fitted LstsqProjector, or a path to a saved one."""
    mode: str = "concat"
    gate: float | dict[int, float] = 1.0
    """One gate for all mapped layers, or {master_layer: gate}."""
    rope: str = "master"
    """'master': re-rotate keys in the master's frame (correct); 'slave': inject post-RoPE keys (naive)."""
    align: str | None = None
    """Needed when tokenizers differ: 'first' | 'last' | 'mean' over covering slave tokens."""
    window_slots: bool = True
    """On sliding-window master layers, injected slots obey the window too."""

    def resolve(self, master: LM) -> "ResolvedSlave":
        if not isinstance(self.lm, LM):
            raise FusionLabError(f"Slave(lm=...) expects an fl.LM from fl.load(), got {type(self.lm).__name__}.")
        if self.mode not in MODES:
            raise FusionLabError(f"unknown mode {self.mode!r}; use one of {MODES}.")
        if self.rope not in ROPE:
            raise FusionLabError(f"unknown rope {self.rope!r}; use 'master' (re-rotate) or 'slave' (naive).")
        lmap = _layer_map(self.layer_map, master, self.lm)
        same_tok = master.vocab_hash == self.lm.vocab_hash
        if not same_tok and self.align is None:
            raise FusionLabError(f"{master.name} and {self.lm.name} have different tokenizers; pass "
                                 "Slave(..., align='mean') (or 'first' / 'last') to align tokens by characters.")
        if self.align is not None and self.align not in ALIGN_STRATEGIES:
            raise FusionLabError(f"unknown align {self.align!r}; use one of {ALIGN_STRATEGIES} (or None for a slave "
                                 "with the master's tokenizer).")
        checks.flag("window_slots", self.window_slots)
        proj = make_projector(self.projector)
        proj.prepare(master, self.lm, lmap)
        gates = _gates(self.gate, lmap)
        learned = proj.learned_gates()  # a trained fuser carries its own gates: they multiply
        if learned is not None:
            gates = {i: g * learned.get(i, 0.0) for i, g in gates.items()}
        return ResolvedSlave(self, lmap, proj, gates, same_tok)


def _gates(gate: Any, lmap: LayerMap) -> dict[int, float]:
    """One gate for every mapped layer, or {master_layer: gate} (unlisted mapped layers: 0); finite and >= 0."""
    def one(where: str, g: Any) -> float:
        if isinstance(g, bool) or not isinstance(g, (int, float)) or g != g or g in (float("inf"), float("-inf")):
            raise FusionLabError(f"gates must be finite numbers >= 0; {where} is {g!r}.")
        if g < 0:
            raise FusionLabError(f"gates must be >= 0; {where} is {g}.")
        return float(g)

    if isinstance(gate, dict):
        extra = sorted(set(gate) - set(lmap.pairs), key=str)
        if extra:
            raise FusionLabError(f"gates given for layers {extra} that the layer map does not map "
                                 f"(mapped: {sorted(lmap.pairs)}); gate only mapped master layers.")
        return {i: one(f"gate[{i}]", gate.get(i, 0.0)) for i in lmap.pairs}
    g = one("gate", gate)
    return {i: g for i in lmap.pairs}


def _layer_map(spec: Any, master: LM, slave: LM) -> LayerMap:
    if spec is None:
        spec = "identity" if master.spec.layers == slave.spec.layers else "proportional"
    if isinstance(spec, str):
        return LayerMap.build(spec, master, slave)
    if isinstance(spec, dict):
        return LayerMap(spec, "explicit", master.spec.layers, slave.spec.layers)
    if isinstance(spec, LayerMap):
        return spec.validate_for(master, slave)
    raise FusionLabError(f"layer_map must be a LayerMap, a strategy name or a dict, got {type(spec).__name__}.")


@dataclass
class ResolvedSlave:
    slave: Slave
    layer_map: LayerMap
    projector: Projector
    gates: dict[int, float]
    same_tokenizer: bool

    @property
    def lm(self) -> LM:
        return self.slave.lm

    def slave_inputs(self, master: LM, master_ids: torch.Tensor, text: str | None,
                     special_tokens: bool = True) -> tuple[torch.Tensor, TokenAlignment]:
        """The slave's token ids for a text the master reads as `master_ids` (1, T) (with its special tokens, or
        without them when the text continues a sequence), and the alignment onto those master positions."""
        if self.same_tokenizer:
            return master_ids, identity_alignment(master_ids.shape[1], master_ids.device)
        if text is None:
            text = master.tokenizer.decode(master_ids[0], skip_special_tokens=False)
            if master.tokenizer(text, return_tensors="pt")["input_ids"].tolist() != master_ids.cpu().tolist():
                raise FusionLabError("cross-tokenizer fusion needs the prompt text: pass a string, not token ids.")
        al = align_tokens(master.tokenizer, self.lm.tokenizer, text, self.slave.align, special_tokens)
        if al.n_master != master_ids.shape[1]:
            raise FusionLabError(f"the text's {al.n_master} master tokens do not match the {master_ids.shape[1]} ids "
                                 "given; pass the text exactly as the master reads it.")
        ids = self.lm.tokenizer(text, return_tensors="pt")["input_ids"]
        if ids.shape[1] > self.lm.spec.max_positions:
            raise ContextTooLong(f"prompt is {ids.shape[1]} tokens for slave {self.lm.name}, beyond its "
                                 f"max positions {self.lm.spec.max_positions}.")
        return ids, al

    def capture_kv(self, ids: torch.Tensor, cache: Any = None, positions: torch.Tensor | None = None) -> CapturedKV:
        """The slave's pre-RoPE K/V at its mapped layers (incremental with a cache: live timing)."""
        return capture_kv(self.lm, ids, sorted(set(self.layer_map.pairs.values())), positions, cache)

    def to_master(self, master: LM, cap: CapturedKV, al: TokenAlignment, master_layer: int,
                  master_pos: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Slots for one master layer: (1, H_m, S, D_m) keys in the chosen frame, and values."""
        j = self.layer_map.pairs[master_layer]
        k = post_rope_keys(self.lm, cap, j) if self.slave.rope == "slave" else cap.keys[j]
        k, v = al.gather(k), al.gather(cap.values[j])  # (1, H_s, S, D_s)
        k, v = self.projector(master_layer, k, v, positions=master_pos)  # (1, H_m, S, D_m)
        k, v = k.to(master.device, master.dtype), v.to(master.device, master.dtype)
        if self.slave.rope == "master":
            cos, sin = rope_cos_sin(master.model, master_layer, master_pos, k)
            k = apply_rope(k, cos, sin)
        return k, v
