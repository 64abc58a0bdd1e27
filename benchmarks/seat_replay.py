"""Why HumanEval's seats stay under 85 % busy, and which order would fix it: the committed full run's rows
(`data/results/04_humaneval.full.csv`, tokens per completion) replayed through `fusionlab.analysis.seat_replay`, no
model, in seconds.

Per setting: the occupancy the run measured; the replay in the grid's own order (shortest prompt first,
`nb04_humaneval`'s batch_key) — the check that the replay models the run; task order; 200 seeded random orders
(what an order that knows nothing gives, mean and 5-95 %); longest completion first (an oracle: it needs the
lengths before decoding). Then all four settings sharing one run's seats (one scheduler for every row, the settings
one after another), which no setting's own order can match: each setting's run ends with its last rows decoding
alone, four times over.

The counts are re-tokenised completions cut at their stop string, so a row's replayed length is its real one minus
the stop string's tokens: the replay's steps run a few % under the run's.

Writes benchmarks/results/seat_replay.json.
Usage: python benchmarks/seat_replay.py [--seats 16]
"""
from __future__ import annotations

import argparse
import datetime
import json
from pathlib import Path

import numpy as np
import pandas as pd

from fusionlab.analysis.seat_replay import SeatReplay, random_orders, replay
from fusionlab.experiments import nb04_humaneval as he
from fusionlab.files import atomic_write_text
from fusionlab.paths import results_dir

OUT = Path(__file__).parent / "results"


def summary(r: SeatReplay) -> dict:
    return {"occupancy": round(r.occupancy, 4), "decode_steps": r.decode_steps}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--seats", type=int, default=he.SEATS)
    a = ap.parse_args()
    runs = pd.read_csv(results_dir() / "04_humaneval.full.csv")
    prompt_chars = {t["task_id"]: len(t["prompt"]) for t in he.problems()}
    out: dict = {"date": datetime.date.today().isoformat(), "source": "data/results/04_humaneval.full.csv",
                 "seats": a.seats, "settings": {}}
    shared, own_steps = [], 0
    for setting, rows in runs.groupby("setting", sort=False):
        rows = rows.assign(chars=rows.task_id.map(prompt_chars))
        grid = rows.sort_values("chars", kind="stable")  # run_cells sorts the missing cells by batch_key
        lengths = [int(n) for n in grid.new_tokens.clip(lower=1)]  # each row has at least its prefill's token
        shuffled = random_orders(lengths, a.seats)
        occ = np.array([r.occupancy for r in shuffled])
        own = replay(lengths, a.seats)
        own_steps, shared = own_steps + own.decode_steps, shared + lengths
        out["settings"][setting] = {
            "measured": {"occupancy": round(float(rows.busy_seat_steps.sum() / rows.seat_steps.sum()), 4),
                         "decode_steps": int(rows.seat_steps.sum() // a.seats)},
            "grid_order": summary(own),
            "task_order": summary(replay([int(n) for n in rows.new_tokens.clip(lower=1)], a.seats)),
            "random_orders": {"occupancy_mean": round(float(occ.mean()), 4),
                              "occupancy_5_95": [round(float(q), 4) for q in np.percentile(occ, [5, 95])],
                              "decode_steps_mean": round(float(np.mean([r.decode_steps for r in shuffled])), 1)},
            "longest_first": summary(replay(sorted(lengths, reverse=True), a.seats)),
            "corr_prompt_chars_new_tokens": round(float(np.corrcoef(rows.chars, rows.new_tokens)[0, 1]), 3)}
    together = replay(shared, a.seats)
    out["four_settings_sharing_seats"] = summary(together) | {
        "decode_steps_separately": own_steps, "steps_ratio": round(together.decode_steps / own_steps, 4)}
    OUT.mkdir(exist_ok=True)
    atomic_write_text(OUT / "seat_replay.json", json.dumps(out, indent=1) + "\n")
    print(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
