"""A grid's scheduler runs, streamed against grouped, side by side in one process: the master alone on the same
HumanEval prompts (in the grid's order: shortest first), `--seats` seats, HumanEval's stop strings,
(a) grouped: GROUP_SEATS x seats prompts per scheduler run, as the grids ran until 2026-12-06 (a group's last rows
    decode while the seats the group freed stay idle);
(b) streamed: every prompt in one scheduler run, as the grids run now (`run_cells(streams=True)`).
Both must give the same completions. Two runs each, in turns.

Writes benchmarks/results/streaming.json: wall seconds and occupancy of each run, streamed / grouped wall per run.
Usage: python benchmarks/bench_streaming.py [--n 64] [--seats 8] [--new 256] [--reps 2]
"""
from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import torch

import fusionlab as fl
from fusionlab.engine.continuous import GROUP_SEATS, ContinuousBatcher
from fusionlab.experiments import nb04_humaneval as he
from fusionlab.files import atomic_write_text

OUT = Path(__file__).parent / "results"


def run(f: fl.FusedModel, prompts: list[str], seats: int, new: int, per_run: int) -> tuple[float, float, list[str]]:
    """Wall seconds, occupancy (busy / all seat-steps over every scheduler run) and the completions."""
    t0, outs, busy, steps = time.perf_counter(), [], 0, 0
    for at in range(0, len(prompts), per_run):
        cb = ContinuousBatcher(f, seats)
        outs += cb.generate(prompts[at:at + per_run], max_new_tokens=new, stop=he.STOP)
        busy, steps = busy + cb.last_stats.busy_seats, steps + cb.last_stats.decode_steps * seats
    return time.perf_counter() - t0, busy / steps, outs


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="qwen2.5-coder-0.5b-instruct")
    ap.add_argument("--n", type=int, default=64)
    ap.add_argument("--seats", type=int, default=8)
    ap.add_argument("--new", type=int, default=256)
    ap.add_argument("--reps", type=int, default=2)
    a = ap.parse_args()
    lm = fl.load(a.model)
    prompts = sorted((t["prompt"] for t in he.problems()[:a.n]), key=len)  # nb04's batch_key order
    runs, outs = [], {}
    with fl.fuse(lm, []) as f:
        for rep in range(a.reps):
            for how, per_run in (("grouped", GROUP_SEATS * a.seats), ("streamed", len(prompts))):
                wall, occ, got = run(f, prompts, a.seats, a.new, per_run)
                runs.append({"run": rep + 1, "how": how, "wall_s": wall, "occupancy": occ})
                print(runs[-1], flush=True)
                if outs.setdefault(how, got) != got:
                    raise SystemExit(f"{how}: run {rep + 1} gave other completions than run 1")
    if outs["grouped"] != outs["streamed"]:
        raise SystemExit("streamed and grouped scheduler runs gave different completions")
    wall = {h: [r["wall_s"] for r in runs if r["how"] == h] for h in ("grouped", "streamed")}
    rec = {"model": a.model, "prompts": a.n, "seats": a.seats, "group_seats": GROUP_SEATS, "max_new_tokens": a.new,
           "reps": a.reps, "threads": torch.get_num_threads(), "torch": torch.__version__, "runs": runs,
           "streamed_over_grouped_wall": [s / g for s, g in zip(wall["streamed"], wall["grouped"])],
           "same_completions": True, "date": time.strftime("%Y-%m-%d")}
    atomic_write_text(OUT / "streaming.json", json.dumps(rec, indent=2))
    print(json.dumps(rec, indent=2))


if __name__ == "__main__":
    main()
