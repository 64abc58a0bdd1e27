"""Packaging in sync, notebooks committed without outputs, results/claims/ledger, intervals."""
from __future__ import annotations

import json
import re
import tomllib
from pathlib import Path

import pandas as pd
import pytest

from fusionlab import results, stats

ROOT = Path(__file__).resolve().parent.parent


def _names(reqs):
    return {re.split(r"[<>=!\[ ]", r.strip(), 1)[0].lower(): r.replace(" ", "") for r in reqs}


def test_environment_yml_matches_pyproject():
    import yaml

    py = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    want = _names(py["dependencies"] + py["optional-dependencies"]["notebooks"] + py["optional-dependencies"]["dev"])
    env = yaml.safe_load((ROOT / "environment.yml").read_text())
    pip = next(d["pip"] for d in env["dependencies"] if isinstance(d, dict))
    got = _names([p for p in pip if not p.startswith("-e")])
    assert got == want


def test_notebooks_are_valid_and_have_no_outputs():
    import nbformat

    nbs = sorted((ROOT / "notebooks").glob("*.ipynb"))
    assert nbs
    for nb in nbs:
        data = json.loads(nb.read_text())
        assert all("id" in cell for cell in data["cells"]), f"{nb.name}: a cell lacks an id (nbformat 4.5)"
        nbformat.validate(nbformat.from_dict(data))
        for cell in data["cells"]:
            if cell["cell_type"] == "code":
                assert cell.get("outputs") == [] and cell.get("execution_count") is None, nb.name


def test_ci_runs_exactly_the_readme_test_command():
    readme = (ROOT / "README.md").read_text()
    ci = (ROOT / ".ci" / "run").read_text()
    assert "python3 fusionlab/bootstrap.py test" in readme and "python3 fusionlab/bootstrap.py lab" in readme
    assert "exec python3 fusionlab/bootstrap.py test" in ci


def test_claims_and_ledger(tmp_path):
    c = results.Claim("x beats y", "4.2", "2.3x", "1.1x", "n=40, 95% CI [0.9, 1.3]", "tiny", "not supported", "nb")
    results.save_claims("nb", [c], "quick", folder=tmp_path)
    results.save_claims("nb", [results.Claim(**{**c.__dict__, "measured": "1.2x"})], "full", folder=tmp_path)
    df = results.ledger(tmp_path)
    assert list(df["measured"]) == ["1.2x"] and list(df["run"]) == ["full"]
    md = results.ledger_markdown(df)
    assert "| x beats y | 2.3x | 1.2x |" in md
    with pytest.raises(ValueError, match="verdict must be one of"):
        results.Claim("a", "b", "c", "d", "e", "f", "great", "nb")


def test_write_ledger_replaces_block(tmp_path, monkeypatch):
    readme = tmp_path / "README.md"
    readme.write_text(f"top\n{results.BEGIN}\nOLD-BLOCK\n{results.END}\nbottom\n")
    empty = results.ledger(tmp_path / "none")
    monkeypatch.setattr(results, "ledger", lambda: empty)
    results.write_ledger(readme)
    text = readme.read_text()
    assert "OLD-BLOCK" not in text and text.startswith("top") and text.endswith("bottom\n")


def test_humaneval_table_from_saved_results(tmp_path):
    rows = [("master alone", t, p, "passed" if p else "wrong or crashed") for t, p in zip("abcd", [1, 1, 1, 0])]
    rows += [("+s", t, p, "passed" if p else "syntax error") for t, p in zip("abcd", [0, 0, 1, 0])]
    df = pd.DataFrame(rows, columns=["setting", "task_id", "passed", "kind"]).assign(
        passed=lambda d: d["passed"].astype(bool), seconds=2.0, new_tokens=10, extra_kv_bytes=[0] * 4 + [2**20] * 4)
    df.to_csv(tmp_path / "04_humaneval.default.csv", index=False)
    md = results.humaneval_markdown(tmp_path).splitlines()
    lo, hi = stats.wilson(3, 4)
    assert md[2] == f"| master alone | 3/4 = 75.0% [{lo:.1%}, {hi:.1%}] | - | 0 of 4 | 2.0 | 5.0 | 0.00 |"
    lo, hi = stats.wilson(1, 4)  # McNemar: 2 discordant pairs, both for the master -> p = 2 * 1/4 = 0.5
    assert md[3] == f"| +s | 1/4 = 25.0% [{lo:.1%}, {hi:.1%}] | 0.5 | 3 of 4 | 2.0 | 5.0 | 1.00 |"
    assert "04_humaneval.default.csv" in md[-1]
    assert results.humaneval_markdown(tmp_path / "none").startswith("_Not measured yet")


def test_wilson_and_bootstrap():
    lo, hi = stats.wilson(12, 100)
    assert (round(lo, 3), round(hi, 3)) == (0.070, 0.198)  # 12/100, standard Wilson 95% interval
    assert stats.wilson(0, 0) == (0.0, 1.0)
    for n in range(1, 60):  # the interval always contains the observed rate, even at 0 and 1
        for k in (0, n // 2, n):
            lo, hi = stats.wilson(k, n)
            assert lo <= k / n <= hi
    lo, hi = stats.bootstrap_ci([1.0] * 10)
    assert lo == hi == 1.0


def test_readme_tables_are_generated_from_the_saved_results():
    """The README's ledger, benchmark, load-time, projector and HumanEval tables equal what `fusionlab ledger` writes
    from the committed results (regenerate with `fusionlab ledger` after a lab run)."""
    readme = (ROOT / "README.md").read_text()
    blocks = {"ledger": results.ledger_markdown(results.ledger()), "bench": results.bench_markdown(),
              "loadtimes": results.loadtimes_markdown(), "projector": results.projector_markdown(),
              "humaneval": results.humaneval_markdown()}
    for name, body in blocks.items():
        begin, end = f"<!-- {name}:begin -->", f"<!-- {name}:end -->"
        assert readme[readme.index(begin) + len(begin):readme.index(end)].strip() == body.strip(), name
