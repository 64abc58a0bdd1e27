"""Notebook 10's rules for the learned offload fusers: one rule per trained fuser (`control_verdict`), each rung's
training-free channel as its start measured it (`channel_state`), and the ledger rows X06 (the recipe carries where a
channel works: the positive control), X07 (across families) and X09 (where training-free transfer has failed).
Rules tested on hand-made rows, degenerate ones included.
"""
from __future__ import annotations

import pandas as pd

from ..analysis.stats import interval
from .claim import Claim
from .nb10_claims import NB, NULL_BOUND

CONTROL_VERDICTS = ("opens and beats its start", "keeps the channel", "closes the channel", "inconclusive")
CARRIES = ("opens and beats its start", "keeps the channel")
"""The verdicts of a fuser that beats both of its controls (`beats_controls`)."""


def control_verdict(row: dict) -> str:
    """One trained fuser on a rung whose training-free channel works, from its held-out transfer CI (lo, hi), its
    paired NLL change against each control (`beats_controls`) and against the rung's training-free start
    (vs_start_lo / vs_start_hi, nats/token; negative = better):
      opens and beats its start  beats both controls, and lower NLL than the start (CI below 0)
      keeps the channel          beats both controls, no worse than the start (CI reaches 0)
      closes the channel         worse than the start (CI above 0) and does not beat both controls
      inconclusive               otherwise."""
    beats = beats_controls(row)
    if beats and row["vs_start_hi"] < 0:
        return "opens and beats its start"
    if beats and row["vs_start_lo"] <= 0:
        return "keeps the channel"
    if row["vs_start_lo"] > 0 and not beats:
        return "closes the channel"
    return "inconclusive"


def beats_controls(row: dict) -> bool:
    """The fuser carries the document's information: its transfer CI lies above 0 (better than the master alone) and,
    paired on the same held-out windows with a bootstrap over documents, its NLL is lower than both controls':
    vs_control_hi < 0 (minus the same fuser reading another document) and vs_shuffled_hi < 0 (minus the
    shuffled-pairing fuser reading the right one). A control not measured (NaN: it diverged; absent: a table from
    before the paired comparison) is never beaten. Paired, because both controls are scored on the very windows the
    fuser is: their shared difficulty cancels."""
    nan = float("nan")
    return row["lo"] > 0 and row.get("vs_control_hi", nan) < 0 and row.get("vs_shuffled_hi", nan) < 0


def _fuser_text(r: dict) -> str:
    shuffled = r.get("shuffled_transfer", float("nan"))
    vs = [interval(r[f"vs_{c}_lo"], r[f"vs_{c}_hi"], "+.3f") if pd.notna(r.get(f"vs_{c}_lo")) else "none"
          for c in ("control", "shuffled")]
    paired = f"; NLL vs them {vs[0]} / {vs[1]}"
    return (f"{r['rung']} ({r['opening']}) {r['transfer']:.2f} {interval(r['lo'], r['hi'], '.2f')} from "
            f"{r['start_transfer']:.2f}, controls {r['control_transfer']:.2f} / {shuffled:.2f}{paired} "
            f"({control_verdict(r)})")


FUSER_SETUP = ("offload fusers (concat, rank 32) trained with validation by document on held-out-disjoint files; the "
               "slave reads window k, the master predicts window k+1; controls = the fuser reading another document "
               "and a shuffled-pairing fuser")


def channel_state(row: dict) -> str:
    """A sibling fuser row's rung as its training-free start measured it (`start_lo` / `start_hi`, the start's
    transfer CI): 'works' (CI above 0), 'failed' (CI below NULL_BOUND: the start carries nothing useful, or hurts),
    else 'partial'. A foreign slave's row (start 'lstsq') is 'foreign'."""
    if row.get("start") != "identity":
        return "foreign"
    if row["start_lo"] > 0:
        return "works"
    return "failed" if row["start_hi"] < NULL_BOUND else "partial"


def _siblings(table: pd.DataFrame, state: str) -> pd.DataFrame:
    if "start" not in table or not len(table):
        return table.iloc[0:0]
    return table[[channel_state(r) == state for r in table.to_dict("records")]]


def _carries_verdict(rows: list[dict], control_ok: bool) -> str:
    """X07 and X09: evidence only beside a positive control; supported iff some fuser beats both its controls
    (`beats_controls`); not supported iff every fuser's transfer CI lies below NULL_BOUND; inconclusive otherwise."""
    if not rows or not control_ok:
        return "inconclusive"
    if any(beats_controls(r) for r in rows):
        return "supported"
    return "not supported" if all(r["hi"] < NULL_BOUND for r in rows) else "inconclusive"


def fuser_control_claim(table: pd.DataFrame) -> Claim:
    """X06, from `nb10_fuser_control.measure`'s table, on the siblings whose training-free channel works
    (`channel_state`): supported iff for some opening every rung's fuser carries (beats both controls, no
    worse than its start); partly supported iff some (rung, opening) does; not supported iff every one closes the
    channel; inconclusive otherwise (no rows)."""
    sib = _siblings(table, "works")
    rows = sib.to_dict("records")
    got = {(r["rung"], r["opening"]): control_verdict(r) for r in rows}
    by_opening = {o: [v for (_, op), v in got.items() if op == o] for o in dict.fromkeys(r["opening"] for r in rows)}
    verdict = ("inconclusive" if not rows else
               "supported" if any(vs and all(v in CARRIES for v in vs) for vs in by_opening.values()) else
               "partly supported" if any(v in CARRIES for v in got.values()) else
               "not supported" if all(v == "closes the channel" for v in got.values()) else "inconclusive")
    return Claim(claim="the lab's fuser recipe learns a channel where one exists (a learned offload fuser keeps what "
                       "a sibling's training-free channel carries, above its controls)",
                 seed_section="positive control for X01/X02 (FusionLab)", seed_value="-",
                 measured="; ".join(_fuser_text(r) for r in rows) or "no sibling fuser trained",
                 n=f"n={int(sib['n'].min()) if len(sib) else 0} held-out windows from "
                   f"{int(sib['docs'].min()) if len(sib) else 0} documents per fuser",
                 setup=FUSER_SETUP, verdict=verdict, claim_id="X06", notebook=NB)


def foreign_fuser_claim(table: pd.DataFrame) -> Claim:
    """X07, the fix across families (start 'lstsq'), judged by `_carries_verdict` beside X06."""
    foreign = _siblings(table, "foreign")
    rows = foreign.to_dict("records")
    control_ok = fuser_control_claim(table).verdict in ("supported", "partly supported")
    verdict = _carries_verdict(rows, control_ok)
    return Claim(claim="a learned offload fuser that can open carries a foreign slave's memory to the master",
                 seed_section="C2C: cross-family fusers; notebook 07's closed offload fusers",
                 seed_value="-", measured=("; ".join(_fuser_text(r) for r in rows) or "no foreign fuser trained") +
                 ("" if control_ok else " (no positive control: X06 not supported)"),
                 n=f"n={int(foreign['n'].min()) if len(foreign) else 0} held-out windows per fuser",
                 setup=FUSER_SETUP + "; warm start: the slave's lstsq projector", verdict=verdict, claim_id="X07",
                 notebook=NB)


def failed_rung_fuser_claim(table: pd.DataFrame) -> Claim:
    """X09, the moonshot: on a sibling rung where training-free transfer has failed (`channel_state` 'failed'), does
    a learned fuser carry the sibling's memory? Judged by `_carries_verdict` beside X06 (the recipe must carry where a
    channel works before its null here means anything)."""
    failed = _siblings(table, "failed")
    rows = failed.to_dict("records")
    control_ok = fuser_control_claim(table).verdict in ("supported", "partly supported")
    return Claim(claim="a learned offload fuser carries a sibling's memory on a rung where training-free transfer has "
                       "failed",
                 seed_section="issue 27's moonshot (FusionLab)", seed_value="-",
                 measured=("; ".join(_fuser_text(r) for r in rows) or
                           "no sibling rung whose training-free channel failed was trained") +
                 ("" if control_ok else " (no positive control: X06 not supported)"),
                 n=f"n={int(failed['n'].min()) if len(failed) else 0} held-out windows per fuser",
                 setup=FUSER_SETUP + "; warm start: the rung's identity channel",
                 verdict=_carries_verdict(rows, control_ok), claim_id="X09", notebook=NB)
