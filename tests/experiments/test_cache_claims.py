"""Notebook 08 part 3 (cache claims): verdict rules on hand-made numbers, measurements on tiny models."""
from __future__ import annotations

import pytest
import torch

from fusionlab.experiments import nb08_cache_claims as cc
from fusionlab.experiments.nb02_niah import load_needles

from conftest import TEXT


def test_sliding_cache_on_tiny_gemma(tiny):
    g = tiny("tiny-gemma3")  # window 8, layers sliding x3 + full
    m = cc.measure_sliding_cache(g, g.encode(TEXT))
    assert m["tokens"] > m["window"] == 8
    kept = {r["type"]: r["kept"] for r in m["layers"]}
    assert kept == {"sliding_attention": 7, "full_attention": m["tokens"]} and all(r["is_the_tail"] for r in m["layers"])
    assert cc.sliding_cache_verdict(m) == "supported"
    bad = {**m, "layers": [{**r, "is_the_tail": False} for r in m["layers"]]}
    assert cc.sliding_cache_verdict(bad) == "not supported"
    assert cc.sliding_cache_verdict({**m, "tokens": 5}) == "not supported"  # kept counts no longer match 5 tokens


def test_truncation_drops_the_prefix_exactly(tiny):
    m = cc.measure_truncation(tiny("tiny-qwen2"), "a long prefix of many words " * 3, "and now the question?")
    assert m["truncated_vs_floor"] < 1e-5 < m["skyline_vs_floor"]
    assert cc.truncation_verdict({"truncated_vs_floor": 1e-6, "skyline_vs_floor": 2.0}) == "not supported"
    assert cc.truncation_verdict({"truncated_vs_floor": 1.0, "skyline_vs_floor": 2.0}) == "supported"
    assert cc.truncation_verdict({"truncated_vs_floor": 1e-6, "skyline_vs_floor": 1e-6}) == "inconclusive"


def test_quantization_rule_and_tiny_run(tiny):
    m = cc.measure_kv_quantization(tiny("tiny-qwen2"), [TEXT, TEXT.upper()], bits=(8, 4), group=16)
    assert m["n"] == 2 and set(m["bits"]) == {8, 4}
    assert m["bits"][8]["bytes_vs_bf16"] < 0.6 and m["bits"][4]["bytes_vs_bf16"] < 0.35
    hand = {"n": 12, "nll": 3.0, "bits": {8: {"ci": (0.0, 0.01)}, 4: {"ci": (0.02, 0.05)}}}
    assert cc.quantization_verdict(hand) == "supported"
    hand["bits"][4]["ci"] = (0.1, 0.2)
    assert cc.quantization_verdict(hand) == "partly supported"
    hand["bits"][8]["ci"] = (0.1, 0.2)
    assert cc.quantization_verdict(hand) == "not supported"
    assert cc.quantization_verdict({**hand, "n": 3}) == "inconclusive"


def _rows(intact: list[bool], windowed: list[bool], beyond: bool = True) -> list[dict]:
    rows = []
    for k, (a, b) in enumerate(zip(intact, windowed)):
        rows += [{"needle": "n", "length": k, "depth": 10, "setting": "global layers intact", "beyond": beyond,
                  "correct": a},
                 {"needle": "n", "length": k, "depth": 10, "setting": "global layers windowed", "beyond": beyond,
                  "correct": b}]
    return rows


def test_window_niah_rule_on_hand_made_cells():
    assert cc.window_niah_verdict(_rows([True] * 10, [False] * 10))[0] == "supported"
    assert cc.window_niah_verdict(_rows([True] * 10, [True] * 10))[0] == "not supported"
    assert cc.window_niah_verdict(_rows([False] * 10, [False] * 10))[0] == "inconclusive"  # the model cannot do it
    assert cc.window_niah_verdict(_rows([True] * 4, [False] * 4))[0] == "inconclusive"  # too few cells
    assert cc.window_niah_verdict(_rows([True] * 10, [False] * 10, beyond=False))[1]["n"] == 0  # near needles ignored


def test_window_niah_runs_on_tiny_gemma(tiny):
    g = tiny("tiny-gemma3")
    needle = [n for n in load_needles() if n.id == "en-city"]
    hay = " ".join(f"Sentence {i} is about rivers." for i in range(200))
    rows = cc.measure_window_niah(g, needle, hay, [240], [10, 90], max_new_tokens=3)
    assert len(rows) == 4 and {r["setting"] for r in rows} == {"global layers intact", "global layers windowed"}
    assert any(r["beyond"] for r in rows)


def test_arithmetic_claims():
    c = cc.linear_state_claim()
    assert c.verdict == "supported" and c.claim_id == "C61"
    h = cc.hybrid_context_claim()
    assert h.verdict == "partly supported" and "59K tokens fit" in h.measured
    assert cc.hybrid_context_claim(kv_heads=1, head_dim=64).verdict == "supported"  # a tiny KV would reach 1M
    assert cc.hybrid_context_claim(params=40e9).verdict == "not supported"
