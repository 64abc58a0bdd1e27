"""The scorecard (verdict counts, the claims-by-verdict figure) and the recorded notebook costs in README."""
from __future__ import annotations

import pandas as pd
import pytest

from fusionlab.errors import FusionLabError
from fusionlab.lab import readme, results, runner, scorecard


def test_counts_take_each_claim_once_by_its_first_row():
    df = pd.DataFrame({"claim_id": ["C02", "C02", "C05", "X01", "C07"],
                       "verdict": ["supported", "inconclusive", "not supported", "supported", "not measured yet"]})
    c = scorecard.verdict_counts(df)
    assert list(c.index) == list(results.VERDICTS) and c["supported"] == 1 and c["not supported"] == 1
    assert c["inconclusive"] == 0 and c["not measured yet"] == 1 and c.sum() == 3  # X01 is ours, not the posts'
    fig = scorecard.figure(df)
    assert len(fig.axes[0].patches) == 3 and "3 checkable claims" in fig.axes[0].get_title()


def test_lab_times_are_recorded_and_rendered(tmp_path):
    assert "Not measured yet" in readme.labtimes_markdown(tmp_path)
    results.record_lab_time("00_quickstart.ipynb", 61.2, "default", folder=tmp_path)
    results.record_lab_time("04_three_model_cache_bus.ipynb", 599.0, "default", folder=tmp_path)
    results.record_lab_time("04_three_model_cache_bus.ipynb", 1800.4, "full", folder=tmp_path)
    results.record_lab_time("00_quickstart.ipynb", 59.0, "default", folder=tmp_path)  # a re-run replaces its entry
    md = readme.labtimes_markdown(tmp_path)
    assert "| `00_quickstart` | 59 (" in md and "| `04_three_model_cache_bus` | 599 (" in md and "| 1800 (" in md
    assert "**11 min** (2 of" in md and "**30 min** (1 of" in md and "| `00_quickstart` | 59 (" in md
    assert "| `09_prompt_variants` | - | - |" in md  # a notebook never timed shows as such, not as missing
    results.record_lab_time("00_quickstart.ipynb", 12.0, "default", folder=tmp_path, cells={"cached": 5, "computed": 1})
    assert "| `00_quickstart` | 12 (" in (md := readme.labtimes_markdown(tmp_path)) and "; 5 of 6 cells from the cache) |" in md


def test_run_all_only_names_notebooks():
    with pytest.raises(FusionLabError, match="no notebook matches"):
        runner.run_all(only=["99"])
