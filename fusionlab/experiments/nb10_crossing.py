"""Where along one knob of the ladder training-free transfer falls to half of the gap (notebook 10), with a CI.

The weight-noise rungs are one family with one knob, so their transfer can be read as a curve of the sibling's
next-token KL from the master. The crossing is the KL at which the curve first falls below `level`, by
interpolation in log KL between the last rung at or above it and the first below; its CI resamples documents
(the rungs' transfers are recomputed on each resample, the KLs stay fixed). A curve that never falls below `level`
is reported as not bracketed: the crossing then lies beyond the farthest rung, and no number is made up for it.

The same rule reads offload accuracy (`accuracy_crossing`, resampling items) twice: where the channel stops
carrying (offload) and where the slave itself stops knowing (its ceiling), so a channel that fails before the
slave forgets can be told from one that fails because it does.
"""
from __future__ import annotations

import math
from typing import Callable

import numpy as np
import pandas as pd

from ..errors import FusionLabError
from .nb06_offload_stats import answered


def _cross(xs: list[float], ys: list[float], level: float) -> float:
    """The x at which the y's (ordered by x) first fall below `level`; NaN when they never do."""
    for i in range(1, len(xs)):
        if ys[i - 1] >= level > ys[i]:
            frac = (ys[i - 1] - level) / (ys[i - 1] - ys[i])
            if xs[i - 1] <= 0:  # the exact copy sits at KL 0: interpolate linearly from it
                return xs[i - 1] + frac * (xs[i] - xs[i - 1])
            return float(10 ** (math.log10(xs[i - 1]) + frac * (math.log10(xs[i]) - math.log10(xs[i - 1]))))
    return float("nan")


def _at(f: np.ndarray, k: np.ndarray, v: np.ndarray, kls: list[float], level: float, idx: np.ndarray) -> float:
    """The crossing on the units `idx` (one resample); NaN where the skyline is no better than the floor there."""
    gap = k[idx].mean() - f[idx].mean()
    if gap <= 0:
        return float("nan")  # nothing to fall from
    return _cross(kls, [(v[j, idx].mean() - f[idx].mean()) / gap for j in range(len(kls))], level)


def _resampled(stat: Callable[[np.ndarray], float], n: int, n_boot: int, seed: int) -> dict:
    """`stat` on all n units (`point`) and its 95 % percentile CI over `n_boot` resamples of them, leaving out the
    resamples where it is undefined (NaN); `share_defined` says how many were kept."""
    rng = np.random.default_rng(seed)
    draws = np.array([stat(rng.integers(0, n, n)) for _ in range(n_boot)])
    ok = draws[np.isfinite(draws)]
    lo, hi = (float(q) for q in np.quantile(ok, [0.025, 0.975])) if len(ok) else (float("nan"), float("nan"))
    return {"point": stat(np.arange(n)), "lo": lo, "hi": hi, "share_defined": len(ok) / n_boot}


def curve(f: np.ndarray, k: np.ndarray, v: np.ndarray, kls: list[float], level: float = 0.5,
          n_boot: int = 2000, seed: int = 0) -> dict:
    """The crossing of one knob's curve from per-unit scores, higher = better (documents' negated NLL, items'
    correctness): f, k (n,) the floor and skyline, v (rungs, n) the rungs in KL order. A rung's transfer is
    (mean v - mean f) / (mean k - mean f); the CI resamples units. Returns crossing, lo, hi, share_defined,
    bracketed."""
    out = {"crossing": float("nan"), "lo": float("nan"), "hi": float("nan"), "share_defined": 0.0,
           "bracketed": False}
    if len(kls) < 2 or len(f) == 0:
        return out
    r = _resampled(lambda idx: _at(f, k, v, kls, level, idx), len(f), n_boot, seed)
    return out | {"crossing": r["point"], "lo": r["lo"], "hi": r["hi"], "share_defined": r["share_defined"],
                  "bracketed": bool(np.isfinite(r["point"]))}


FLOOR, SKYLINE = "floor (no document)", "skyline (master reads it)"


def _read(wide: pd.DataFrame, div: pd.DataFrame, prefix: str, name: str, level: float, n_boot: int, seed: int,
          **meta: str) -> dict:
    """The crossing of the `prefix` rungs' curve from `wide` (unit x setting scores, higher = better), a rung's
    setting being `name.format(rung)`; units missing any setting are dropped. `meta` (unit, of) is kept in the
    result."""
    kl = div.set_index("recipe")["kl"]
    rungs = sorted((r for r in kl.index if str(r).startswith(prefix) and name.format(r) in wide), key=lambda r: kl[r])
    out = {"rungs": rungs, "kl": [float(kl[r]) for r in rungs], "level": level, **meta}
    if FLOOR not in wide or SKYLINE not in wide:
        return out | {"n": 0} | curve(np.array([]), np.array([]), np.empty((0, 0)), [], level)
    wide = wide[[FLOOR, SKYLINE] + [name.format(r) for r in rungs]].dropna()
    v = wide.iloc[:, 2:].to_numpy().T  # (rungs, units)
    return out | {"n": len(wide)} | curve(wide[FLOOR].to_numpy(), wide[SKYLINE].to_numpy(), v, out["kl"], level,
                                          n_boot, seed)


def crossing(cells: pd.DataFrame, div: pd.DataFrame, prefix: str = "noise:", level: float = 0.5,
             n_boot: int = 2000, seed: int = 0) -> dict:
    """The KL at which the `prefix` rungs' NLL transfer falls below `level` of the gap, from the transfer cells
    (`nb10_nll_transfer.run` rows) and the divergence table (`recipe`, `kl`). Returns the rungs used (by KL), the
    point estimate, a 95% percentile CI over documents, the share of resamples with a crossing, and `bracketed`."""
    wide = -cells.pivot_table(index="doc", columns="setting", values="nll")  # lower NLL is better: negated
    return _read(wide, div, prefix, "+{}", level, n_boot, seed, unit="documents", of="transfer")


OF = {"offload": "+{}", "ceiling": "{} alone (reads it)"}
"""Which curve of an offload grid: the master reading the rung's slots, or the rung's slave answering alone."""


def _wide_accuracy(cells: pd.DataFrame) -> pd.DataFrame:
    """Offload cells as item x setting correctness (correct = 1, anything else = 0), cells that did not run dropped."""
    done = answered(cells).assign(ok=lambda d: (d["label"] == "correct").astype(float))
    return done.pivot_table(index="item", columns="setting", values="ok")


def accuracy_crossing(cells: pd.DataFrame, div: pd.DataFrame, of: str = "offload", prefix: str = "noise:",
                      level: float = 0.5, n_boot: int = 2000, seed: int = 0) -> dict:
    """As `crossing`, on offload accuracy (`nb10_offload` cells; correct = 1, anything else = 0): `of` 'offload' is
    the transfer (offload - floor) / (skyline - floor), 'ceiling' the slave's own accuracy on the same scale (where
    the slave stops knowing, beside where the channel stops carrying). The CI resamples items."""
    if of not in OF:
        raise FusionLabError(f"of={of!r} is not a curve of an offload grid; use one of {sorted(OF)}.")
    return _read(_wide_accuracy(cells), div, prefix, OF[of], level, n_boot, seed, unit="items", of=of)


ORDER = {"channel after": "the channel carries past the point where the slave stops knowing",
         "channel before": "the channel fails before the slave stops knowing",
         "indistinguishable": "the channel and the slave halve at indistinguishable KL",
         "not bracketed": "one of the curves does not fall to the level within the ladder: no order to read"}
"""`crossing_order`'s verdicts and how a sentence says them."""


def crossing_order(cells: pd.DataFrame, div: pd.DataFrame, prefix: str = "noise:", level: float = 0.5,
                   n_boot: int = 2000, seed: int = 0) -> dict:
    """Does the channel fail before its slave forgets? The two offload curves (`accuracy_crossing`'s offload and
    ceiling) on the same items and the same resamples: gap = log10(channel's crossing / slave's crossing), in decades
    of KL, its 95% CI over paired resamples (those where both curves cross). Verdict, in this order: 'not bracketed'
    (either point crossing undefined), 'channel after' (CI above 0: the master reads the sibling's memory at
    divergences where the sibling can no longer answer), 'channel before' (CI below 0), else 'indistinguishable'."""
    wide, kl = _wide_accuracy(cells), div.set_index("recipe")["kl"]
    rungs = sorted((r for r in kl.index if str(r).startswith(prefix)
                    and all(OF[of].format(r) in wide for of in OF)), key=lambda r: kl[r])
    out = {"rungs": rungs, "level": level, "n": 0, "gap": float("nan"), "lo": float("nan"), "hi": float("nan"),
           "share_defined": 0.0, "verdict": "not bracketed"}
    if len(rungs) < 2 or FLOOR not in wide or SKYLINE not in wide:
        return out
    wide = wide[[FLOOR, SKYLINE] + [OF[of].format(r) for of in OF for r in rungs]].dropna()
    f, k, kls = wide[FLOOR].to_numpy(), wide[SKYLINE].to_numpy(), [float(kl[r]) for r in rungs]
    curves = [wide[[OF[of].format(r) for r in rungs]].to_numpy().T for of in OF]  # (rungs, items) each

    def gap(idx: np.ndarray) -> float:
        a, b = (_at(f, k, v, kls, level, idx) for v in curves)
        return float(np.log10(a / b)) if a > 0 and b > 0 else float("nan")  # NaN propagates: not bracketed

    out["n"] = len(wide)
    if len(wide) == 0:
        return out
    r = _resampled(gap, len(wide), n_boot, seed)
    out |= {"gap": r["point"], "lo": r["lo"], "hi": r["hi"], "share_defined": r["share_defined"]}
    if not np.isfinite(r["point"]) or not r["share_defined"]:
        return out
    out["verdict"] = ("channel after" if out["lo"] > 0 else "channel before" if out["hi"] < 0
                      else "indistinguishable")
    return out


def order_sentence(c: dict) -> str:
    """`crossing_order`'s result in one line."""
    if c["verdict"] == "not bracketed":
        return ORDER["not bracketed"]
    return (f"{ORDER[c['verdict']]} (channel / slave crossing {c['gap']:+.2f} decades of KL [{c['lo']:+.2f}, "
            f"{c['hi']:+.2f}], paired bootstrap over {c['n']} items)")


def as_row(c: dict) -> dict:
    """The crossing as one flat table row (what the notebook saves and the README renders)."""
    return {"family": ",".join(c["rungs"]), "kl_max": max(c["kl"]) if c["kl"] else float("nan"),
            **{k: c[k] for k in ("level", "n", "crossing", "lo", "hi", "share_defined", "bracketed")},
            "unit": c.get("unit", "documents"), "of": c.get("of", "transfer")}


WHAT = {"transfer": "transfer", "offload": "transfer", "ceiling": "the slave's own accuracy"}
"""How a sentence names the curve (`of`)."""


def sentence(c: dict) -> str:
    """One line for the notebook and the README, from `crossing`'s (or `accuracy_crossing`'s) result or its
    `as_row` (rows saved before `unit` / `of` existed are NLL transfer over documents)."""
    row = as_row(c) if "rungs" in c else c
    if not isinstance(row["family"], str) or not row["family"]:
        return "no rungs of this family measured"
    if "," not in row["family"]:
        return f"one rung of this family measured ({row['family']}): no curve to fall"
    unit = row["unit"] if isinstance(row.get("unit"), str) else "documents"
    what = WHAT[row["of"] if isinstance(row.get("of"), str) else "transfer"]
    if not row["bracketed"]:
        return (f"{what} stays above {row['level']:.0%} of the gap on every rung measured (up to KL "
                f"{row['kl_max']:.3g} nats/token): the crossing lies beyond the ladder (n={row['n']} {unit})")
    return (f"{what} falls to {row['level']:.0%} of the gap at KL {row['crossing']:.3g} nats/token "
            f"[{row['lo']:.3g}, {row['hi']:.3g}] (bootstrap over {row['n']} {unit}; {row['share_defined']:.0%} of "
            "resamples cross within the ladder)")
