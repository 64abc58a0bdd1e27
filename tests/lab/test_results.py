"""Results on disk: claims saved per notebook and run size, the ledger prefers the largest run."""
from __future__ import annotations

import pytest

from fusionlab.errors import FusionLabError
from fusionlab.lab import results


def test_claims_and_ledger(tmp_path):
    c = results.Claim(claim="x beats y", seed_section="4.2", seed_value="2.3x", measured="1.1x",
                      n="n=40, 95% CI [0.9, 1.3]", setup="tiny", verdict="not supported", notebook="nb", claim_id="C35")
    results.save_claims("nb", [c], "quick", folder=tmp_path)
    results.save_claims("nb", [results.Claim(**{**c.__dict__, "measured": "1.2x"})], "full", folder=tmp_path)
    df = results.ledger(tmp_path, with_open=False)
    assert list(df["measured"]) == ["1.2x"] and list(df["run"]) == ["full"]
    full = results.ledger(tmp_path)  # then one row for every other claim of data/claims.csv, saying why it is open
    assert len(full) == 73 and (full["claim_id"] == "C35").sum() == 1 and full["claim_id"].is_unique
    assert results.best_table("nothing", folder=tmp_path) is None
    with pytest.raises(FusionLabError, match="verdict must be one of"):
        results.Claim(claim="a", seed_section="b", seed_value="c", measured="d", n="e", setup="f", verdict="great",
                      notebook="nb")


def test_quick_results_go_to_the_ignored_folder(monkeypatch, tmp_path):
    """QUICK runs (the tests) never rewrite a committed result: their tables and claims land in results/quick/,
    which git ignores and the ledger never reads."""
    import subprocess

    import pandas as pd

    from fusionlab import paths

    monkeypatch.setattr(results, "results_dir", lambda: tmp_path)
    t = results.save_table(pd.DataFrame({"a": [1]}), "nb_table.quick")
    d = results.save_table(pd.DataFrame({"a": [1]}), "nb_table.default")
    c = results.save_claims("nb", [results.Claim(claim="x", seed_section="s", seed_value="v", measured="m", n="n",
                                                 setup="setup", verdict="supported", notebook="nb", claim_id="C35")], "quick")
    assert t.parent == tmp_path / "quick" and c.parent == tmp_path / "quick" / "claims" and d.parent == tmp_path
    assert results.ledger(tmp_path / "claims", with_open=False).empty
    probe = paths.results_dir() / "quick" / "x.csv"
    ignored = subprocess.run(["git", "check-ignore", "-q", str(probe)], cwd=paths.repo_root())
    assert ignored.returncode == 0


def test_a_table_reads_back_with_the_same_rows(tmp_path):
    """A generated note with a bare carriage return once split its CSV record in two on reading (two rows lost
    their setting); every text cell now reads back, carriage returns as newlines."""
    import pandas as pd

    df = pd.DataFrame({"setting": ["a", "b", "c"], "note": ["x\ry 3 ", "p\r\nq", None], "nll": [1.0, 2.0, 3.0]})
    path = results.save_table(df, "nb_t.default", folder=tmp_path)
    back = pd.read_csv(path)
    assert back.shape == df.shape and list(back["setting"]) == ["a", "b", "c"]
    assert list(back["note"][:2]) == ["x\ny 3 ", "p\nq"] and list(back["nll"]) == [1.0, 2.0, 3.0]
