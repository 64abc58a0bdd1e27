"""Siblings of a model, made here from its weights: the rungs of the transfer map between an exact copy and a foreign
family (notebook 10).

A sibling is named by a recipe string, and the recipe alone (with the master's weights) decides its weights:

    noise:0.01          Gaussian noise on every parameter, std = 0.01 x that tensor's RMS (seed 0)
    noise:0.01,seed=3   the same at another seed
    int8                the decoder's linear weights fake-quantised to int8, one symmetric scale per output channel
    int4                ... to int4, one symmetric scale per group of 32 input weights (int4:g64 for groups of 64)
    prune:6             6 decoder layers removed, evenly spaced, first and last kept
    finetune:english:200
                        the master fine-tuned for 200 steps on one domain's training documents (DroidSpeak's
                        setting); made by `fusionlab.experiments.nb10_finetune` (it owns the data split) and read
                        back from the cache here: a recipe whose weights are not made yet is a clear error

Quantisation touches the decoder's linear weights only (embeddings, norms and the head stay as they are), as the
weight-only schemes people run (GPTQ, AWQ, bitsandbytes) do. A pruned sibling keeps `extra["kept_layers"]`: slave
layer j is master layer kept[j], which `sibling_layer_map` turns into the layer map that feeds each slave layer to its
own master layer.

Why no disk cache: a recipe is regenerated in seconds (one seeded draw per tensor, independent of iteration order),
which is no slower than reading a multi-GB copy back. The fingerprint is derived from the master's fingerprint, the
canonical recipe and the torch version (the seeded draws are bit-stable within one torch version), so cell caches and
saved projectors key on exactly these weights without hashing them.
"""
from __future__ import annotations

import copy
import hashlib
import json
import math
from dataclasses import dataclass
from pathlib import Path

import torch
from safetensors.torch import load_file

from ..engine.layermap import LayerMap
from ..engine.lm import LM
from ..errors import FusionLabError
from ..paths import cache_dir

KINDS = ("noise", "int8", "int4", "prune", "finetune")
FINETUNE_DOMAINS = ("code", "english", "chinese")
INT4_GROUP = 32


@dataclass(frozen=True)
class Recipe:
    """A parsed recipe; `str(recipe)` is its canonical spelling (the one in names and fingerprints)."""

    kind: str
    scale: float = 0.0
    """noise: the std as a fraction of each tensor's RMS."""
    seed: int = 0
    group: int = INT4_GROUP
    """int4: input weights per scale."""
    drop: int = 0
    """prune: how many decoder layers to remove."""
    domain: str = ""
    """finetune: the domain of the training documents."""
    steps: int = 0
    """finetune: optimiser steps."""

    def __str__(self) -> str:
        if self.kind == "noise":
            return f"noise:{self.scale:g}" + (f",seed={self.seed}" if self.seed else "")
        if self.kind == "int4":
            return "int4" if self.group == INT4_GROUP else f"int4:g{self.group}"
        if self.kind == "prune":
            return f"prune:{self.drop}"
        if self.kind == "finetune":
            return f"finetune:{self.domain}:{self.steps}"
        return self.kind


def _bad(recipe: str, why: str) -> FusionLabError:
    return FusionLabError(f"sibling recipe {recipe!r}: {why}. Recipes: 'noise:0.01' (optionally ',seed=N'), 'int8', "
                          "'int4' or 'int4:gN', 'prune:K' (K layers removed), 'finetune:DOMAIN:STEPS' (DOMAIN one of "
                          f"{FINETUNE_DOMAINS}, STEPS >= 1).")


def parse_recipe(recipe: str) -> Recipe:
    """The recipe string as a Recipe; one FusionLabError naming the recipe and the fix for anything else."""
    if not isinstance(recipe, str) or not recipe.strip():
        raise _bad(recipe, "a recipe is a non-empty string")
    kind, _, rest = recipe.strip().partition(":")
    if kind not in KINDS:
        raise _bad(recipe, f"unknown kind {kind!r} (one of {KINDS})")
    if kind == "int8":
        if rest:
            raise _bad(recipe, "int8 takes no argument")
        return Recipe("int8")
    if kind == "int4":
        if not rest:
            return Recipe("int4")
        if not rest.startswith("g") or not rest[1:].isdigit() or int(rest[1:]) < 1:
            raise _bad(recipe, f"the int4 group must be written gN with N >= 1, got {rest!r}")
        return Recipe("int4", group=int(rest[1:]))
    if kind == "prune":
        if not rest.isdigit() or int(rest) < 1:
            raise _bad(recipe, f"prune needs a layer count >= 1, got {rest!r}")
        return Recipe("prune", drop=int(rest))
    if kind == "finetune":
        domain, _, steps = rest.partition(":")
        if domain not in FINETUNE_DOMAINS:
            raise _bad(recipe, f"the fine-tuning domain must be one of {FINETUNE_DOMAINS}, got {domain!r}")
        if not steps.isdigit() or int(steps) < 1:
            raise _bad(recipe, f"a fine-tune needs a step count >= 1, got {steps!r}")
        return Recipe("finetune", domain=domain, steps=int(steps))
    scale_text, _, seed_text = rest.partition(",")
    try:
        scale = float(scale_text)
    except ValueError:
        raise _bad(recipe, f"the noise scale must be a number, got {scale_text!r}") from None
    if not math.isfinite(scale) or scale < 0:
        raise _bad(recipe, f"the noise scale must be finite and >= 0, got {scale_text!r}")
    seed = 0
    if seed_text:
        key, _, value = seed_text.partition("=")
        if key.strip() != "seed" or not value.strip().isdigit():
            raise _bad(recipe, f"after the scale only ',seed=N' (N >= 0) may follow, got {seed_text!r}")
        seed = int(value)
    return Recipe("noise", scale=scale, seed=seed)


def _tensor_seed(seed: int, name: str) -> int:
    """One generator seed per (recipe seed, parameter name): the draw does not depend on iteration order."""
    return int.from_bytes(hashlib.sha256(f"{seed}|{name}".encode()).digest()[:8], "little")


@torch.no_grad()
def add_noise(model: torch.nn.Module, scale: float, seed: int) -> None:
    """In place: every parameter += N(0, (scale * RMS(parameter))²), drawn in fp32 from a per-tensor generator.
    Relative by design (a norm's gain near 1 and a projection near 0.02 drift alike), so an all-zero tensor stays 0."""
    for name, p in model.named_parameters():  # tied weights appear once
        gen = torch.Generator().manual_seed(_tensor_seed(seed, name))
        rms = p.detach().float().pow(2).mean().sqrt()
        noise = torch.randn(p.shape, generator=gen, dtype=torch.float32)  # same draw on any device
        p.add_((noise * (scale * rms)).to(p.dtype).to(p.device))


def fake_quantise(weight: torch.Tensor, bits: int, group: int | None) -> torch.Tensor:
    """Symmetric round-to-nearest: one scale per output row (group None) or per `group` consecutive inputs."""
    levels = 2 ** (bits - 1) - 1  # 127 for int8, 7 for int4
    out_dim, in_dim = weight.shape  # (O, I)
    g = in_dim if group is None else group
    w = weight.float().reshape(out_dim, in_dim // g, g)  # (O, I/g, g)
    scale = w.abs().amax(-1, keepdim=True).clamp_min(torch.finfo(torch.float32).tiny) / levels  # (O, I/g, 1)
    q = (w / scale).round().clamp(-levels, levels) * scale
    return q.reshape(out_dim, in_dim).to(weight.dtype)


@torch.no_grad()
def quantise_linears(model: torch.nn.Module, bits: int, group: int | None, recipe: str) -> None:
    """In place, the decoder's nn.Linear weights (not embeddings, norms or the head)."""
    for name, module in model.model.layers.named_modules():
        if isinstance(module, torch.nn.Linear):
            if group is not None and module.in_features % group:
                raise _bad(recipe, f"layer {name} has {module.in_features} inputs, not a multiple of the group "
                                   f"{group}; pick a group that divides it")
            module.weight.copy_(fake_quantise(module.weight, bits, group))


def kept_layers(n_layers: int, drop: int, recipe: str) -> list[int]:
    """Master layers a prune:drop sibling keeps: `drop` removed, evenly spaced strictly inside (first, last)."""
    if drop > n_layers - 2:
        raise _bad(recipe, f"the model has {n_layers} layers and pruning keeps the first and the last, so at most "
                           f"{max(n_layers - 2, 0)} can go")
    inner = list(range(1, n_layers - 1))
    gone = {inner[int((k + 0.5) * len(inner) / drop)] for k in range(drop)}
    return [i for i in range(n_layers) if i not in gone]


def prune_layers(model: torch.nn.Module, keep: list[int]) -> None:
    """In place: the decoder keeps only `keep` (renumbered 0..len-1 for the cache), config updated to match."""
    layers = model.model.layers
    model.model.layers = torch.nn.ModuleList([layers[i] for i in keep])
    for j, layer in enumerate(model.model.layers):
        layer.self_attn.layer_idx = j
    cfg = model.config
    if getattr(cfg, "layer_types", None):
        cfg.layer_types = [cfg.layer_types[i] for i in keep]
    cfg.num_hidden_layers = len(keep)


def finetuned_path(master: LM, recipe: str | Recipe) -> Path:
    """Where a fine-tuned sibling's trained weights live (the decoder's tensors; a `.json` manifest beside them)."""
    spec = recipe if isinstance(recipe, Recipe) else parse_recipe(recipe)
    return cache_dir() / "siblings" / f"{master.fingerprint[:16]}__{str(spec).replace(':', '-')}.safetensors"


def load_finetuned(model: torch.nn.Module, master: LM, spec: Recipe) -> dict:
    """In place: the fine-tuned tensors over the master's copy; returns the run's manifest (data, steps, hash)."""
    path = finetuned_path(master, spec)
    if not path.exists() or not path.with_suffix(".json").exists():
        raise FusionLabError(f"sibling recipe {str(spec)!r}: its weights are not made yet ({path}); make them with "
                             f"`python -m fusionlab.experiments.nb10_finetune {spec}` (notebook 10 does it too).")
    state = load_file(path)
    missing = set(state) - set(model.state_dict())
    if missing:
        raise FusionLabError(f"{path} holds tensors this model lacks ({sorted(missing)[:3]}...): it was made for "
                             "another architecture; delete it and make it again.")
    model.load_state_dict(state, strict=False)
    return json.loads(path.with_suffix(".json").read_text())


def sibling(master: LM, recipe: str) -> LM:
    """A new LM: `master`'s weights changed by `recipe` (the master is left untouched)."""
    if not isinstance(master, LM):
        raise FusionLabError(f"sibling(master, recipe) needs an fl.LM (from fl.load), got {type(master).__name__}.")
    spec = parse_recipe(recipe)
    model = copy.deepcopy(master.model)
    extra: dict = {"recipe": str(spec), "master": master.name, "master_fingerprint": master.fingerprint}
    if spec.kind == "noise":
        add_noise(model, spec.scale, spec.seed)
    elif spec.kind in ("int8", "int4"):
        quantise_linears(model, 8 if spec.kind == "int8" else 4, None if spec.kind == "int8" else spec.group, recipe)
    elif spec.kind == "finetune":
        extra["finetune"] = load_finetuned(model, master, spec)
    else:
        keep = kept_layers(master.spec.layers, spec.drop, recipe)
        prune_layers(model, keep)
        extra["kept_layers"] = keep
    model.eval()
    made = extra.get("finetune", {}).get("weights_sha256", "")  # a fine-tune's weights also depend on its data
    derived = hashlib.sha256(f"{master.fingerprint}|{spec}|torch {torch.__version__}{made}".encode()).hexdigest()
    lm = LM(model, master.tokenizer, f"{master.name} ~ {spec}", source=master.source, source_sha256=derived,
            extra=extra)
    parent = master.rebuild_recipe()
    if parent is not None:
        lm.remember_rebuild({"sibling": {"master": parent, "recipe": recipe}})
    return lm


def sibling_layer_map(master: LM, slave: LM) -> LayerMap:
    """Each slave layer feeds the master layer it came from (a pruned sibling's `kept_layers`; else identity)."""
    keep = slave.extra.get("kept_layers", list(range(slave.spec.layers)))
    return LayerMap({m: j for j, m in enumerate(keep)}, "sibling", master.spec.layers, slave.spec.layers)
