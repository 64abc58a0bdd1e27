"""One grid in-process and on a local Ray instance, side by side in one process: notebook 02's QUICK NIAH grid (Qwen
master, its two QUICK settings), each run into a fresh cell cache, ABAB order. On Ray every worker holds its own
copy of the model and computes with cpus/worker threads; on this 2-core machine the ratio is expected near 1 (two
1-thread workers vs one 2-thread process), plus Ray's start and each worker's model load, reported apart.

Writes benchmarks/results/ray.json: wall seconds per run, the ratio Ray / in-process with and without the first
(cold) Ray run, and the per-cell cost that the README's paper estimate of each full grid on N workers uses.
Usage: python benchmarks/bench_ray.py [--reps 2]
"""
from __future__ import annotations

import argparse
import json
import os
import tempfile
import time
from pathlib import Path

import ray

import fusionlab as fl
from fusionlab.experiments import nb02_niah_grid as ng
from fusionlab.lab import ray_cells

OUT = Path(__file__).parent / "results"


def one_run(qwen: fl.LM, settings: list, args: tuple, on_ray: bool) -> tuple[float, int]:
    with tempfile.TemporaryDirectory() as tmp:
        t0 = time.perf_counter()
        if on_ray:
            with ray_cells.on_ray():
                df = ng.run_grid(qwen, settings, *args, cache=Path(tmp) / "c.jsonl", max_new_tokens=8)
        else:
            df = ng.run_grid(qwen, settings, *args, cache=Path(tmp) / "c.jsonl", max_new_tokens=8)
        return time.perf_counter() - t0, len(df)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--reps", type=int, default=2)
    a = ap.parse_args()
    qwen = fl.load("qwen2.5-coder-0.5b-instruct")
    p = ng.plan("quick")
    needles = {n.id: n for n in ng.load_needles()}
    settings = ng.rope_settings(qwen, p.variants, None)
    args = ([needles[i] for i in p.needles], p.lengths, p.depths, {"en": "paul_graham", "zh": "zh"})
    t0 = time.perf_counter()
    ray.init(num_cpus=os.cpu_count(), include_dashboard=False, log_to_driver=False, _node_ip_address="127.0.0.1")
    start_s = time.perf_counter() - t0
    here, there = [], []
    for _ in range(a.reps):
        there.append(one_run(qwen, settings, args, True)[0])  # the first Ray run also loads each worker's model
        s, cells = one_run(qwen, settings, args, False)
        here.append(s)
    workers = len(ray_cells._POOL)
    ray_cells.shutdown()
    ray.shutdown()
    warm = there[1:] or there
    rec = {"grid": f"notebook 02 QUICK NIAH ({cells} cells, {len(settings)} settings, Qwen master)",
           "cpus": os.cpu_count(), "workers": workers, "ray_start_s": round(start_s, 1),
           "inprocess_s": [round(x, 1) for x in here], "ray_s": [round(x, 1) for x in there],
           "ratio_cold": round(there[0] / here[0], 3), "ratio_warm": round(sum(warm) / len(warm) / (sum(here) / len(here)), 3),
           "seconds_per_cell_inprocess": round(sum(here) / len(here) / cells, 2),
           "measured": time.strftime("%Y-%m-%d")}
    OUT.mkdir(exist_ok=True)
    (OUT / "ray.json").write_text(json.dumps(rec, indent=2) + "\n")
    print(json.dumps(rec, indent=2))


if __name__ == "__main__":
    main()
