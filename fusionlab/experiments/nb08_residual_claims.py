"""Notebook 08, part 6: C04 'inject only the slave's K/V; its FFN/residual would break the master'.

The alternative the post warns against, built the way the K/V path is: per mapped layer, a ridge map from the slave's
MLP output (aligned to master tokens by characters, as the K/V fit does) to the master's MLP output at that layer,
fitted on the calibration text; at inference the mapped slave MLP output is added to the master's own (a forward
hook on the master's MLP, removed on exit). Held-out NLL, paired per text: master alone, K/V only (lstsq, concat),
K/V + the slave's MLP output, MLP output alone.
"""
from __future__ import annotations

from contextlib import contextmanager
from typing import Any, Iterator

import numpy as np
import torch

from ..analysis.evaluate import token_nll
from ..analysis.stats import bootstrap_ci, interval
from ..engine.arch import decoder_layers
from ..engine.fit import calibration_paragraphs
from ..engine.fuse import fuse
from ..engine.layermap import LayerMap
from ..engine.lm import LM
from ..engine.projector import LstsqProjector
from ..engine.slave import Slave
from ..engine.token_align import align_tokens
from .claim import Claim

NB = "08_remaining_claims"


@torch.inference_mode()
def mlp_outputs(lm: LM, ids: torch.Tensor, layers: list[int]) -> dict[int, torch.Tensor]:
    """Each listed layer's MLP output (T, hidden) for ids (1, T)."""
    out: dict[int, torch.Tensor] = {}
    blocks = decoder_layers(lm.model)
    handles = [blocks[i].mlp.register_forward_hook(lambda m, a, o, i=i: out.__setitem__(i, o[0].float()))
               for i in layers]
    try:
        lm.model(ids)
    finally:
        for h in handles:
            h.remove()
    return out


def _aligned(master: LM, slave: LM, text: str, lmap: LayerMap) -> tuple[Any, dict[int, torch.Tensor], dict]:
    m_ids, s_ids = master.encode(text), slave.encode(text)
    al = align_tokens(master.tokenizer, slave.tokenizer, text, "mean")
    s_out = mlp_outputs(slave, s_ids, sorted(set(lmap.pairs.values())))
    gathered = {j: al.gather(x[None, None])[0, 0] for j, x in s_out.items()}  # (S, hidden_s) per slave layer
    return al, gathered, m_ids


def fit_mlp_map(master: LM, slave: LM, lmap: LayerMap, texts: list[str] | None = None,
                ridge: float = 0.1) -> dict[int, torch.Tensor]:
    """Per master layer i: W (hidden_s + 1, hidden_m), ridge least squares from the slave's MLP output at lmap[i] to
    the master's at i, over the aligned tokens of `texts` (default: the calibration text)."""
    xtx: dict[int, torch.Tensor] = {}
    xty: dict[int, torch.Tensor] = {}
    for text in texts or calibration_paragraphs():
        al, gathered, m_ids = _aligned(master, slave, text, lmap)
        m_out = mlp_outputs(master, m_ids, list(lmap.pairs))
        for i, j in lmap.pairs.items():
            x = torch.cat([gathered[j], torch.ones(len(al.groups), 1)], 1).double()  # (S, F_s + 1)
            y = m_out[i].index_select(0, al.master_index).double()  # (S, F_m)
            xtx[i] = xtx.get(i, 0) + x.T @ x
            xty[i] = xty.get(i, 0) + x.T @ y
    return {i: torch.linalg.solve(a + ridge * a.diagonal().mean() * torch.eye(a.shape[0], dtype=a.dtype),
                                  xty[i]).float() for i, a in xtx.items()}


@contextmanager
def slave_mlp_added(master: LM, slave: LM, lmap: LayerMap, maps: dict[int, torch.Tensor], text: str) -> Iterator[None]:
    """While open, the master's MLP at each mapped layer outputs its own plus the mapped slave MLP output for `text`
    (at the aligned master positions); hooks removed on exit."""
    al, gathered, _ = _aligned(master, slave, text, lmap)
    blocks = decoder_layers(master.model)

    def add(i: int):  # noqa: ANN202
        extra = torch.cat([gathered[lmap.pairs[i]], torch.ones(len(al.groups), 1)], 1) @ maps[i]  # (S, F_m)

        def hook(module, args, output):  # noqa: ANN001
            return output.index_add(1, al.master_index, extra[None].to(output.dtype))
        return hook

    handles = [blocks[i].mlp.register_forward_hook(add(i)) for i in maps]
    try:
        yield
    finally:
        for h in handles:
            h.remove()


def measure_residual_injection(master: LM, slave: LM, proj: LstsqProjector, maps: dict[int, torch.Tensor],
                               texts: list[str], seed: int = 0) -> dict[str, Any]:
    """Held-out NLL per text for the four settings; paired differences with bootstrap CIs."""
    lmap = proj.layer_map
    rows: dict[str, list[float]] = {k: [] for k in ("master alone", "K/V only", "K/V + MLP", "MLP only")}
    with fuse(master, [Slave(slave, layer_map=lmap, projector=proj, align="mean")]) as fused:
        for text in texts:
            ids = master.encode(text)
            rows["master alone"].append(float(token_nll(master, ids).mean()))
            rows["K/V only"].append(float(token_nll(fused, ids).mean()))
            with slave_mlp_added(master, slave, lmap, maps, text):
                rows["K/V + MLP"].append(float(token_nll(fused, ids).mean()))
                rows["MLP only"].append(float(token_nll(master, ids).mean()))
    r = {k: np.array(v) for k, v in rows.items()}
    diff = lambda a, b: (float((r[a] - r[b]).mean()), bootstrap_ci(r[a] - r[b], seed=seed))  # noqa: E731
    return {"n": len(texts), "nll": {k: float(v.mean()) for k, v in r.items()},
            "mlp_vs_kv": diff("K/V + MLP", "K/V only"), "kv_vs_master": diff("K/V only", "master alone"),
            "mlp_only_vs_master": diff("MLP only", "master alone"), "layers": len(maps)}


def residual_verdict(m: dict[str, Any]) -> str:
    """Supported if adding the slave's MLP output raises the NLL over K/V-only injection (paired CI above 0); not
    supported if it lowers it (CI below 0); inconclusive if the CI spans 0 or n < 5."""
    lo, hi = m["mlp_vs_kv"][1]
    if m["n"] < 5 or lo <= 0 <= hi:
        return "inconclusive"
    return "supported" if lo > 0 else "not supported"


def residual_claim(m: dict[str, Any], setup: str) -> Claim:
    n = m["nll"]
    (d, (lo, hi)), (dk, (klo, khi)) = m["mlp_vs_kv"], m["kv_vs_master"]
    return Claim(claim="inject only the slave's K/V; its FFN/residual would break the master", seed_section="A§2.2",
                 seed_value="qualitative",
                 measured=f"held-out NLL: master {n['master alone']:.3f}, K/V only {n['K/V only']:.3f} (Δ {dk:+.3f} "
                          f"{interval(klo, khi, '+.3f')}), K/V + slave MLP output {n['K/V + MLP']:.3f} (Δ vs K/V only {d:+.3f} "
                          f"{interval(lo, hi, '+.3f')}), MLP output alone {n['MLP only']:.3f}",
                 n=f"n={m['n']} held-out texts, paired bootstrap",
                 setup=setup + f"; ridge maps of the MLP output at "
                       f"{m['layers']} mapped layers, fitted on the calibration text",
                 verdict=residual_verdict(m), notebook=NB, claim_id="C04")
