"""Context offload experiment: items and their controls, scoring, a tiny end-to-end grid (self-offload must answer
exactly as the skyline), and every statistic and claim rule on hand-made data."""
from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

import fusionlab as fl
from fusionlab.experiments import nb02_niah as niah, nb06_offload as off, nb06_offload_stats as st, nb06_claims as claims
from fusionlab.engine.projector import IdentityProjector
from fusionlab.models.siblings import sibling, sibling_layer_map
from fusionlab.paths import asset

HAY = " ".join(f"Sentence number {i} talks about rivers, harbours and old maps of the town." for i in range(400))


@pytest.fixture()
def hays(tmp_path):
    en = tmp_path / "en.txt"
    en.write_text(HAY)
    return {"en": str(en), "zh": str(asset("haystack", "zh.txt"))}


def test_items_documents_and_decoys(tiny, hays):
    m = tiny("tiny-qwen2")
    items = off.build_items(m, ["en-city", "zh-city"], [("en-city", "en-number")], [400], [50], hays)
    assert [it.task for it in items] == ["fact", "fact", "two-fact"]
    for it in items:
        inner = it.document.removeprefix("<document>\n").removesuffix("\n</document>\n")
        assert abs(niah.n_tokens(m.tokenizer, inner) - 400) <= 3
        assert all(nd.needle in it.document for nd in it.needles)
        assert not any(a.lower() in it.decoy.lower() for nd in it.needles for a in nd.answers)  # the control lacks it
    assert "porto" in items[0].document.lower()  # a fact's document keeps its distractor
    assert items[2].question.startswith("Answer both questions. (1) Which city")
    assert items[1].prompt(m).startswith("<s>user: 请根据上面的文档")


def test_two_fact_scoring():
    pool = {n.id: n for n in niah.load_needles()}
    it = off.Item("x", "two-fact", "en", (pool["en-city"], pool["en-number"]), 1, 50, "", "")
    assert off.score_item("Lisbon, and 217 steps", it)["label"] == "correct"
    assert off.score_item("Lisbon", it)["label"] == "partial"
    assert off.score_item("The document does not say.", it)["label"] == "abstain"
    assert off.score_item("Paris and 12", it)["label"] == "wrong"


def test_tiny_grid_self_offload_answers_as_the_skyline_and_resumes(tiny, hays, tmp_path):
    m, ll = tiny("tiny-qwen2"), tiny("tiny-llama")
    proj = fl.fit_lstsq(m, ll, texts=[HAY[:300], "def f(x): return x"], holdout_every=0)
    items = off.build_items(m, ["en-city", "en-number"], [], [300], [50], hays)
    grid = off.settings(m, {"llama": (ll, proj)}, naive=["llama"])
    df = off.run(items, grid, max_new_tokens=6, cache=tmp_path / "c.jsonl")
    assert set(df["role"]) == {"floor", "skyline", "self", "control", "cross", "ceiling"} and len(df) == len(grid) * 2
    agree, n = st.self_agreement(df)
    assert n == 2 and agree == 2  # the engine's exact anchor, on generated text
    again = off.run(items, [g for g in grid], max_new_tokens=6, cache=tmp_path / "c.jsonl")
    assert again["answer"].tolist() == df["answer"].tolist()
    acc, tr, ctrl = st.accuracy(df), st.transfer(df), st.versus_control(df)
    assert set(ctrl["setting"]) == {"self-offload", "+llama"} and (tr["n"] == 2).all()
    assert acc["n"].eq(2).all()


def test_ceilings_and_an_exact_sibling_anchor_the_ladder(tiny, hays, tmp_path):
    """A slave's ceiling is the slave alone reading document + question; for the zero-noise sibling it answers as
    the skyline, and so does its offload through the identity projector (the ladder's first rung is exact)."""
    m = tiny("tiny-qwen2")
    copy, pruned = sibling(m, "noise:0"), sibling(m, "prune:2")
    items = off.build_items(m, ["en-city", "en-number"], [], [300], [50], hays)
    grid = off.settings(m, {"copy": (copy, IdentityProjector()), "pruned": (pruned, IdentityProjector())},
                        bus=False, self_copy=False, ceilings=True,
                        layer_maps={"pruned": sibling_layer_map(m, pruned)})
    df = off.run(items, grid, max_new_tokens=6, cache=tmp_path / "c.jsonl")
    answer = lambda setting: df[df["setting"] == setting].set_index("item")["answer"]  # noqa: E731
    sky = answer("skyline (master reads it)")
    assert answer("copy alone (reads it)").equals(sky) and answer("+copy").equals(sky)
    assert set(df[df["role"] == "ceiling"]["setting"]) == {"copy alone (reads it)", "pruned alone (reads it)"}
    assert not answer("pruned alone (reads it)").equals(sky)  # a real rung: the pruned model answers otherwise


def frame(rows: dict[str, tuple[str, list[int]]], lengths: list[int] | None = None) -> pd.DataFrame:
    """setting -> (role, correctness per item); items 0..n-1 (optionally spread over lengths)."""
    out = []
    for setting, (role, ok) in rows.items():
        for i, c in enumerate(ok):
            out.append({"setting": setting, "role": role, "item": f"i{i}", "label": "correct" if c else "wrong",
                        "distractor": False, "answer": "a" if c else "b",
                        "length": (lengths or [256])[i % len(lengths or [256])],
                        "control_of": {"+s, shuffled doc": "+s", "self-offload, shuffled doc": "self-offload"}
                        .get(setting)})
    return pd.DataFrame(out)


def test_transfer_rate_values():
    s, f, k = (np.array(x, bool) for x in ([1, 1, 0, 0], [0, 0, 0, 0], [1, 1, 1, 1]))
    r = st.transfer_rate(s, f, k)
    assert r["transfer"] == 0.5 and r["lo"] <= 0.5 <= r["hi"] and r["n"] == 4
    same = st.transfer_rate(f, f, f)  # skyline = floor: undefined, never a number
    assert np.isnan(same["transfer"]) and same["defined_share"] == 0


def test_borrowed_memory_claim_branches():
    n = 40
    base = {"floor": ("floor", [0] * n), "sky": ("skyline", [1] * n), "self-offload": ("self", [1] * n),
            "s alone (reads it)": ("ceiling", [1] * n)}
    good = frame(base | {"+s": ("cross", [1] * 30 + [0] * 10), "+s, shuffled doc": ("control", [0] * n)})
    claim = lambda df: claims.borrowed_memory_claim(st.accuracy(df), st.transfer(df), st.versus_control(df),  # noqa: E731
                                       st.self_agreement(df))
    assert claim(good).verdict == "supported"
    guess = frame(base | {"+s": ("cross", [1] * 30 + [0] * 10), "+s, shuffled doc": ("control", [1] * 30 + [0] * 10)})
    assert claim(guess).verdict == "inconclusive"  # transfers, but so does the wrong document: a guess
    nothing = frame(base | {"+s": ("cross", [0] * n), "+s, shuffled doc": ("control", [0] * n)})
    assert claim(nothing).verdict == "not supported" and "transfer +0.00" in claim(nothing).measured
    assert "slave alone 100%" in claim(nothing).measured
    never_knew = frame({**base, "s alone (reads it)": ("ceiling", [0] * n), "+s": ("cross", [0] * n),
                        "+s, shuffled doc": ("control", [0] * n)})
    assert claim(never_knew).verdict == "inconclusive"  # a null from a slave that never knew says nothing
    no_ceiling = frame({k: v for k, v in base.items() if k != "s alone (reads it)"} |
                       {"+s": ("cross", [0] * n), "+s, shuffled doc": ("control", [0] * n)})
    assert claim(no_ceiling).verdict == "inconclusive"  # nor does one whose ceiling nobody measured
    bus = frame({**base, "t alone (reads it)": ("ceiling", [0] * n), "+s +t": ("bus", [0] * n)})
    assert claims.ceiling_of(st.accuracy(bus).set_index("setting"), "+s +t") == 1.0 and claim(bus).verdict == \
        "not supported"  # a bus knew if one of its slaves did
    useless_doc = frame({"floor": ("floor", [1] * n), "sky": ("skyline", [1] * n), "+s": ("cross", [1] * n)})
    assert claim(useless_doc).verdict == "inconclusive"
    tiny_n = frame({k: (r, ok[:2]) for k, (r, ok) in {**base, "+s": ("cross", [0] * n)}.items()})
    assert claim(tiny_n).verdict == "inconclusive"  # n=2: the bootstrap CI is [0, 0], but that proves nothing


def test_length_claim_branches():
    def acc(sky, best):
        rows = []
        for length, a, b in zip([256, 1024, 2048], sky, best):
            rows += [{"setting": "sky", "role": "skyline", "length": length, "accuracy": a},
                     {"setting": "+s", "role": "cross", "length": length, "accuracy": b},
                     {"setting": "floor", "role": "floor", "length": length, "accuracy": 0.0}]
        return pd.DataFrame(rows)

    assert claims.length_claim(acc([1, 0, 0], [1, 1, 1])).verdict == "supported"  # 2048 >= 1.42 x 256
    assert claims.length_claim(acc([1, 1, 0], [1, 0, 0])).verdict == "not supported"
    assert claims.length_claim(acc([1, 1, 1], [1, 1, 1])).verdict == "inconclusive"  # both at the grid's top
    assert claims.effective_length(acc([1, 0, 1], [0, 0, 0])).to_dict() == {"sky": 2048, "+s": 0, "floor": 0}
    assert claims.length_claim(acc([1, 1, 0], [1, 0, 0]).assign(n=2)).verdict == "inconclusive"


@pytest.mark.parametrize("size", ["quick", "default", "full"])
def test_every_plan_names_known_needles_and_slaves(size):
    p = off.plan(size)
    known = {n.id for n in niah.load_needles()}
    assert set(p.facts) | {x for pair in p.pairs for x in pair} | set(p.calibration) <= known
    assert not set(p.calibration) & (set(p.facts) | {x for pair in p.pairs for x in pair})  # never scored
    assert set(p.naive) <= set(p.slaves) and set(p.kvcomm) <= set(p.slaves)
    with pytest.raises(fl.FusionLabError, match="run size"):
        off.plan("huge")
