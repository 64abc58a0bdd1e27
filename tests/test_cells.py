"""The one resumable cell cache: keys, resume, skipped cells, cut lines, and concurrent writers."""
from __future__ import annotations

import json
import multiprocessing as mp
import tempfile
from pathlib import Path
from contextlib import nullcontext

import pytest

from fusionlab.cells import Cell, CellCache, cell_key, read_tally, run_cells
from fusionlab.errors import ContextTooLong, FusionLabError


def test_key_is_stable_and_order_sensitive():
    assert cell_key("a", 1, {"x": 2}) == cell_key("a", 1, {"x": 2})
    assert cell_key("a", 1) != cell_key(1, "a") and len(cell_key("a")) == 64


def test_run_cells_computes_only_what_is_missing_and_records_skips(tmp_path):
    calls, opened = [], []

    def open_model():
        opened.append(1)
        return nullcontext("model")

    def compute(model, c):
        calls.append(c.item)
        if c.item == 3:
            raise ContextTooLong("too long for this model")
        return {"square": c.item ** 2, "model": model}

    cells = [Cell(cell_key("sq", i), {"i": i}, i) for i in range(5)]
    cache = CellCache(tmp_path / "c.jsonl")
    out = run_cells(cache, cells, open_model, compute, desc="t")
    assert [r.get("square") for r in out] == [0, 1, 4, None, 16] and out[3]["skipped"] == "too long for this model"
    again = run_cells(CellCache(tmp_path / "c.jsonl"), cells, open_model, compute, desc="t")  # a fresh process
    assert again == out and len(calls) == 5 and len(opened) == 1  # nothing recomputed, no model opened


def test_a_cached_result_comes_back_under_the_callers_labels(tmp_path):
    """The key names the computation; a cell cached under an old setting name must not leak that name (notebook 07's
    HumanEval once returned 16 rows under a fuser's earlier name, splitting one setting in two)."""
    cache = CellCache(tmp_path / "c.jsonl")
    old = [Cell(cell_key("same computation", i), {"setting": "old name", "i": i}, i) for i in range(3)]
    run_cells(cache, old, lambda: nullcontext(None), lambda m, c: {"v": c.item}, desc="t")
    new = [Cell(c.key, {"setting": "new name", "i": c.fields["i"]}, c.item) for c in old]
    out = run_cells(cache, new, lambda: pytest.fail("nothing should be recomputed"), lambda m, c: {}, desc="t")
    assert [r["setting"] for r in out] == ["new name"] * 3 and [r["v"] for r in out] == [0, 1, 2]


def test_a_cut_last_line_is_ignored_with_a_warning_and_the_next_append_is_clean(tmp_path):
    path = tmp_path / "c.jsonl"
    cache = CellCache(path)
    cache.add({"key": "a", "v": 1})
    with path.open("a") as f:
        f.write('{"key": "b", "v": ')  # a writer killed mid-line
    with pytest.warns(UserWarning, match=r"c\.jsonl: ignored 1 unreadable line"):
        again = CellCache(path)
    assert "a" in again and "b" not in again
    again.add({"key": "c", "v": 3})
    with pytest.warns(UserWarning):
        third = CellCache(path)
    assert {r["key"] for r in third} == {"a", "c"}
    assert path.read_text().splitlines()[-1] == json.dumps({"key": "c", "v": 3})


def test_record_needs_a_key(tmp_path):
    with pytest.raises(FusionLabError, match="needs a string 'key'"):
        CellCache(tmp_path / "c.jsonl").add({"v": 1})


def _writer(path: str, who: int, n: int) -> None:
    cache = CellCache(path)
    for i in range(n):
        cache.add({"key": f"{who}-{i}", "payload": "x" * 5000})  # long lines: interleaving would show


def test_two_processes_appending_never_interleave(tmp_path):
    path = tmp_path / "c.jsonl"
    procs = [mp.get_context("fork").Process(target=_writer, args=(str(path), w, 200)) for w in range(2)]
    for p in procs:
        p.start()
    for p in procs:
        p.join()
    lines = path.read_text().splitlines()
    assert len(lines) == 400 and all(json.loads(line)["payload"] == "x" * 5000 for line in lines)
    assert len(CellCache(path)) == 400


def test_batches_fall_back_cell_by_cell_when_one_cannot_run(tmp_path):
    seen = []

    def one(model, c):
        if c.item == 2:
            raise ContextTooLong("cell 2 is too long")
        return {"v": c.item}

    def batch(model, cs):
        seen.append([c.item for c in cs])
        return [one(model, c) for c in cs]  # raises for the batch holding cell 2

    cells = [Cell(cell_key("b", i), {"i": i}, i) for i in (4, 3, 2, 1, 0)]
    out = run_cells(CellCache(tmp_path / "c.jsonl"), cells, lambda: nullcontext(None), one, desc="t",
                    compute_batch=batch, batch_size=2, batch_key=lambda c: c.item)
    assert seen == [[0, 1], [2, 3]]  # ordered by the key before batching; the last single cell goes alone
    assert [r.get("v") for r in out] == [4, 3, None, 1, 0] and out[2]["skipped"] == "cell 2 is too long"
    with pytest.raises(FusionLabError, match="batch_size must be a positive int"):
        run_cells(CellCache(tmp_path / "d.jsonl"), cells, lambda: nullcontext(None), one, desc="t", batch_size=0)


def test_tally_counts_cached_and_computed_cells_when_asked(tmp_path, monkeypatch):
    """`fusionlab lab` sets FUSIONLAB_CELL_TALLY per notebook; without it nothing is written."""
    cache, tally = CellCache(tmp_path / "c.jsonl"), tmp_path / "tally.jsonl"
    cells = [Cell(cell_key("t", i), {"i": i}, i) for i in range(3)]
    run_cells(cache, cells[:1], lambda: nullcontext(None), lambda m, c: {"v": c.item}, desc="t")
    assert not tally.exists() and read_tally(tally) == {"cached": 0, "computed": 0}
    monkeypatch.setenv("FUSIONLAB_CELL_TALLY", str(tally))
    run_cells(cache, cells, lambda: nullcontext(None), lambda m, c: {"v": c.item}, desc="t")
    run_cells(cache, cells, lambda: pytest.fail("all cached"), lambda m, c: {}, desc="t")
    assert [json.loads(x) for x in tally.read_text().splitlines()] == [
        {"desc": "t", "cached": 1, "computed": 2}, {"desc": "t", "cached": 3, "computed": 0}]
    assert read_tally(tally) == {"cached": 4, "computed": 2}


def test_chained_cells_form_one_ordered_group_each():
    from fusionlab.cells import CellJob

    cells = [Cell(cell_key("c", run, b), {}, (run, b)) for b in (1, 2) for run in "xy"]
    job = CellJob(nullcontext, lambda m, c: {}, chain=lambda c: c.item[0])
    assert [[c.item for c in g] for g in job.groups(cells)] == [[("x", 1), ("x", 2)], [("y", 1), ("y", 2)]]
    with pytest.raises(FusionLabError, match="chain"):
        run_cells(CellCache(Path(tempfile.mkdtemp()) / "c.jsonl"), cells, nullcontext, lambda m, c: {}, "x",
                  compute_batch=lambda m, cs: [{} for _ in cs], chain=lambda c: c.item[0])


def test_batches_spread_over_workers_where_the_cells_allow():
    from fusionlab.cells import CellJob

    cells = [Cell(cell_key("s", i), {}, i) for i in range(5)]
    job = CellJob(nullcontext, lambda m, c: {}, compute_batch=lambda m, cs: [{} for _ in cs], batch_size=4)
    assert [len(g) for g in job.groups(cells)] == [4, 1]
    assert [len(g) for g in job.groups(cells, spread=2)] == [3, 2]
    assert [len(g) for g in job.groups(cells, spread=8)] == [1] * 5


class _Stop(Exception):
    """A run killed mid-grid."""


def _streaming_batch(log, fail_after=None, skip_item=None):
    """A compute_batch that finishes its cells last-first, emitting each as it ends; it dies (`fail_after` cells
    emitted) or refuses a cell (ContextTooLong after emitting the others) where asked."""
    def batch(model, cs, emit=None):
        log.append([c.item for c in cs])
        recs = {}
        for j in reversed(range(len(cs))):
            if fail_after is not None and len(recs) == fail_after:
                raise _Stop()
            if cs[j].item == skip_item:
                continue
            recs[j] = {"v": cs[j].item * 10}
            if emit is not None:
                emit(j, recs[j])
        if skip_item is not None:
            raise ContextTooLong("one prompt too long")
        return [recs[j] for j in range(len(cs))]
    return batch


def test_a_streaming_grid_is_one_batch_and_saves_each_cell_as_it_finishes(tmp_path):
    """In-process, a streaming grid's missing cells are one scheduler run (no seat waits for a group's longest row),
    and each record is on disk when its row ends: a run killed after 2 of 5 keeps those 2, and the resumed run
    computes only the other 3."""
    cells = [Cell(cell_key("st", i), {"i": i}, i) for i in range(5)]
    path, log = tmp_path / "c.jsonl", []
    with pytest.raises(_Stop):
        run_cells(CellCache(path), cells, lambda: nullcontext(None), lambda m, c: pytest.fail("batched"), "t",
                  compute_batch=_streaming_batch(log, fail_after=2), batch_size=2, streams=True)
    assert log == [[0, 1, 2, 3, 4]] and sorted(r["i"] for r in CellCache(path)) == [3, 4]
    out = run_cells(CellCache(path), cells, lambda: nullcontext(None), lambda m, c: pytest.fail("batched"), "t",
                    compute_batch=_streaming_batch(log), batch_size=2, streams=True)
    assert log[1] == [0, 1, 2] and [r["v"] for r in out] == [0, 10, 20, 30, 40]


def test_a_streaming_batch_that_refuses_a_cell_keeps_the_others_and_skips_only_it(tmp_path):
    one_by_one = []

    def compute(model, c):
        one_by_one.append(c.item)
        raise ContextTooLong("too long alone")
    cells = [Cell(cell_key("sk", i), {"i": i}, i) for i in range(4)]
    out = run_cells(CellCache(tmp_path / "c.jsonl"), cells, lambda: nullcontext(None), compute, "t",
                    compute_batch=_streaming_batch([], skip_item=2), batch_size=4, streams=True)
    assert one_by_one == [2] and [r.get("v") for r in out] == [0, 10, None, 30] and out[2]["skipped"] == "too long alone"


def test_streaming_jobs_keep_batch_size_groups_where_records_come_back_per_group():
    """Ray returns a worker's records when its batch ends: there a streaming job still goes batch_size at a time."""
    from fusionlab.cells import CellJob

    cells = [Cell(cell_key("g", i), {}, i) for i in range(5)]
    job = CellJob(nullcontext, lambda m, c: {}, compute_batch=_streaming_batch([]), batch_size=2, streams=True)
    assert [len(g) for g in job.groups(cells, streaming=True)] == [5]
    assert [len(g) for g in job.groups(cells, spread=2)] == [2, 2, 1]
    assert job.compute_group(None, cells[:3]) == [{"v": 0}, {"v": 10}, {"v": 20}]  # no emit: the list alone
