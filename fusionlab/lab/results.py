"""Results on disk: tables as CSV, each notebook's claims as JSON (what the README's ledger is built from).

Files live in `paths.results_dir()`: `<notebook>_<table>.<run size>.csv` and `claims/<notebook>.<run size>.json`.
QUICK runs (the tests) write theirs to the ignored `quick/` folder inside it, as figures go to figures/quick/: running
the tests never rewrites a committed result, and the ledger is built from default and full runs only.
"""
from __future__ import annotations

import json
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any

import pandas as pd

from ..errors import FusionLabError
from ..experiments import gpu_claims
from ..experiments.claim import LEGACY_IDS, VERDICTS, Claim, unmeasured  # noqa: F401  (fl.results.Claim for users)
from ..files import atomic_write_text
from ..paths import results_dir
from ..runsize import SIZES


def _home_for(run_size: str, folder: Path | None) -> Path:
    """An explicit folder as given; otherwise the results folder, or its ignored quick/ for QUICK runs."""
    if folder is not None:
        return Path(folder)
    return results_dir() / "quick" if run_size == "quick" else results_dir()


def _newlines(df: pd.DataFrame) -> pd.DataFrame:
    """Carriage returns in text cells as newlines: the csv writer quotes a cell only for the characters of its own
    line end ('\\n'), so a bare '\\r' (a generated note can hold one) went unquoted and pandas' reader split the
    record there."""
    text = [c for c in df.columns if df[c].dtype == object or pd.api.types.is_string_dtype(df[c])]
    if not text:
        return df
    out = df.copy()
    for c in text:
        out[c] = out[c].map(lambda x: x.replace("\r\n", "\n").replace("\r", "\n") if isinstance(x, str) else x)
    return out


def _table_path(name: str, folder: Path | None) -> Path:
    """Where table `name` (`<notebook>_<table>.<run size>`) lives: its run size picks the folder."""
    size = name.rsplit(".", 1)[-1] if "." in name else ""
    return _home_for(size, folder) / f"{name}.csv"


def save_table(df: pd.DataFrame, name: str, folder: Path | None = None) -> Path:
    """`name`.csv (`<notebook>_<table>.<run size>`) in the results folder, written atomically; reading it back gives
    the same rows (text with carriage returns written as newlines)."""
    return atomic_write_text(_table_path(name, folder), _newlines(df).to_csv(index=False))


def load_table(name: str, folder: Path | None = None) -> pd.DataFrame | None:
    """The table `save_table(df, name, folder)` wrote, or None where it has not been saved."""
    f = _table_path(name, folder)
    return pd.read_csv(f) if f.exists() else None


def save_claims(notebook: str, claims: list[Claim], run_size: str, folder: Path | None = None) -> Path:
    """One JSON per notebook and run size; the ledger prefers full over default runs (QUICK ones live in the ignored quick/)."""
    folder = Path(folder) if folder is not None else _home_for(run_size, None) / "claims"
    missing = [c.claim for c in claims if not c.claim_id]
    if missing:
        raise FusionLabError(f"claims without a claim_id (C01-C73 from data/claims.csv, or X..): {missing}.")
    body = json.dumps({"notebook": notebook, "run_size": run_size, "date": time.strftime("%Y-%m-%dT%H:%M:%S"),
                       "claims": [asdict(c) for c in claims]}, indent=2, ensure_ascii=False)
    return atomic_write_text(folder / f"{notebook}.{run_size}.json", body)


def claims_frame(claims: list[Claim]) -> pd.DataFrame:
    return pd.DataFrame([asdict(c) for c in claims])


def ledger(folder: Path | None = None, with_open: bool = True, gpu: Path | None = None) -> pd.DataFrame:
    """All saved claims, the largest run of each notebook only; the GPU run's rows (`gpu`, default
    benchmarks/results/gpu_claims.json, when a session has run it) in place of any other row for those claims; then
    (`with_open`) a row for every claim of data/claims.csv that none of them covers (`claim.unmeasured`: why it is
    open)."""
    folder = Path(folder or results_dir() / "claims")
    rank = {size: i for i, size in enumerate(SIZES)}
    best: dict[str, dict[str, Any]] = {}
    for f in sorted(folder.glob("*.json")):
        rec = json.loads(f.read_text())
        cur = best.get(rec["notebook"])
        if cur is None or rank[rec["run_size"]] < rank[cur["run_size"]]:
            best[rec["notebook"]] = rec
    rows = [dict(c, run=rec["run_size"], date=rec["date"][:10]) for rec in best.values() for c in rec["claims"]]
    for r in rows:
        r["claim_id"] = r.get("claim_id") or LEGACY_IDS.get(r["claim"], "")
    run = gpu_claims.load(gpu)
    if run is not None:
        measured = gpu_claims.claims(run)
        ids = {c.claim_id for c in measured}
        rows = [r for r in rows if r["claim_id"] not in ids]
        rows += [dict(asdict(c), run="gpu", date=str(run.get("date", "-"))[:10]) for c in measured]
    if with_open:
        seen = {r["claim_id"] for r in rows}
        rows += [dict(asdict(c), run="-", date="-") for c in unmeasured(seen)]
    return pd.DataFrame(rows)


def best_table(stem: str, folder: Path | None = None,
               dtype: dict[str, type] | None = None) -> tuple[pd.DataFrame, str] | None:
    """The saved table `stem`.<size>.csv from the largest run size available (full > default > quick); `dtype` pins
    columns pandas would guess wrong (a commit hash of digits only, `0274500`, would read as the int 274500)."""
    folder = Path(folder or results_dir())
    for size in SIZES:
        f = folder / f"{stem}.{size}.csv"
        if f.exists():
            return pd.read_csv(f, dtype=dtype), size
    return None


def record_lab_time(notebook: str, seconds: float, run_size: str, folder: Path | None = None,
                    cells: dict[str, int] | None = None) -> Path:
    """Add one notebook's wall time to lab_times.<run size>.json (the README's notebook-cost table reads it), with
    how many grid cells came from the cache and how many were computed (`cells.read_tally`)."""
    import os

    import torch

    path = Path(folder or results_dir()) / f"lab_times.{run_size}.json"
    rec = json.loads(path.read_text()) if path.exists() else {"run_size": run_size, "notebooks": {}}
    rec["machine"] = {"cpus": os.cpu_count(), "torch": torch.__version__}
    rec["notebooks"][notebook] = {"seconds": round(seconds, 1), "date": time.strftime("%Y-%m-%dT%H:%M:%S")} | (
        {"cells_cached": cells["cached"], "cells_computed": cells["computed"]} if cells else {})
    return atomic_write_text(path, json.dumps(rec, indent=2, sort_keys=True))


def lab_times(run_size: str, folder: Path | None = None) -> dict[str, Any] | None:
    path = Path(folder or results_dir()) / f"lab_times.{run_size}.json"
    return json.loads(path.read_text()) if path.exists() else None
