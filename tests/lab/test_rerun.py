"""`fusionlab rerun-diff`: the earlier run read back from git, compared problem by problem, saved for the README."""
from __future__ import annotations

import subprocess

import pandas as pd
import pytest

from fusionlab.errors import FusionLabError
from fusionlab.lab.cli import main
from fusionlab.lab.rerun import COLUMN_TYPES, compare_with_commit


def git(root, *args: str) -> str:
    return subprocess.run(["git", "-C", str(root), *args], check=True, capture_output=True, text=True).stdout.strip()


def grid(passed: list[int], completions: list[str], settings=("master alone", "+s")) -> pd.DataFrame:
    return pd.DataFrame([{"setting": s, "task_id": f"HumanEval/{i}", "completion": c, "passed": bool(p)}
                         for s in settings for i, (p, c) in enumerate(zip(passed, completions))])


@pytest.fixture
def repo(tmp_path):
    res = tmp_path / "data" / "results"
    res.mkdir(parents=True)
    git(tmp_path, "init", "-q")
    git(tmp_path, "config", "user.email", "t@t")
    git(tmp_path, "config", "user.name", "t")
    grid([1, 0, 1], ["a", "b", "c"]).to_csv(res / "04_humaneval.full.csv", index=False)
    git(tmp_path, "add", "-A")
    git(tmp_path, "commit", "-qm", "batch 1")
    return tmp_path, res, git(tmp_path, "rev-parse", "--short", "HEAD")


def test_compare_with_the_committed_run(repo):
    _, res, commit = repo
    new = grid([1, 0, 1], ["a", "b", "c"], ["master alone"])
    new = pd.concat([new, grid([1, 1, 1], ["a", "B", "c"], ["+s"]), grid([0, 0, 0], "xyz", ["+only now"])])
    new.assign(batch=8, scheduler="continuous").to_csv(res / "04_humaneval.full.csv", index=False)
    t, path = compare_with_commit("04", "HEAD", "full", res)  # a moving name is saved as the hash it meant
    assert path == res / "04_batch_rerun.full.csv"
    saved = pd.read_csv(path, dtype=COLUMN_TYPES).fillna({"changed_tasks": ""})
    assert saved.to_dict("records") == t.to_dict("records")
    runs = {"before_run": "batch 1", "after_run": "continuous batching, 8 seats"}  # each run says how it was made
    assert t.to_dict("records") == [
        {"setting": "master alone", "before_commit": commit, **runs, "n": 3, "passed_before": 2, "passed_after": 2,
         "completions_changed": 0, "outcomes_changed": 0, "changed_tasks": ""},
        {"setting": "+s", "before_commit": commit, **runs, "n": 3, "passed_before": 2, "passed_after": 3,
         "completions_changed": 1, "outcomes_changed": 1, "changed_tasks": "HumanEval/1"}]


def test_bad_commit_missing_run_and_no_clone(repo, tmp_path_factory):
    _, res, _ = repo
    with pytest.raises(FusionLabError, match="before='nope'.*git log --oneline"):
        compare_with_commit("04", "nope", "full", res)
    with pytest.raises(FusionLabError, match="notebook='07'.*--full --only 07"):
        compare_with_commit("07", "HEAD", "full", res)
    lone = tmp_path_factory.mktemp("lone")
    grid([1], ["a"]).to_csv(lone / "04_humaneval.full.csv", index=False)
    with pytest.raises(FusionLabError, match="not inside a git clone"):
        compare_with_commit("04", "HEAD", "full", lone)


def test_cli_reports_errors_with_exit_2(capsys, tmp_path, monkeypatch):
    monkeypatch.setattr("fusionlab.lab.rerun.results_dir", lambda: tmp_path)
    assert main(["rerun-diff", "04", "--before", "HEAD"]) == 2
    assert "does not exist" in capsys.readouterr().err
