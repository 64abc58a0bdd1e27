"""Notebook 10's verdict rules: where along the ladder (exact copy -> siblings -> foreign families) a slave's K/V
stops reaching the master. Judged per rung (accuracy or NLL transfer), then along the ladder, then as ledger rows
X03 (quantisation), X04 (any rung beyond the copy) and X05 (K/V against a text relay). Rules tested on hand-made
rungs, degenerate ones included.
"""
from __future__ import annotations

import math
from typing import Callable

import pandas as pd

from ..analysis.stats import interval
from .claim import Claim
from .nb06_claims import MIN_ITEMS

NB = "10_transfer_map"
RUNG_VERDICTS = ("transfers", "does not transfer", "inconclusive", "too few to judge", "no gap to transfer",
                 "the slave never knew")
NULL_BOUND = 0.25
"""A rung 'does not transfer' only when its transfer CI lies wholly below this share of the floor-to-skyline gap."""
MIN_DOCS = 10
"""Fewer documents than this and a bootstrap over documents says little: no NLL verdict then."""


def rung_verdict(rung: dict) -> str:
    """One slave on the ladder, from its accuracies (floor, skyline, ceiling: the slave alone reading it), its
    transfer-rate CI (lo, hi) and its paired test against the different-document control (p_value, acc_setting,
    acc_control). The order of the rules is the argument:
      too few to judge      fewer than MIN_ITEMS items
      no gap to transfer    the skyline no better than the floor (an all-zero grid)
      the slave never knew  its own ceiling no better than the floor: a null then says nothing about the channel
      transfers             transfer CI above 0 and more correct than the control, McNemar p < 0.05
      does not transfer     transfer CI below NULL_BOUND
      inconclusive          otherwise."""
    no_evidence = _accuracy_no_evidence(rung)
    if no_evidence:
        return no_evidence
    if rung["lo"] > 0 and rung["p_value"] < 0.05 and rung["acc_setting"] > rung["acc_control"]:
        return "transfers"
    if rung["hi"] < NULL_BOUND:
        return "does not transfer"
    return "inconclusive"


def _accuracy_no_evidence(rung: dict) -> str | None:
    """What makes an accuracy row no evidence either way, in rule order: too few items, no floor-to-skyline gap (an
    all-zero grid), a slave whose ceiling is no better than the floor; None when the row can be judged."""
    if rung["n"] < MIN_ITEMS:
        return "too few to judge"
    if not rung["skyline"] > rung["floor"]:
        return "no gap to transfer"
    if not rung["ceiling"] > rung["floor"]:
        return "the slave never knew"
    return None


def nll_rung_verdict(rung: dict) -> str:
    """One slave from `nb10_nll_transfer.transfer`'s row: n documents, the master's gap CI (gap_low), the slave's own
    gap CI (ceiling_gap_low; NaN or absent when not measured), the transfer CI (lo, hi) and the advantage over the
    different-document control (vs_control_low, nats/token):
      too few to judge      fewer than MIN_DOCS documents
      no gap to transfer    reading A does not lower the master's loss on B (its CI reaches 0)
      the slave never knew  reading A does not lower the slave's own loss on B (its CI reaches 0)
      transfers             transfer CI above 0 and the offload beats the control (its CI above 0)
      does not transfer     transfer CI below NULL_BOUND, and the slave's ceiling was measured
      inconclusive          otherwise (a null without a ceiling is one)."""
    if rung["n"] < MIN_DOCS:
        return "too few to judge"
    if not rung["gap_low"] > 0:
        return "no gap to transfer"
    ceiling = rung.get("ceiling_gap_low", float("nan"))
    measured = ceiling is not None and not math.isnan(ceiling)
    if measured and not ceiling > 0:
        return "the slave never knew"
    if rung["lo"] > 0 and rung.get("vs_control_low", float("nan")) > 0:
        return "transfers"
    if measured and rung["hi"] < NULL_BOUND:
        return "does not transfer"
    return "inconclusive"


RELAY_VERDICTS = ("K/V beats the relay", "the relay beats K/V", "no difference", "too few to judge",
                  "no gap to transfer", "no relay measured")


def relay_verdict(rung: dict) -> str:
    """K/V against the same slave's text relay on one rung, from the advantage of the offload over the relay
    (vs_relay_low / vs_relay_high: relay NLL - offload NLL, nats/token, bootstrap CI over documents):
      no relay measured     the row has no relay advantage
      too few to judge      fewer than MIN_DOCS documents
      no gap to transfer    reading A does not lower the master's loss on B (nothing for either channel to carry)
      K/V beats the relay   the advantage's CI lies above 0
      the relay beats K/V   ... below 0
      no difference         otherwise."""
    low, high = rung.get("vs_relay_low", float("nan")), rung.get("vs_relay_high", float("nan"))
    if low is None or high is None or math.isnan(low) or math.isnan(high):
        return "no relay measured"
    if rung["n"] < MIN_DOCS:
        return "too few to judge"
    if not rung["gap_low"] > 0:
        return "no gap to transfer"
    if low > 0:
        return "K/V beats the relay"
    if high < 0:
        return "the relay beats K/V"
    return "no difference"


ACCURACY_RELAY_VERDICTS = (*RELAY_VERDICTS, "the slave never knew")


def accuracy_relay_verdict(rung: dict) -> str:
    """K/V against the same slave's text relay on offload accuracy (`nb10_offload.accuracy_table`'s row: n items,
    floor, skyline, ceiling, offload, relay, p_vs_relay = exact McNemar paired by item):
      no relay measured     the row has no relay accuracy
      too few to judge      fewer than MIN_ITEMS items
      no gap to transfer    the skyline no better than the floor
      the slave never knew  its ceiling no better than the floor: neither channel has anything to carry
      K/V beats the relay   more correct through K/V, p < 0.05
      the relay beats K/V   more correct through the relay, p < 0.05
      no difference         otherwise."""
    relay = rung.get("relay", float("nan"))
    if relay is None or math.isnan(relay):
        return "no relay measured"
    no_evidence = _accuracy_no_evidence(rung)
    if no_evidence:
        return no_evidence
    if rung["p_vs_relay"] < 0.05 and rung["offload"] != relay:
        return "K/V beats the relay" if rung["offload"] > relay else "the relay beats K/V"
    return "no difference"


def domain_verdict(row: dict) -> str:
    """One rung's transfer in one domain (`nb10_nll_transfer.transfer_by_domain`):

      too few to judge       fewer than MIN_DOCS documents in the domain
      beyond the skyline     CI wholly above 1 (the slots help more than the master reading A itself)
      short of the skyline   CI wholly below 1
      at the skyline         otherwise
    """
    if row["n"] < MIN_DOCS or not math.isfinite(row["lo"]):
        return "too few to judge"
    if row["lo"] > 1:
        return "beyond the skyline"
    return "short of the skyline" if row["hi"] < 1 else "at the skyline"


def beyond_skyline_sentence(table: pd.DataFrame, by_domain: pd.DataFrame) -> str:
    """For every rung whose pooled transfer CI lies above 1: where it comes from, domain by domain ('' if none)."""
    parts = []
    for r in table[table["lo"] > 1].to_dict("records"):
        doms = by_domain[by_domain["setting"] == r["setting"]].to_dict("records")
        if doms:
            parts.append(f"{r['slave']} {r['transfer']:.2f} {interval(r['lo'], r['hi'], '.2f')}: " + ", ".join(
                f"{d['domain']} {d['transfer']:.2f} {interval(d['lo'], d['hi'], '.2f')} (n={d['n']}, "
                f"{domain_verdict(d)})" for d in doms))
    if not parts:
        return ""
    return ("Transfer above 1 (the slots help more than the master reading part A itself), by domain: "
            + "; ".join(parts) + ".")


def ladder_verdict(rungs: list[dict], judge: Callable[[dict], str] = rung_verdict) -> dict:
    """The ladder in order of divergence from the master (first: the exact copy, the positive control). Where
    transfer breaks counts only if the exact copy transfers; a rung the rules cannot judge ('too few', 'no gap',
    'never knew') is skipped, not counted as a break. Returns the per-rung verdicts, the last rung that transfers
    before the first that does not, and one sentence."""
    verdicts = [(r["slave"], judge(r)) for r in rungs]
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


# --- ledger rows -----------------------------------------------------------------------------------------------
SETUP = ("NLL transfer: the slave reads part A of a document, the Qwen 0.5B master predicts part B; identity "
         "projector for siblings, lstsq for foreign slaves; control = part A of a different document")


def _rung_text(r: dict, verdict: str) -> str:
    return f"{r['slave']} {r['transfer']:.2f} {interval(r['lo'], r['hi'], '.2f')} ({verdict})"


def _ladder(table: pd.DataFrame) -> tuple[list[dict], dict]:
    rungs = table.to_dict("records")
    return rungs, ladder_verdict(rungs, nll_rung_verdict)


def quantisation_claim(table: pd.DataFrame) -> Claim:
    """X03, from the ladder table (one row per slave, nearest first, `slave` naming the recipe). Supported iff the
    exact copy and every quantised or fine-tuned rung transfer; not supported iff the copy transfers and some such
    rung does not; inconclusive otherwise (no such rung, or any rung the rules cannot judge)."""
    rungs, lad = _ladder(table)
    got = dict(lad["rungs"])
    quant = [r for r in rungs if str(r["slave"]).startswith(("int8", "int4", "finetune"))]
    copy_ok = bool(lad["rungs"]) and lad["rungs"][0][1] == "transfers"
    vs = [got[r["slave"]] for r in quant]
    verdict = ("supported" if copy_ok and vs and all(v == "transfers" for v in vs) else
               "not supported" if copy_ok and "does not transfer" in vs else "inconclusive")
    measured = "; ".join(_rung_text(r, got[r["slave"]]) for r in ([rungs[0]] if rungs else []) + quant)
    return Claim(claim="training-free KV transfer survives quantising the slave (int8 per channel, int4 per group) "
                       "or fine-tuning it briefly (DroidSpeak's setting)",
                 seed_section="transfer map (FusionLab)", seed_value="-",
                 measured=(measured or "no quantised or fine-tuned rung") + " (share of the floor-to-skyline NLL gap "
                          "closed)",
                 n=f"n={int(table['n'].min()) if len(table) else 0} documents per rung",
                 setup=SETUP, verdict=verdict, claim_id="X03", notebook=NB)


def ladder_claim(table: pd.DataFrame) -> Claim:
    """X04: supported iff the exact copy transfers and some rung beyond it transfers; not supported iff the copy
    transfers and every rung beyond it 'does not transfer'; inconclusive otherwise (incl. a failed positive
    control, which makes the ladder no evidence at all)."""
    rungs, lad = _ladder(table)
    rest = [v for _, v in lad["rungs"][1:]]
    copy_ok = bool(lad["rungs"]) and lad["rungs"][0][1] == "transfers"
    verdict = ("supported" if copy_ok and "transfers" in rest else
               "not supported" if copy_ok and rest and all(v == "does not transfer" for v in rest) else
               "inconclusive")
    got = dict(lad["rungs"])
    return Claim(claim="training-free KV transfer reaches the master from a slave that is not an exact copy",
                 seed_section="transfer map (FusionLab); KVComm / DroidSpeak: same family only",
                 seed_value="-", measured=f"{lad['verdict']}: " + "; ".join(_rung_text(r, got[r['slave']])
                                                                            for r in rungs),
                 n=f"n={int(table['n'].min()) if len(table) else 0} documents per rung, {len(rungs)} rungs",
                 setup=SETUP, verdict=verdict, claim_id="X04", notebook=NB)


def _relay_text(r: dict, verdict: str) -> str:
    nan = float("nan")
    adv = interval(r.get("vs_relay_low", nan), r.get("vs_relay_high", nan), "+.3f")
    return (f"{r['slave']} K/V {r['transfer']:.2f} vs relay {r.get('relay_transfer', nan):.2f}, advantage "
            f"{r.get('vs_relay', nan):+.3f} {adv} ({verdict})")


def relay_claim(table: pd.DataFrame) -> Claim:
    """X05, on the rungs beyond the exact copy (where K/V reads the document itself, so it wins by construction):
    supported iff K/V beats the relay on every judged rung; partly supported iff on some; not supported iff on none
    and the relay wins on some; inconclusive otherwise (no judged rung: too few documents, no gap, no relay, or
    only ties)."""
    every = [(r, relay_verdict(r)) for r in table.to_dict("records")[1:]]
    got = [(r, v) for r, v in every if v != "no relay measured"]  # a bus has no one writer: no relay to compare
    rungs, unrelayed = [r for r, _ in got], [r["slave"] for r, v in every if v == "no relay measured"]
    judged = [v for _, v in got if v in ("K/V beats the relay", "the relay beats K/V", "no difference")]
    wins = judged.count("K/V beats the relay")
    verdict = ("inconclusive" if not judged else "supported" if wins == len(judged) else
               "partly supported" if wins else
               "not supported" if "the relay beats K/V" in judged else "inconclusive")
    measured = "; ".join(_relay_text(r, v) for r, v in got)
    if unrelayed:
        measured += f"{'; ' if measured else ''}no relay measured for {', '.join(unrelayed)}"
    return Claim(claim="a slave's K/V carry more of what it read than its text does (offload beats a text relay)",
                 seed_section="transfer map (FusionLab); C2C / KVComm compare with text communication",
                 seed_value="-", measured=(measured or "no rung beyond the exact copy") +
                 " (share of the NLL gap closed; advantage = relay NLL - K/V NLL, nats/token)",
                 n=f"n={int(table['n'].min()) if len(table) else 0} documents per rung, {len(rungs)} rungs",
                 setup=SETUP + "; relay = the slave's greedy note on part A, read by the master before part B",
                 verdict=verdict, claim_id="X05", notebook=NB)

