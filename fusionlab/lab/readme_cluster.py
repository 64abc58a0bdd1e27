"""The README's cluster block: the measured in-process vs Ray-local ratio for one grid (benchmarks/bench_ray.py)
and a paper estimate of each recorded grid on N workers, from its measured cost per computed cell."""
from __future__ import annotations

import json
from pathlib import Path

from ..paths import repo_root
from .results import lab_times

WORKERS = (4, 16)
NOT_YET = "_Not measured yet: run `python benchmarks/bench_ray.py`._"


def ray_markdown(bench: Path | None = None, folder: Path | None = None) -> str:
    f = Path(bench or repo_root() / "benchmarks" / "results" / "ray.json")
    if not f.exists():
        return NOT_YET
    r = json.loads(f.read_text())
    pairs = [ray / here for ray, here in zip(r["ray_s"], r["inprocess_s"])]  # ABAB: each Ray run beside its own
    lines = [f"Measured ({r['measured']}, `benchmarks/bench_ray.py`): {r['grid']} on {r['cpus']} cores, in-process "
             f"{' / '.join(f'{s:.0f}' for s in r['inprocess_s'])} s vs Ray-local ({r['workers']} workers) "
             f"{' / '.join(f'{s:.0f}' for s in r['ray_s'])} s, run in turns: Ray / in-process per pair "
             f"{' / '.join(f'{x:.2f}' for x in pairs)} (the first Ray run includes each worker's start and model "
             f"loads; Ray's own start, {r['ray_start_s']:.0f} s, is apart). On 2 cores two 1-thread workers do what "
             "one 2-thread process does: a ratio near 1 is all this machine can show, and no speed-up is claimed.",
             "",
             "| grid (recorded run) | cells computed | seconds | s / cell | "
             + " | ".join(f"paper estimate on {n} workers" for n in WORKERS) + " |",
             "|---|---|---|---|" + "---|" * len(WORKERS)]
    for size in ("default", "full"):
        for nb, t in sorted(((lab_times(size, folder) or {}).get("notebooks") or {}).items()):
            n = t.get("cells_computed") or 0
            if n < 2:
                continue
            est = " | ".join(f"{t['seconds'] / min(k, n) / 60:.0f} min" for k in WORKERS)
            lines.append(f"| `{nb.removesuffix('.ipynb')}` ({size}) | {n} | {t['seconds']:.0f} | "
                         f"{t['seconds'] / n:.1f} | {est} |")
    lines += ["", "The estimate is the recorded wall time divided by min(N, cells): perfect scaling, each worker as "
              "fast as this machine, a grid's whole time spent in its cells; it leaves out each worker's start and "
              "model load (above) and a cluster's network. It is arithmetic, not a measurement."]
    return "\n".join(lines)
