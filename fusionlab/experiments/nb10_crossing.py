"""Where along one knob of the ladder training-free transfer falls to half of the gap (notebook 10), with a CI.

The weight-noise rungs are one family with one knob, so their transfer can be read as a curve of the sibling's
next-token KL from the master. The crossing is the KL at which the curve first falls below `level`, by
interpolation in log KL between the last rung at or above it and the first below; its CI resamples documents
(the rungs' transfers are recomputed on each resample, the KLs stay fixed). A curve that never falls below `level`
is reported as not bracketed: the crossing then lies beyond the farthest rung, and no number is made up for it.
"""
from __future__ import annotations

import math

import numpy as np
import pandas as pd


def _cross(xs: list[float], ys: list[float], level: float) -> float:
    """The x at which the y's (ordered by x) first fall below `level`; NaN when they never do."""
    for i in range(1, len(xs)):
        if ys[i - 1] >= level > ys[i]:
            frac = (ys[i - 1] - level) / (ys[i - 1] - ys[i])
            if xs[i - 1] <= 0:  # the exact copy sits at KL 0: interpolate linearly from it
                return xs[i - 1] + frac * (xs[i] - xs[i - 1])
            return float(10 ** (math.log10(xs[i - 1]) + frac * (math.log10(xs[i]) - math.log10(xs[i - 1]))))
    return float("nan")


def crossing(cells: pd.DataFrame, div: pd.DataFrame, prefix: str = "noise:", level: float = 0.5,
             n_boot: int = 2000, seed: int = 0) -> dict:
    """The KL at which the `prefix` rungs' NLL transfer falls below `level` of the gap, from the transfer cells
    (`nb10_nll_transfer.run` rows) and the divergence table (`recipe`, `kl`). Returns the rungs used (by KL), the
    point estimate, a 95% percentile CI over documents, the share of resamples with a crossing, and `bracketed`."""
    kl = div.set_index("recipe")["kl"]
    measured = set(cells["setting"])
    rungs = sorted((r for r in kl.index if str(r).startswith(prefix) and f"+{r}" in measured), key=lambda r: kl[r])
    wide = cells.pivot_table(index="doc", columns="setting", values="nll")
    need = ["floor (no document)", "skyline (master reads it)"] + [f"+{r}" for r in rungs]
    wide = wide[[c for c in need if c in wide]].dropna()
    out = {"rungs": rungs, "kl": [float(kl[r]) for r in rungs], "level": level, "n": len(wide),
           "crossing": float("nan"), "lo": float("nan"), "hi": float("nan"), "share_defined": 0.0, "bracketed": False}
    if len(rungs) < 2 or len(wide) == 0 or len(wide.columns) < len(need):
        return out
    f, k = wide["floor (no document)"].to_numpy(), wide["skyline (master reads it)"].to_numpy()
    v = np.stack([wide[f"+{r}"].to_numpy() for r in rungs])  # (rungs, docs)

    def at(idx: np.ndarray) -> float:
        gap = f[idx].mean() - k[idx].mean()
        if gap <= 0:
            return float("nan")  # no gap on this resample: nothing to fall from
        ys = [(f[idx].mean() - v[j, idx].mean()) / gap for j in range(len(rungs))]
        return _cross(out["kl"], ys, level)

    point = at(np.arange(len(f)))
    rng = np.random.default_rng(seed)
    draws = np.array([at(rng.integers(0, len(f), len(f))) for _ in range(n_boot)])
    ok = draws[np.isfinite(draws)]
    out |= {"crossing": point, "share_defined": len(ok) / n_boot, "bracketed": bool(np.isfinite(point))}
    if len(ok):
        out["lo"], out["hi"] = (float(q) for q in np.quantile(ok, [0.025, 0.975]))
    return out


def as_row(c: dict) -> dict:
    """The crossing as one flat table row (what the notebook saves and the README renders)."""
    return {"family": ",".join(c["rungs"]), "kl_max": max(c["kl"]) if c["kl"] else float("nan"),
            **{k: c[k] for k in ("level", "n", "crossing", "lo", "hi", "share_defined", "bracketed")}}


def sentence(c: dict) -> str:
    """One line for the notebook and the README, from `crossing`'s result or its `as_row`."""
    row = as_row(c) if "rungs" in c else c
    if not isinstance(row["family"], str) or not row["family"]:
        return "no rungs of this family measured"
    if not row["bracketed"]:
        return (f"transfer stays above {row['level']:.0%} of the gap on every rung measured (up to KL "
                f"{row['kl_max']:.3g} nats/token): the crossing lies beyond the ladder (n={row['n']} documents)")
    return (f"transfer falls to {row['level']:.0%} of the gap at KL {row['crossing']:.3g} nats/token "
            f"[{row['lo']:.3g}, {row['hi']:.3g}] (bootstrap over {row['n']} documents; {row['share_defined']:.0%} of "
            "resamples cross within the ladder)")
