"""Results on disk: claims saved per notebook and run size, the ledger prefers the largest run."""
from __future__ import annotations

import pytest

from fusionlab.errors import FusionLabError
from fusionlab.lab import results


def test_claims_and_ledger(tmp_path):
    c = results.Claim("x beats y", "4.2", "2.3x", "1.1x", "n=40, 95% CI [0.9, 1.3]", "tiny", "not supported", "nb")
    results.save_claims("nb", [c], "quick", folder=tmp_path)
    results.save_claims("nb", [results.Claim(**{**c.__dict__, "measured": "1.2x"})], "full", folder=tmp_path)
    df = results.ledger(tmp_path)
    assert list(df["measured"]) == ["1.2x"] and list(df["run"]) == ["full"]
    assert results.best_table("nothing", folder=tmp_path) is None
    with pytest.raises(FusionLabError, match="verdict must be one of"):
        results.Claim("a", "b", "c", "d", "e", "f", "great", "nb")
