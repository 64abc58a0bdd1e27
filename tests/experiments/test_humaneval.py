"""HumanEval plumbing: the checker runs apart, records hangs/crashes, McNemar and pass@1 are exact."""
from __future__ import annotations

import pandas as pd
import pytest

import fusionlab as fl
from fusionlab.experiments import nb04_humaneval as he


def test_checker_scores_right_wrong_hang_and_crash():
    task = he.problems()[0]  # HumanEval/0 has_close_elements
    good = ("    for i, a in enumerate(numbers):\n        for j, b in enumerate(numbers):\n"
            "            if i != j and abs(a - b) < threshold:\n                return True\n    return False\n")
    gens = pd.DataFrame([
        {"setting": "s", "task_id": task["task_id"], "completion": good},
        {"setting": "s", "task_id": task["task_id"], "completion": "    return True\n"},
        {"setting": "s", "task_id": task["task_id"], "completion": "    while True:\n        pass\n"},
        {"setting": "s", "task_id": task["task_id"], "completion": "    import os\n    os._exit(3)\n"},
    ])
    broken = gens.iloc[[1]].assign(completion="    return (numbers\n")  # unclosed bracket: never runs
    res = he.check(pd.concat([gens.iloc[[0, 1, 3]], broken]), timeout=2)  # one checker process for four outcomes
    assert res["passed"].tolist() == [True, False, False, False]
    kinds = res["kind"].tolist()
    assert [kinds[0], kinds[1], kinds[3]] == ["passed", "wrong or crashed", "syntax error"]  # [2]: os._exit, a crash
    assert res["result"].iloc[1].startswith("failed")
    res = he.check(gens.iloc[[2]], timeout=1)
    assert res["passed"].tolist() == [False] and res["result"].iloc[0] == "timed out"
    assert res["kind"].tolist() == ["timed out"]
    both = he.check(pd.concat([gens.iloc[[0, 1]], gens.iloc[[0]].assign(setting="t")]), timeout=2)  # same task twice
    assert len(both) == 3 and both["passed"].tolist() == [True, False, True]


def test_failure_kinds_counts_per_setting_in_order():
    df = pd.DataFrame({"setting": ["bus", "bus", "bus", "alone", "alone"],
                       "kind": ["syntax error", "passed", "syntax error", "passed", "timed out"]})
    t = he.failure_kinds(df)
    assert t.index.tolist() == ["bus", "alone"]
    assert t.columns.tolist() == ["passed", "wrong or crashed", "syntax error", "timed out"]
    assert t.loc["bus"].tolist() == [1, 0, 2, 0] and t.loc["alone"].tolist() == [1, 0, 0, 1]


def test_mcnemar_and_subset():
    a = pd.Series([True, True, False, False, True])
    b = pd.Series([True, False, True, True, True])
    r = he.mcnemar(a, b)
    assert (r["only_baseline"], r["only_setting"]) == (1, 2) and abs(r["p_value"] - 1.0) < 1e-12
    r = he.mcnemar(pd.Series([False] * 10), pd.Series([True] * 10))
    assert abs(r["p_value"] - 2 / 2**10) < 1e-12
    assert [t["task_id"] for t in he.subset(3)] == [t["task_id"] for t in he.subset(3)] and len(he.subset(3)) == 3
    assert len(he.subset(None)) == 164


def test_generate_all_caches(tiny, tmp_path):
    m = tiny("tiny-qwen2")
    tasks = sorted(he.problems(), key=lambda t: len(t["prompt"]))[:2]  # fit the tiny 512-position model
    builds = []

    def build():
        builds.append(1)
        return fl.fuse(m, [])

    a = he.generate_all("master", "tiny", build, tasks, max_new_tokens=5, cache=tmp_path / "g.jsonl")
    b = he.generate_all("master", "tiny", build, tasks, max_new_tokens=5, cache=tmp_path / "g.jsonl")
    assert builds == [1] and a["completion"].tolist() == b["completion"].tolist()
    table = he.pass_at_1(he.check(a, timeout=2))
    assert table["n"].iloc[0] == 2 and 0 <= table["pass@1"].iloc[0] <= 1


def test_batched_completions_equal_batch_one(tiny, tmp_path):
    m = tiny("tiny-qwen2")
    tasks = [t for t in he.problems() if len(t["prompt"]) < 300][:5]  # within the tiny model's 512 positions
    one = he.generate_all("s", "k", lambda: fl.fuse(m, []), tasks, max_new_tokens=12, cache=tmp_path / "a.jsonl",
                          batch_size=1)
    many = he.generate_all("s", "k", lambda: fl.fuse(m, []), tasks, max_new_tokens=12, cache=tmp_path / "b.jsonl",
                           batch_size=4)
    assert one["completion"].tolist() == many["completion"].tolist() and set(many["batch"]) == {4}
    assert (many["scheduler"] == "continuous").all()  # 5 prompts, 4 seats, one streamed run
    assert 0 < he.batch_occupancy(many)["occupancy"].iloc[0] <= 1 and (many["seat_steps"] >= 0).all()


def test_settings_sharing_seats_give_each_setting_its_own_completions(tiny, tmp_path):
    """The cache bus's four settings in one shared scheduler run (rows of every setting side by side on 4 seats)
    give the completions each setting gives run apart on its own model, under the same cache keys, so a shared run
    resumes a grid the separate runs began; the rows say the run was shared."""
    from fusionlab.experiments import nb04_cache_bus as bus
    from fusionlab.models.variants import rope_variant

    m = tiny("tiny-qwen2")
    parts = {}
    for label, factor in (("a", 2.0), ("b", 0.5)):
        s = rope_variant("tiny-qwen2", theta_factor=factor)
        parts[label] = (s, fl.fit_lstsq(m, s))
    tasks = [t for t in he.problems() if len(t["prompt"]) < 300][:3]
    apart = pd.concat([he.generate_all(n, k, b, tasks, max_new_tokens=10, cache=tmp_path / "apart.jsonl",
                                       batch_size=4) for n, (k, b) in bus.settings(m, parts).items()])
    reads, build = bus.shared_run(m, parts)
    assert list(reads) == ["master alone", "+a", "+b", "+a +b"] and [r for _, r in reads.values()] == \
        [[], [0], [1], None]
    shared = he.generate_shared(reads, build, tasks, max_new_tokens=10, cache=tmp_path / "shared.jsonl", batch_size=4)
    key = ["setting", "task_id"]
    assert shared[key + ["completion"]].equals(apart[key + ["completion"]].reset_index(drop=True))
    assert set(shared["shared_by"]) == {4} and he.run_label(shared).endswith(", 4 settings sharing the seats")
    assert he.run_label(apart) == "continuous batching, 3 seats, streamed"  # 3 tasks a setting: 3 seats
    assert (shared.loc[shared["setting"] == "master alone", "extra_kv_bytes"] == 0).all()
    assert (shared.loc[shared["setting"] != "master alone", "extra_kv_bytes"] > 0).all()
    again = he.generate_shared(reads, build, tasks, max_new_tokens=10, cache=tmp_path / "apart.jsonl")
    assert again["completion"].tolist() == apart["completion"].tolist()  # the separate runs' cache serves it


def test_rerun_changes_lists_each_changed_problem():
    before = pd.DataFrame({"setting": ["a", "a", "a", "b"], "task_id": ["H/0", "H/1", "H/2", "H/0"],
                           "completion": ["x", "y", "z", "w"], "passed": [True, False, True, False]})
    after = before.copy()
    after.loc[1, ["completion", "passed"]] = ["y2", True]  # text and outcome change
    after.loc[2, "completion"] = "z2"  # text changes, outcome does not
    got = he.rerun_changes(before, after).set_index("setting")
    assert got.loc["a", "passed_before"] == 2 and got.loc["a", "passed_after"] == 3
    assert got.loc["a", "completions_changed"] == 2 and got.loc["a", "outcomes_changed"] == 1
    assert got.loc["a", "changed_tasks"] == "H/1 H/2" and got.loc["b", "completions_changed"] == 0
    assert "seconds_before" not in got
    timed = he.rerun_changes(before.assign(seconds=[4.0, 4.0, 4.0, 1.0]), after.assign(seconds=1.5)).set_index("setting")
    assert timed["seconds_before"].tolist() == [12.0, 1.0] and timed["seconds_after"].tolist() == [4.5, 1.5]


def test_batch_occupancy_from_shared_batch_seconds():
    """Two batches of setting a (rows share the batch's seconds): 3 rows of lengths 10/5/5 and 2 rows of 4/4 ->
    (20 + 8) / (3*10 + 2*4); batch-1 rows are left out."""
    df = pd.DataFrame({"setting": ["a"] * 6, "seconds": [1.0, 1.0, 1.0, 2.0, 2.0, 3.0], "batch": [3, 3, 3, 2, 2, 1],
                       "new_tokens": [10, 5, 5, 4, 4, 99]})
    got = he.batch_occupancy(df).set_index("setting").loc["a"]
    assert got["batches"] == 2 and got["mean_rows"] == 2.5 and got["occupancy"] == pytest.approx(28 / 38)
    assert he.batch_occupancy(df[df["batch"] == 1]).empty


def test_batch_occupancy_prefers_the_scheduler_s_measurement():
    """Rows the continuous scheduler ran carry their group's measured occupancy: the mean over rows is reported."""
    df = pd.DataFrame({"setting": ["a"] * 4, "seconds": [1.0, 1.0, 2.0, 2.0], "batch": [2] * 4,
                       "new_tokens": [10, 5, 4, 4], "occupancy": [0.9, 0.9, 0.5, 0.5]})
    assert he.batch_occupancy(df).set_index("setting").loc["a", "occupancy"] == pytest.approx(0.7)


def test_batch_occupancy_of_streamed_rows_sums_their_seat_steps():
    """Streamed rows each carry the seat-steps since the previous row ended: the setting's occupancy is the sums'
    ratio (a row that ended on the same step as another carries 0 / 0 and weighs nothing)."""
    df = pd.DataFrame({"setting": ["a"] * 3, "seconds": [1.0, 0.5, 0.0], "batch": [2] * 3, "new_tokens": [3, 4, 5],
                       "seat_steps": [10, 4, 0], "busy_seat_steps": [10, 1, 0]})
    assert he.batch_occupancy(df).set_index("setting").loc["a", "occupancy"] == pytest.approx(11 / 14)


def test_a_rerun_names_how_each_run_was_generated():
    base = pd.DataFrame({"setting": ["a", "a"], "task_id": ["H/0", "H/1"], "completion": ["x", "y"],
                         "passed": [True, False]})
    static = base.assign(batch=8)
    grouped = base.assign(batch=8, scheduler="continuous")
    streamed = grouped.assign(seat_steps=[8, 0], busy_seat_steps=[6, 0])
    assert [he.run_label(d) for d in (base, base.assign(batch=1), static, grouped, streamed)] == [
        "batch 1", "batch 1", "static batches of up to 8", "continuous batching, 8 seats",
        "continuous batching, 8 seats, streamed"]
    got = he.rerun_changes(static, streamed).iloc[0]
    assert got["before_run"] == "static batches of up to 8" and got["after_run"].endswith("streamed")
