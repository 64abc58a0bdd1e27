"""Helpers behind notebook 00: specs side by side, one greedy answer per model and language, the geometry figure.

The warm-up (time-to-first-token) measurement lives in `ttft.py`: it needs a fresh process."""
from __future__ import annotations

import time
from typing import Any

import pandas as pd

from ..engine.fuse import fuse
from ..engine.lm import LM

PROMPTS = {"en": "In one sentence, what is a key-value cache in a transformer?",
           "zh": "用一句话解释：什么是Transformer中的键值缓存？"}


def spec_table(lms: list[LM]) -> pd.DataFrame:
    """One column per model: layers, heads, KV heads, head_dim, RoPE θ per layer type, vocab, template."""
    rows = {}
    for lm in lms:
        s = lm.spec
        rows[lm.name] = {"architecture": s.model_type, "layers": s.layers, "heads": s.heads, "kv_heads": s.kv_heads,
                         "head_dim": s.head_dim, "hidden": s.hidden_size, "vocab": s.vocab_size,
                         "max_positions": s.max_positions, "sliding_window": s.sliding_window,
                         "layer_types": ", ".join(f"{t}×{s.layer_types.count(t)}" for t in sorted(set(s.layer_types))),
                         "rope_theta": ", ".join(f"{t}: {r.theta:g}" for t, r in sorted(s.rope.items())),
                         "chat_template": s.has_chat_template,
                         "params_M": round(sum(p.numel() for p in lm.model.parameters()) / 1e6, 1)}
    return pd.DataFrame(rows)


def answers(lms: list[LM], max_new_tokens: int = 40) -> pd.DataFrame:
    """Greedy answers (chat template where the model has one; base models get the raw prompt)."""
    rows = []
    for lm in lms:
        with fuse(lm, []) as f:
            for lang, prompt in PROMPTS.items():
                t0 = time.perf_counter()
                text = f.generate(prompt, max_new_tokens=max_new_tokens, chat=lm.spec.has_chat_template)
                rows.append({"model": lm.name, "lang": lang, "chat_template": lm.spec.has_chat_template,
                             "answer": text.strip(), "seconds": round(time.perf_counter() - t0, 2)})
    return pd.DataFrame(rows)


def plot_geometries(lms: list[LM]) -> Any:
    """Three panels: KV bytes per token per layer, layer count, KV heads × head_dim, for each model."""
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 3, figsize=(9, 2.8))
    names = [lm.name for lm in lms]
    layers = [lm.spec.layers for lm in lms]
    kv_width = [lm.spec.kv_heads * lm.spec.head_dim for lm in lms]
    per_token = [2 * lm.spec.layers * lm.spec.kv_heads * lm.spec.head_dim * 2 / 1024 for lm in lms]
    for ax, vals, title in zip(axes, [layers, kv_width, per_token],
                               ["decoder layers", "KV width per layer (H_kv × D)", "KV per token, bf16 (KiB, all layers)"]):
        ax.barh(names, vals, color=["C0", "C1", "C2"][: len(names)])
        ax.set_title(title)
        for i, v in enumerate(vals):
            ax.text(v, i, f" {v:g}", va="center")
    for ax in axes[1:]:
        ax.set_yticklabels([])
    fig.tight_layout()
    return fig

