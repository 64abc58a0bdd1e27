"""NLL transfer on the ladder: the exact anchor (an exact-copy slave reading A predicts B as the master reading A
does), controls that cannot read their own document, the transfer arithmetic and the rules on hand-made rungs
(an all-zero grid, a slave that never knew, a null without a ceiling), the ledger rows X03 / X04, and the other
channels of a rung (through lstsq, KVComm's layers) as columns of its row, each with its own cells and control."""
from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest

from fusionlab.errors import FusionLabError
from fusionlab.experiments import nb10_claims as c10, nb10_nll_transfer as nll, nb10_transfer_map as tm
from fusionlab.experiments.nb07_corpora import Doc
from fusionlab.lab.results import load_table, save_table

WORDS = "river harbour lantern copper meadow signal orchard violet granite falcon".split()


def corpus(n: int, domain: str = "english") -> list[Doc]:
    """Documents with disjoint vocabularies: a control that read its own document would be caught by the test."""
    return [Doc(domain, f"{domain}{i}", " ".join(f"{WORDS[i % len(WORDS)]}{domain}{i} said {k}." for k in range(80)),
                "heldout")
            for i in range(n)]


def test_pairs_split_at_token_offsets_and_derange_documents(tiny):
    m = tiny("tiny-qwen2")
    docs = corpus(5) + corpus(3, "code") + corpus(1, "chinese")
    ps = nll.pairs(m.tokenizer, docs, 40, 16)
    assert {p.domain for p in ps} == {"english", "code"}  # one chinese document: no control, left out
    for p in ps:
        assert p.other_doc != p.doc and p.part_b not in p.other_a
        assert next(d for d in docs if d.name == p.other_doc).domain == p.domain
        assert len(m.encode(p.part_a, special_tokens=False)[0]) == pytest.approx(40, abs=1)
        assert (p.part_a + p.part_b) in next(d.text for d in docs if d.name == p.doc)
    assert len(nll.pairs(m.tokenizer, docs, 40, 16, per_domain=2)) == 4
    with pytest.raises(FusionLabError, match="a_tokens"):
        nll.pairs(m.tokenizer, docs, 5000, 16)


@pytest.mark.parametrize("arch", ["tiny-qwen2", "tiny-llama", "tiny-gemma3"])
def test_exact_copy_slave_predicts_b_as_the_master_reading_a(tiny, tmp_path, arch):
    m = tiny(arch)
    ps = nll.pairs(m.tokenizer, corpus(4), 40, 16)
    cells = tm.nll_ladder(m, ["noise:0", "noise:0.1"], {}, ps, tmp_path / "c.jsonl")
    wide = cells.pivot_table(index="doc", columns="setting", values="nll")
    assert np.allclose(wide["+noise:0"], wide["skyline (master reads it)"], atol=1e-4)
    assert not np.allclose(wide["+noise:0, shuffled doc"], wide["+noise:0"], atol=1e-3)
    ceil = cells[cells["setting"] == "noise:0 alone (reads it)"].set_index("doc")
    assert np.allclose(ceil["nll"], wide["skyline (master reads it)"], atol=1e-4)
    assert np.allclose(ceil["nll_alone"], wide["floor (no document)"], atol=1e-4)
    again = tm.nll_ladder(m, ["noise:0", "noise:0.1"], {}, ps, tmp_path / "c.jsonl")  # resumed: all cached
    assert again["nll"].equals(cells["nll"])
    tr = nll.transfer(cells).set_index("slaves")
    assert tr.loc["noise:0", "transfer"] == pytest.approx(1, abs=1e-3) or tr.loc["noise:0", "gap"] == pytest.approx(0, abs=1e-4)


def frame(floor, sky, fused, ctrl, own_alone, own):
    rows = []
    for i in range(len(floor)):
        rows += [{"setting": "floor", "role": "floor", "doc": f"d{i}", "nll": floor[i], "control_of": None, "slaves": ""},
                 {"setting": "sky", "role": "skyline", "doc": f"d{i}", "nll": sky[i], "control_of": None, "slaves": ""},
                 {"setting": "+s", "role": "cross", "doc": f"d{i}", "nll": fused[i], "control_of": None, "slaves": "s"},
                 {"setting": "+s, ctrl", "role": "control", "doc": f"d{i}", "nll": ctrl[i], "control_of": "+s",
                  "slaves": "s"},
                 {"setting": "s alone", "role": "ceiling", "doc": f"d{i}", "nll": own[i], "nll_alone": own_alone[i],
                  "control_of": None, "slaves": "s"}]
    return pd.DataFrame(rows)


def test_transfer_arithmetic_on_hand_made_documents():
    rng = np.random.default_rng(0)
    f = 3 + rng.normal(0, 0.1, 20)
    k = f - 1
    half = f - 0.5
    tr = nll.transfer(frame(f, k, half, f, f, k)).iloc[0]
    assert tr["transfer"] == pytest.approx(0.5) and tr["lo"] <= 0.5 <= tr["hi"] and tr["n"] == 20
    assert tr["vs_control"] == pytest.approx(0.5) and tr["ceiling_share"] == pytest.approx(1)
    assert c10.nll_rung_verdict({**tr, "slave": "s"}) == "transfers"
    zero = nll.transfer(frame(*(np.zeros(20),) * 6)).iloc[0]  # an all-zero grid: undefined, never a division by 0
    assert math.isnan(zero["transfer"]) and c10.nll_rung_verdict(dict(zero)) == "no gap to transfer"


def test_transfer_beyond_the_skyline_is_traced_to_its_domain():
    """A pooled transfer above 1 is split by domain: the domain whose slots beat the master reading A itself is named,
    one at the skyline is not, and a domain with fewer than MIN_DOCS documents gets no verdict however narrow its
    CI; no rung above 1, no sentence."""
    rng = np.random.default_rng(1)
    parts = []
    for dom, n, extra in (("chinese", 12, 0.3), ("code", 12, 0.0), ("english", c10.MIN_DOCS - 1, 0.3)):
        f = 3 + rng.normal(0, 0.1, n)
        k = f - 1
        noise = rng.normal(0, 0.1, n)
        part = frame(f, k, k - extra + noise - noise.mean(), f, f, k)
        part["doc"] = dom + part["doc"]
        parts.append(part.assign(domain=dom))
    cells = pd.concat(parts, ignore_index=True)
    by = nll.transfer_by_domain(cells).set_index("domain")
    assert list(by["n"]) == [12, 12, c10.MIN_DOCS - 1]
    assert by.loc["chinese", "transfer"] == pytest.approx(1.3) and by.loc["code", "transfer"] == pytest.approx(1.0)
    verdicts = {d: c10.domain_verdict(r) for d, r in by.iterrows()}
    assert verdicts == {"chinese": "beyond the skyline", "code": "at the skyline", "english": "too few to judge"}
    table = nll.transfer(cells).assign(slave="s")
    assert table["lo"].iloc[0] > 1
    text = c10.beyond_skyline_sentence(table, by.reset_index())
    assert ": s 1.19 [" in text and "chinese 1.30 [" in text and "(n=12, beyond the skyline)" in text
    assert f"(n={c10.MIN_DOCS - 1}, too few to judge)" in text and "code 1.00 [" in text
    assert c10.beyond_skyline_sentence(table.assign(lo=0.9), by.reset_index()) == ""
    assert c10.domain_verdict({"n": 12, "lo": float("nan"), "hi": float("nan")}) == "too few to judge"


def rung(slave="s", n=30, gap_low=0.2, ceiling_gap_low=0.1, lo=0.4, hi=0.8, vs_control_low=0.05, transfer=0.6):
    return {"slave": slave, "n": n, "gap_low": gap_low, "ceiling_gap_low": ceiling_gap_low, "lo": lo, "hi": hi,
            "vs_control_low": vs_control_low, "transfer": transfer}


NULL = {"lo": -0.05, "hi": 0.1, "vs_control_low": -0.02, "transfer": 0.02}


@pytest.mark.parametrize("kw, want", [
    ({}, "transfers"),
    ({"n": c10.MIN_DOCS - 1}, "too few to judge"),
    ({"gap_low": 0.0, "ceiling_gap_low": 0.0, "lo": 0.0, "hi": 0.0, "vs_control_low": 0.0}, "no gap to transfer"),
    ({"ceiling_gap_low": -0.01, **NULL}, "the slave never knew"),
    (NULL, "does not transfer"),
    ({"ceiling_gap_low": float("nan"), **NULL}, "inconclusive"),  # a null without its ceiling is no evidence
    ({"ceiling_gap_low": float("nan")}, "transfers"),  # a gain over its control needs no ceiling
    ({"vs_control_low": -0.01}, "inconclusive"),  # above the floor, not above the other document
    ({"lo": -0.1, "hi": 0.5}, "inconclusive"),
])
def test_nll_rung_rules(kw, want):
    assert c10.nll_rung_verdict(rung(**kw)) == want


def test_ledger_rows_from_hand_made_ladders():
    good = pd.DataFrame([rung("noise:0", transfer=1.0), rung("int8"), rung("int4")])
    assert c10.quantisation_claim(good).verdict == "supported"
    assert c10.ladder_claim(good).verdict == "supported"
    broken = pd.DataFrame([rung("noise:0"), rung("int8"), rung("int4", **NULL), rung("smollm2", **NULL)])
    assert c10.quantisation_claim(broken).verdict == "not supported"
    assert "breaks at int4" in c10.ladder_claim(broken).measured
    only_nulls = pd.DataFrame([rung("noise:0"), rung("noise:0.1", **NULL), rung("smollm2", **NULL)])
    assert c10.ladder_claim(only_nulls).verdict == "not supported"
    assert c10.quantisation_claim(only_nulls).verdict == "inconclusive"  # no quantised rung
    tuned = pd.DataFrame([rung("noise:0"), rung("int8"), rung("finetune:code:200", **NULL)])
    assert c10.quantisation_claim(tuned).verdict == "not supported"  # a fine-tune is judged beside the quantised
    zero = {"gap_low": 0.0, "ceiling_gap_low": 0.0, "lo": 0.0, "hi": 0.0, "vs_control_low": 0.0, "transfer": 0.0}
    dead = pd.DataFrame([rung("noise:0", **zero), rung("int8", **zero), rung("int4", **zero)])
    assert c10.quantisation_claim(dead).verdict == c10.ladder_claim(dead).verdict == "inconclusive"
    assert c10.ladder_claim(pd.DataFrame([rung("noise:0", **NULL), rung("int8")])).verdict == "inconclusive"


def test_ladder_table_joins_divergence_and_transfer_in_ladder_order():
    rng = np.random.default_rng(1)
    f = 3 + rng.normal(0, 0.1, 12)
    cells = frame(f, f - 1, f - 0.5, f, f, f - 1)
    div = pd.DataFrame([{"recipe": "s", "slave": "tiny ~ s", "kl": 0.1, "kl_low": 0.05, "kl_high": 0.2,
                         "texts": 2, "tokens": 50, "k_identity": 0.9, "v_identity": 0.8, "k_lstsq": 0.95,
                         "v_lstsq": 0.85}])
    t = tm.ladder_table(cells, div, ["s"]).iloc[0]
    assert t["slave"] == "s" and t["distance"] == pytest.approx(0.1) and t["verdict"] == "transfers"
    assert t["kind"] == "foreign"  # not a sibling recipe


def test_the_ladder_table_orders_siblings_by_measured_kl_then_foreign_slaves():
    f = 3 + np.random.default_rng(2).normal(0, 0.1, 12)
    one = frame(f, f - 1, f - 0.5, f, f, f - 1)
    rungs = {"finetune:code:50": 0.02, "noise:0": 0.0, "noise:0.1": 0.9, "smollm2": float("nan")}
    cells = pd.concat([one] + [one[one["slaves"] == "s"].assign(
        slaves=name, setting=lambda d, n=name: d["setting"].str.replace("s", n, n=1),
        control_of=lambda d, n=name: d["control_of"].str.replace("s", n, n=1)) for name in rungs if name != "s"],
        ignore_index=True)
    cells = cells[cells["slaves"] != "s"]
    div = pd.DataFrame([{"recipe": r, "kl": kl, "k_lstsq": 0.9, "v_lstsq": 0.9} for r, kl in rungs.items()])
    t = tm.ladder_table(cells, div, ["noise:0", "noise:0.1", "smollm2", "finetune:code:50"])
    assert list(t["slave"]) == ["noise:0", "finetune:code:50", "noise:0.1", "smollm2"]
    assert list(t["kind"]) == ["sibling"] * 3 + ["foreign"]


def test_siblings_through_lstsq_sit_beside_their_identity_row(tiny, tmp_path):
    m = tiny("tiny-qwen2")
    ps = nll.pairs(m.tokenizer, corpus(4), 40, 16)
    cells = tm.nll_ladder(m, ["noise:0"], {}, ps, tmp_path / "c.jsonl", lstsq=True)
    assert {"+noise:0", "+noise:0 lstsq", "+noise:0 lstsq, shuffled doc"} <= set(cells["setting"])
    ceilings = cells[cells["role"] == "ceiling"]
    assert ceilings["setting"].nunique() == 2  # one per label, the same slave alone: equal, measured once
    assert ceilings.groupby("setting")["nll"].apply(tuple).nunique() == 1
    div = pd.DataFrame([{"recipe": "noise:0", "kl": 0.0, "kl_low": 0.0, "kl_high": 0.0, "k_identity": 1.0,
                         "v_identity": 1.0, "k_lstsq": 0.9, "v_lstsq": 0.9}])
    t = tm.ladder_table(cells, div, ["noise:0"])
    assert list(t["slave"]) == ["noise:0"]  # the lstsq channel is a column of its rung, not a rung
    via = nll.transfer(cells).set_index("setting").loc["+noise:0 lstsq"]
    assert t.iloc[0]["lstsq_transfer"] == pytest.approx(via["transfer"], nan_ok=True)
    assert "lstsq_transfer" in tm.summary(t)


def test_kvcomm_channel_has_its_own_cells_control_and_column(tiny, tmp_path):
    import fusionlab as fl

    m = tiny("tiny-qwen2")
    ps = nll.pairs(m.tokenizer, corpus(4), 40, 16)
    samples = tm.kvcomm_samples([f"{w} paragraph {i} about the {w}." for i, w in enumerate(WORDS[:6])])
    foreign = {"llama": (tiny("tiny-llama"), fl.fit_lstsq(m, tiny("tiny-llama")))}
    cells = tm.nll_ladder(m, ["noise:0"], foreign, ps, tmp_path / "c.jsonl", kvcomm=samples)
    for label in ("noise:0", "llama"):
        kv = cells[cells["setting"] == f"+{label}, KVComm layers"]
        ctrl = cells[cells["control_of"] == f"+{label}, KVComm layers"]
        assert len(kv) == len(ctrl) == len(ps) and set(kv["slaves"]) == {label + tm.VIA_KVCOMM}
    full = cells[cells["setting"] == "+noise:0"].set_index("doc")["nll"]
    some = cells[cells["setting"] == "+noise:0, KVComm layers"].set_index("doc")["nll"]
    assert not np.allclose(full, some[full.index])  # fewer layers fed: its own cells, never the full map's
    div = pd.DataFrame([{"recipe": r, "kl": 0.0, "kl_low": 0.0, "kl_high": 0.0, "k_identity": 1.0,
                         "v_identity": 1.0, "k_lstsq": 0.9, "v_lstsq": 0.9} for r in ("noise:0", "llama")])
    t = tm.ladder_table(cells, div, ["noise:0", "llama"])
    assert list(t["slave"]) == ["noise:0", "llama"] and t["kvcomm_transfer"].notna().all()
    with pytest.raises(FusionLabError, match="kvcomm_samples needs 5 paragraphs"):
        tm.kvcomm_samples(["one", "two"])


def test_kvcomm_at_every_layer_is_the_full_map_and_at_30_percent_feeds_fewer(tiny):
    """The anchor for the KVComm column: selecting 100 % of the layers must give back the rung's own map."""
    from fusionlab.engine.projector import IdentityProjector
    from fusionlab.models.siblings import sibling, sibling_layer_map

    m = tiny("tiny-qwen2")
    sib = sibling(m, "noise:0")
    home = sibling_layer_map(m, sib)
    samples = tm.kvcomm_samples([f"{w} paragraph {i} about the {w}." for i, w in enumerate(WORDS[:6])])
    assert tm.kvcomm_layers(m, sib, IdentityProjector(), home, samples, top=1.0).pairs == home.pairs
    some = tm.kvcomm_layers(m, sib, IdentityProjector(), home, samples).pairs
    assert 0 in some and set(some) < set(home.pairs)


def test_the_map_draws_siblings_by_kl_and_every_slave_by_lstsq_distance():
    import matplotlib

    matplotlib.use("Agg")
    base = {"n": 30, "lo": 0.5, "hi": 0.9, "transfer": 0.7, "ceiling_share": 1.0, "relay_transfer": 0.1}
    table = pd.DataFrame([{**base, "slave": "noise:0", "kind": "sibling", "kl": 0.0, "distance": 0.1},
                          {**base, "slave": "int8", "kind": "sibling", "kl": 0.001, "distance": 0.1},
                          {**base, "slave": "smollm2", "kind": "foreign", "kl": float("nan"), "distance": 1.9},
                          {**base, "slave": "quick", "kind": "sibling", "kl": 0.5, "distance": float("nan")}])
    fig = tm.plot_transfer_map(table)
    left, right = fig.axes[:2]
    assert len(left.texts) == 3 and len(right.texts) == 3  # no foreign KL; no lstsq distance where none was fitted
    offsets = [t.xyann for t in right.texts if t.get_text() in ("noise:0", "int8")]
    assert offsets[0] != offsets[1]  # two rungs on one spot: their names are staggered, not printed over each other


def test_the_bus_is_the_last_rung_and_knows_what_its_best_slave_knows(tiny, tmp_path):
    import fusionlab as fl

    m = tiny("tiny-qwen2")
    ps = nll.pairs(m.tokenizer, corpus(4), 40, 16)
    foreign = {name: (tiny(f"tiny-{name}"), fl.fit_lstsq(m, tiny(f"tiny-{name}"))) for name in ("llama", "gemma3")}
    cells = tm.nll_ladder(m, [], foreign, ps, tmp_path / "c.jsonl", bus=True)
    bus = tm.bus_label(foreign)
    assert {"+llama +gemma3", "+llama +gemma3, shuffled doc"} <= set(cells["setting"])
    assert (cells.loc[cells["setting"] == "+llama +gemma3", "rung"] == bus).all()
    div = pd.DataFrame([tm.foreign_divergence(k, p) for k, (_, p) in foreign.items()] + [tm.bus_divergence(foreign)])
    t = tm.ladder_table(cells, div, [*foreign, bus])
    assert list(t["slave"]) == ["llama", "gemma3", bus] and t.iloc[-1]["kind"] == "foreign"
    members = t.set_index("slave")["ceiling_gap"]
    assert t.iloc[-1]["ceiling_gap"] == pytest.approx(max(members["llama"], members["gemma3"]))
    fig = tm.plot_transfer_map(t)  # the bus has no single distance: left off the figure, kept in the table
    import matplotlib.pyplot as plt
    plt.close(fig)


def test_an_nll_stage_computes_the_notebooks_own_cells_rung_by_rung(tiny, tmp_path):
    from fusionlab.experiments import nb10_nll_stage as stage

    m = tiny("tiny-qwen2")
    docs = corpus(4)
    plan = tm.Plan(["noise:0.1", "noise:0"], ["tiny-llama"], 4, 40, 16, 2, lstsq=False, relay_tokens=0, kvcomm=False)
    assert stage.stage_rungs(plan) == ["noise:0", "noise:0.1", "tiny-llama"]  # the copy first; no bus for one slave
    texts = [d.text[:400] for d in docs[:2]]
    saved = []
    table = stage.run_nll_stage(m, ["noise:0", "noise:0.1"], plan, docs, tmp_path / "c.jsonl", tmp_path / "d.jsonl",
                                on_rung=lambda cells, div, t: saved.append((len(cells), list(div["recipe"]),
                                                                           t["slave"].tolist())),
                                load_slave=tiny, texts=texts)
    # floor and skyline once (4 documents), then each rung's offload, ceiling and different-document control
    assert saved == [(4 * 2 + 4 * 3, ["noise:0"], ["noise:0"]),
                     (4 * 2 + 8 * 3, ["noise:0", "noise:0.1"], ["noise:0", "noise:0.1"])]
    assert table.set_index("slave").loc["noise:0", "transfer"] == pytest.approx(1.0, abs=1e-3)  # the exact anchor
    kept = []
    stage.run_nll_stage(m, ["noise:0"], plan, docs, tmp_path / "c.jsonl", tmp_path / "d.jsonl", texts=texts,
                        on_rung=lambda cells, div, t: kept.append((cells, div)))
    for kind, df in zip(("cells", "divergence"), kept[-1]):
        save_table(df, stage.table_name(kind), tmp_path)  # read back as the CLI does: through the saved CSV
    earlier = (load_table(stage.table_name("cells"), tmp_path), load_table(stage.table_name("divergence"), tmp_path))
    later = stage.run_nll_stage(m, ["noise:0.1"], plan, docs, tmp_path / "c.jsonl", tmp_path / "d.jsonl",
                                texts=texts, earlier=earlier)
    assert later["slave"].tolist() == ["noise:0", "noise:0.1"]  # a call for one rung keeps the rungs saved before
    before = (tmp_path / "c.jsonl").read_text()
    again = tm.nll_ladder(m, ["noise:0", "noise:0.1"], {}, nll.pairs(m.tokenizer, docs, 40, 16, 4),
                          tmp_path / "c.jsonl")  # the notebook's own call: every cell read back, none redone
    assert len(again) == 4 * 2 + 8 * 3 and (tmp_path / "c.jsonl").read_text() == before
    with pytest.raises(FusionLabError, match="noise:0.5"):
        stage.run_nll_stage(m, ["noise:0.5"], plan, docs)
    twins = tm.Plan(["noise:0"], ["tiny-llama", "tiny-gemma3"], 4, 40, 16, 2)
    with pytest.raises(FusionLabError, match="share the short name 'tiny'"):
        stage.run_nll_stage(m, ["noise:0"], twins, docs)


def test_a_stage_reads_its_noise_rungs_as_one_curve_of_kl():
    from fusionlab.experiments.nb10_nll_stage import stage_crossing

    floor, sky = [3.0, 3.2, 2.8], [2.0, 2.2, 1.8]  # a gap of 1 nat on each document
    share = {"noise:0": 1.0, "noise:0.1": 0.75, "noise:0.2": 0.25}
    cells = pd.DataFrame([{"setting": s, "doc": d, "nll": v} for d in range(3) for s, v in
                          [("floor (no document)", floor[d]), ("skyline (master reads it)", sky[d])] +
                          [(f"+{r}", floor[d] - x) for r, x in share.items()]])
    div = pd.DataFrame({"recipe": ["noise:0", "noise:0.1", "noise:0.2", "smollm2"], "kl": [0.0, 1.0, 5.0, math.nan]})
    row = stage_crossing(cells, div).iloc[0]
    assert row["family"] == "noise:0,noise:0.1,noise:0.2" and row["bracketed"] and row["n"] == 3
    assert row["crossing"] == pytest.approx(5 ** 0.5) and row["lo"] == pytest.approx(5 ** 0.5)  # halfway in log KL
    flat = cells.assign(nll=3.0)  # floor = skyline: nothing to fall from, no crossing made up
    assert not stage_crossing(flat, div).iloc[0]["bracketed"]
    assert stage_crossing(cells[cells["setting"] != "+noise:0.2"], div).iloc[0]["bracketed"] == False  # noqa: E712
