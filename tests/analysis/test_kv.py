"""KV budget: the formula equals the bytes of real caches; hybrid layer types; bad input."""
from __future__ import annotations

import pytest
import torch
from transformers import DynamicCache

import fusionlab as fl
from fusionlab import kv
from fusionlab.errors import FusionLabError

from conftest import TINY_NAMES, embedded_available

QWEN3_NEXT_LIKE = {"num_hidden_layers": 8, "num_attention_heads": 16, "num_key_value_heads": 2, "head_dim": 256,
                   "hidden_size": 2048, "layer_types": ["linear_attention"] * 3 + ["full_attention"] +
                   ["linear_attention"] * 3 + ["full_attention"], "linear_num_key_heads": 16,
                   "linear_key_head_dim": 128, "linear_num_value_heads": 32, "linear_value_head_dim": 128,
                   "linear_conv_kernel_dim": 4}


def real_cache(lm: fl.LM, n: int) -> DynamicCache:
    ids = torch.randint(3, lm.spec.vocab_size, (1, n))
    cache = DynamicCache(config=lm.model.config)
    with torch.no_grad():
        lm.model(ids, cache=cache, use_cache=True)
    return cache


@pytest.mark.parametrize("name", TINY_NAMES)
@pytest.mark.parametrize("n", [5, 40])  # below and above tiny-gemma3's window of 8
def test_formula_equals_real_cache_tiny(tiny, name, n):
    lm = tiny(name)
    measured = kv.measured_cache_bytes(real_cache(lm, n))
    formula = kv.budget(lm, n, dtype="float32").layers
    assert measured["bytes"].tolist() == formula["bytes"].tolist()
    assert measured["tokens"].tolist() == formula["tokens"].tolist()


@pytest.mark.integration
@pytest.mark.skipif(not embedded_available("gemma3-270m"), reason="run `fusionlab fetch` first")
@pytest.mark.parametrize("name", ["qwen2.5-coder-0.5b-instruct", "smollm2-135m-instruct", "gemma3-270m"])
def test_formula_equals_real_cache_embedded(name):
    lm = fl.load(name)
    for n in (64, 600):  # 600 > Gemma's 512-token window
        measured = kv.measured_cache_bytes(real_cache(lm, n))
        assert measured["bytes"].sum() == kv.budget(lm, n, dtype="float32").total_bytes


def test_seed_formula_and_types():
    b = kv.budget({"num_hidden_layers": 40, "num_attention_heads": 40, "num_key_value_heads": 32,
                   "head_dim": 128}, 32768, dtype="bfloat16")
    assert b.total_bytes == 2 * 1 * 32768 * 40 * 32 * 128 * 2
    h = kv.budget(QWEN3_NEXT_LIKE, 32768)
    assert set(h.layers["type"]) == {"linear_attention", "full_attention"}
    lin = h.layers[h.layers["type"] == "linear_attention"]["bytes"]
    assert lin.nunique() == 1 and lin.iloc[0] == kv.budget(QWEN3_NEXT_LIKE, 16).layers["bytes"].iloc[0]
    i8 = kv.budget(QWEN3_NEXT_LIKE | {"layer_types": None}, 1024, kv_dtype="int8").total_bytes
    bf = kv.budget(QWEN3_NEXT_LIKE | {"layer_types": None}, 1024).total_bytes
    assert bf / 2 < i8 < bf / 2 * 1.07


def test_fused_budget_equals_placed_slots(tiny):
    m, s = tiny("tiny-qwen2"), tiny("tiny-qwen2", fresh=True)
    ids = m.encode("count the slots please")
    with fl.fuse(m, [fl.Slave(s, layer_map={0: 0, 2: 1})]) as f:
        f(ids)
        placed = f.slot_bytes()["tiny-qwen2"]
        assert placed == f.extra_kv_bytes(ids.shape[1])["tiny-qwen2"]
    table = kv.fused_budget(m, [(2, 1)], prompt_len=ids.shape[1])
    assert table.set_index("part").loc["slave 0 slots", "bytes"] == placed


def test_bad_input():
    with pytest.raises(FusionLabError, match="must be positive"):
        kv.budget(QWEN3_NEXT_LIKE, 0)
    with pytest.raises(FusionLabError, match=r"lacks \['num_attention_heads'\]"):
        kv.budget({"num_hidden_layers": 2}, 10)
    with pytest.raises(FusionLabError, match=r"unknown layer type 'moe_attention'.*full_attention"):
        kv.budget(QWEN3_NEXT_LIKE | {"layer_types": ["moe_attention"] * 8}, 10)
    with pytest.raises(FusionLabError, match=r"lacks \['linear_conv_kernel_dim'\]"):
        kv.budget({k: v for k, v in QWEN3_NEXT_LIKE.items() if k != "linear_conv_kernel_dim"}, 10)
    with pytest.raises(FusionLabError, match="unknown dtype"):
        kv.budget(QWEN3_NEXT_LIKE, 10, dtype="fp8")
