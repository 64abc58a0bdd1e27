"""Why did some fused HumanEval completions change between the batch-1 run and the batched rerun of notebook 04?

Two things changed between those runs: decoding in batches, and the lstsq projectors (refit since; they differ by
about 1e-7). The master alone has no projector and changed on 0 of 164 problems, which isolates batching for it.
For the fused settings this script regenerates every changed problem alone (batch 1) with today's projectors:
equal to the batched completion -> the change came from the refit; equal to the old batch-1 completion -> from
batching; neither -> both. Writes benchmarks/results/rerun_attribution.json (the README's Reliability block reads it).

Usage: python benchmarks/rerun_attribution.py [--before a60cb00]   (after `fusionlab lab --full --only 04`)
"""
from __future__ import annotations

import argparse
import json
from pathlib import Path

import pandas as pd

import fusionlab as fl
from fusionlab.experiments import nb04_cache_bus as bus
from fusionlab.experiments import nb04_humaneval as he
from fusionlab.lab.rerun import table_at_commit
from fusionlab.paths import results_dir

OUT = Path(__file__).parent / "results" / "rerun_attribution.json"
NAMES = {"master": "qwen2.5-coder-0.5b-instruct", "smollm2": "smollm2-135m-instruct", "gemma3": "gemma3-270m"}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--before", default="a60cb00", help="the commit that saved the batch-1 run")
    args = ap.parse_args()
    now_path = results_dir() / "04_humaneval.full.csv"
    (old, _), new = table_at_commit(now_path, args.before), pd.read_csv(now_path)
    both = old.merge(new, on=["setting", "task_id"], suffixes=("_old", "_new"))
    changed = both[both["completion_old"] != both["completion_new"]]
    master = fl.load(NAMES["master"])
    slaves = {k: fl.load(v) for k, v in NAMES.items() if k != "master"}
    parts = {k: (s, fl.fit_lstsq(master, s)) for k, s in slaves.items()}  # the notebook's fit (cached, deterministic)
    settings = bus.settings(master, parts)
    prompts = {t["task_id"]: t["prompt"] for t in he.problems()}
    rows = []
    for setting, g in changed.groupby("setting", sort=False):
        with settings[setting][1]() as fused:
            for r in g.itertuples():
                alone = fused.generate(prompts[r.task_id], max_new_tokens=256, stop=he.STOP)
                cause = ("projector refit" if alone == r.completion_new else
                         "batching" if alone == r.completion_old else "both")
                rows.append({"setting": setting, "task_id": r.task_id, "cause": cause})
                print(rows[-1], flush=True)
    df = pd.DataFrame(rows, columns=["setting", "task_id", "cause"])
    res = {"before": args.before, "changed": len(df), "master_alone_changed": int(
        (changed["setting"] == "master alone").sum()), "by_cause": df["cause"].value_counts().to_dict(),
        "rows": df.to_dict("records")}
    OUT.parent.mkdir(exist_ok=True)
    OUT.write_text(json.dumps(res, indent=2))
    print(json.dumps(res["by_cause"]))


if __name__ == "__main__":
    main()
