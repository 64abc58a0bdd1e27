"""The GPU claims' verdict rules on hand-made results (a GPU run, a CPU dry run, degenerate ones), and the ledger:
without a GPU run the rows say "not run yet"; with one, its rows replace them."""
from __future__ import annotations

import json

import pytest

from fusionlab.experiments import gpu_claims as gc
from fusionlab.experiments.claim import GPU_PREPARED, Claim
from fusionlab.lab import results


def gpu_run(**over) -> dict:
    r = {"device": "NVIDIA H200", "torch": "2.13.0", "date": "2026-12-03T10:00:00", "master": "qwen", "slave": "smol",
         "tokens": 1024, "training": {"steps": 3, "error": ""}}
    for t, tok in (("float16", 120.0), ("bfloat16", 100.0)):
        r[f"fused_{t}"] = {"first_token_s": 0.05, "decode_tok_s": tok}
        r[f"cache_{t}"] = {"dynamic": {"allocations": 1000, "peak_allocated_gb": 1.5, "reserved_over_allocated": 1.2},
                           "static": {"allocations": 100, "peak_allocated_gb": 1.4, "reserved_over_allocated": 1.1}}
        r[f"streams_{t}"] = {"one_stream_s": 0.020, "side_stream_s": 0.012}
        r[f"memory_calls_{t}"] = {"allocated_gb": [1.30, 1.31, 1.30], "spread_gb": 0.01}
    r.update(over)
    return r


def cpu_dry_run() -> dict:
    """What `gpu_claims.py --device cpu` writes: every CUDA counter absent."""
    r = gpu_run(device="cpu")
    for t in ("float16", "bfloat16"):
        r[f"cache_{t}"] = {k: {"allocations": None, "peak_allocated_gb": None, "reserved_over_allocated": None}
                           for k in ("dynamic", "static")}
        r[f"streams_{t}"] = {"one_stream_s": None, "side_stream_s": None}
        r[f"memory_calls_{t}"] = {"allocated_gb": None}
    return r


def verdicts(r: dict) -> dict[str, str]:
    return {c.claim_id: c.verdict for c in gc.claims(r)}


def test_a_gpu_run_gives_every_prepared_claim_a_row_by_rule():
    v = verdicts(gpu_run())
    assert set(v) == set(GPU_PREPARED)
    assert v == {"C14": "supported", "C15": "supported", "C27": "supported", "C28": "supported",
                 "C29": "partly supported", "C36": "not supported", "C47": "not supported", "C50": "supported"}


def test_a_cpu_dry_run_measures_no_cuda_claim():
    v = verdicts(cpu_dry_run())
    assert all(v[c] == "not testable here" for c in ("C27", "C28", "C29", "C47", "C50"))


@pytest.mark.parametrize("rule,args,expected", [
    (gc.first_token_verdict, (0.9,), "not supported"), (gc.first_token_verdict, (None,), "not testable here"),
    (gc.fp16_verdict, (102.0, 100.0), "inconclusive"), (gc.fp16_verdict, (90.0, 100.0), "not supported"),
    (gc.fp16_verdict, (0.0, 100.0), "not testable here"),
    (gc.allocation_cut_verdict, (1000, 900), "partly supported"), (gc.allocation_cut_verdict, (1000, 1200), "not supported"),
    (gc.allocation_cut_verdict, (0, 0), "not testable here"),  # an all-zero count is not evidence
    (gc.peak_memory_verdict, (5.0, 1.5), "supported"), (gc.peak_memory_verdict, (1.0, 1.2), "not supported"),
    (gc.fragmentation_verdict, ([1.2, 2.6],), "inconclusive"), (gc.fragmentation_verdict, ([None, None],), "not testable here"),
    (gc.stream_verdict, (0.020, 0.0199), "not supported"), (gc.stream_verdict, (0.0, 0.0), "not testable here"),
    (gc.training_verdict, ({"steps": 0, "error": "RuntimeError: CUDA error: an illegal memory access was encountered"},),
     "supported"),
    (gc.training_verdict, ({"steps": 0, "error": "OutOfMemoryError: ..."},), "inconclusive"),
    (gc.training_verdict, ({"steps": 0, "error": ""},), "inconclusive"),  # no error but no step either: nothing ran
    (gc.memory_creep_verdict, ([1.0, 1.9],), "partly supported"), (gc.memory_creep_verdict, ([1.0],), "not testable here"),
])
def test_each_rule_on_hand_made_values(rule, args, expected):
    assert rule(*args) == expected


def test_the_ledger_says_not_run_yet_until_a_gpu_run_exists_then_uses_it(tmp_path):
    folder = tmp_path / "claims"
    results.save_claims("05_kv_cache_budget", [Claim(
        claim="pre-allocation lowers peak memory by 3.2 GB", seed_section="A§3.4", seed_value="-3.2 GB", measured="-",
        n="-", setup="not run", verdict="not testable here", notebook="05_kv_cache_budget", claim_id="C29")],
        "default", folder=folder)
    absent = results.ledger(folder, gpu=tmp_path / "gpu_claims.json").set_index("claim_id")
    assert absent.loc["C14", "measured"].endswith("(not run yet: no benchmarks/results/gpu_claims.json)")
    assert absent.loc["C29", "notebook"] == "05_kv_cache_budget"
    (tmp_path / "gpu_claims.json").write_text(json.dumps(gpu_run()))
    led = results.ledger(folder, gpu=tmp_path / "gpu_claims.json")
    assert led["claim_id"].is_unique
    rows = led.set_index("claim_id").loc[list(GPU_PREPARED)]
    assert (rows["run"] == "gpu").all() and (rows["date"] == "2026-12-03").all()
    assert not rows["measured"].str.contains("not run yet").any()
    assert rows.loc["C14", "measured"] == "fused (float16) first token 0.050 s"
    assert rows.loc["C29", "verdict"] == "partly supported"  # the GPU run replaced notebook 05's placeholder row
