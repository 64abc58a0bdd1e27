"""Fit an `lstsq` projector: ridge regression per mapped layer, slave pre-RoPE K/V -> master pre-RoPE K/V.

Training-free (closed form): the same calibration text goes through both models, tokens are paired by
character offsets, and X^T X / X^T Y are accumulated in float64, so memory stays flat in the text length.
Held-out paragraphs give R² per layer, reported with the projector.

Bit-reproducible: the whole fit (both models' forward passes, the accumulation, the solve) runs with a fixed thread
count (`threads=1` by default, see determinism.py), so the same models and text give torch.equal weights whatever
`torch.set_num_threads` the caller uses.
"""
from __future__ import annotations

import hashlib
import json
import os
import time
from pathlib import Path

import torch
from tqdm.auto import tqdm

from ..errors import FusionLabError
from ..paths import asset, cache_dir
from . import checks
from .determinism import fixed_threads
from .kv_capture import capture_kv
from .layermap import LayerMap
from .lm import LM
from .projector import IdentityProjector, LstsqProjector
from .token_align import STRATEGIES, align_tokens, identity_alignment


def calibration_paragraphs(folder: Path | None = None) -> list[str]:
    """Our own calibration text (English, Chinese, code), one paragraph / code block per item."""
    folder = folder or asset("calibration")
    paras = []
    for f in sorted(folder.glob("*.txt")):
        paras += [p.strip() for p in f.read_text(encoding="utf-8").split("\n\n" if f.stem == "code" else "\n") if p.strip()]
    if not paras:
        raise FusionLabError(f"no calibration text found in {folder}.")
    return paras


def _pairs(master: LM, slave: LM, text: str, lmap: LayerMap, align: str):
    """Per mapped master layer: (X (S, F_s), Y (S, F_m)) for keys and for values."""
    m_ids, s_ids = master.encode(text), slave.encode(text)
    same = master.vocab_hash == slave.vocab_hash
    al = identity_alignment(m_ids.shape[1]) if same else align_tokens(master.tokenizer, slave.tokenizer, text, align)
    mc = capture_kv(master, m_ids, list(lmap.pairs))
    sc = capture_kv(slave, s_ids, sorted(set(lmap.pairs.values())))
    idx = al.master_index.to(master.device)
    flat = lambda x: x[0].transpose(0, 1).reshape(x.shape[2], -1).double().cpu()  # noqa: E731  (S, H*D)
    out = {}
    for i, j in lmap.pairs.items():
        out[i] = {kind: (flat(al.gather(getattr(sc, attr)[j].float())),
                         flat(getattr(mc, attr)[i].float().index_select(2, idx)))
                  for kind, attr in (("k", "keys"), ("v", "values"))}
    return out


FIT_VERSION = 1
"""Part of every saved fit's key: bump it when the fit's arithmetic changes, so older saved fits are never reused."""


def fit_lstsq(master: LM, slave: LM, layer_map: LayerMap | str | None = None, texts: list[str] | None = None,
              align: str = "mean", ridge: float = 1e-1, holdout_every: int = 5, threads: int | None = 1,
              cache: bool | None = None) -> LstsqProjector:
    """Closed-form ridge fit per mapped layer; every `holdout_every`-th paragraph is held out for R².
    `threads`: the fixed thread count that makes the fit bit-reproducible (None: the caller's setting, faster on many
    cores but reproducible only at that same count).
    `cache`: at a fixed thread count the fit is bit-reproducible, so a fit of the same inputs (both models' weights,
    layer map, texts, settings, torch and transformers versions) is saved once under cache_dir()/projectors and
    reloaded, equal to the bit, instead of recomputed. None (default): cache fits on the calibration text (texts=None,
    the expensive case every notebook repeats); True / False: always / never."""
    for role, x in (("master", master), ("slave", slave)):
        if not isinstance(x, LM):
            raise FusionLabError(f"fit_lstsq needs two fl.LM (from fl.load); the {role} is a {type(x).__name__}.")
    checks.number("ridge", ridge, 0.0)
    checks.integer("holdout_every", holdout_every, 0)
    checks.choice("align", align, STRATEGIES)
    if texts is not None:
        if isinstance(texts, str) or not isinstance(texts, (list, tuple)) or not texts:
            raise FusionLabError("texts must be a non-empty list of strings (calibration paragraphs).")
        for i, t in enumerate(texts):
            checks.text(f"texts[{i}]", t)
    if cache is not None and not isinstance(cache, bool):
        raise FusionLabError(f"cache must be True, False or None (cache fits on the calibration text), got {cache!r}.")
    lmap = (LayerMap.build(layer_map or "proportional", master, slave) if not isinstance(layer_map, LayerMap)
            else layer_map.validate_for(master, slave))
    use_cache = (texts is None if cache is None else cache) and threads is not None
    texts = list(texts or calibration_paragraphs())
    path = saved_fit_path(master, slave, lmap, texts, align, ridge, holdout_every, threads) if use_cache else None
    if path is not None and path.exists():
        try:
            return LstsqProjector.load(path)
        except FusionLabError:
            path.unlink(missing_ok=True)  # a damaged saved fit is refitted below (and saved again)
    with fixed_threads(threads):
        proj = _fit(master, slave, lmap, texts, align, ridge, holdout_every)
    proj.meta["threads"] = threads
    if path is not None:  # written whole, then renamed: a concurrent reader sees no file or all of it
        tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
        os.replace(proj.save(tmp), path)
    return proj


def saved_fit_path(master: LM, slave: LM, lmap: LayerMap, texts: list[str], align: str, ridge: float,
                   holdout_every: int, threads: int | None) -> Path:
    """Where the fit of exactly these inputs is saved: a hash of everything the fit's bits depend on."""
    import transformers

    key = {"v": FIT_VERSION, "master": master.fingerprint, "slave": slave.fingerprint, "map": lmap.to_dict(),
           "texts": hashlib.sha256("\x00".join(texts).encode()).hexdigest(), "align": align, "ridge": ridge,
           "holdout_every": holdout_every, "threads": threads, "torch": torch.__version__,
           "transformers": transformers.__version__, "dtypes": [str(master.dtype), str(slave.dtype)]}
    digest = hashlib.sha256(json.dumps(key, sort_keys=True, default=str).encode()).hexdigest()[:24]
    return cache_dir() / "projectors" / f"{slave.name}__to__{master.name}.{digest}.safetensors"


def _fit(master: LM, slave: LM, lmap: LayerMap, texts: list[str], align: str, ridge: float,
         holdout_every: int) -> LstsqProjector:
    held = [t for n, t in enumerate(texts) if holdout_every and n % holdout_every == holdout_every - 1]
    train = [t for t in texts if t not in held] or texts
    t0 = time.perf_counter()
    xtx, xty, n_tok = {}, {}, 0
    for text in tqdm(train, desc=f"fit {slave.name}->{master.name}", leave=False):
        for i, kinds in _pairs(master, slave, text, lmap, align).items():
            for kind, (x, y) in kinds.items():
                x = torch.cat([x, torch.ones(x.shape[0], 1, dtype=x.dtype)], 1)  # bias column
                key = f"{kind}.{i}"
                xtx[key] = xtx.get(key, 0) + x.T @ x
                xty[key] = xty.get(key, 0) + x.T @ y
            n_tok += x.shape[0] if kinds else 0
    n_tok //= max(len(lmap), 1)
    weights = {}
    for key, a in xtx.items():
        lam = ridge * a.diagonal().mean()
        weights[key] = torch.linalg.solve(a + lam * torch.eye(a.shape[0], dtype=a.dtype), xty[key]).float()
    proj = LstsqProjector(weights, {
        "master": {"name": master.name, "fingerprint": master.fingerprint, "kv_heads": master.spec.kv_heads,
                   "head_dim": master.spec.head_dim},
        "slave": {"name": slave.name, "fingerprint": slave.fingerprint, "kv_heads": slave.spec.kv_heads,
                  "head_dim": slave.spec.head_dim},
        "layer_map": lmap.to_dict(), "ridge": ridge, "align": align, "n_tokens": n_tok,
        "fit_seconds": round(time.perf_counter() - t0, 2)})
    proj.meta["r2"] = r2_scores(proj, master, slave, held or train[-1:], lmap, align)
    return proj


def r2_scores(proj: LstsqProjector, master: LM, slave: LM, texts: list[str], lmap: LayerMap,
              align: str) -> dict[str, dict[str, float]]:
    """R² of the projection on `texts`, per master layer, for keys and values."""
    def predict(kind: str, i: int, x: torch.Tensor) -> torch.Tensor:
        w = proj.weights[f"{kind}.{i}"].double()
        return x @ w[:-1] + w[-1]
    return _r2(predict, master, slave, texts, lmap, align)


def identity_r2(master: LM, slave: LM, texts: list[str], lmap: LayerMap,
                align: str = "mean") -> dict[str, dict[str, float]]:
    """R² of the slave's own pre-RoPE keys and values as predictions of the master's, with no projection: 1 for an
    exact copy, lower as a sibling drifts (geometries must match)."""
    IdentityProjector().prepare(master, slave, lmap)  # the one same-geometry rule, with its error and fix
    return _r2(lambda kind, i, x: x, master, slave, texts, lmap, align)


def _r2(predict, master: LM, slave: LM, texts: list[str], lmap: LayerMap, align: str) -> dict[str, dict[str, float]]:
    """The one R² rule: 1 - SSE / SST pooled over `texts`, per master layer and kind; `predict(kind, i, X) -> Ŷ`."""
    sse: dict[str, float] = {}
    sst: dict[str, float] = {}
    for text in texts:
        for i, kinds in _pairs(master, slave, text, lmap, align).items():
            for kind, (x, y) in kinds.items():
                key = f"{kind}.{i}"
                sse[key] = sse.get(key, 0.0) + float(((predict(kind, i, x) - y) ** 2).sum())
                sst[key] = sst.get(key, 0.0) + float(((y - y.mean(0)) ** 2).sum())
    return {str(i): {kind: 1 - sse[f"{kind}.{i}"] / max(sst[f"{kind}.{i}"], 1e-12) for kind in ("k", "v")}
            for i in lmap.pairs}
