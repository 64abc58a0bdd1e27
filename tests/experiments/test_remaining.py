"""Notebook 08's verdict rules on hand-made numbers, and its measurements on tiny models (both outcomes reachable)."""
from __future__ import annotations

import pytest
import torch

import fusionlab as fl
from fusionlab.experiments import nb08_engine_claims as ec, nb08_arithmetic_claims as pa

from conftest import TEXT


def test_arithmetic_values():
    assert pa.weights_gb(35e9, 16) == pytest.approx(70.0)
    assert pa.oom_claim().verdict == "supported" and pa.oom_claim(params=7e9).verdict == "not supported"
    # hidden 4096 / intermediate 14336 / GQA 32:8 x 128: FFN 176.2M, attention 41.9M per layer
    assert pa.ffn_share(4096, 14336, 32, 8, 128) == pytest.approx(176160768 / (176160768 + 41943040))
    assert pa.ffn_claim().verdict == "not supported"
    assert pa.ffn_claim(stated=0.81).verdict == "partly supported"
    c59, c60 = pa.fp16_27b_claims()
    assert (c59.verdict, c60.verdict) == ("supported", "not supported")
    assert pa.fp16_27b_claims(params=10e9)[1].verdict == "supported"


def test_rope_neighbour_distance_is_translation_invariant_but_depends_on_theta():
    d = pa.rope_neighbour_distance(1e6, 64, [1, 10_000, 1_000_000])
    assert max(d.values()) / min(d.values()) - 1 < 1e-9
    assert pa.rope_neighbour_distance(1e4, 64, [1])[1] != pytest.approx(d[1])
    assert pa.rope_range_claim().verdict == "not supported"


def test_ssm_state_is_constant_in_the_budget():
    c = pa.ssm_state_claim()
    assert c.verdict == "supported" and c.claim_id == "C66"


def test_behaviour_rules_on_hand_made_numbers():
    g = {"no_grad_repeats_identical": True, "grad_repeats_identical": True}
    assert ec.grad_verdict(g) == "not supported"
    assert ec.grad_verdict({**g, "grad_repeats_identical": False}) == "supported"
    st = {**g, "stitched_no_grad_repeats_identical": True, "stitched_grad_repeats_identical": False}
    assert ec.grad_verdict(st) == "supported"  # the stitched model decides where it was measured
    assert ec.grad_verdict({**st, "stitched_grad_repeats_identical": True, "grad_repeats_identical": False}) == \
        "not supported"
    assert ec.dropout_verdict({"train_vs_eval_max_abs": 0.0}) == "not supported"
    assert ec.dropout_verdict({"train_vs_eval_max_abs": 0.2}) == "supported"
    u = {"layers_seen_use_cache_true": 4, "layers_seen_use_cache_false": 4, "identical": True}
    assert ec.use_cache_verdict(u) == "not supported"
    assert ec.use_cache_verdict({**u, "layers_seen_use_cache_true": 0}) == "supported"
    assert ec.strict_false_verdict({"fails_at_load": True}) == "not supported"
    assert ec.strict_false_verdict({"fails_at_load": False}) == "supported"
    c = {"steps": 4, "same_argmax": 4, "max_abs_logit_diff": 2e-5}
    assert ec.cached_decoding_verdict(c) == "supported"
    assert ec.cached_decoding_verdict({**c, "same_argmax": 3}) == "not supported"
    assert ec.cached_decoding_verdict({**c, "max_abs_logit_diff": 0.1}) == "not supported"
    e = {"n": 10, "entropy_diff_ci": (0.01, 0.2), "nll_master": 3.0, "nll_diff_ci": (-0.01, 0.005)}
    assert ec.entropy_verdict(e) == "supported"
    assert ec.entropy_verdict({**e, "nll_diff_ci": (0.6, 2.2)}) == "partly supported"
    assert ec.entropy_verdict({**e, "entropy_diff_ci": (-0.2, -0.01)}) == "not supported"
    assert ec.entropy_verdict({**e, "entropy_diff_ci": (-0.1, 0.1)}) == "inconclusive"
    assert ec.entropy_verdict({**e, "n": 3}) == "inconclusive"
    rows = [{"batch": 1, "tokens_per_s": 10, "step_ms": 100}, {"batch": 8, "tokens_per_s": 50, "step_ms": 160}]
    assert ec.batching_verdict(rows) == "supported"
    assert ec.batching_verdict([rows[0], {**rows[1], "step_ms": 100}]) == "not supported"
    assert ec.batching_verdict([rows[0], {**rows[1], "tokens_per_s": 11}]) == "not supported"


def test_measurements_on_tiny_models(tiny):
    lm = tiny("tiny-qwen2")
    ids = lm.encode(TEXT)
    g = ec.measure_grad_determinism(lm, ids, repeats=2)
    assert g["no_grad_repeats_identical"] and g["grad_repeats_identical"]
    st = ec.measure_grad_determinism(lm, ids, repeats=2, slave=tiny("tiny-llama"), text=TEXT)
    assert st["stitched_no_grad_repeats_identical"] and st["stitched_grad_repeats_identical"]
    assert st["stitched_grad_vs_no_grad_max_abs"] == 0.0
    assert ec.measure_dropout(lm, ids)["train_vs_eval_max_abs"] == 0.0 and not lm.model.training
    u = ec.measure_use_cache(lm, ids)
    assert u["identical"] and u["layers_seen_use_cache_true"] == lm.spec.layers
    before = {k: v.clone() for k, v in lm.model.state_dict().items()}
    s = ec.measure_strict_false(lm.model, tiny("tiny-llama").model)
    assert s["fails_at_load"] and "size mismatch" in s["error"]
    assert all(torch.equal(before[k], v) for k, v in lm.model.state_dict().items())  # loaded into a copy
    c = ec.measure_cached_decoding(lm, ids[:, :12], 4)
    assert ec.cached_decoding_verdict(c) == "supported"
    rows = ec.measure_batching(lm, TEXT, [1, 2], steps=2, reps=1)
    assert [r["batch"] for r in rows] == [1, 2] and all(r["tokens_per_s"] > 0 for r in rows)


def test_dropout_is_detected_when_a_model_has_it(tiny):
    lm = tiny("tiny-llama", fresh=True)
    for mod in lm.model.modules():  # give the model an active dropout: the rule must then say 'supported'
        if hasattr(mod, "attention_dropout"):
            mod.attention_dropout = 0.5
    assert ec.dropout_verdict(ec.measure_dropout(lm, lm.encode(TEXT))) == "supported"


def test_entropy_of_a_self_copy_fusion_is_the_masters(tiny):
    lm, copy = tiny("tiny-qwen2"), tiny("tiny-qwen2", fresh=True)
    texts = [TEXT, TEXT[::-1], TEXT.upper(), TEXT.lower(), TEXT[10:]]
    with fl.fuse(lm, [fl.Slave(copy, mode="replace")]) as fused:  # replacing own K/V with identical K/V
        m = ec.measure_entropy(lm, fused, texts)
    assert m["n"] == 5 and abs(m["entropy_diff"]) < 1e-4 and max(map(abs, m["entropy_diff_ci"])) < 1e-4
    assert abs(m["nll_fused"] - m["nll_master"]) < 1e-4
