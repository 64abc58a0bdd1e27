"""KVComm's layers with and without an attention sink: the study's grid on tiny models (floor and skyline once, each
slave's four ways and the control), and the verdict rule on hand-made cells, degenerate ones included."""
from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from fusionlab.experiments import nb10_kvcomm_sink as ks, nb10_transfer_map as tm

from test_nll_transfer import corpus


def test_the_study_runs_each_slave_four_ways_with_floor_and_skyline_once(tiny, tmp_path):
    m = tiny("tiny-qwen2")
    docs = corpus(4)
    plan = tm.Plan(["noise:0"], ["tiny-llama"], 4, 40, 16, 5)
    texts = [d.text[:120] for d in corpus(5, "code")]
    seen = []
    cells = ks.run(m, ["noise:0", "tiny-llama"], plan, docs, tmp_path / "c.jsonl",
                   on_slave=lambda c: seen.append(len(c)), load_slave=tiny, texts=texts)
    assert seen == [4 * 2 + 4 * 4, 4 * 2 + 8 * 4]  # floor + skyline once; 3 ways + 1 control per slave
    assert set(cells["slave"].dropna()) == {"noise:0", "tiny"}
    assert cells[cells["role"].isin(["floor", "skyline"])]["slave"].isna().all()
    t = ks.table(cells)
    assert t["slave"].tolist() == ["noise:0", "tiny"] and (t["n"] == 4).all()
    assert set(t["verdict"]) <= {"the sink mends it", "a sink only", "no effect", "the sink hurts", "inconclusive"}
    first, second = (cells[cells["slave"].ne(s)] for s in ("tiny", "noise:0"))
    both = ks.with_earlier(second.reset_index(drop=True), first.reset_index(drop=True))
    assert ks.table(both)["slave"].tolist() == ["noise:0", "tiny"]  # a call for one slave keeps the other's rows
    assert ks.with_earlier(cells, None) is cells
    again = ks.run(m, ["noise:0"], plan, docs, tmp_path / "c.jsonl", load_slave=tiny, texts=texts)
    pd.testing.assert_frame_equal(again.drop(columns="seconds"),  # resumed: every cell read back
                                  cells[cells["slave"].ne("tiny")].reset_index(drop=True).drop(columns="seconds"))


def hand_made(kvcomm: float, sink: float, sink_only: float, control: float, floor: float = 3.0, sky: float = 2.0,
              n: int = 8) -> pd.DataFrame:
    """Cells for one slave 's' on n documents: each way's NLL on B, with a little per-document spread."""
    rng = np.random.default_rng(0)
    rows = []
    for d in range(n):
        e = rng.normal(0, 0.01)
        for name, role, nll, of in [("floor (no document)", "floor", floor, None),
                                    ("skyline (master reads it)", "skyline", sky, None),
                                    ("+s, KVComm layers", "cross", kvcomm, None),
                                    ("+s, KVComm layers + sink", "cross", sink, None),
                                    ("+s, KVComm layers + sink, shuffled doc", "control", control,
                                     "+s, KVComm layers + sink"),
                                    ("+s, sink only", "cross", sink_only, None)]:
            rows.append({"setting": name, "doc": f"d{d}", "domain": "english", "nll": nll + e, "role": role,
                         "control_of": of, "slaves": "s" if role in ("cross", "control") else "",
                         "slave": "s" if role in ("cross", "control") else None})
    return pd.DataFrame(rows)


@pytest.mark.parametrize("kvcomm,sink,sink_only,control,want", [
    (4.0, 2.5, 3.0, 3.0, "the sink mends it"),  # KVComm's layers hurt; with the sink they carry the document
    (4.0, 2.9, 2.9, 3.0, "a sink only"),  # the sink lifts it back, but no more than the sink alone does
    (4.0, 2.9, 3.0, 2.9, "a sink only"),  # ... or no more than a different document
    (2.5, 2.5, 3.0, 3.0, "no effect"),
    (2.5, 2.8, 3.0, 3.0, "the sink hurts"),
    (3.0, 3.0, 3.0, 3.0, "no effect"),
])
def test_the_verdict_rule_on_hand_made_cells(kvcomm, sink, sink_only, control, want):
    row = ks.table(hand_made(kvcomm, sink, sink_only, control)).iloc[0]
    assert row["verdict"] == want
    assert row["sink_gain"] == pytest.approx(kvcomm - sink, abs=1e-6)
    assert row["kvcomm_transfer"] == pytest.approx((3.0 - kvcomm) / 1.0, abs=0.05)


def test_degenerate_grids_are_inconclusive():
    flat = ks.table(hand_made(3.0, 3.0, 3.0, 3.0, floor=3.0, sky=3.0)).iloc[0]  # floor == skyline: no gap
    assert flat["verdict"] == "inconclusive" and not flat["gap"] > 0.05
    one = ks.table(hand_made(4.0, 2.5, 3.0, 3.0, n=1)).iloc[0]  # one document: no CI
    assert one["verdict"] == "inconclusive"
    assert ks.verdict({"gap": 1.0, "n": 8, "sink_gain_low": float("nan")}) == "inconclusive"
