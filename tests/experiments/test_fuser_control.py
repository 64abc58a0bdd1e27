"""The learned-fuser positive control: trained (validation by document, early stopping) and scored on held-out
offload chunks on a tiny master's exact copy, reloaded the second time; its verdict rule on hand-made rows."""
from __future__ import annotations

import pytest

import fusionlab as fl

from fusionlab.experiments import nb07_corpora as corpora, nb10_fuser_control as fc


def test_the_control_trains_scores_and_reloads(tiny, monkeypatch, tmp_path):
    monkeypatch.setattr(fc, "cache_dir", lambda: tmp_path)
    m = tiny("tiny-qwen2")
    p = fc.control_plan("quick")
    p.openings = ["zero", "log"]
    docs = corpora.code_docs()[:12] + corpora.english_docs()
    llama = tiny("tiny-llama")
    foreign = {"llama": (llama, fl.fit_lstsq(m, llama, texts=[d.text[:2000] for d in docs[:4]], holdout_every=0))}
    nll, table, hist = fc.measure(m, p, docs, foreign)
    assert table["rung"].tolist() == ["noise:0", "noise:0", "llama"] and table["start"].tolist() == \
        ["identity", "identity", "lstsq"]
    assert table["opening"].tolist() == ["zero", "log", "log"] and set(table["verdict"]) <= set(fc.VERDICTS)
    assert (table["source"] == "trained now").all() and (table["docs"] >= 2).all()
    assert {"floor (master alone)", "skyline (master reads it)", "noise:0 fuser (log), other document",
            "noise:0 shuffled-pairing fuser", "noise:0 training-free (identity, g=1)"} <= set(nll["setting"])
    assert table["start_transfer"].iloc[0] == pytest.approx(1.0, abs=1e-3)  # the copy's channel: the skyline
    start = table[table["rung"] == "noise:0"].set_index("opening")["gate_start"]
    assert start["zero"] == 0 and start["log"] == pytest.approx(0.1353, abs=1e-4)  # closed; exp(-2)
    again = fc.measure(m, p, docs, foreign)[1]
    assert (again["source"] == "cache").all() and again["transfer"].tolist() == table["transfer"].tolist()


def row(**kw):
    base = {"lo": 0.5, "hi": 0.9, "control_hi": 0.1, "shuffled_hi": 0.2, "vs_start_lo": -0.2, "vs_start_hi": -0.05}
    return {**base, **kw}


@pytest.mark.parametrize("kw, want", [
    ({}, "opens and beats its start"),
    ({"shuffled_hi": 0.6}, "inconclusive"),  # training alone (shuffled pairing) does as well: no information shown
    ({"vs_start_lo": -0.1, "vs_start_hi": 0.05}, "keeps the channel"),
    ({"lo": 0.0, "vs_start_lo": 0.05, "vs_start_hi": 0.3}, "closes the channel"),
    ({"lo": 0.0, "vs_start_lo": -0.1, "vs_start_hi": 0.1}, "inconclusive"),
    ({"lo": 0.0, "hi": 0.0, "control_hi": 0.0, "vs_start_lo": 0.0, "vs_start_hi": 0.0}, "inconclusive"),  # all zero
])
def test_control_verdicts(kw, want):
    assert fc.control_verdict(row(**kw)) == want
