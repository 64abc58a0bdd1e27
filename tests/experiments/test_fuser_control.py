"""The learned-fuser positive control: trained (validation by document, early stopping) and scored on held-out
offload chunks on a tiny master's exact copy, reloaded the second time; its verdict rule on hand-made rows."""
from __future__ import annotations

import pytest

import fusionlab as fl

from fusionlab.experiments import nb07_corpora as corpora, nb10_fuser_control as fc
from fusionlab.experiments.nb10_fuser_claims import (CONTROL_VERDICTS, channel_state, control_verdict,
                                                     failed_rung_fuser_claim, foreign_fuser_claim, fuser_control_claim)


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
    assert table["opening"].tolist() == ["zero", "log", "log"] and set(table["verdict"]) <= set(CONTROL_VERDICTS)
    assert (table["source"] == "trained now").all() and (table["docs"] >= 2).all()
    assert {"floor (master alone)", "skyline (master reads it)", "noise:0 fuser (log), other document",
            "noise:0 shuffled-pairing fuser", "noise:0 training-free (identity, g=1)"} <= set(nll["setting"])
    assert table["start_transfer"].iloc[0] == pytest.approx(1.0, abs=1e-3)  # the copy's channel: the skyline

    start = table[table["rung"] == "noise:0"].set_index("opening")["gate_start"]
    assert start["zero"] == 0 and start["log"] == 1.0  # closed; the warm start at full weight
    again = fc.measure(m, p, docs, foreign)[1]
    assert (again["source"] == "cache").all() and again["transfer"].tolist() == table["transfer"].tolist()


def row(**kw):
    base = {"lo": 0.5, "hi": 0.9, "control_hi": 0.1, "shuffled_hi": 0.2, "vs_start_lo": -0.2, "vs_start_hi": -0.05,
            "vs_control_lo": -0.6, "vs_control_hi": -0.3, "vs_shuffled_lo": -0.4, "vs_shuffled_hi": -0.1}
    return {**base, **kw}


@pytest.mark.parametrize("kw, want", [
    ({}, "opens and beats its start"),
    ({"vs_shuffled_hi": 0.05}, "inconclusive"),  # training alone (shuffled pairing) does as well: no information
    ({"vs_shuffled_lo": float("nan"), "vs_shuffled_hi": float("nan")}, "inconclusive"),  # its control diverged
    ({"lo": -0.1, "vs_start_lo": -0.1, "vs_start_hi": 0.1}, "inconclusive"),  # beats its controls, not the master
    ({"control_hi": 0.6, "shuffled_hi": 0.7}, "opens and beats its start"),  # CIs overlap, paired it wins
    ({"vs_start_lo": -0.1, "vs_start_hi": 0.05}, "keeps the channel"),
    ({"lo": 0.0, "vs_start_lo": 0.05, "vs_start_hi": 0.3}, "closes the channel"),
    ({"lo": 0.0, "vs_start_lo": -0.1, "vs_start_hi": 0.1}, "inconclusive"),
    ({"lo": 0.0, "hi": 0.0, "control_hi": 0.0, "vs_start_lo": 0.0, "vs_start_hi": 0.0, "vs_control_lo": 0.0,
      "vs_control_hi": 0.0, "vs_shuffled_lo": 0.0, "vs_shuffled_hi": 0.0}, "inconclusive"),  # all zero
])
def test_control_verdicts(kw, want):
    assert control_verdict(row(**kw)) == want


def fuser_row(rung, opening, start, **kw):
    return {"rung": rung, "opening": opening, "start": start, "n": 24, "docs": 13, "transfer": 0.7,
            "start_transfer": 0.66, "start_lo": 0.5, "start_hi": 0.8, "control_transfer": 0.0,
            "shuffled_transfer": 0.05, **row(**kw)}


def table(*rows):
    import pandas as pd
    return pd.DataFrame(list(rows))


def test_x06_needs_an_opening_that_carries_on_every_rung():
    carry, close = {}, {"lo": 0.0, "vs_start_lo": 0.05, "vs_start_hi": 0.3}
    both = table(fuser_row("noise:0", "zero", "identity", **close), fuser_row("noise:0.1", "zero", "identity", **close),
                 fuser_row("noise:0", "log", "identity", **carry), fuser_row("noise:0.1", "log", "identity", **carry))
    assert fuser_control_claim(both).verdict == "supported" and fuser_control_claim(both).claim_id == "X06"
    some = table(fuser_row("noise:0", "log", "identity", **carry), fuser_row("noise:0.1", "log", "identity", **close))
    assert fuser_control_claim(some).verdict == "partly supported"
    shut = table(fuser_row("noise:0", "log", "identity", **close))
    assert fuser_control_claim(shut).verdict == "not supported"
    zero = table(fuser_row("noise:0", "log", "identity", lo=0.0, hi=0.0, control_hi=0.0, shuffled_hi=0.0,
                           vs_start_lo=0.0, vs_start_hi=0.0, vs_control_lo=0.0, vs_control_hi=0.0,
                           vs_shuffled_lo=0.0, vs_shuffled_hi=0.0))
    assert fuser_control_claim(zero).verdict == "inconclusive"  # an all-zero row is no evidence either way
    assert fuser_control_claim(table(fuser_row("smollm2", "log", "lstsq"))).verdict == "inconclusive"  # no sibling


def test_x07_counts_only_beside_a_positive_control():
    ok = fuser_row("noise:0", "log", "identity")
    null = fuser_row("smollm2", "log", "lstsq", lo=-0.2, hi=0.1, control_hi=0.1, vs_control_hi=0.05)
    assert foreign_fuser_claim(table(ok, null)).verdict == "not supported"
    assert foreign_fuser_claim(table(ok, fuser_row("gemma3", "log", "lstsq"))).verdict == "supported"
    assert foreign_fuser_claim(table(null)).verdict == "inconclusive"  # no positive control beside it
    assert "no positive control" in foreign_fuser_claim(table(null)).measured


def test_a_rungs_channel_state_comes_from_its_measured_start():
    assert channel_state(fuser_row("noise:0", "log", "identity")) == "works"
    assert channel_state(fuser_row("noise:0.2", "log", "identity", start_lo=-2.0, start_hi=-0.5)) == "failed"
    assert channel_state(fuser_row("noise:0.2", "log", "identity", start_lo=-0.1, start_hi=0.4)) == "partial"
    assert channel_state(fuser_row("gemma3", "log", "lstsq", start_lo=-3.0, start_hi=-1.0)) == "foreign"


def test_x06_leaves_out_rungs_whose_channel_failed_and_x09_judges_them_beside_it():
    ok = fuser_row("noise:0", "log", "identity")
    failed = dict(start_lo=-2.0, start_hi=-0.5)
    shut = fuser_row("noise:0.2", "log", "identity", lo=-0.3, hi=0.1, control_hi=0.1, vs_start_lo=-2.0,
                     vs_start_hi=-1.0, vs_control_hi=0.05, **failed)
    assert fuser_control_claim(table(ok, shut)).verdict == "supported"  # the failed rung is not X06's question
    x09 = failed_rung_fuser_claim(table(ok, shut))
    assert x09.claim_id == "X09" and x09.verdict == "not supported" and "noise:0.2 (log)" in x09.measured
    carries = fuser_row("noise:0.2", "log", "identity", lo=0.3, hi=0.6, control_hi=0.2, shuffled_hi=0.25, **failed)
    assert failed_rung_fuser_claim(table(ok, carries)).verdict == "supported"
    between = fuser_row("noise:0.2", "log", "identity", lo=0.1, hi=0.6, control_hi=0.2, vs_control_hi=0.02, **failed)
    assert failed_rung_fuser_claim(table(ok, between)).verdict == "inconclusive"
    assert failed_rung_fuser_claim(table(carries)).verdict == "inconclusive"  # no positive control beside it
    none = failed_rung_fuser_claim(table(ok))
    assert none.verdict == "inconclusive" and none.measured.startswith("no sibling rung whose training-free channel")
    assert failed_rung_fuser_claim(table()).verdict == "inconclusive"  # an empty table is no evidence


def test_the_log_fuser_starts_exactly_at_the_rungs_training_free_channel(tiny):
    import torch
    from fusionlab.models.siblings import sibling
    from fusionlab.training.fuser import LearnedFuser

    m = tiny("tiny-qwen2")
    sib = sibling(m, "noise:0.1")
    start = fc.identity_start(m, sib)
    fuser = LearnedFuser(start, fc.config_for(fc.control_plan("quick"), "log"))
    doc, text = "Rivers, harbours and old maps of the town. " * 4, "The committee chose a city for the conference."
    logits = []
    for proj in (start, fuser):
        with fl.fuse(m, [fl.Slave(sib, layer_map=start.layer_map, projector=proj, mode="concat", align="mean")]) as f:
            logits.append(f(text, context=doc))
    assert torch.allclose(logits[0], logits[1], atol=1e-5)  # gate 1, key scale 1, residual 0: the rung itself


def test_a_diverged_shuffled_control_is_recorded_and_never_beaten(tiny, monkeypatch, tmp_path):
    from fusionlab.training.loop import TrainingDiverged

    monkeypatch.setattr(fc, "cache_dir", lambda: tmp_path)
    real = fc.obtain

    def flaky(*args, source="slave"):
        if source == "shuffled":
            raise TrainingDiverged("training diverged at step 0 (loss 7.3); the last good checkpoint is kept")
        return real(*args, source=source)

    monkeypatch.setattr(fc, "obtain", flaky)
    m = tiny("tiny-qwen2")
    docs = corpora.code_docs()[:12] + corpora.english_docs()
    _, table, _ = fc.measure(m, fc.control_plan("quick"), docs)
    row = table.iloc[0]
    assert row["shuffled_diverged"].startswith("training diverged at step 0") and row["shuffled_hi"] != row["shuffled_hi"]
    assert row["verdict"] not in ("opens and beats its start", "keeps the channel")
