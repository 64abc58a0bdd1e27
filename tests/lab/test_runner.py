"""The lab's progress while a notebook runs (`runner.CellProgress`) and `fusionlab lab --ray`'s refusals."""
from __future__ import annotations

import json
import sys

import nbformat

from fusionlab.lab import cli, runner


def test_progress_names_the_cell_the_estimate_and_each_finished_grid(tmp_path, capsys):
    tally = tmp_path / "cells.jsonl"
    p = runner.CellProgress("04", 3, 500.0, tally)
    p({"cell_type": "markdown"})  # not a code cell: not counted
    tally.write_text(json.dumps({"desc": "master alone", "cached": 30, "computed": 12}) + "\n")
    p({"cell_type": "code"})
    p({"cell_type": "code"})
    out = capsys.readouterr().out.splitlines()
    assert "04: cell 1/3 done" in out[0] and "of ~500 s (last run)" in out[0]
    assert out[1].strip() == "grid 'master alone': 12 computed, 30 from the cache"
    assert "cell 2/3" in out[2] and len(out) == 3  # a grid is reported once


def test_execute_streams_one_line_per_code_cell(tmp_path, capsys):
    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell("x = 1"), nbformat.v4.new_markdown_cell("m"),
                                         nbformat.v4.new_code_cell("x + 1")])
    nb.metadata["kernelspec"] = {"name": "fusionlab", "display_name": "FusionLab (.venv)", "language": "python"}
    path = tmp_path / "99_tiny.ipynb"
    nbformat.write(nb, path)
    runner.execute(path, out_dir=tmp_path / "out", html=False,
                   progress=runner.CellProgress("99", runner.code_cells(path), None, None))
    lines = [x for x in capsys.readouterr().out.splitlines() if "99: cell" in x]
    assert [x.split(",")[0].strip() for x in lines] == ["99: cell 1/2 done", "99: cell 2/2 done"]


def test_lab_on_ray_without_ray_says_how_to_install(monkeypatch, capsys):
    monkeypatch.setitem(sys.modules, "ray", None)
    assert cli.main(["lab", "--ray"]) == 2
    assert "fusionlab[ray]" in capsys.readouterr().err


def test_lab_on_an_unreachable_cluster_names_it_before_any_notebook(capsys):
    assert cli.main(["lab", "--ray", "127.0.0.1:9", "--only", "00"]) == 2
    err = capsys.readouterr().err
    assert "127.0.0.1:9" in err and "ray start --head" in err


def test_the_cluster_block_reports_each_pair_and_claims_no_speed_up(tmp_path):
    from fusionlab.lab import readme_cluster

    assert readme_cluster.ray_markdown(tmp_path / "none.json") == readme_cluster.NOT_YET
    bench = tmp_path / "ray.json"
    bench.write_text(json.dumps({"measured": "2026-12-05", "grid": "g", "cpus": 2, "workers": 2, "ray_start_s": 9.0,
                                 "inprocess_s": [60.0, 50.0], "ray_s": [90.0, 50.0]}))
    text = readme_cluster.ray_markdown(bench, folder=tmp_path)
    assert "per pair 1.50 / 1.00" in text and "no speed-up is claimed" in text


def test_a_running_grid_shows_its_count_rate_and_time_left(tmp_path):
    grids = tmp_path / "progress.jsonl"
    p = runner.CellProgress("02", 5, None, None, grids, every_s=30)
    grids.write_text(json.dumps({"desc": "niah", "done": 4, "total": 104}) + "\n")
    assert p.grid_lines(now=0.0) == ["      grid 'niah': 4/104 cells"]  # no rate from one point
    with grids.open("a") as f:
        f.write(json.dumps({"desc": "niah", "done": 8, "total": 104}) + "\n")
    assert p.grid_lines(now=10.0) == []  # shown 10 s ago: quiet
    with grids.open("a") as f:
        f.write(json.dumps({"desc": "niah", "done": 14, "total": 104}) + "\n")
    assert p.grid_lines(now=40.0) == ["      grid 'niah': 14/104 cells (4.0 s/cell, ~6 min left)"]
    with grids.open("a") as f:
        f.write(json.dumps({"desc": "niah", "done": 104, "total": 104}) + "\n")
    assert "104/104" in p.grid_lines(now=41.0)[0]  # the end is always shown


def test_run_cells_reports_each_finished_cell_to_the_progress_file(tmp_path, monkeypatch):
    """One line per saved cell (a streaming grid saves each as its row ends; a batch's cells when it returns)."""
    from contextlib import nullcontext

    from fusionlab.cells import PROGRESS_ENV, Cell, CellCache, cell_key, run_cells

    monkeypatch.setenv(PROGRESS_ENV, str(tmp_path / "p.jsonl"))
    cells = [Cell(cell_key("p", i), {}, i) for i in range(5)]
    run_cells(CellCache(tmp_path / "c.jsonl"), cells, nullcontext, lambda m, c: {"v": c.item}, "grid",
              compute_batch=lambda m, cs: [{"v": c.item} for c in cs], batch_size=2)
    rows = [json.loads(x) for x in (tmp_path / "p.jsonl").read_text().splitlines()]
    assert [(r["done"], r["total"]) for r in rows] == [(k, 5) for k in range(1, 6)]
