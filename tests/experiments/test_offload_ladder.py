"""Offload accuracy over the ladder: synthetic facts (seeded, distinct, unknowable, with a distractor), the grid on a
tiny master (the exact rung answers as the skyline; floor and skyline once), and the per-rung table and its verdicts
on hand-made cells, degenerate ones included."""
from __future__ import annotations

import math

import pandas as pd
import pytest

from fusionlab.errors import FusionLabError
from fusionlab.experiments import nb02_niah as niah, nb10_offload as lad, nb10_transfer_map as tm
from fusionlab.experiments.nb10_claims import RUNG_VERDICTS
from fusionlab.experiments.nb10_synthetic_facts import TEMPLATES, facts
from fusionlab.lab.results import load_table, save_table
from fusionlab.paths import asset

HAY = " ".join(f"Sentence number {i} talks about rivers, harbours and old maps of the town." for i in range(400))


@pytest.mark.parametrize("lang", ["en", "zh"])
def test_facts_are_seeded_distinct_and_answerable_only_from_their_sentence(lang):
    a, b = facts(30, lang), facts(30, lang, seed=1)
    assert a == facts(30, lang) and a != b  # a pure function of (n, lang, seed)
    assert {f.id.split("-")[2] for f in a} == {t.kind for t in TEMPLATES if t.lang == lang}
    assert len({f.needle for f in a}) == 30 and len({f.answers[0] for f in a}) == 30
    for f in a:
        assert niah.score(f.needle, f)["label"] == "correct"
        assert not any(x.lower() in f.question.lower() for x in f.answers)  # the question does not give it away
        assert not any(x.lower() in f.distractor.lower() for x in f.answers)
        assert niah.score(f.distractor, f)["distractor"] in (True, False)
    assert niah.score("The code is " + a[0].answers[0].replace("-", ""), a[0])["label"] == "correct"


@pytest.mark.parametrize("kw", [{"n": 0, "lang": "en"}, {"n": 3, "lang": "fr"}, {"n": 10 ** 5, "lang": "zh"}])
def test_bad_fact_requests_say_what_to_change(kw):
    with pytest.raises(FusionLabError):
        facts(**kw)


def test_the_ladder_grid_on_a_tiny_master(tiny, tmp_path):
    m = tiny("tiny-qwen2")
    (tmp_path / "en.txt").write_text(HAY)
    hays = {"en": str(tmp_path / "en.txt"), "zh": str(asset("haystack", "zh.txt"))}
    plan = lad.OffloadPlan(["noise:0", "prune:2"], [], 2, [200], max_new_tokens=5)
    items = lad.items(m, plan, hays)
    assert len(items) == 4 and {it.lang for it in items} == {"en", "zh"}
    assert all(it.needles[0].needle in it.document and it.needles[0].needle not in it.decoy for it in items)
    df = lad.offload_ladder(m, plan.rungs, {}, items, plan.max_new_tokens, cache=tmp_path / "c.jsonl")
    assert (df.groupby("setting").size() == 4).all()  # floor and skyline once, not once per rung
    answer = lambda s: df[df["setting"] == s].set_index("item")["answer"]  # noqa: E731
    sky = answer("skyline (master reads it)")
    assert answer("+noise:0").equals(sky) and answer("noise:0 alone (reads it)").equals(sky)
    table = lad.accuracy_table(df, plan.rungs)
    assert table["slave"].tolist() == plan.rungs and set(table["verdict"]) == {"too few to judge"}  # 4 items


def cells(ceiling: list[int], offload: list[int], control: list[int], floor: list[int], sky: list[int]) -> pd.DataFrame:
    rows = []
    for setting, role, ok in (("floor (no document)", "floor", floor), ("skyline (master reads it)", "skyline", sky),
                              ("s alone (reads it)", "ceiling", ceiling), ("+s", "cross", offload),
                              ("+s, shuffled doc", "control", control)):
        rows += [{"setting": setting, "role": role, "item": f"i{i}", "label": "correct" if c else "wrong",
                  "distractor": False, "control_of": "+s" if role == "control" else None} for i, c in enumerate(ok)]
    return pd.DataFrame(rows)


N = 30
ALL, NONE, HALF = [1] * N, [0] * N, [1, 0] * (N // 2)


@pytest.mark.parametrize("ceiling, offload, control, floor, sky, want", [
    (ALL, ALL, NONE, NONE, ALL, "transfers"),
    (ALL, NONE, NONE, NONE, ALL, "does not transfer"),
    (NONE, NONE, NONE, NONE, ALL, "the slave never knew"),
    (NONE, NONE, NONE, NONE, NONE, "no gap to transfer"),  # an all-zero grid is no evidence either way
    (ALL, HALF, HALF, NONE, ALL, "inconclusive"),  # as often right as its control: no information shown
])
def test_accuracy_table_judges_each_rung(ceiling, offload, control, floor, sky, want):
    t = lad.accuracy_table(cells(ceiling, offload, control, floor, sky), ["s", "absent"])
    assert t["slave"].tolist() == ["s"] and t["verdict"].iloc[0] == want and want in RUNG_VERDICTS
    row = t.iloc[0]
    assert row["n"] == N and row["offload"] == sum(offload) / N and row["ceiling"] == sum(ceiling) / N
    assert row["offload_lo"] <= row["offload"] <= row["offload_hi"]


def test_accuracy_table_asks_whether_the_master_reads_more_than_the_slave_answers():
    more = lad.accuracy_table(cells(HALF, ALL, NONE, NONE, ALL), ["s"]).iloc[0]  # 15 items only through the master
    assert more["p_vs_ceiling"] == pytest.approx(2 / 2**15)
    same = lad.accuracy_table(cells(ALL, ALL, NONE, NONE, ALL), ["s"]).iloc[0]  # no discordant item: no difference
    assert same["p_vs_ceiling"] == 1.0
    alone_missing = cells(ALL, ALL, NONE, NONE, ALL)[lambda d: d["role"] != "ceiling"]
    assert math.isnan(lad.accuracy_table(alone_missing, ["s"]).iloc[0]["p_vs_ceiling"])  # nothing to pair: no p


def test_the_full_plans_add_noise_rungs_where_the_default_curves_halve():
    noise = lambda rungs: [float(r.split(":")[1]) for r in rungs if r.startswith("noise:")]  # noqa: E731
    full, offload_full = tm.plan("full").rungs, lad.offload_plan("full").rungs
    added = {*tm.FINER_NOISE, *tm.BEND_NOISE}
    assert added <= set(full) and added <= set(offload_full)
    assert not added & set(tm.plan("default").rungs)  # the default run is unchanged
    assert noise(full) == sorted(noise(full)) and noise(offload_full) == sorted(noise(offload_full))
    assert [r for r in full if r not in added][:len(tm.LADDER)] == list(tm.LADDER)
    assert 0.03 < min(noise(tm.FINER_NOISE)) and max(noise(tm.FINER_NOISE)) < 0.1
    assert 0.1 < min(noise(tm.BEND_NOISE)) and max(noise(tm.BEND_NOISE)) < 0.2  # between the rungs NLL halves


@pytest.mark.parametrize("size", ["quick", "default", "full"])
def test_every_plan_is_buildable(size):
    p = lad.offload_plan(size)
    assert p.rungs[0] == "noise:0"  # the positive control first, in every size
    for lang in p.langs:
        facts(p.per_lang, lang, p.seed)
    with pytest.raises(FusionLabError):
        lad.offload_plan("huge")


def test_a_distractor_is_about_a_place_no_reader_could_confuse_with_the_needles():
    for f in facts(30, "en"):
        place = next(w.strip("?") for w in f.question.split() if w.strip("?").endswith("holm"))
        other = next(w for w in f.distractor.split() if w.endswith("holm"))
        assert place[0] != other[0]  # not Seluholm beside Saleholm
    for f in facts(30, "zh"):
        assert not set(f.question[:2]) & set(f.distractor[:2])


def test_a_stage_computes_the_plans_own_cells_rung_by_rung(tiny, tmp_path):
    from fusionlab.experiments import nb10_offload_stage as stage

    m = tiny("tiny-qwen2")
    (tmp_path / "en.txt").write_text(HAY)
    hays = {"en": str(tmp_path / "en.txt")}
    plan = lad.OffloadPlan(["noise:0", "prune:2", "noise:0.1"], [], 3, [200, 240], langs=("en",), max_new_tokens=4)
    assert stage.stage_order(plan) == ["noise:0", "noise:0.1", "prune:2"]  # FIRST's rungs first, then ladder order
    built = stage.stage_items(m, plan, 200, hays)
    whole = [it for it in lad.items(m, plan, hays) if it.length == 200]
    alone = lad.items(m, lad.OffloadPlan(plan.rungs, [], 3, [200], langs=("en",)), hays)
    assert [(it.id, it.decoy) for it in built] == [(it.id, it.decoy) for it in whole]  # the plan's own controls,
    assert [it.decoy for it in alone] != [it.decoy for it in whole]  # which one length built alone would not give
    saved = []
    div = {"texts": [HAY[:300], HAY[300:600]], "divergence_cache": tmp_path / "d.jsonl"}
    table = stage.run_stage(m, 200, ["noise:0", "prune:2"], plan, cache=tmp_path / "c.jsonl", haystacks=hays,
                            on_rung=lambda cells, t, d: saved.append((len(cells), t["slave"].tolist(),
                                                                      d["recipe"].tolist())), **div)
    # floor and skyline once, then the ceiling, offload and control of each rung, 3 items each, saved after each rung;
    # the divergence holds the weight-noise rungs only (the crossing's x axis)
    assert saved == [(3 * 2 + 3 * 3, ["noise:0"], ["noise:0"]), (3 * 2 + 6 * 3, ["noise:0", "prune:2"], ["noise:0"])]
    assert table["slave"].tolist() == ["noise:0", "prune:2"]
    kept = []
    stage.run_stage(m, 200, ["noise:0"], plan, cache=tmp_path / "c.jsonl", haystacks=hays,
                    on_rung=lambda cells, t, d: kept.append((cells, d)), **div)
    save_table(kept[-1][0], stage.table_name("cells", 200), tmp_path)  # read back as the CLI does: through the CSV
    save_table(kept[-1][1], stage.DIVERGENCE, tmp_path)
    assert kept[-1][1]["kl"].tolist() == [0.0]  # the exact copy
    measured = (tmp_path / "d.jsonl").read_text()
    got = []
    later = stage.run_stage(m, 200, ["noise:0.1"], plan, cache=tmp_path / "c.jsonl", haystacks=hays,
                            earlier=load_table(stage.table_name("cells", 200), tmp_path),
                            divergence=load_table(stage.DIVERGENCE, tmp_path),
                            on_rung=lambda cells, t, d: got.append(d), **div)
    assert later["slave"].tolist() == ["noise:0", "noise:0.1"]  # a call for one rung keeps the rungs saved before
    assert got[-1]["recipe"].tolist() == ["noise:0", "noise:0.1"] and got[-1]["kl"].iloc[1] > 0
    assert (tmp_path / "d.jsonl").read_text().startswith(measured)  # the copy's row was kept, not measured again
    before = (tmp_path / "c.jsonl").read_text()
    again = lad.offload_ladder(m, ["prune:2"], {}, built, 4, cache=tmp_path / "c.jsonl")  # the notebook's own call
    assert len(again) == 3 * 2 + 3 * 3 and (tmp_path / "c.jsonl").read_text() == before  # all read back, none redone


@pytest.mark.parametrize("kw", [{"length": 999}, {"length": 200, "rungs": ["noise:0.5"]}])
def test_a_bad_stage_request_says_what_to_change(tiny, kw):
    from fusionlab.experiments import nb10_offload_stage as stage

    plan = lad.OffloadPlan(["noise:0"], [], 2, [200], langs=("en",))
    with pytest.raises(FusionLabError, match="length=999|noise:0.5"):
        stage.run_stage(tiny("tiny-qwen2"), plan=plan, **kw)


def test_the_bus_ceiling_is_any_member_answering_alone():
    rows = [{"setting": f"{m} alone (reads it)", "role": "ceiling", "item": f"i{i}", "label": lab, "answer": "x",
             "seconds": 1.0, "length": 256}
            for m, labels in (("a", ["correct", "wrong", "wrong", None]), ("b", ["wrong", "correct", "wrong", "wrong"]))
            for i, lab in enumerate(labels)]
    cells = pd.DataFrame(rows)
    bus = lad.bus_ceiling(cells, ["a", "b"])
    assert list(bus.columns) == list(cells.columns) and set(bus["setting"]) == {"a,b alone (reads it)"}
    assert bus.set_index("item")["label"].to_dict() == {"i0": "correct", "i1": "correct", "i2": "wrong"}  # i3: a
    assert (bus["seconds"] == 0).all() and (bus["length"] == 256).all()  # did not run for a: left out, not wrong
    assert lad.rung_names("a,b") == ("+a +b", "a,b alone (reads it)") and lad.rung_names("int4")[0] == "+int4"


def test_a_stage_ends_with_the_bus_of_its_foreign_slaves(tiny, tmp_path):
    from fusionlab.experiments import nb10_offload_stage as stage

    m = tiny("tiny-qwen2")
    (tmp_path / "en.txt").write_text(HAY)
    plan = lad.OffloadPlan(["noise:0"], ["llama", "gemma3"], 3, [200], langs=("en",), max_new_tokens=4, bus=True)
    assert stage.stage_rungs(plan) == ["noise:0", "llama", "gemma3", "bus"]
    assert stage.stage_labels(plan)["bus"] == "llama,gemma3"
    assert stage.stage_rungs(lad.OffloadPlan(["noise:0"], ["llama"], 3, [200], bus=True))[-1] == "llama"  # one slave
    saved = []
    table = stage.run_stage(m, 200, ["llama", "gemma3", "bus"], plan, cache=tmp_path / "c.jsonl",
                            haystacks={"en": str(tmp_path / "en.txt")}, load_slave=lambda n: tiny(f"tiny-{n}"),
                            on_rung=lambda cells, t, d: saved.append(cells))
    assert table["slave"].tolist() == ["llama", "gemma3", "llama,gemma3"]
    cells = saved[-1]
    assert len(cells) == 3 * 2 + 2 * 3 * 3 + 3 * 3  # floor, skyline; each slave's 3 settings; bus, control, ceiling
    bus = cells[cells["rung"] == "llama,gemma3"]
    assert set(bus["setting"]) >= {"+llama +gemma3", "+llama +gemma3, shuffled doc", "llama,gemma3 alone (reads it)"}
    ok = lambda s: cells[cells["setting"] == s].set_index("item")["label"].eq("correct")  # noqa: E731
    assert ok("llama,gemma3 alone (reads it)").equals(ok("llama alone (reads it)") | ok("gemma3 alone (reads it)"))
    row = table.set_index("slave").loc["llama,gemma3"]
    assert row["ceiling"] == ok("llama,gemma3 alone (reads it)").mean() and row["n"] == 3


def test_the_text_relay_answers_the_same_items_from_the_slaves_own_answer(tiny, tmp_path, monkeypatch):
    from fusionlab.experiments import nb10_offload_relay as orelay
    from fusionlab.experiments.nb10_transfer_map import rung_settings
    from fusionlab.models.siblings import sibling

    m = tiny("tiny-qwen2")
    (tmp_path / "en.txt").write_text(HAY)
    plan = lad.OffloadPlan(["noise:0"], [], 3, [200], langs=("en",), max_new_tokens=4, relay=True)
    items = lad.items(m, plan, {"en": str(tmp_path / "en.txt")})
    df = lad.offload_ladder(m, plan.rungs, {}, items, 4, cache=tmp_path / "c.jsonl", relay=plan.relay)
    relay = df[df["setting"].str.startswith("noise:0 text relay")]
    assert set(relay["setting"]) == {"noise:0 text relay", "noise:0 text relay, other doc's note"}
    assert set(relay["role"]) == {"relay", "control"} and (relay.groupby("setting").size() == 3).all()
    assert (relay["note_tokens"] > 0).all() and (relay["seconds"] >= relay["note_seconds"]).all()
    mine = relay[relay["setting"] == "noise:0 text relay"].set_index("item")["note"]
    ceiling = df[df["setting"] == "noise:0 alone (reads it)"].set_index("item")["answer"]
    assert mine.sort_index().tolist() == ceiling.sort_index().tolist()  # the note is the slave's ceiling answer
    other = relay[relay["role"] == "control"].set_index("item")["note"]
    assert (mine != other).any()  # a note on the decoy is another note
    table = lad.accuracy_table(df, plan.rungs)
    assert {"relay", "relay_lo", "relay_control", "p_vs_relay", "note_tokens", "relay_seconds",
            "offload_seconds"} <= set(table.columns)
    before = (tmp_path / "c.jsonl").read_text()
    grid = rung_settings(m, "noise:0", sibling(m, "noise:0"))
    ceil = next(st for st in grid if st.role == "ceiling")
    again = orelay.relay_cells(m, ceil, items, 4, tmp_path / "c.jsonl")
    # the same slave again: its notes and the master's answers come from the cache
    assert (tmp_path / "c.jsonl").read_text() == before and again["answer"].tolist() == relay["answer"].tolist()
    with pytest.raises(FusionLabError, match="ceiling"):
        orelay.relay_cells(m, next(st for st in grid if st.role == "floor"), items, 4, tmp_path / "c.jsonl")

    monkeypatch.setattr(orelay, "notes", lambda ceiling, items, which, *a: {it.id: {"note": "", "note_seconds": 0.0}
                                                                            for it in items})
    empty = orelay.relay_cells(m, ceil, items, 4, tmp_path / "c.jsonl")
    assert len(empty) == 6 and empty["label"].notna().all() and (empty["note_tokens"] == 0).all()  # scored, not skipped


def test_the_relay_columns_compare_kv_with_talking_on_the_same_items():
    base = cells(ALL, ALL, NONE, NONE, ALL)
    extra = [{"setting": s, "role": role, "item": f"i{i}", "label": "correct" if ok else "wrong",
              "control_of": "s text relay" if role == "control" else None, "note_tokens": 10, "seconds": 2.0}
             for s, role, labels in (("s text relay", "relay", HALF),
                                     ("s text relay, other doc's note", "control", NONE))
             for i, ok in enumerate(labels)]
    row = lad.accuracy_table(pd.concat([base.assign(seconds=1.0), pd.DataFrame(extra)], ignore_index=True),
                             ["s"]).iloc[0]
    assert row["relay"] == 0.5 and row["relay_control"] == 0.0 and row["relay_transfer"] == 0.5
    assert row["p_vs_relay"] == pytest.approx(2 / 2**15)  # K/V right on 15 items the relay missed, never the reverse
    assert row["note_tokens"] == 10 and row["relay_seconds"] == 2.0 and row["offload_seconds"] == 1.0
    assert "relay" not in lad.accuracy_table(base, ["s"]).columns  # no relay measured: no relay columns
