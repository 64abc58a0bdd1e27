"""Notebook 05's logic: configs as plain dicts, memory-vs-length curves, formula vs real caches (+ peak RSS).

The large-model configs are typed from the models' published config.json files (no download needed);
a user with the files can pass them instead.
"""
from __future__ import annotations

import json
import subprocess
import sys
from typing import Any

import pandas as pd

from ..analysis import kv
from ..engine.fit import fit_lstsq
from ..engine.fuse import fuse
from ..engine.slave import Slave


GEMMA2_27B = {"num_hidden_layers": 46, "num_attention_heads": 32, "num_key_value_heads": 16, "head_dim": 128,
              "sliding_window": 4096, "layer_types": ["sliding_attention", "full_attention"] * 23}
GEMMA3_27B = {"num_hidden_layers": 62, "num_attention_heads": 32, "num_key_value_heads": 16, "head_dim": 128,
              "sliding_window": 1024,
              "layer_types": [("full_attention" if (i + 1) % 6 == 0 else "sliding_attention") for i in range(62)]}
QWEN3_NEXT_80B = {"num_hidden_layers": 48, "num_attention_heads": 16, "num_key_value_heads": 2, "head_dim": 256,
                  "hidden_size": 2048, "linear_num_key_heads": 16, "linear_key_head_dim": 128,
                  "linear_num_value_heads": 32, "linear_value_head_dim": 128, "linear_conv_kernel_dim": 4,
                  "layer_types": [("full_attention" if (i + 1) % 4 == 0 else "linear_attention") for i in range(48)]}


QWEN3_NEXT_80B_LINEAR = {k: v for k, v in QWEN3_NEXT_80B.items() if k.startswith("linear_")}


def dense_version(cfg: dict[str, Any]) -> dict[str, Any]:
    """The same geometry with every layer full attention (the seed's formula)."""
    return cfg | {"layer_types": ["full_attention"] * cfg["num_hidden_layers"]}


def archetypes() -> dict[str, dict[str, Any]]:
    """Dense / Gemma-3-style 5:1 sliding / 3:1 linear hybrid, same attention geometry for a fair comparison."""
    base = dense_version(GEMMA3_27B)
    return {"dense (Gemma 3 27B geometry, all full)": base,
            "5:1 sliding (Gemma 3 27B)": GEMMA3_27B,
            "3:1 linear hybrid (Gemma 3 27B geometry)": base | QWEN3_NEXT_80B_LINEAR | {"hidden_size": 5376,
                "layer_types": [("full_attention" if (i + 1) % 4 == 0 else "linear_attention") for i in range(62)]}}


def curves(configs: dict[str, Any], lengths: list[int], dtype: str = "bfloat16") -> pd.DataFrame:
    rows = [{"config": name, "seq_len": n, "bytes": kv.budget(cfg, n, dtype=dtype).total_bytes}
            for name, cfg in configs.items() for n in lengths]
    return pd.DataFrame(rows)


def plot_curves(df: pd.DataFrame, title: str) -> Any:
    import matplotlib.pyplot as plt
    import seaborn as sns

    fig, ax = plt.subplots(figsize=(5.5, 3.2))
    sns.lineplot(df.assign(GiB=df["bytes"] / 2**30), x="seq_len", y="GiB", hue="config", marker="o", ax=ax)
    ax.set_xscale("log", base=2)
    ax.set_xlabel("context length (tokens)")
    ax.set_ylabel("KV cache (GiB)")
    ax.set_title(title)
    ax.legend(fontsize=7)
    fig.tight_layout()
    return fig


_PROBE = """
import json, resource, torch, fusionlab as fl
from transformers import DynamicCache
from fusionlab import kv
lm = fl.load({name!r})
before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
cache = DynamicCache(config=lm.model.config)
ids = torch.randint(3, lm.spec.vocab_size, (1, {n}))
with torch.no_grad():
    lm.model(ids, cache=cache, use_cache=True, logits_to_keep=1)
after = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
print(json.dumps({{"measured_bytes": int(kv.measured_cache_bytes(cache)["bytes"].sum()),
                  "formula_bytes": kv.budget(lm, {n}, dtype="float32").total_bytes,
                  "peak_rss_delta_mib": (after - before) / 1024}}))
"""


def measure_real(names: list[str], lengths: list[int]) -> pd.DataFrame:
    """Formula vs tensor bytes of real caches, and the process's peak-RSS rise, one fresh process per run."""
    rows = []
    for name in names:
        for n in lengths:
            out = subprocess.run([sys.executable, "-c", _PROBE.format(name=name, n=n)], capture_output=True,
                                 text=True, check=True)
            rows.append({"model": name, "seq_len": n, **json.loads(out.stdout.strip().splitlines()[-1])})
    df = pd.DataFrame(rows)
    df["formula_equals_measured"] = df["measured_bytes"] == df["formula_bytes"]
    return df


def factorizations(target_bytes: float, seq_len: int, bytes_per: int = 2) -> int:
    """L · H_kv · D that the seed's formula needs to reach `target_bytes` (batch 1)."""
    return round(target_bytes / (2 * seq_len * bytes_per))


def fused_setup(master: Any, slaves: list[Any], prompt: str) -> pd.DataFrame:
    """Budget of master + slaves (lstsq, mean alignment, proportional maps) vs the slot bytes fl.fuse placed."""
    projs = [fit_lstsq(master, s) for s in slaves]
    with fuse(master, [Slave(s, layer_map=p.layer_map, projector=p, align="mean")
                       for s, p in zip(slaves, projs)]) as f:
        f(prompt)
        placed = f.slot_bytes()
    t = master.encode(prompt).shape[1]
    per_slot = 2 * master.spec.kv_heads * master.spec.head_dim * 4  # fp32, per layer
    spec = [(len(p.layer_map), placed[s.name] / (per_slot * len(p.layer_map) * t)) for s, p in zip(slaves, projs)]
    df = kv.fused_budget(master, spec, t, dtype="float32")
    df["measured_bytes"] = [None] + [placed[s.name] for s in slaves] + [None]
    df["slots_per_token"] = [None] + [round(x, 3) for _, x in spec] + [None]
    df.attrs["prompt_tokens"] = t
    return df


def weights_gb(params: float, bits: float) -> float:
    return params * bits / 8 / 1e9
