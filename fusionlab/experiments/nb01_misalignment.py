"""Notebook 01's logic: each misalignment failure reproduced on real models, measured, and fixed.

Every function returns plain data (DataFrames, strings); the notebook only calls and shows them.
"""
from __future__ import annotations

import copy
from typing import Any

import pandas as pd
import torch

from ..analysis.evaluate import nll_table
from ..engine.arch import decoder_layers
from ..engine.fit import fit_lstsq
from ..engine.fuse import fuse
from ..engine.layermap import LayerMap
from ..engine.lm import LM
from ..engine.preflight import check_alignment
from ..engine.slave import Slave
from ..errors import FusionLabError
from ..models.zoo import load


def naive_weight_merge_error(master_name: str, slave: LM) -> str:
    """Load the slave's weights into a fresh copy of the master's architecture: the real error message."""
    target = load(master_name)  # a throwaway copy: load_state_dict copies matching tensors before it raises
    try:
        target.model.load_state_dict(slave.model.state_dict(), strict=False)
    except RuntimeError as e:
        lines = str(e).splitlines()
        return "\n".join(lines[:4] + [f"... ({len(lines) - 1} size mismatches in total)"])
    return "no error (the architectures match)"


def naive_cache_concat_error(master: LM, slave: LM, text: str) -> str:
    """torch.cat of the two models' layer-0 caches: the error a naive stitcher meets first."""
    from transformers import DynamicCache

    caches = []
    for lm in (master, slave):
        c = DynamicCache(config=lm.model.config)
        with torch.no_grad():
            lm.model(lm.encode(text), cache=c, use_cache=True)
        caches.append(c.layers[0].keys)
    try:
        torch.cat(caches, dim=2)
    except RuntimeError as e:
        return f"{e}  (master {tuple(caches[0].shape)}, slave {tuple(caches[1].shape)})"
    return "no error (shapes match)"


def token_ids_table(lms: list[LM], text: str) -> pd.DataFrame:
    return pd.DataFrame({lm.name: [lm.tokenizer(text)["input_ids"][:16]] for lm in lms}, index=[text]).T


@torch.inference_mode()
def wrong_ids_nll(master: LM, foreign: LM, texts: list[str]) -> pd.DataFrame:
    """Master NLL per token on its own ids vs on the foreign tokenizer's ids (what an embedding lookup with
    the wrong ids produces: the model reads a different, meaningless sequence)."""
    import torch.nn.functional as F

    rows = []
    for i, text in enumerate(texts):
        for kind, lm in (("own ids", master), (f"{foreign.name} ids", foreign)):
            ids = lm.encode(text).clamp(max=master.spec.vocab_size - 1).to(master.device)
            logits = master.model(ids).logits[0, :-1].float()
            nll = F.cross_entropy(logits, ids[0, 1:], reduction="none")
            rows.append({"text": i, "ids": kind, "tokens": int(nll.numel()), "nll": float(nll.mean())})
    return pd.DataFrame(rows)


def attention_distortion(master: LM, slave: LM, text: str, rope: str, layers: list[int]) -> pd.DataFrame:
    """Self-fusion with a RoPE-altered copy: per layer, the total-variation distance between the attention a
    query gives the slave's slot copies and the attention it gives the master's own keys (0 = identical)."""
    rows = []

    def rec(layer: int, probs: torch.Tensor, k_pos: torch.Tensor, k_src: torch.Tensor, *_: object) -> None:
        own, slot = probs[0][..., k_src == -1], probs[0][..., k_src == 0]  # (H, Q, T) each, same positions
        own = own / own.sum(-1, keepdim=True)
        slot = slot / slot.sum(-1, keepdim=True).clamp_min(1e-12)
        rows.append({"layer": layer, "rope": rope, "tv_distance": float(0.5 * (own - slot).abs().sum(-1).mean())})

    with fuse(master, [Slave(slave, layer_map="identity", mode="concat", rope=rope)]) as f:
        with f.recording(rec, layers):
            f(text)
    return pd.DataFrame(rows)


def rope_mismatch_nll(master: LM, slave: LM, texts: list[str]) -> pd.DataFrame:
    """NLL on held text: master alone, fused with re-rotated keys, fused with naive post-RoPE keys."""
    with fuse(master, [Slave(slave, layer_map="identity", rope="master")]) as good:
        a = nll_table({"fused, re-rotated": good}, master, texts)
    with fuse(master, [Slave(slave, layer_map="identity", rope="slave")]) as naive:
        b = nll_table({"fused, naive post-RoPE": naive}, master, texts)
    base = nll_table({"master alone": master}, master, texts)
    df = pd.concat([base, a, b], ignore_index=True)
    df["slave"] = slave.name
    return df


@torch.inference_mode()
def norm_overwrite(master: LM, slave: LM, texts: list[str]) -> pd.DataFrame:
    """The blog's recipe: copy the master's norm weights into the slave. Slave NLL before and after."""
    before = nll_table({"slave, own norms": slave}, slave, texts)
    patched = copy.deepcopy(slave)
    try:
        for lm_layer, sl_layer in zip(decoder_layers(master.model), decoder_layers(patched.model)):
            sl_layer.input_layernorm.weight.copy_(lm_layer.input_layernorm.weight)
            sl_layer.post_attention_layernorm.weight.copy_(lm_layer.post_attention_layernorm.weight)
        patched.model.model.norm.weight.copy_(master.model.model.norm.weight)
    except RuntimeError as e:
        raise FusionLabError(f"norm overwrite impossible: {str(e).splitlines()[0]}") from e
    after = nll_table({"slave, master's norms": patched}, slave, texts)
    return pd.concat([before, after], ignore_index=True)


def layer_map_comparison(master: LM, slave: LM, texts: list[str], strategies: dict[str, dict]) -> pd.DataFrame:
    """Per strategy: a projector fitted for that map, its held-out R² (keys, values), and fused NLL."""
    rows = []
    for label, kw in strategies.items():
        lmap = LayerMap.build(kw["strategy"], master, slave, **kw.get("args", {}))
        proj = fit_lstsq(master, slave, lmap)
        r2 = proj.meta["r2"]
        with fuse(master, [Slave(slave, layer_map=lmap, projector=proj, align="mean")]) as f:
            nll = nll_table({label: f}, master, texts)
        rows.append({"strategy": label, "mapped_layers": len(lmap),
                     "r2_keys": sum(x["k"] for x in r2.values()) / len(r2),
                     "r2_values": sum(x["v"] for x in r2.values()) / len(r2),
                     "nll": float(nll["nll"].mean()), "nll_per_text": nll["nll"].tolist()})
    return pd.DataFrame(rows)


def alignment_matrix(lms: list[LM]) -> pd.DataFrame:
    """Adapters needed for every ordered pair (master row, slave column)."""
    out: dict[str, dict[str, Any]] = {}
    for m in lms:
        out[m.name] = {}
        for s in lms:
            rep = check_alignment(m, s)
            out[m.name][s.name] = "OK" if not rep.adapters else ", ".join(a.split(" (")[0] for a in rep.adapters)
    return pd.DataFrame(out).T


