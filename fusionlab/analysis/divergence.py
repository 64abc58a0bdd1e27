"""How far a slave is from the master, measured one way for every rung of the transfer map (notebook 10).

Two views: in the output, the next-token KL(master ‖ slave) on held-out text (needs a shared tokenizer); in the
cache, per layer the R² of the slave's keys and values as predictors of the master's, raw (identity, same geometry
only) and after the `lstsq` projector (fitted on the calibration text, R² on its held-out paragraphs). An exact copy
scores KL 0 and R² 1 on both; a transfer that breaks should break somewhere along these numbers.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd
import torch
import torch.nn.functional as F

from ..engine.fit import fit_lstsq, identity_r2
from ..engine.layermap import LayerMap
from ..engine.lm import LM
from ..errors import FusionLabError
from .stats import bootstrap_ci


@dataclass
class Divergence:
    """One slave's distance from the master."""

    slave: str
    kl: float
    """Mean next-token KL(master ‖ slave) in nats per token, pooled over held-out texts."""
    kl_ci: tuple[float, float]
    """95% bootstrap interval over texts (documents), not tokens."""
    texts: int
    tokens: int
    r2: pd.DataFrame
    """One row per mapped master layer: layer, k_identity, v_identity, k_lstsq, v_lstsq (identity NaN when the
    geometries differ)."""

    def row(self) -> dict:
        """The summary line of a ladder table: KL and the layer-mean R²s."""
        means = {c: float(self.r2[c].mean()) for c in ("k_identity", "v_identity", "k_lstsq", "v_lstsq")}
        return {"slave": self.slave, "kl": self.kl, "kl_low": self.kl_ci[0], "kl_high": self.kl_ci[1],
                "texts": self.texts, "tokens": self.tokens, **means}


@torch.inference_mode()
def text_kl(master: LM, slave: LM, text: str) -> torch.Tensor:
    """Per-token KL(master ‖ slave) (T,) of the next-token distributions on `text`."""
    ids = master.encode(text)  # (1, T)
    log_p = F.log_softmax(master.model(ids.to(master.device)).logits[0].float(), -1)  # (T, V)
    log_q = F.log_softmax(slave.model(ids.to(slave.device)).logits[0].float(), -1)  # (T, V)
    return (log_p.exp() * (log_p - log_q)).sum(-1).cpu()


def divergence(master: LM, slave: LM, texts: list[str], layer_map: LayerMap, lstsq: bool = True,
               seed: int = 0) -> Divergence:
    """KL on `texts` (held-out, never the calibration text) and the per-layer K/V R² through `layer_map`."""
    if master.vocab_hash != slave.vocab_hash:
        raise FusionLabError(f"divergence: next-token KL needs one tokenizer, and {slave.name} does not share "
                             f"{master.name}'s; compare foreign slaves by their K/V R² (fl.fit_lstsq(...).meta['r2']).")
    if not texts:
        raise FusionLabError("divergence(texts=...) needs at least one held-out text, got none.")
    per_text = [text_kl(master, slave, t) for t in texts]
    sums = np.array([float(k.sum()) for k in per_text])
    counts = np.array([k.numel() for k in per_text])
    kl = float(sums.sum() / counts.sum())
    pooled = lambda idx: float(sums[idx.astype(int)].sum() / counts[idx.astype(int)].sum())  # noqa: E731
    low, high = bootstrap_ci(np.arange(len(texts)), pooled, seed=seed)  # resamples texts, not tokens
    same_geometry = (master.spec.kv_heads, master.spec.head_dim) == (slave.spec.kv_heads, slave.spec.head_dim)
    raw = identity_r2(master, slave, texts, layer_map) if same_geometry else {}
    fitted = fit_lstsq(master, slave, layer_map).meta["r2"] if lstsq else {}
    rows = [{"layer": int(i),
             "k_identity": raw.get(str(i), {}).get("k", float("nan")),
             "v_identity": raw.get(str(i), {}).get("v", float("nan")),
             "k_lstsq": fitted.get(str(i), {}).get("k", float("nan")),
             "v_lstsq": fitted.get(str(i), {}).get("v", float("nan"))} for i in layer_map.pairs]
    return Divergence(slave.name, kl, (low, high), len(texts), int(counts.sum()), pd.DataFrame(rows))
