"""Notebook 08 parts 4-5 (stack and speed claims): verdict rules on hand-made numbers, measurements on tiny models."""
from __future__ import annotations

import zipfile

import fusionlab as fl
from fusionlab.experiments import nb08_speed_claims as sp, nb08_stack_claims as sc


def test_tokenizer_stack(tiny):
    m = sc.measure_tokenizer_stack([tiny("tiny-qwen2")])
    assert m["tokenizers"]["tiny-qwen2"]["fast"] and sc.tokenizer_stack_verdict(m) == "not testable here"
    slow = {"sentencepiece_installed": True, "tokenizers": {"x": {"class": "T", "fast": False}}}
    assert sc.tokenizer_stack_verdict(slow) == "inconclusive"


def test_release_file_reads_a_wheel_offline(tmp_path):
    with zipfile.ZipFile(tmp_path / "pkg-1.0-py3-none-any.whl", "w") as z:
        z.writestr("pkg/flash_attention_utils.py", "x = 1\n")
        z.writestr("pkg/other.py", "")
    m = sc.measure_release_file("pkg", "1.0", "pkg/modeling_flash_attention_utils.py", folder=tmp_path)
    assert m["available"] and not m["has_file"] and m["flash_attention_files"] == ["pkg/flash_attention_utils.py"]
    assert sc.release_file_verdict(m) == "not supported"
    assert sc.release_file_verdict({**m, "has_file": True}) == "inconclusive"
    assert sc.release_file_verdict({"available": False}) == "inconclusive"


def test_accelerate_hooks_leave_fusion_exact():
    m = sc.measure_accelerate("tiny-qwen2", "a short prompt about rivers")
    assert m["hooked_modules"] > 0 and m["parameter_device"] == "meta"
    assert sc.accelerate_verdict(m) == "not supported"
    assert sc.accelerate_verdict({**m, "slave_hooked_max_abs_diff": 0.5}) == "supported"
    assert sc.accelerate_verdict({**m, "hooked_modules": 0}) == "inconclusive"


def test_norm_interpolation(tiny):
    rows = sc.measure_norm_interpolation([tiny("tiny-qwen2"), tiny("tiny-gemma3")])
    assert {r["norm"] for r in rows} >= {"input_layernorm", "post_attention_layernorm", "pre_feedforward_layernorm"}
    assert sc.norm_interpolation_verdict(rows) == "not supported"  # random tiny weights: far from 0.002
    assert sc.norm_interpolation_verdict([{"median_abs_error": 0.001}]) == "supported"
    assert sc.norm_interpolation_verdict([{"median_abs_error": 0.001}, {"median_abs_error": 0.1}]) == "partly supported"


def test_described_hook_injects_nothing(tiny):
    m = sc.measure_described_hook(tiny("tiny-qwen2"), "hello there", max_new_tokens=3)
    assert m["injected_calls"] == 0 and m["output1_types"] == ["NoneType"] and m["same_tokens"]
    assert sc.described_hook_verdict(m) == "inconclusive"  # our reconstruction, not the post's listing


def test_live_decode_and_rule(tiny):
    rows = sp.measure_live_decode(tiny("tiny-qwen2"), {"copy": fl.load("tiny-qwen2"), "cross": tiny("tiny-llama")},
                                  "a prompt about rivers", new_tokens=3, min_reps=2, max_reps=2)
    assert rows[0]["ratio"] > 0 and rows[1]["ratio"] is None and "tokenizers" in rows[1]["why_not"]
    assert sp.live_decode_verdict([{"ratio": 0.5, "ci_low": 0.45, "ci_high": 0.55}]) == "not supported"
    assert sp.live_decode_verdict([{"ratio": 0.9, "ci_low": 0.8, "ci_high": 0.95}]) == "supported"
    assert sp.live_decode_verdict([{"ratio": None, "why_not": "x"}]) == "inconclusive"


def test_compile_and_tokenizer_rules(tiny):
    m = sp.measure_compile(tiny("tiny-qwen2"), "hi", new_tokens=2)
    assert isinstance(m["compiles"], bool) and (m["compiles"] or m["error"])
    assert sp.compile_verdict({"compiles": False}) == "not supported"
    assert sp.compile_verdict({"compiles": True, "eager_s": 2.0, "compiled_s": 1.0}) == "supported"
    assert sp.compile_verdict({"compiles": True, "eager_s": 1.0, "compiled_s": 2.0}) == "not supported"
    t = sp.measure_tokenizer_instances(tiny("tiny-qwen2"), ["a prompt"] * 5, forward_tokens=16, repeats=1)
    assert t["lru_cache_s"] <= t["two_instances_s"] and 0 <= t["saving_share"] < 1
    assert sp.tokenizer_instances_verdict({"saving_share": 0.2}) == "supported"
    assert sp.tokenizer_instances_verdict({"saving_share": 0.07}) == "partly supported"
    assert sp.tokenizer_instances_verdict({"saving_share": 0.001}) == "not supported"


def test_residual_injection_on_tiny_models(tiny):
    import torch

    from fusionlab.experiments import nb08_residual_claims as rc

    m, s = tiny("tiny-qwen2"), tiny("tiny-llama")
    texts = ["The quick brown fox jumps over the lazy dog.", "x = 1 + 2  # 代码", "More text, 更多文字, here.",
             "Rivers and libraries and maps.", "A fifth short paragraph of text.", "def f(x): return x * 2"]
    proj = fl.fit_lstsq(m, s, texts=texts, holdout_every=0)
    maps = rc.fit_mlp_map(m, s, proj.layer_map, texts=texts)
    assert set(maps) == set(proj.layer_map.pairs) and maps[0].shape == (s.spec.hidden_size + 1, m.spec.hidden_size)
    zero = {i: torch.zeros_like(w) for i, w in maps.items()}
    r0 = rc.measure_residual_injection(m, s, proj, zero, texts[:5])  # a zero map: K/V + MLP == K/V only
    assert r0["mlp_vs_kv"][0] == 0 and r0["nll"]["MLP only"] == r0["nll"]["master alone"]
    r = rc.measure_residual_injection(m, s, proj, maps, texts[:5])
    assert r["n"] == 5 and r["mlp_vs_kv"][0] != 0
    hand = {"n": 12, "mlp_vs_kv": (0.5, (0.2, 0.8))}
    assert rc.residual_verdict(hand) == "supported"
    assert rc.residual_verdict({**hand, "mlp_vs_kv": (-0.5, (-0.8, -0.2))}) == "not supported"
    assert rc.residual_verdict({**hand, "mlp_vs_kv": (0.1, (-0.2, 0.3))}) == "inconclusive"
    assert rc.residual_claim(r, "tiny").claim_id == "C04"
