"""Where transfer falls to half: interpolation in log KL between the bracketing rungs, a CI over documents, and no
number where the curve never falls below the level (or where there is no gap at all)."""
from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest

from fusionlab.errors import FusionLabError
from fusionlab.experiments import nb10_crossing as cr


def grid(transfers: dict[str, float], n: int = 20, noise: float = 0.02, gap: float = 1.0) -> pd.DataFrame:
    rng = np.random.default_rng(0)
    rows = []
    for i in range(n):
        f = 4 + rng.normal(0, 0.1)
        rows += [{"setting": "floor (no document)", "doc": f"d{i}", "nll": f},
                 {"setting": "skyline (master reads it)", "doc": f"d{i}", "nll": f - gap}]
        rows += [{"setting": f"+{r}", "doc": f"d{i}", "nll": f - gap * t + rng.normal(0, noise)}
                 for r, t in transfers.items()]
    return pd.DataFrame(rows)


DIV = pd.DataFrame({"recipe": ["noise:0", "noise:0.01", "noise:0.1", "noise:0.3", "int8"],
                    "kl": [0.0, 0.01, 0.1, 1.0, 0.001]})


def test_crossing_interpolates_in_log_kl_with_a_ci():
    c = cr.crossing(grid({"noise:0": 1.0, "noise:0.01": 0.9, "noise:0.1": 0.8, "noise:0.3": 0.4, "int8": 0.1}), DIV)
    assert c["rungs"] == ["noise:0", "noise:0.01", "noise:0.1", "noise:0.3"]  # int8 is another knob
    assert c["bracketed"] and c["crossing"] == pytest.approx(10 ** -0.25, rel=0.05)  # 3/4 of the way, in log KL
    assert c["lo"] < c["crossing"] < c["hi"] and c["share_defined"] > 0.95
    assert "falls to 50% of the gap at KL" in cr.sentence(c)
    assert cr.sentence(cr.as_row(c)) == cr.sentence(c)  # the saved row says the same


def test_a_curve_that_never_falls_below_the_level_gives_no_number():
    c = cr.crossing(grid({"noise:0": 1.0, "noise:0.1": 0.7, "noise:0.3": 0.66}), DIV)
    assert not c["bracketed"] and math.isnan(c["crossing"])
    assert "the crossing lies beyond the ladder" in cr.sentence(c)


def test_degenerate_grids_are_no_evidence():
    zero = grid({"noise:0": 0.0, "noise:0.1": 0.0}, gap=0.0, noise=0.0)  # floor = skyline: no gap to fall from
    c = cr.crossing(zero, DIV)
    assert not c["bracketed"] and c["share_defined"] == 0.0
    one = cr.crossing(grid({"noise:0": 1.0}), DIV)
    assert one["bracketed"] is False  # one rung: no curve
    assert cr.sentence(one) == "one rung of this family measured (noise:0): no curve to fall"
    assert cr.sentence(cr.crossing(grid({}), DIV)) == "no rungs of this family measured"


def test_crossing_from_the_exact_copy_at_kl_zero_is_linear():
    c = cr.crossing(grid({"noise:0": 1.0, "noise:0.01": 0.0}, noise=0.0), DIV)
    assert c["crossing"] == pytest.approx(0.005)


def facts(correct: dict[str, float], n: int = 100, floor: float = 0.0, skyline: float = 1.0) -> pd.DataFrame:
    """Offload cells: each setting right on the first share x n items (seeded order), wrong on the rest."""
    order = np.random.default_rng(1).permutation(n)
    share = {"floor (no document)": floor, "skyline (master reads it)": skyline, **correct}
    return pd.DataFrame([{"setting": s, "item": f"fact{i}", "label": "correct" if rank < round(t * n) else "wrong"}
                         for s, t in share.items() for rank, i in enumerate(order)])


def test_offload_accuracy_has_two_curves_the_channel_and_the_slave():
    cells = facts({"+noise:0": 1.0, "+noise:0.01": 0.9, "+noise:0.1": 0.8, "+noise:0.3": 0.4,
                   "noise:0 alone (reads it)": 1.0, "noise:0.01 alone (reads it)": 0.6,
                   "noise:0.1 alone (reads it)": 0.4, "noise:0.3 alone (reads it)": 0.0})
    off = cr.accuracy_crossing(cells, DIV)
    assert off["rungs"] == ["noise:0", "noise:0.01", "noise:0.1", "noise:0.3"] and off["n"] == 100
    assert off["crossing"] == pytest.approx(10 ** -0.25, rel=0.05) and off["lo"] < off["crossing"] < off["hi"]
    own = cr.accuracy_crossing(cells, DIV, of="ceiling")  # 0.6 at KL 0.01, 0.4 at 0.1: halfway in log KL
    assert own["crossing"] == pytest.approx(10 ** -1.5, rel=0.05)
    assert cr.sentence(off).startswith("transfer falls to 50% of the gap at KL")
    assert cr.sentence(own).startswith("the slave's own accuracy falls to 50% of the gap at KL")
    assert "bootstrap over 100 items" in cr.sentence(cr.as_row(own))


def test_offload_accuracy_counts_abstentions_as_wrong_and_drops_cells_that_did_not_run():
    cells = facts({"+noise:0": 1.0, "+noise:0.1": 0.0})
    cells.loc[(cells["setting"] == "+noise:0") & (cells["item"] == "fact0"), "label"] = "abstain"
    cells.loc[(cells["setting"] == "+noise:0.1") & (cells["item"] == "fact1"), "label"] = None
    c = cr.accuracy_crossing(cells, DIV)
    assert c["n"] == 99  # fact1 did not run on every curve
    assert c["crossing"] == pytest.approx(0.1 * (1 - 0.5 / (98 / 99)) + 0.0, rel=0.01)  # linear from KL 0


def test_offload_accuracy_without_a_gap_or_with_a_bad_curve_name_is_no_evidence():
    flat = facts({"+noise:0": 0.0, "+noise:0.1": 0.0}, skyline=0.0)  # the master never answers: no gap
    c = cr.accuracy_crossing(flat, DIV)
    assert not c["bracketed"] and c["share_defined"] == 0.0 and math.isnan(c["crossing"])
    with pytest.raises(FusionLabError, match="of='slots'"):
        cr.accuracy_crossing(flat, DIV, of="slots")


def test_crossing_order_reads_both_curves_on_the_same_resamples():
    later = facts({"+noise:0": 1.0, "+noise:0.01": 1.0, "+noise:0.1": 0.9, "+noise:0.3": 0.1,
                   "noise:0 alone (reads it)": 1.0, "noise:0.01 alone (reads it)": 0.9,
                   "noise:0.1 alone (reads it)": 0.1, "noise:0.3 alone (reads it)": 0.0}, n=200)
    c = cr.crossing_order(later, DIV)
    off, own = (cr.accuracy_crossing(later, DIV, of)["crossing"] for of in ("offload", "ceiling"))
    assert c["gap"] == pytest.approx(math.log10(off / own)) and c["gap"] > 0.5 and c["n"] == 200
    assert c["lo"] > 0 and c["verdict"] == "channel after"
    assert cr.order_sentence(c).startswith("the channel carries past the point where the slave stops knowing (")
    def exchange(setting: str) -> str:  # the same data with the two curves' roles exchanged
        if setting.startswith("+"):
            return setting[1:] + " alone (reads it)"
        return "+" + setting.removesuffix(" alone (reads it)") if setting.endswith(" alone (reads it)") else setting

    swapped = later.assign(setting=later["setting"].map(exchange))
    back = cr.crossing_order(swapped, DIV)
    assert back["verdict"] == "channel before" and back["gap"] == pytest.approx(-c["gap"])


def test_crossing_order_of_equal_curves_is_indistinguishable_and_degenerate_grids_have_no_order():
    same = {"+noise:0": 1.0, "+noise:0.1": 0.6, "+noise:0.3": 0.2,
            "noise:0 alone (reads it)": 1.0, "noise:0.1 alone (reads it)": 0.6, "noise:0.3 alone (reads it)": 0.2}
    c = cr.crossing_order(facts(same), DIV)
    assert c["gap"] == 0.0 and c["lo"] <= 0 <= c["hi"] and c["verdict"] == "indistinguishable"
    flat = cr.crossing_order(facts({k: 0.0 for k in same}, skyline=0.0), DIV)  # an all-zero grid is no evidence
    assert flat["verdict"] == "not bracketed" and math.isnan(flat["gap"]) and flat["share_defined"] == 0.0
    high = cr.crossing_order(facts({k: 0.9 for k in same}), DIV)  # neither curve falls: nothing to order
    assert high["verdict"] == "not bracketed"
    assert cr.order_sentence(high).startswith("one of the curves does not fall")
    one = cr.crossing_order(facts({"+noise:0": 1.0, "noise:0 alone (reads it)": 1.0}), DIV)
    assert one["rungs"] == ["noise:0"] and one["verdict"] == "not bracketed"
