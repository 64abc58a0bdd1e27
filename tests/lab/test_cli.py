"""The fusionlab CLI: align, kv, models; errors print one line and exit 2."""
from __future__ import annotations

import pandas as pd
import pytest

from fusionlab import kv
from fusionlab.experiments import nb10_nll_stage as stage
from fusionlab.lab import readme, results
from fusionlab.lab.cli import main
from fusionlab.models.tiny import tiny_config


def test_align(capsys):
    assert main(["align", "tiny-qwen2", "tiny-gemma3"]) == 0
    out = capsys.readouterr().out
    assert "alignment tiny-gemma3 -> tiny-qwen2: OK" in out and "lstsq projector" in out


def test_kv(capsys, tmp_path):
    assert main(["kv", "tiny-gemma3", "--seq", "100", "--dtype", "float32"]) == 0
    out = capsys.readouterr().out
    want = kv.budget(tiny_config("tiny-gemma3"), 100, dtype="float32").total_bytes
    assert f"total: {want:,} bytes" in out and "sliding_attention" in out
    cfg = tmp_path / "c.json"
    cfg.write_text('{"num_hidden_layers": 40, "num_attention_heads": 40, "num_key_value_heads": 32, "head_dim": 128}')
    assert main(["kv", str(cfg), "--seq", "32768"]) == 0
    assert "21,474,836,480 bytes" in capsys.readouterr().out


def test_errors_exit_2(capsys):
    assert main(["kv", "tiny-qwen2", "--seq", "0"]) == 2
    assert "seq_len and batch must be positive" in capsys.readouterr().err
    assert main(["align", "nope", "tiny-qwen2"]) == 2
    assert "unknown model 'nope'" in capsys.readouterr().err


def test_an_offload_stage_at_a_length_outside_the_plan_exits_2(capsys):
    assert main(["offload-stage", "--length", "999", "--master", "tiny-qwen2"]) == 2
    assert "length=999 is not in the plan's lengths [256, 1024, 2048]" in capsys.readouterr().err


def test_an_nll_stage_with_a_rung_outside_the_plan_exits_2(capsys):
    assert main(["nll-stage", "--rungs", "noise:0.5", "--master", "tiny-qwen2"]) == 2
    assert "rungs=['noise:0.5'] are not in the plan" in capsys.readouterr().err


def test_an_nll_stage_saves_its_tables_and_its_crossing_after_each_rung(monkeypatch, tmp_path, capsys):
    """The stage itself is tested in test_nll_transfer; here: what the command saves after a rung."""
    cells = pd.DataFrame([{"setting": s, "doc": d, "nll": v, "role": r} for d in range(2) for s, v, r in
                          [("floor (no document)", 3.0, "floor"), ("skyline (master reads it)", 2.0, "skyline"),
                           ("+noise:0", 2.0, "cross"), ("+noise:0.1", 2.8, "cross")]])
    div = pd.DataFrame({"recipe": ["noise:0", "noise:0.1"], "kl": [0.0, 1.0]})
    table = pd.DataFrame({"slave": ["noise:0"], "transfer": [1.0]})

    def fake_stage(master, rungs, on_rung, earlier):
        on_rung(cells, div, table)
        return table

    monkeypatch.setattr(results, "results_dir", lambda: tmp_path)
    monkeypatch.setattr(stage, "run_nll_stage", fake_stage)
    monkeypatch.setattr(readme, "write_ledger", lambda: None)
    monkeypatch.setattr("fusionlab.experiments.nb10_transfer_map.summary", lambda t: t)
    assert main(["nll-stage", "--rungs", "noise:0.1", "--master", "tiny-qwen2"]) == 0
    got = {k: pd.read_csv(tmp_path / f"10_nll_stage_{k}.full.csv") for k in ("cells", "divergence", "map", "crossing")}
    assert len(got["cells"]) == 8 and got["crossing"].iloc[0]["family"] == "noise:0,noise:0.1"
    # transfer 1.0 -> 0.2 between KL 0 and 1, interpolated linearly from the copy at KL 0
    assert got["crossing"].iloc[0]["crossing"] == pytest.approx(0.625)
