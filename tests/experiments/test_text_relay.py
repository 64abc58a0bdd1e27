"""The text relay beside the offload: the floor and skyline score as 'read this text, then B' does, a relay's
control reads the note on *another* document (never its own), notes are cached per writer and text, relay rows join
the transfer table (vs_relay), and the relay rule and X05 on hand-made rungs, degenerate ones included."""
from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from fusionlab.engine.fuse import fuse
from fusionlab.experiments import nb10_claims as c10, nb10_nll_transfer as nll, nb10_text_relay as relay
from fusionlab.experiments import nb10_transfer_map as tm
from fusionlab.models.siblings import sibling

from test_nll_transfer import corpus, frame


def test_floor_and_skyline_are_text_then_b(tiny):
    m = tiny("tiny-qwen2")
    p = nll.pairs(m.tokenizer, corpus(3), 40, 16)[0]
    with fuse(m, []) as f:
        assert nll.nll_after(f, "", p.part_b) == nll.nll_of(f, p, "nothing")
        assert nll.nll_after(f, p.part_a, p.part_b) == nll.nll_of(f, p, "itself")
        assert nll.nll_after(f, p.other_a, p.part_b) != nll.nll_of(f, p, "itself")


def test_relay_rows_their_control_reads_another_documents_note_and_notes_are_cached(tiny, tmp_path):
    m = tiny("tiny-qwen2")
    ps = nll.pairs(m.tokenizer, corpus(4), 40, 16)
    writer = sibling(m, "noise:0.1")
    cache = tmp_path / "c.jsonl"
    df = relay.run(m, ps, [relay.Relay("noise:0.1", writer, tokens=6)], cache)
    assert set(df["role"]) == {"relay", "control"} and len(df) == 2 * len(ps)
    assert set(df["slaves"]) == {"noise:0.1"}
    with fuse(writer, []) as f:  # the note is the writer's own greedy answer to the note prompt, at the budget
        want = f.generate(relay.NOTE_PROMPT.format(text=ps[0].part_a), max_new_tokens=6, chat=True)
    assert df[(df["role"] == "relay") & (df["doc"] == ps[0].doc)]["note"].iloc[0] == want
    own = df[df["role"] == "relay"].set_index("doc")["note"]
    ctrl = df[df["role"] == "control"].set_index("doc")["note"]
    for p in ps:
        assert ctrl[p.doc] == own[p.other_doc]  # the other document's note, written once
    lines = cache.read_text().count("\n")
    again = relay.run(m, ps, [relay.Relay("noise:0.1", writer, tokens=6)], cache)
    assert cache.read_text().count("\n") == lines and again["nll"].equals(df["nll"])


def test_ladder_with_relay_reports_it_beside_the_offload(tiny, tmp_path):
    m = tiny("tiny-qwen2")
    ps = nll.pairs(m.tokenizer, corpus(4), 40, 16)
    cells = tm.nll_ladder(m, ["noise:0"], {}, ps, tmp_path / "c.jsonl", relay_tokens=4)
    tr = nll.transfer(cells).set_index("setting")
    assert "noise:0 text relay" in tr.index and tr.loc["noise:0 text relay", "role"] == "relay"
    kv = tr.loc["+noise:0"]
    relay_nll = cells[cells["setting"] == "noise:0 text relay"].set_index("doc")["nll"]
    offload = cells[cells["setting"] == "+noise:0"].set_index("doc")["nll"]
    assert kv["vs_relay"] == pytest.approx(float((relay_nll - offload[relay_nll.index]).mean()))
    assert not np.isnan(tr.loc["noise:0 text relay", "vs_control"])  # the relay has its own control


def with_relay(cells: pd.DataFrame, relay_nll: np.ndarray) -> pd.DataFrame:
    docs = cells[cells["role"] == "floor"]["doc"].tolist()
    extra = [{"setting": "s text relay", "role": "relay", "doc": d, "nll": v, "control_of": None, "slaves": "s"}
             for d, v in zip(docs, relay_nll)]
    return pd.concat([cells, pd.DataFrame(extra)], ignore_index=True)


def test_vs_relay_arithmetic_and_ladder_table_columns():
    rng = np.random.default_rng(2)
    f = 3 + rng.normal(0, 0.1, 16)
    cells = with_relay(frame(f, f - 1, f - 0.5, f, f, f - 1), f - 0.2)
    tr = nll.transfer(cells).set_index("setting")
    assert tr.loc["+s", "vs_relay"] == pytest.approx(0.3) and tr.loc["+s", "vs_relay_low"] > 0
    assert tr.loc["s text relay", "transfer"] == pytest.approx(0.2)
    assert "vs_relay" not in tr.columns or np.isnan(tr.loc["s text relay", "vs_relay"])  # never vs itself
    div = pd.DataFrame([{"recipe": "s", "kl": 0.1, "kl_low": 0.05, "kl_high": 0.2, "k_identity": 0.9,
                         "v_identity": 0.8, "k_lstsq": 0.95, "v_lstsq": 0.85}])
    t = tm.ladder_table(cells, div, ["s"])
    assert len(t) == 1 and t.iloc[0]["relay_transfer"] == pytest.approx(0.2)
    assert c10.relay_verdict(t.iloc[0].to_dict()) == "K/V beats the relay"


def rung(slave="s", n=30, gap_low=0.2, vs_relay=0.1, vs_relay_low=0.05, vs_relay_high=0.15):
    return {"slave": slave, "n": n, "gap_low": gap_low, "transfer": 0.5, "relay_transfer": 0.3,
            "vs_relay": vs_relay, "vs_relay_low": vs_relay_low, "vs_relay_high": vs_relay_high}


LOSE = {"vs_relay": -0.1, "vs_relay_low": -0.15, "vs_relay_high": -0.05}
TIE = {"vs_relay": 0.0, "vs_relay_low": -0.05, "vs_relay_high": 0.05}


@pytest.mark.parametrize("kw, want", [
    ({}, "K/V beats the relay"),
    (LOSE, "the relay beats K/V"),
    (TIE, "no difference"),
    ({"n": c10.MIN_DOCS - 1}, "too few to judge"),
    ({"gap_low": 0.0, "vs_relay": 0.0, "vs_relay_low": 0.0, "vs_relay_high": 0.0}, "no gap to transfer"),
    ({"vs_relay_low": float("nan"), "vs_relay_high": float("nan")}, "no relay measured"),
])
def test_relay_rules(kw, want):
    assert c10.relay_verdict(rung(**kw)) == want


def test_relay_claim_skips_the_exact_copy_and_reads_degenerate_ladders_as_no_evidence():
    copy_loses = rung("noise:0", **LOSE)  # the copy is not judged: K/V reads the document itself there
    assert c10.relay_claim(pd.DataFrame([copy_loses, rung("int8"), rung("int4")])).verdict == "supported"
    assert c10.relay_claim(pd.DataFrame([rung("noise:0"), rung("int8"), rung("smollm2", **LOSE)])).verdict == \
        "partly supported"
    assert c10.relay_claim(pd.DataFrame([rung("noise:0"), rung("int8", **LOSE), rung("x", **TIE)])).verdict == \
        "not supported"
    assert c10.relay_claim(pd.DataFrame([rung("noise:0"), rung("int8", **TIE)])).verdict == "inconclusive"
    zero = {"gap_low": 0.0, "vs_relay": 0.0, "vs_relay_low": 0.0, "vs_relay_high": 0.0}
    dead = pd.DataFrame([rung("noise:0", **zero), rung("int8", **zero), rung("int4", **zero)])
    assert c10.relay_claim(dead).verdict == "inconclusive"
    assert c10.relay_claim(pd.DataFrame([rung("noise:0")])).verdict == "inconclusive"  # nothing beyond the copy
    claim = c10.relay_claim(pd.DataFrame([rung("noise:0"), rung("int8")]))
    assert claim.claim_id == "X05" and "int8 K/V 0.50 vs relay 0.30" in claim.measured
    no_relay = {"vs_relay": float("nan"), "vs_relay_low": float("nan"), "vs_relay_high": float("nan")}
    bus = c10.relay_claim(pd.DataFrame([rung("noise:0"), rung("int8"), rung("smollm2,gemma3", **no_relay)]))
    assert bus.verdict == "supported" and "nan" not in bus.measured and "1 rungs" in bus.n
    assert bus.measured.endswith("no relay measured for smollm2,gemma3 (share of the NLL gap closed; advantage = "
                                 "relay NLL - K/V NLL, nats/token)")


def acc_rung(n=120, floor=0.0, skyline=1.0, ceiling=0.5, offload=0.0, relay=0.3, p_vs_relay=1e-6):
    return {"n": n, "floor": floor, "skyline": skyline, "ceiling": ceiling, "offload": offload, "relay": relay,
            "p_vs_relay": p_vs_relay}


@pytest.mark.parametrize("kw, want", [
    ({}, "the relay beats K/V"),
    ({"offload": 0.9}, "K/V beats the relay"),
    ({"p_vs_relay": 0.2}, "no difference"),
    ({"offload": 0.3, "p_vs_relay": 1.0}, "no difference"),
    ({"n": 5}, "too few to judge"),
    ({"skyline": 0.0, "ceiling": 0.0, "relay": 0.0, "p_vs_relay": 1.0}, "no gap to transfer"),  # an all-zero grid
    ({"ceiling": 0.0, "relay": 0.0, "p_vs_relay": 1.0}, "the slave never knew"),
    ({"relay": float("nan"), "p_vs_relay": float("nan")}, "no relay measured"),
])
def test_accuracy_relay_rules(kw, want):
    assert c10.accuracy_relay_verdict(acc_rung(**kw)) == want
    assert want in c10.ACCURACY_RELAY_VERDICTS


def test_an_empty_note_is_scored_never_a_crash(tiny, tmp_path):
    m = tiny("tiny-qwen2")
    ps = nll.pairs(m.tokenizer, corpus(3), 40, 16)
    df = relay.run(m, ps, [relay.Relay("noise:0", m, tokens=0)], tmp_path / "c.jsonl")
    assert (df["note"] == "").all() and (df["note_tokens"] == 0).all() and df["nll"].notna().all()
    with fuse(m, []) as f:  # what the master read: the head alone, then B
        assert df["nll"].iloc[0] == pytest.approx(nll.nll_after(f, relay.NOTE_HEAD + "\n\n", ps[0].part_b))
