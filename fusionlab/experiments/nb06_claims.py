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
    (McNemar p < 0.05, more correct). Not supported iff every real slave's transfer CI lies below 0.25 (under a
    quarter of what the master gains by reading the document itself). Inconclusive otherwise: fewer than MIN_ITEMS
    items, or a skyline no better than the floor (then there is nothing to transfer)."""
    a = acc.set_index("setting")
    floor, sky = a[a["role"] == "floor"].iloc[0], a[a["role"] == "skyline"].iloc[0]
    real = tr[tr["role"].isin(["cross", "bus"])].set_index("setting")
    c = ctrl.set_index("setting") if len(ctrl) else pd.DataFrame()
    beats = [s for s in real.index if real.loc[s, "lo"] > 0 and s in c.index
             and c.loc[s, "p_value"] < 0.05 and c.loc[s, "acc_setting"] > c.loc[s, "acc_control"]]
    none = len(real) > 0 and bool((real["hi"] < 0.25).all())
    verdict = ("inconclusive" if sky["accuracy"] <= floor["accuracy"] or floor["n"] < MIN_ITEMS else
               "supported" if beats else "not supported" if none else "inconclusive")
    fmt = lambda s: f"{a.loc[s, 'accuracy']:.0%} {interval(a.loc[s, 'lo'], a.loc[s, 'hi'], '.0%')}"  # noqa: E731
    per = "; ".join(f"{s} {fmt(s)}, transfer {real.loc[s, 'transfer']:+.2f} "
                    f"{interval(real.loc[s, 'lo'], real.loc[s, 'hi'], '+.2f')}" + (f", vs shuffled p={c.loc[s, 'p_value']:.2g}" if s in c.index else "")
                    for s in real.index)
    return Claim(claim="a slave's K/V carry what it read to the master (the master borrows its memory)" + label,
                 seed_section="2.2", seed_value="the slave contributes memory / history anchors",
                 measured=f"floor {fmt(floor.name)}, skyline {fmt(sky.name)}; "
                          + (f"self-offload = skyline on {agree[0]}/{agree[1]} answers; " if agree[1] else "") + per,
                 n=f"n={int(floor['n'])} items (facts and fact pairs x lengths)",
                 setup="Qwen 0.5B master reads only the question; slaves read the document (concat, prefix)",
                 verdict=verdict, claim_id="X01", notebook=notebook)


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


# --- the transfer map (issue: from an exact copy to a foreign family) ----------------------------------------
RUNG_VERDICTS = ("transfers", "does not transfer", "inconclusive", "no gap to transfer", "the slave never knew")
NULL_BOUND = 0.25
"""A rung 'does not transfer' only when its transfer CI lies wholly below this share of the floor-to-skyline gap."""


def rung_verdict(rung: dict) -> str:
    """One slave on the ladder, from its accuracies (floor, skyline, ceiling: the slave alone reading it), its
    transfer-rate CI (lo, hi) and its paired test against the different-document control (p_value, acc_setting,
    acc_control). The order of the rules is the argument:
      no gap to transfer    fewer than MIN_ITEMS items, or the skyline no better than the floor (an all-zero grid)
      the slave never knew  its own ceiling no better than the floor: a null then says nothing about the channel
      transfers             transfer CI above 0 and more correct than the control, McNemar p < 0.05
      does not transfer     transfer CI below NULL_BOUND
      inconclusive          otherwise."""
    if rung["n"] < MIN_ITEMS or not rung["skyline"] > rung["floor"]:
        return "no gap to transfer"
    if not rung["ceiling"] > rung["floor"]:
        return "the slave never knew"
    if rung["lo"] > 0 and rung["p_value"] < 0.05 and rung["acc_setting"] > rung["acc_control"]:
        return "transfers"
    if rung["hi"] < NULL_BOUND:
        return "does not transfer"
    return "inconclusive"


def ladder_verdict(rungs: list[dict]) -> dict:
    """The ladder in order of divergence from the master (first: the exact copy, the positive control). Where
    transfer breaks counts only if the exact copy transfers; a rung whose null is 'never knew' or 'no gap' is
    skipped, not counted as a break. Returns the per-rung verdicts, the last rung that transfers before the first
    that does not, and one sentence."""
    verdicts = [(r["slave"], rung_verdict(r)) for r in rungs]
    if not verdicts or verdicts[0][1] != "transfers":
        why = verdicts[0][1] if verdicts else "no rungs"
        return {"rungs": verdicts, "last": None, "break": None,
                "verdict": f"not evidence: the exact copy (positive control) gives '{why}'"}
    last, brk = verdicts[0][0], None
    for slave, v in verdicts[1:]:
        if v == "transfers" and brk is None:
            last = slave
        elif v == "does not transfer" and brk is None:
            brk = slave
    if brk is None:
        open_ = [s for s, v in verdicts if v not in ("transfers", "does not transfer")]
        text = "transfers on every measured rung" + (f" (not judged: {', '.join(open_)})" if open_ else "")
    else:
        text = f"transfer holds through {last} and breaks at {brk}"
    return {"rungs": verdicts, "last": last, "break": brk, "verdict": text}
