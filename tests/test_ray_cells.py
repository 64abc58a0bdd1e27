"""Grids on Ray (`fusionlab.ray_cells`): results identical to the in-process runner, a killed worker loses and
duplicates no cell, models travel by recipe, and each bad input gets one FusionLabError. One local Ray instance
(2 CPUs, loopback) for the whole session."""
from __future__ import annotations

import importlib
import json
import os
import signal
import sys
import threading
import time
from contextlib import nullcontext

import pytest
import torch

import fusionlab as fl
from fusionlab.lab import ray_cells
from fusionlab.cells import Cell, CellCache, cell_key, run_cells
from fusionlab.errors import ContextTooLong, FusionLabError
from fusionlab.models.siblings import sibling

from conftest import embedded_available

# in CI the bootstrap installs the extra: a missing Ray must fail there, not skip
ray = importlib.import_module("ray") if os.environ.get("CI") else pytest.importorskip("ray")


@pytest.fixture(scope="session")
def local_ray():
    # this module's helpers (doubling, ...) are not importable on the workers: send them by value, as a notebook's are
    ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False, _node_ip_address="127.0.0.1")
    yield
    ray_cells.shutdown()
    ray.shutdown()


def doubling(model, c: Cell) -> dict:
    if c.item < 0:
        raise ContextTooLong(f"cell {c.item} cannot run")
    time.sleep(c.fields.get("sleep", 0.0))
    return {"value": c.item * 2}


def number_cells(n: int, sleep: float = 0.0) -> list[Cell]:
    return [Cell(cell_key("doubling", i), {"i": i, "sleep": sleep}, i) for i in range(n)]


def lines(path) -> list[dict]:
    return [json.loads(x) for x in path.read_text().splitlines()]


def test_a_grid_on_ray_equals_the_grid_in_process(local_ray, tmp_path):
    cells = number_cells(7) + [Cell(cell_key("doubling", -1), {"i": -1}, -1)]  # one cell that cannot run
    here = run_cells(CellCache(tmp_path / "a.jsonl"), cells, nullcontext, doubling, desc="here",
                     compute_batch=lambda m, cs: [doubling(m, c) for c in cs], batch_size=3)
    there = run_cells(CellCache(tmp_path / "b.jsonl"), cells, nullcontext, doubling, desc="ray",
                      compute_batch=lambda m, cs: [doubling(m, c) for c in cs], batch_size=3, backend="ray")
    assert there == here and here[-1]["skipped"] == "cell -1 cannot run"
    assert sorted(r["key"] for r in lines(tmp_path / "b.jsonl")) == sorted(c.key for c in cells)


def test_fused_generation_on_ray_equals_in_process(local_ray, tmp_path):
    """Tiny models cross to the workers by recipe and generate exactly what the driver generates."""
    master, slave = fl.load("tiny-qwen2"), fl.load("tiny-qwen2")
    prompts = ["one two three", "the cat sat on", "a b c d e f", "numbers: 1 2 3"]
    cells = [Cell(cell_key("gen", p), {"prompt": p}, p) for p in prompts]

    def generate(fused, cs):
        return [{"text": t} for t in fused.generate([c.item for c in cs], max_new_tokens=6)]

    def open_fused():
        return fl.fuse(master, [fl.Slave(slave)])

    here = run_cells(CellCache(tmp_path / "a.jsonl"), cells, open_fused, lambda f, c: generate(f, [c])[0], "here",
                     compute_batch=generate, batch_size=2)
    with ray_cells.on_ray():
        there = run_cells(CellCache(tmp_path / "b.jsonl"), cells, open_fused, lambda f, c: generate(f, [c])[0],
                          "ray", compute_batch=generate, batch_size=2)
    assert there == here


def test_a_killed_worker_loses_no_cell_and_duplicates_none(local_ray, tmp_path):
    workers = ray_cells.pool(ray_cells.RaySettings())
    pids = ray.get([w.pid.remote() for w in workers])
    path = tmp_path / "k.jsonl"
    cells = number_cells(16, sleep=0.4)

    def kill_one_when_started():
        while not path.exists() or len(path.read_text().splitlines()) < 2:
            time.sleep(0.05)
        os.kill(pids[0], signal.SIGKILL)

    killer = threading.Thread(target=kill_one_when_started)
    killer.start()
    recs = run_cells(CellCache(path), cells, nullcontext, doubling, desc="kill", backend="ray")
    killer.join()
    assert [r["value"] for r in recs] == [2 * i for i in range(16)]
    written = lines(path)
    assert len(written) == 16 and len({r["key"] for r in written}) == 16  # nothing lost, nothing twice
    assert ray.get(workers[0].pid.remote()) != pids[0]  # Ray restarted the killed worker


def test_models_travel_by_recipe_unless_changed():
    lm = fl.load("tiny-llama")
    wire = ray_cells.lm_to_wire(lm)
    assert wire["recipe"] == {"load": {"name": "tiny-llama", "dtype": lm.dtype, "device": "cpu",
                                       "attn_implementation": "sdpa"}}
    assert ray_cells.lm_from_wire({**wire, "fingerprint": lm.fingerprint}).fingerprint == lm.fingerprint
    sib = sibling(lm, "noise:0.01")
    assert ray_cells.lm_to_wire(sib)["recipe"]["sibling"]["recipe"] == "noise:0.01"
    assert ray_cells.lm_from_wire(ray_cells.lm_to_wire(sib)).fingerprint == sib.fingerprint
    with torch.no_grad():
        next(lm.model.parameters()).add_(1.0)  # changed in place: the recipe no longer makes it
    assert "value" in ray_cells.lm_to_wire(lm)
    assert ray_cells.lm_from_wire(ray_cells.lm_to_wire(lm)).model is lm.model


def test_a_worker_without_the_model_names_the_fetch_command():
    with pytest.raises(FusionLabError, match="fusionlab fetch"):
        ray_cells.lm_from_wire({"recipe": {"load": {"name": "/nowhere/model"}}, "name": "m", "fingerprint": None})


def test_other_weights_on_a_worker_are_refused():
    wire = ray_cells.lm_to_wire(fl.load("tiny-llama"))
    with pytest.raises(FusionLabError, match="other weights"):
        ray_cells.lm_from_wire({**wire, "fingerprint": "0" * 64})


def test_an_unreachable_address_fails_within_seconds():
    t0 = time.perf_counter()
    with pytest.raises(FusionLabError, match="127.0.0.1:9"):
        ray_cells.check_reachable("127.0.0.1:9")
    assert time.perf_counter() - t0 < ray_cells.CONNECT_TIMEOUT_S + 2
    with pytest.raises(FusionLabError, match="host:port"):
        ray_cells.check_reachable("nowhere")


def test_ray_missing_says_how_to_install(monkeypatch):
    monkeypatch.setitem(sys.modules, "ray", None)  # `import ray` now raises ImportError
    with pytest.raises(FusionLabError, match=r"fusionlab\[ray\]"):
        ray_cells.on_ray().__enter__()


def test_more_gpus_than_the_cluster_has(local_ray):
    ray_cells.shutdown()
    with pytest.raises(FusionLabError, match="GPU"):
        ray_cells.pool(ray_cells.RaySettings(gpus_per_worker=1))


def test_bad_settings_and_backends(tmp_path, monkeypatch):
    with pytest.raises(FusionLabError, match="cpus_per_worker"):
        ray_cells.on_ray(cpus_per_worker=0).__enter__()
    monkeypatch.setenv(ray_cells.CPUS_ENV, "two")
    with pytest.raises(FusionLabError, match="FUSIONLAB_RAY_CPUS"):
        ray_cells.RaySettings.from_env()
    with pytest.raises(FusionLabError, match="backend"):
        run_cells(CellCache(tmp_path / "c.jsonl"), number_cells(1), nullcontext, doubling, "x", backend="spark")


def test_a_cell_cache_path_must_be_a_writable_file(tmp_path):
    with pytest.raises(FusionLabError, match="is a directory"):
        CellCache(tmp_path)
    (tmp_path / "file").write_text("x")
    with pytest.raises(FusionLabError, match="not writable"):
        CellCache(tmp_path / "file" / "cells.jsonl")


def test_on_ray_restores_the_environment(monkeypatch):
    monkeypatch.delenv(ray_cells.RAY_ENV, raising=False)
    with ray_cells.on_ray("10.0.0.1:6379", cpus_per_worker=2):
        assert os.environ[ray_cells.RAY_ENV] == "10.0.0.1:6379"
        assert ray_cells.RaySettings.from_env() == ray_cells.RaySettings("10.0.0.1:6379", 2, 0)
    assert ray_cells.RAY_ENV not in os.environ


@pytest.mark.integration
@pytest.mark.skipif(not embedded_available("qwen2.5-coder-0.5b-instruct"), reason="embedded models not fetched")
def test_quick_niah_grid_and_humaneval_subset_on_ray_equal_in_process(local_ray, tmp_path):
    from fusionlab.experiments import nb02_niah_grid as ng, nb04_humaneval as he

    qwen = fl.load("qwen2.5-coder-0.5b-instruct")
    p = ng.plan("quick")
    needles = {n.id: n for n in ng.load_needles()}
    settings = ng.rope_settings(qwen, p.variants, None)[:2]
    args = ([needles[i] for i in p.needles], p.lengths, p.depths, {"en": "paul_graham", "zh": "zh"})
    here = ng.run_grid(qwen, settings, *args, cache=tmp_path / "a.jsonl", max_new_tokens=p.max_new_tokens)
    with ray_cells.on_ray():
        there = ng.run_grid(qwen, settings, *args, cache=tmp_path / "b.jsonl", max_new_tokens=p.max_new_tokens)
    cols = ["key", "setting", "needle", "length", "depth", "answer", "label"]
    assert len(here) >= 4 and there[cols].equals(here[cols])
    tasks = he.subset(2)
    build = lambda: fl.fuse(qwen, [])  # noqa: E731
    gens_here = he.generate_all("master", "master alone", build, tasks, max_new_tokens=32,
                                 cache=tmp_path / "h.jsonl")
    with ray_cells.on_ray():
        gens_there = he.generate_all("master", "master alone", build, tasks, max_new_tokens=32,
                                      cache=tmp_path / "r.jsonl")
    assert gens_there["completion"].tolist() == gens_here["completion"].tolist()


def stamped(model, c: Cell) -> dict:
    t0 = time.time()
    time.sleep(0.3)
    return {"pid": os.getpid(), "start": t0, "end": time.time()}


def test_a_chain_runs_in_order_on_one_worker(local_ray, tmp_path):
    """A growing training run's budgets continue one checkpoint: on Ray they must never run at once."""
    cells = [Cell(cell_key("chain", run, b), {"run": run, "budget": b}, (run, b)) for run in "ab" for b in (1, 2, 3)]
    recs = run_cells(CellCache(tmp_path / "c.jsonl"), cells, nullcontext, stamped, "chains", backend="ray",
                     chain=lambda c: c.item[0])
    for run in "ab":
        mine = [r for r in recs if r["run"] == run]
        assert len({r["pid"] for r in mine}) == 1
        assert all(x["end"] <= y["start"] for x, y in zip(mine, mine[1:]))  # one after another, in budget order


def test_the_in_process_lab_never_imports_ray():
    import subprocess

    code = "import sys, fusionlab; from fusionlab.lab import cli, runner; assert 'ray' not in sys.modules, 'ray imported'"
    assert subprocess.run([sys.executable, "-c", code], capture_output=True, text=True).returncode == 0


def test_fuser_training_runs_are_cells_on_ray(local_ray, tiny, monkeypatch, tmp_path):
    """The positive control's training runs go to the workers (one run per cell) and give the fusers the
    in-process runs give. The workers write under the clone's own cache folder (they do not see this test's
    monkeypatch): a budget unique to this process makes them train rather than find an old run."""
    from fusionlab import paths
    from fusionlab.experiments import nb07_corpora as corpora, nb10_fuser_control as fc

    m = tiny("tiny-qwen2")
    p = fc.control_plan("quick")
    p.budget_tokens = 128 + os.getpid() % 97
    docs = corpora.code_docs()[:12] + corpora.english_docs()
    monkeypatch.setattr(fc, "cache_dir", lambda: tmp_path / "here")
    here = fc.measure(m, p, docs)[1]
    monkeypatch.setattr(fc, "cache_dir", paths.cache_dir)  # where the workers write (one machine: one folder)

    def no_training_here(*a, **k):
        raise AssertionError("the driver trained a fuser: the run grid should have left it finished")

    monkeypatch.setattr(fc, "train_fuser", no_training_here)  # the driver's module only; workers import their own
    try:
        with ray_cells.on_ray():
            there = fc.measure(m, p, docs)[1]
    finally:
        for f in (paths.cache_dir() / "fusers").glob(f"*_{p.budget_tokens}.*"):
            f.unlink()
    assert (here["source"] == "trained now").all() and (there["source"] == "trained now").all()
    assert there["transfer"].tolist() == here["transfer"].tolist()


def test_rope_variants_travel_by_recipe():
    from fusionlab.models.variants import rope_variant

    v = rope_variant("tiny-llama", theta_factor=4.0)
    wire = ray_cells.lm_to_wire(v)
    assert wire["recipe"] == {"rope_variant": {"name": "tiny-llama", "theta_factor": 4.0, "scaling": None}}
    assert ray_cells.lm_from_wire(wire).fingerprint == v.fingerprint


def fails_on_five(model, c: Cell) -> dict:
    if c.item == 5 and not os.environ.get("FIXED"):
        raise RuntimeError("the driver's run stops here")
    time.sleep(0.1)
    return {"value": c.item * 2}


def test_a_driver_stopped_mid_grid_resumes_from_the_cache(local_ray, tmp_path):
    path = tmp_path / "d.jsonl"
    cells = number_cells(8)
    with pytest.raises(RuntimeError, match="stops here"):
        run_cells(CellCache(path), cells, nullcontext, fails_on_five, desc="stops", backend="ray")
    kept = {r["key"] for r in lines(path)}
    assert kept and cells[5].key not in kept  # what came back before the stop is kept
    seen = []
    recs = run_cells(CellCache(path), cells, nullcontext,
                     lambda m, c: seen.append(c.item) or {"value": c.item * 2}, desc="resumes")  # in-process resume
    assert [r["value"] for r in recs] == [2 * i for i in range(8)]
    assert sorted(seen) == sorted(c.item for c in cells if c.key not in kept)
    assert len(lines(path)) == 8  # nothing twice
