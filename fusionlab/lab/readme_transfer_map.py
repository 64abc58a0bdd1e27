"""The README's transfer-map block (notebook 10): one row per rung, rendered from the saved ladder table only, the
verdicts from `nb10_claims`' rules on the same rows (never typed)."""
from __future__ import annotations

import math
from pathlib import Path

from ..analysis.stats import interval
from ..experiments.nb10_claims import nll_rung_verdict, relay_verdict
from ..experiments.nb10_crossing import sentence
from .results import best_table

HEAD = ("| slave | KL (nats/token) | distance | transfer [95% CI] | vs other document (nats) | slave's own gain | "
        "through lstsq | KVComm layers | text relay | K/V − relay (nats) | verdict | K/V vs relay |")


def _missing(v: object) -> bool:
    return v is None or (isinstance(v, float) and math.isnan(v))


def _cell(r: dict, point: str, lo: str | None = None, hi: str | None = None, spec: str = ".2f") -> str:
    """`point [lo, hi]`, the point alone where no interval was saved, '-' where the run did not measure it."""
    v = r.get(point)
    if _missing(v):
        return "-"
    if lo is None or _missing(r.get(lo)) or _missing(r.get(hi)):
        return f"{v:{spec}}"
    return f"{v:{spec}} {interval(r[lo], r[hi], spec)}"


def transfer_map_markdown(folder: Path | None = None) -> str:
    """Notebook 10's ladder, nearest rung first: divergence, NLL transfer with its controls, the slave's own gain
    (its ceiling, as a share of the master's gap), the sibling through `lstsq`, the slave on KVComm's layers, the
    text relay and the verdicts."""
    got = best_table("10_transfer_map", folder)
    if got is None:
        return "_Not measured yet: run notebook 10._"
    df, size = got
    lines = [HEAD, "|" + "---|" * (HEAD.count("|") - 1)]
    for r in df.to_dict("records"):
        lines.append(
            f"| {r['slave']} | {_cell(r, 'kl', spec='.3f')} | {_cell(r, 'distance', spec='.3f')} | "
            f"{_cell(r, 'transfer', 'lo', 'hi')} | "
            f"{_cell(r, 'vs_control', 'vs_control_low', 'vs_control_high', '+.2f')} | "
            f"{_cell(r, 'ceiling_share')} | {_cell(r, 'lstsq_transfer', 'lstsq_lo', 'lstsq_hi')} | "
            f"{_cell(r, 'kvcomm_transfer', 'kvcomm_lo', 'kvcomm_hi')} | "
            f"{_cell(r, 'relay_transfer', 'relay_lo', 'relay_hi')} | "
            f"{_cell(r, 'vs_relay', 'vs_relay_low', 'vs_relay_high', '+.2f')} | {nll_rung_verdict(r)} | "
            f"{relay_verdict(r)} |")
    n = int(df["n"].min())
    return "\n".join(lines) + (
        f"\n\nfrom `data/results/10_transfer_map.{size}.csv`: {n} documents (one part A / part B pair each), paired "
        "bootstrap over documents. transfer = share of the master's floor-to-skyline NLL gap (mean "
        f"{df['gap'].iloc[0]:.2f} nats/token) the offload closes; vs other document = the control's NLL minus the "
        "offload's; slave's own gain = its own gap from reading A as a share of the master's; distance = 1 − "
        "layer-mean K/V R² after lstsq; through lstsq / KVComm layers / text relay: the same transfer through the "
        "other channels." + _crossing(folder))


def _crossing(folder: Path | None) -> str:
    """Where the weight-noise curve halves (`nb10_crossing`), when the run saved it."""
    got = best_table("10_crossing", folder)
    return "" if got is None else f" Weight-noise rungs as one curve of KL: {sentence(got[0].iloc[0].to_dict())}."
