"""Where transfer falls to half: interpolation in log KL between the bracketing rungs, a CI over documents, and no
number where the curve never falls below the level (or where there is no gap at all)."""
from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest

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
    assert cr.crossing(grid({"noise:0": 1.0}), DIV)["bracketed"] is False  # one rung: no curve
    assert cr.sentence(cr.crossing(grid({}), DIV)) == "no rungs of this family measured"


def test_crossing_from_the_exact_copy_at_kl_zero_is_linear():
    c = cr.crossing(grid({"noise:0": 1.0, "noise:0.01": 0.0}, noise=0.0), DIV)
    assert c["crossing"] == pytest.approx(0.005)
