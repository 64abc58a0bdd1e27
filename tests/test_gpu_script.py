"""benchmarks/gpu_claims.py runs end to end (CPU dry run on tiny models), so the script a lent GPU gets is not untried."""
from __future__ import annotations

import importlib.util
import json

from fusionlab.paths import clone_root


def test_gpu_claims_script_dry_run_on_cpu(tmp_path):
    spec = importlib.util.spec_from_file_location("gpu_claims", clone_root() / "benchmarks" / "gpu_claims.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    out = tmp_path / "gpu.json"
    mod.main(["--device", "cpu", "--tokens", "4", "--master", "tiny-qwen2", "--slave", "tiny-llama",
              "--prompt-chars", "200", "--dtypes", "float32", "bfloat16", "--out", str(out)])
    r = json.loads(out.read_text())
    for dtype in ("float32", "bfloat16"):  # fusionlab refuses fp16 on CPU; the GPU run uses float16 and bfloat16
        assert r[f"fused_{dtype}"]["first_token_s"] > 0 and r[f"fused_{dtype}"]["decode_tok_s"] > 0
        assert set(r[f"cache_{dtype}"]) == {"dynamic", "static"}
        assert r[f"cache_{dtype}"]["static"]["allocations"] is None  # CUDA counters only on a GPU
    assert r["training"]["error"] == "" and r["training"]["steps"] >= 1  # C36's training path runs
    assert r["streams_float32"] == {"one_stream_s": None, "side_stream_s": None}  # streams: CUDA only


def test_gpu_batch_script_dry_run_on_cpu(tmp_path):
    import sys

    sys.path.insert(0, str(clone_root() / "benchmarks"))
    spec = importlib.util.spec_from_file_location("gpu_batch", clone_root() / "benchmarks" / "gpu_batch.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    out = tmp_path / "batch.json"
    mod.main(["--device", "cpu", "--dtype", "float32", "--master", "tiny-qwen2", "--slave", "tiny-llama",
              "--batches", "1", "2", "--steps", "2", "--max-reps", "3", "--out", str(out)])
    r = json.loads(out.read_text())
    a = r["anchors"]
    assert a["no_slave"] == 0 and a["self_fusion_live"] < 1e-4 and a["replace_self"] < 1e-4
    assert a["theta_shifted_rerotated_layer0"] < 1e-4 and a["batch_rows_vs_alone_max"] < 1e-4 and a["batch_greedy_equal"]
    assert set(r["batch_decode"]) == {"1", "2"} and r["batch_decode"]["2"]["fused_tok_s"] > 0
