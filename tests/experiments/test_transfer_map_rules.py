"""The transfer map: its verdict rules on hand-made rungs, degenerate ones included: an all-zero grid, a slave that
never knew, a failed positive control."""
from __future__ import annotations

import pytest

from fusionlab.experiments import nb06_offload as off, nb10_offload as offload, nb10_transfer_map as tm
from fusionlab.experiments.nb06_claims import MIN_ITEMS
from fusionlab.experiments.nb10_claims import ladder_verdict, rung_verdict


def rung(slave="s", n=40, floor=0.1, skyline=0.9, ceiling=0.8, lo=0.5, hi=0.9, p=0.001, acc=0.7, ctrl=0.1) -> dict:
    return {"slave": slave, "n": n, "floor": floor, "skyline": skyline, "ceiling": ceiling, "lo": lo, "hi": hi,
            "p_value": p, "acc_setting": acc, "acc_control": ctrl}


@pytest.mark.parametrize("kw, want", [
    ({}, "transfers"),
    ({"floor": 0.0, "skyline": 0.0, "ceiling": 0.0, "lo": 0.0, "hi": 0.0, "acc": 0.0, "ctrl": 0.0}, "no gap to transfer"),
    ({"n": MIN_ITEMS - 1}, "too few to judge"),
    ({"skyline": 0.1}, "no gap to transfer"),
    ({"ceiling": 0.1, "lo": -0.05, "hi": 0.05}, "the slave never knew"),
    ({"lo": -0.05, "hi": 0.1, "p": 0.9, "acc": 0.12}, "does not transfer"),
    ({"lo": 0.1, "p": 0.2}, "inconclusive"),  # CI above 0 but not better than the control
    ({"lo": 0.1, "p": 0.01, "acc": 0.1, "ctrl": 0.3}, "inconclusive"),  # significant, the wrong way
    ({"lo": -0.1, "hi": 0.4, "p": 0.5}, "inconclusive"),
])
def test_rung_rules(kw, want):
    assert rung_verdict(rung(**kw)) == want


NULL = {"lo": -0.05, "hi": 0.1, "p": 0.9, "acc": 0.12}


def test_ladder_breaks_where_the_first_null_follows_transfers():
    out = ladder_verdict([rung("copy"), rung("noise 1%"), rung("noise 10%", **NULL), rung("smollm2", **NULL)])
    assert (out["last"], out["break"]) == ("noise 1%", "noise 10%")
    assert out["verdict"] == "transfer holds through noise 1% and breaks at noise 10%"


def test_a_slave_that_never_knew_is_not_a_break():
    out = ladder_verdict([rung("copy"), rung("int4", ceiling=0.1, **NULL), rung("smollm2", **NULL)])
    assert out["break"] == "smollm2" and dict(out["rungs"])["int4"] == "the slave never knew"


def test_no_verdict_without_the_positive_control():
    zero = {"floor": 0.0, "skyline": 0.0, "ceiling": 0.0, "lo": 0.0, "hi": 0.0, "acc": 0.0, "ctrl": 0.0}
    assert ladder_verdict([rung("copy", **zero), rung("x", **zero)])["verdict"].startswith("not evidence")
    assert ladder_verdict([rung("copy", **NULL), rung("x")])["break"] is None
    assert ladder_verdict([])["verdict"].startswith("not evidence")


def test_every_rung_transferring_says_so_and_names_the_unjudged():
    out = ladder_verdict([rung("copy"), rung("int8"), rung("prune", lo=-0.1, hi=0.5, p=0.3)])
    assert out["break"] is None and out["verdict"] == "transfers on every measured rung (not judged: prune)"


def test_the_ladder_harness_on_a_tiny_master(tiny, tmp_path):
    """Divergence grows along the noise rungs from an exact zero; the exact rung's offload answers as the skyline."""
    m = tiny("tiny-qwen2")
    texts = ["Rivers, harbours and old maps of the town.", "Numbers 12 and 345, and a code QX-7."]
    div = tm.measure_divergence(m, ["noise:0", "noise:0.03", "prune:2"], texts, lstsq=False,
                                cache=tmp_path / "div.jsonl").set_index("recipe")
    assert div.loc["noise:0", "kl"] == pytest.approx(0, abs=1e-6) and div.loc["noise:0", "k_identity"] == 1
    assert div.loc["noise:0.03", "kl"] > 0 and div.loc["prune:2", "kl"] > div.loc["noise:0.03", "kl"]
    hay = " ".join(f"Sentence number {i} talks about rivers, harbours and old maps of the town." for i in range(400))
    (tmp_path / "en.txt").write_text(hay)
    items = off.build_items(m, ["en-city", "en-number"], [], [300], [50], {"en": str(tmp_path / "en.txt")})
    df = offload.offload_ladder(m, ["noise:0", "prune:2"], {}, items, max_new_tokens=6, cache=tmp_path / "c.jsonl")
    answer = lambda s: df[df["setting"] == s].set_index("item")["answer"]  # noqa: E731
    assert answer("+noise:0").equals(answer("skyline (master reads it)"))
    assert {"floor", "skyline", "ceiling", "cross", "control"} == set(df["role"])
