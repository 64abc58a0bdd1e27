"""Notebook 06's verdict rules: does a slave's K/V carry what it read to the master (X01), and how far (by length).

The harness that measures is `nb06_offload_stats`; this module only judges (rules tested on hand-made data).
"""
from __future__ import annotations

import pandas as pd

from ..analysis.stats import interval
from .claim import Claim

NB = "06_context_offload"


MIN_ITEMS = 20
"""Fewer items than this and a percentile bootstrap can collapse to a point (every draw 0/0): no verdict then."""


MIN_PER_LENGTH = 5


# --- claims ------------------------------------------------------------------------------------------------
def borrowed_memory_claim(acc: pd.DataFrame, tr: pd.DataFrame, ctrl: pd.DataFrame, agree: tuple[int, int], label: str = "",
                 notebook: str = NB) -> Claim:
    """Supported iff some real slave (or the bus) has a transfer-rate CI above 0 *and* beats its shuffled control
    (McNemar p < 0.05, more correct). Not supported iff every real slave that *knew* (its ceiling, the slave alone
    reading the document, more accurate than the floor; a bus knows if one of its slaves does) has a transfer CI
    below 0.25 (under a quarter of what the master gains by reading the document itself). Inconclusive otherwise:
    fewer than MIN_ITEMS items, a skyline no better than the floor (nothing to transfer), no ceiling measured, or no
    slave that knew (a null then says nothing about the channel)."""
    a = acc.set_index("setting")
    floor, sky = a[a["role"] == "floor"].iloc[0], a[a["role"] == "skyline"].iloc[0]
    real = tr[tr["role"].isin(["cross", "bus"])].set_index("setting")
    c = ctrl.set_index("setting") if len(ctrl) else pd.DataFrame()
    beats = [s for s in real.index if real.loc[s, "lo"] > 0 and s in c.index
             and c.loc[s, "p_value"] < 0.05 and c.loc[s, "acc_setting"] > c.loc[s, "acc_control"]]
    knew = {s: ceiling_of(a, s) > floor["accuracy"] for s in real.index}
    judged = [s for s in real.index if knew[s]]
    none = bool(judged) and bool((real.loc[judged, "hi"] < 0.25).all())
    verdict = ("inconclusive" if sky["accuracy"] <= floor["accuracy"] or floor["n"] < MIN_ITEMS else
               "supported" if beats else "not supported" if none else "inconclusive")
    fmt = lambda s: f"{a.loc[s, 'accuracy']:.0%} {interval(a.loc[s, 'lo'], a.loc[s, 'hi'], '.0%')}"  # noqa: E731
    ceil = lambda s: "" if ceiling_of(a, s) != ceiling_of(a, s) else f", slave alone {ceiling_of(a, s):.0%}"  # noqa: E731
    per = "; ".join(f"{s} {fmt(s)}, transfer {real.loc[s, 'transfer']:+.2f} "
                    f"{interval(real.loc[s, 'lo'], real.loc[s, 'hi'], '+.2f')}" + ceil(s) +
                    (f", vs shuffled p={c.loc[s, 'p_value']:.2g}" if s in c.index else "")
                    for s in real.index)
    return Claim(claim="a slave's K/V carry what it read to the master (the master borrows its memory)" + label,
                 seed_section="2.2", seed_value="the slave contributes memory / history anchors",
                 measured=f"floor {fmt(floor.name)}, skyline {fmt(sky.name)}; "
                          + (f"self-offload = skyline on {agree[0]}/{agree[1]} answers; " if agree[1] else "") + per,
                 n=f"n={int(floor['n'])} items (facts and fact pairs x lengths)",
                 setup="Qwen 0.5B master reads only the question; slaves read the document (concat, prefix)",
                 verdict=verdict, claim_id="X01", notebook=notebook)


def ceiling_of(acc: pd.DataFrame, setting: str) -> float:
    """The best ceiling among a setting's slaves ('+a', '+a, naive RoPE', '+a +b' -> 'a alone (reads it)', ...), from
    the accuracy table indexed by setting; NaN when none was measured."""
    labels = setting.split(",")[0].lstrip("+").split(" +")
    got = [float(acc.loc[f"{x.strip()} alone (reads it)", "accuracy"]) for x in labels
           if f"{x.strip()} alone (reads it)" in acc.index]
    return max(got) if got else float("nan")


def effective_length(acc_by_length: pd.DataFrame, threshold: float = 0.5) -> pd.Series:
    """setting -> the longest document length whose accuracy is >= threshold (0 if none)."""
    ok = acc_by_length[acc_by_length["accuracy"] >= threshold]
    out = ok.groupby("setting")["length"].max()
    return out.reindex(acc_by_length["setting"].unique(), fill_value=0)


def length_claim(acc_by_length: pd.DataFrame, threshold: float = 0.5) -> Claim:
    """The seed's +42% context-understanding length, read as: the longest document a fused master still answers
    from (accuracy >= 50%) vs the master reading the document itself. Supported iff the best real slave reaches
    >= 1.42x the skyline's length while the skyline stops below the grid's top; not supported iff it reaches less
    than the skyline; inconclusive otherwise (e.g. both at the top of the grid, or < MIN_PER_LENGTH items a length)."""
    eff = effective_length(acc_by_length, threshold)
    roles = acc_by_length.groupby("setting")["role"].first()
    top = int(acc_by_length["length"].max())
    sky = int(eff[roles == "skyline"].iloc[0])
    real = eff[roles.reindex(eff.index).isin(["cross", "bus"])]
    best, best_len = (real.idxmax(), int(real.max())) if len(real) else ("-", 0)
    few = "n" in acc_by_length and int(acc_by_length["n"].min()) < MIN_PER_LENGTH
    verdict = ("inconclusive" if few else "supported" if sky < top and best_len >= 1.42 * sky else
               "not supported" if best_len < sky else "inconclusive")
    return Claim(claim="fusion lengthens context understanding", seed_section="2.2", seed_value="+42%",
                 measured=f"longest document answered at >= {threshold:.0%}: skyline {sky}, best slave setting "
                          f"'{best}' {best_len}, floor {int(eff[roles == 'floor'].iloc[0])} (grid top {top})",
                 n=f"lengths {sorted(acc_by_length['length'].unique().tolist())}",
                 setup="context offload: the document lives in the slave's K/V only", verdict=verdict, claim_id="C06",
                 notebook=NB)

