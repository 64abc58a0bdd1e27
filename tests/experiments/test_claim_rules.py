"""Every claim rule that used to sit in a notebook cell, on hand-made data: each verdict branch is reached."""
from __future__ import annotations

import pandas as pd
import pytest

from fusionlab.errors import FusionLabError
from fusionlab.experiments import nb00_claims as claims00, nb01_claims as claims01, nb04_cache_bus as cache_bus
from fusionlab.experiments import nb04_claims as claims04, nb05_claims as claims05
from fusionlab.experiments.claim import Claim


def test_claim_refuses_an_unknown_verdict():
    with pytest.raises(FusionLabError, match="verdict must be one of"):
        Claim(claim="a", seed_section="b", seed_value="c", measured="d", n="e", setup="f", verdict="great",
              notebook="nb")


def test_warmup_claim():
    fast = claims00.warmup_claim({"cold_s": 3.2, "warm_median_s": 0.78, "warm_runs": 5})
    slow = claims00.warmup_claim({"cold_s": 0.46, "warm_median_s": 0.41, "warm_runs": 3})
    assert fast.verdict == "supported" and "(x0.24)" in fast.measured
    assert slow.verdict == "not supported" and "median of 3 warm" in slow.n


def test_size_mismatch_claim():
    err = "Error(s) in loading state_dict:\n\tsize mismatch for model.embed_tokens.weight: copying a param ..."
    assert claims01.size_mismatch_claim(err).verdict == "supported"
    assert claims01.size_mismatch_claim("no error (the architectures match)").verdict == "not supported"


def _nll(rows: list[tuple], cols: list[str]) -> pd.DataFrame:
    return pd.DataFrame(rows, columns=cols)


def test_tokenizer_claim():
    worse = _nll([(i, k, 3.0 + (8.0 if k != "own ids" else 0) + 0.1 * i) for i in range(6)
                  for k in ("own ids", "x ids")], ["text", "ids", "nll"])
    same = _nll([(i, k, 3.0 + 0.1 * i * (1 if k == "own ids" else -1)) for i in range(6)
                 for k in ("own ids", "x ids")], ["text", "ids", "nll"])
    assert claims01.tokenizer_claim(worse).verdict == "supported" and "+8.00" in claims01.tokenizer_claim(worse).measured
    assert claims01.tokenizer_claim(same).verdict == "inconclusive"


def _rope(naive_gap: float, fixed_gap: float) -> pd.DataFrame:
    rows = []
    for t in range(8):
        base = 3.0 + 0.05 * t
        jitter = 0.01 * (t % 3 - 1)
        rows += [("s", t, "master alone", base), ("s", t, "fused, naive post-RoPE", base + naive_gap + jitter),
                 ("s", t, "fused, re-rotated", base + fixed_gap + jitter)]
    return pd.DataFrame(rows, columns=["slave", "text", "setting", "nll"])


def test_rope_claim():
    assert claims01.rope_claim(_rope(0.25, 0.0)).verdict == "supported"
    assert claims01.rope_claim(_rope(0.0, 0.0)).verdict == "inconclusive"  # naive keys do no harm: nothing shown
    assert claims01.rope_claim(_rope(0.25, 0.30)).verdict == "inconclusive"  # re-rotation no better


def _norm(delta: float) -> pd.DataFrame:
    rows = [(t, "slave, own norms", 3.0 + 0.1 * t) for t in range(6)]
    rows += [(t, "slave, master's norms", 3.0 + 0.1 * t + delta + 0.01 * (t % 2)) for t in range(6)]
    return pd.DataFrame(rows, columns=["text", "setting", "nll"])


def test_norm_claim():
    assert claims01.norm_claim("impossible", _norm(0.5)).verdict == "not supported"
    assert claims01.norm_claim("impossible", _norm(-0.5)).verdict == "supported"
    assert claims01.norm_claim("impossible", _norm(-0.005)).verdict == "inconclusive"


def test_stride_claim_is_judged_against_the_master():
    master = [3.2, 3.3, 3.1, 3.25, 3.15, 3.3]
    def maps(stride, other):
        return pd.DataFrame({"strategy": ["stride 2 (blog)", "proportional (KVComm)"],
                             "nll": [sum(stride) / 6, sum(other) / 6], "r2_keys": [-4.1, 0.3],
                             "nll_per_text": [stride, other]})
    worse = [x + 1.0 + 0.01 * i for i, x in enumerate(master)]  # best of the maps, but far worse than the master
    assert claims01.stride_claim(maps(worse, [x + 1.2 for x in master]), master).verdict == "not supported"
    same = [x + 0.01 * (-1) ** i for i, x in enumerate(master)]
    assert claims01.stride_claim(maps(same, [x + 0.5 for x in master]), master).verdict == "supported"
    assert claims01.stride_claim(maps(same, [x - 0.5 for x in master]), master).verdict == "not supported"  # not the best


def _bus(master: int, bus: int, n: int, p: float):
    table = pd.DataFrame({"setting": ["master alone", "+a", "+a +b"], "n": n, "pass@1": [master / n, 0.3, bus / n],
                          "ci_low": 0.1, "ci_high": 0.9})
    pairs = pd.DataFrame({"setting": ["+a", "+a +b"], "p_value": [0.5, p]})
    kinds = pd.DataFrame({"syntax error": [2, 5, 9]}, index=["master alone", "+a", "+a +b"])
    return table, pairs, kinds


def test_humaneval_claim_branches():
    assert claims04.humaneval_claim(*_bus(70, 95, 164, 0.001), 164).verdict == "supported"
    assert claims04.humaneval_claim(*_bus(71, 3, 164, 1e-20), 164).verdict == "not supported"
    assert claims04.humaneval_claim(*_bus(71, 75, 164, 0.4), 164).verdict == "not supported"  # no gain on >= 100
    assert claims04.humaneval_claim(*_bus(7, 8, 16, 0.9), 16).verdict == "inconclusive"
    assert "syntax errors: master 2, +a +b 9 of 16" in claims04.humaneval_claim(*_bus(7, 8, 16, 0.9), 16).measured


def test_memory_and_kv_claims():
    assert claims04.bus_memory_claim(3.6, 2**20).verdict == "not testable here"
    worked = pd.DataFrame({"model": ["Gemma 2 27B", "Gemma 3 27B"], "formula, all layers full (GB)": [12.3, 16.6],
                           "with sliding windows (GB)": [6.9, 3.1]})
    assert "Gemma 2 27B 12.3 GB" in claims05.worked_example_claim(worked, 164032, 21.47).measured
    assert claims05.worked_example_claim(worked, 164032, 21.47).verdict == "partly supported"
    assert claims05.worked_example_claim(worked, 164032, 30.0).verdict == "not supported"
    assert claims05.worked_example_claim(worked.assign(**{"formula, all layers full (GB)": [21.4, 16.6]}), 1,
                                          21.47).verdict == "supported"
    real = pd.DataFrame({"model": ["a", "a", "b"], "seq_len": [1, 2, 1], "formula_equals_measured": [True, True, False]})
    assert claims05.formula_claim(real).verdict == "not supported"
    assert claims05.formula_claim(real.assign(formula_equals_measured=True)).verdict == "supported"
    assert claims05.hybrid_claim(0.245, 0.267).verdict == "supported"
    assert claims05.hybrid_claim(0.40, 0.45).verdict == "partly supported"
    assert "36 GB bf16" in claims05.stitched_fit_claim().measured


def test_degradation_rule_on_hand_made_rates():
    from fusionlab.experiments.nb02_claims import degradation_claim

    def rates(correct: list[tuple[float, float, float]]) -> pd.DataFrame:
        return pd.DataFrame([{"setting": "single", "length": 1024 * 2**k, "n": 9, "correct": c, "correct_lo": lo,
                              "correct_hi": hi} for k, (c, lo, hi) in enumerate(correct)])
    flat = rates([(0.9, 0.6, 0.98), (1.0, 0.7, 1.0)])
    assert degradation_claim(flat, "full").verdict == "inconclusive"
    drop = rates([(1.0, 0.7, 1.0), (0.5, 0.3, 0.6), (0.1, 0.02, 0.4)])
    c = degradation_claim(drop, "full")
    assert c.verdict == "supported" and c.claim_id == "C73" and "4096: 10%" in c.measured


def test_memory_probe_generates_whatever_the_cache_holds(tiny):
    """C52's memory figure comes from a batch the bus always generates (a fully cached grid generates nothing)."""
    import fusionlab as fl

    m, s = tiny("tiny-qwen2"), tiny("tiny-llama")
    proj = fl.fit_lstsq(m, s, texts=["def f(x): return x + 1", "the quick brown fox jumps"], holdout_every=0)
    gb = cache_bus.memory_probe(m, {"s": (s, proj)}, ["def add(a, b):", "x = 1"], max_new_tokens=2)
    assert gb > 0.05
    claim = claims04.bus_memory_claim(gb, 2**20, batch=2)
    assert claim.verdict == "not testable here" and "generating a batch of 2), slots 1.00 MiB" in claim.measured
