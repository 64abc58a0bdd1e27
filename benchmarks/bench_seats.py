"""How many seats should a HumanEval grid use? The same prompts streamed through one scheduler run at several seat
counts, side by side in one process, for the master alone and for the bus (+smollm2 +gemma3, notebook 04's slowest
setting). On this CPU a decode step is bound by reading the weights, so more rows a step should be cheaper per token
until attention over every row's keys (and, fused, every row's slots) takes over.

Each seat count must give the same completions as the first (every row equals its prompt alone; a fused row may
differ where the batch tests' tolerance allows, so differing completions are counted, not refused).

Writes benchmarks/results/seats.json: per setting and seat count, wall seconds of each run, tokens generated,
occupancy, and the wall ratio to the first seat count.
Usage: python benchmarks/bench_seats.py [--n 32] [--seats 8 16 32] [--new 256] [--reps 2] [--settings alone bus]
"""
from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import torch

import fusionlab as fl
from fusionlab.engine.continuous import ContinuousBatcher
from fusionlab.experiments import nb04_cache_bus as bus
from fusionlab.experiments import nb04_humaneval as he
from fusionlab.files import atomic_write_text

OUT = Path(__file__).parent / "results"
SLAVES = ("smollm2-135m-instruct", "gemma3-270m")


def run(f: fl.FusedModel, prompts: list[str], seats: int, new: int) -> dict:
    """One streamed scheduler run over every prompt: wall seconds, occupancy, tokens and the completions."""
    cb = ContinuousBatcher(f, seats)
    t0 = time.perf_counter()
    outs = cb.generate(prompts, max_new_tokens=new, stop=he.STOP)
    wall = time.perf_counter() - t0
    tokens = sum(len(f.master.tokenizer(o)["input_ids"]) for o in outs)
    return {"wall_s": wall, "occupancy": cb.last_stats.occupancy, "tokens": tokens, "completions": outs}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="qwen2.5-coder-0.5b-instruct")
    ap.add_argument("--n", type=int, default=32)
    ap.add_argument("--seats", type=int, nargs="+", default=[8, 16, 32])
    ap.add_argument("--new", type=int, default=256)
    ap.add_argument("--reps", type=int, default=2)
    ap.add_argument("--settings", nargs="+", default=["alone", "bus"], choices=["alone", "bus"])
    a = ap.parse_args()
    master = fl.load(a.model)
    prompts = sorted((t["prompt"] for t in he.problems()[:a.n]), key=len)  # nb04's batch_key order
    parts = {}
    if "bus" in a.settings:
        for name in SLAVES:
            lm = fl.load(name)
            parts[fl.short_name(name)] = (lm, fl.fit_lstsq(master, lm))
    builds = {"alone": lambda: fl.fuse(master, []), "bus": lambda: fl.fuse(master, bus.slaves_for(parts))}
    result = {}
    for setting in a.settings:
        with builds[setting]() as f:
            runs, first = {s: [] for s in a.seats}, None
            for rep in range(a.reps):
                for seats in a.seats:  # in turns, so a slow spell of the machine hits every seat count
                    r = run(f, prompts, seats, a.new)
                    first = first or r["completions"]
                    r["differing"] = sum(x != y for x, y in zip(r.pop("completions"), first))
                    runs[seats].append(r)
                    print(setting, seats, rep + 1, {k: round(v, 3) for k, v in r.items()}, flush=True)
        base = sum(r["wall_s"] for r in runs[a.seats[0]])
        result[setting] = {str(s): {"wall_s": [r["wall_s"] for r in rs], "tokens": rs[0]["tokens"],
                                    "occupancy": rs[0]["occupancy"], "differing_from_first": rs[-1]["differing"],
                                    "wall_over_first": sum(r["wall_s"] for r in rs) / base}
                           for s, rs in runs.items()}
    rec = {"model": a.model, "prompts": a.n, "seats": a.seats, "max_new_tokens": a.new, "reps": a.reps,
           "threads": torch.get_num_threads(), "torch": torch.__version__, "slaves": list(SLAVES),
           "settings": result, "date": time.strftime("%Y-%m-%d")}
    atomic_write_text(OUT / "seats.json", json.dumps(rec, indent=2))
    print(json.dumps(rec, indent=2))


if __name__ == "__main__":
    main()
