"""The claims ledger is complete: every checkable claim of both posts (data/claims.csv, C01-C73) has a row built from
saved results, every row names a known id, and class-c rows say why they cannot be tested here."""
from __future__ import annotations

import pytest

from fusionlab.experiments.claim import Claim, claim_ids
from fusionlab.lab import results


def test_the_id_list_is_the_posts_73_claims():
    ids = claim_ids()
    assert ids["id"].tolist() == [f"C{i:02d}" for i in range(1, 74)]
    assert set(ids["class"]) <= {"a", "b", "c", "covered"}


def test_every_claim_id_has_a_ledger_row():
    led = results.ledger()
    missing = sorted(set(claim_ids()["id"]) - set(led["claim_id"]))
    assert not missing, f"claims with no ledger row: {missing}"
    known = set(claim_ids()["id"])
    assert all(c in known or c.startswith("X") for c in led["claim_id"]), set(led["claim_id"]) - known


def test_untestable_rows_say_why():
    led = results.ledger()
    c_ids = set(claim_ids().query("`class` == 'c'")["id"])
    rows = led[led["claim_id"].isin(c_ids)]
    assert (rows["verdict"] == "not testable here").all() and (rows["measured"].str.len() > 10).all()


def test_saving_a_claim_without_an_id_is_refused(tmp_path):
    from fusionlab.errors import FusionLabError

    with pytest.raises(FusionLabError, match="without a claim_id"):
        results.save_claims("nb", [Claim(claim="a", seed_section="b", seed_value="c", measured="d", n="e", setup="f",
                                         verdict="supported", notebook="nb")], "quick", folder=tmp_path)


def test_open_claims_get_a_row_that_says_why(tmp_path):
    """Hand-made claims list: a saved claim keeps its row; each open one gets its class's verdict and reason."""
    from fusionlab.experiments.claim import unmeasured

    csv = tmp_path / "claims.csv"
    csv.write_text("id,claim,post_value,where,class,status_at_import\n"
                   "C01,big models,18B,A§1,c,c: models not released\n"
                   "C02,fast on a 4090,800 ms,A§3,b,b: decode timing on the lent GPU\n"
                   "C03,entropy drops,0.3 %,A§2,a,a: next-token entropy with CIs\n"
                   "C04,already measured,x,A§2,a,a: whatever\n", encoding="utf-8")
    rows = {c.claim_id: c for c in unmeasured({"C04"}, csv)}
    assert set(rows) == {"C01", "C02", "C03"}
    assert (rows["C01"].verdict, rows["C01"].measured) == ("not testable here", "models not released")
    assert rows["C02"].verdict == "not testable here" and rows["C02"].measured.startswith("needs a GPU: decode")
    assert rows["C03"].verdict == "not measured yet" and "entropy" in rows["C03"].measured
