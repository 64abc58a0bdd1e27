"""Next-token loss on held-out text, for a plain LM or a FusedModel: the yardstick of notebook 01."""
from __future__ import annotations

from pathlib import Path
from typing import Any

import pandas as pd
import torch
import torch.nn.functional as F

from ..errors import FusionLabError
from ..paths import asset


def heldout_paragraphs(folder: Path | None = None) -> list[str]:
    """Our held-out text (never used for fitting projectors), one paragraph per item."""
    folder = folder or asset("heldout")
    paras = [p.strip() for f in sorted(folder.glob("*.txt")) for p in f.read_text(encoding="utf-8").split("\n\n")
             if p.strip()]
    if not paras:
        raise FusionLabError(f"no held-out text in {folder}.")
    return paras


@torch.inference_mode()
def token_nll(model: Any, ids: torch.Tensor) -> torch.Tensor:
    """Per-token negative log-likelihood (T-1,) of ids (1, T) under `model` (an fl.LM or a FusedModel)."""
    logits = model(ids) if callable(model) and not hasattr(model, "model") else model.model(ids).logits
    return F.cross_entropy(logits[0, :-1].float(), ids[0, 1:], reduction="none")


def nll_table(models: dict[str, Any], lm: Any, texts: list[str]) -> pd.DataFrame:
    """Mean NLL per text for each named model (all read the texts tokenized by `lm`, the master)."""
    rows = []
    for i, text in enumerate(texts):
        ids = lm.encode(text)
        for name, model in models.items():
            nll = token_nll(model, ids)
            rows.append({"text": i, "setting": name, "tokens": int(nll.numel()), "nll": float(nll.mean())})
    return pd.DataFrame(rows)
