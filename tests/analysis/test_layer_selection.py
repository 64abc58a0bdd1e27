"""KVComm's layer selection: the ranking rule on hand-made scores, and the scores measured on a tiny fused model."""
from __future__ import annotations

import pandas as pd
import pytest

import fusionlab as fl
from fusionlab.analysis.layer_selection import kvcomm_rank, kvcomm_select, restrict, slot_mass_by_layer
from fusionlab.errors import FusionLabError

DOC = "The archive keeps 217 maps of the valley, and the harbour office keeps the rest of them."


def test_rank_top_fraction_plus_layer_zero():
    s = pd.Series([0.1, 0.9, 0.2, 0.8, 0.3, 0.05, 0.7, 0.6, 0.4, 0.5], index=range(10))
    assert kvcomm_rank(s, top=0.3) == [0, 1, 3, 6]  # ceil(0.3 * 10) = 3 best, and layer 0 always
    assert kvcomm_rank(s, top=0.3, always=()) == [1, 3, 6]
    assert kvcomm_rank(s, top=1.0) == list(range(10))
    flat = pd.Series([0.5] * 4, index=[2, 3, 4, 5])  # ties: the lower layers first; layer 0 not scored, not added
    assert kvcomm_rank(flat, top=0.5) == [2, 3]


def test_rank_prior_and_bad_input():
    s = pd.Series([0.0] * 9, index=range(9))
    assert kvcomm_rank(s, top=0.1, alpha=0.0, mu=1.0, always=()) == [8]  # ceil(0.9) = 1  # all-prior, centred at the deepest layer
    for bad in (dict(top=0), dict(top=1.5), dict(alpha=2)):
        with pytest.raises(FusionLabError):
            kvcomm_rank(s, **bad)
    with pytest.raises(FusionLabError, match="no layer scores"):
        kvcomm_rank(pd.Series(dtype=float))
    with pytest.raises(FusionLabError, match=r"layers \[9\] are not in the layer map"):
        restrict(fl.LayerMap.identity(4, 4), [9], "x")


def test_scores_and_selection_on_a_tiny_pair(tiny):
    m, s = tiny("tiny-qwen2"), tiny("tiny-qwen2", fresh=True)
    samples = [(" Where are the maps?", DOC), (" How many maps?", DOC + " More text.")]
    with fl.fuse(m, [fl.Slave(s)]) as f:
        df = slot_mass_by_layer(f, samples)
        maps, scores = kvcomm_select(f, samples, top=0.5)
    assert set(df["layer"]) == {0, 1, 2, 3} and len(df) == 8 and df["mass"].between(0, 1).all()
    assert (df["mass"] > 0).all() and scores.equals(df)
    best = df.groupby("layer")["mass"].mean().sort_values(ascending=False).index[:2].tolist()
    assert sorted(maps[0].pairs) == sorted(set(best) | {0}) and maps[0].strategy == "kvcomm top 50%"
