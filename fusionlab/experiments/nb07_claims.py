"""Notebook 07's verdicts and figures, from the held-out NLL tables (rules tested on hand-made frames).

A gain is the slave's only if the fuser beats the master alone *and* each control trained with the same budget:
the same fuser fed another text's K/V (shuffled), noise in place of the slave, and learned constant slots of the same
parameter count. "Beats" = the paired bootstrap 95% CI of the NLL difference lies below 0.
"""
from __future__ import annotations


import numpy as np
import pandas as pd

from ..analysis.stats import interval
from .claim import Claim
from .nb07_curve_stats import CONSTANT, MIN_DOCS, curve_table, verdicts

NB = "07_learned_fuser"
MIN_CHUNKS = 20
CONTROLS = ("shuffled", "noise", "constant")


def versus(gain: pd.DataFrame, setting: str, vs: str, domain: str = "all") -> pd.Series | None:
    g = gain[(gain["setting"] == setting) & (gain["vs"] == vs) & (gain["domain"] == domain)]
    return g.iloc[0] if len(g) else None


def control_table(gains: pd.DataFrame, fusers: dict[str, str], controls: dict[str, dict[str, str]],
                  master: str) -> pd.DataFrame:
    """Per slave: the fuser vs the master and vs each control (all domains pooled): delta, CI, beats."""
    rows = []
    for slave, fuser in fusers.items():
        for label, other in [("master alone", master)] + [(c, controls[slave][c]) for c in CONTROLS
                                                            if c in controls.get(slave, {})]:
            r = versus(gains, fuser, other)
            if r is not None:
                rows.append({"slave": slave, "fuser": fuser, "against": label, "n": int(r["n"]),
                             "docs": int(r.get("docs", r["n"])), "pooled": r.get("pooled", "all"),
                             "delta_nll": r["delta"], "lo": r["lo"], "hi": r["hi"], "beats": bool(r["hi"] < 0)})
    return pd.DataFrame(rows)


def heldout_scope(table: pd.DataFrame) -> str:
    """The n of a control table, in its own words: chunks, documents and the domains it pooled (never a fixed list,
    which went stale when a domain was dropped for too few documents)."""
    if not len(table):
        return "n=0 held-out chunks"
    docs = int(table["docs"].min()) if "docs" in table else int(table["n"].min())
    scope = table["pooled"].iloc[0] if "pooled" in table else "all"
    return f"n={int(table['n'].min())} held-out chunks from {docs} documents (domains pooled: {scope})"


def information_claim(table: pd.DataFrame) -> Claim:
    """Supported iff for some slave the fuser beats the master and all three controls (n >= MIN_CHUNKS). Not
    supported iff no fuser beats the master (every CI reaches 0 or above) with n >= MIN_CHUNKS. Else inconclusive."""
    parts, winners, any_beats_master, enough = [], [], False, True
    for slave, g in table.groupby("slave", sort=False):
        g = g.set_index("against")
        enough &= bool((g["n"] >= MIN_CHUNKS).all())
        beats_master = bool(g.loc["master alone", "beats"]) if "master alone" in g.index else False
        any_beats_master |= beats_master
        beaten = [c for c in CONTROLS if c in g.index and g.loc[c, "beats"]]
        if beats_master and len(beaten) == len(CONTROLS):
            winners.append(slave)
        parts.append(f"{slave}: vs master {g.loc['master alone', 'delta_nll']:+.3f} "
                     f"{interval(g.loc['master alone', 'lo'], g.loc['master alone', 'hi'], '+.3f')}; beats "
                     + (", ".join(beaten) if beaten else "no control") if "master alone" in g.index else slave)
    verdict = ("inconclusive" if not enough else "supported" if winners else
               "inconclusive" if any_beats_master else "not supported")
    return Claim(claim="a learned fuser makes the master better with the slave's information (beats the master and "
                       "shuffled, noise and constant-slot controls)",
                 seed_section="2.2 / C2C", seed_value="C2C: +6-14% over the receiver",
                 measured="; ".join(parts) + " (held-out NLL, nats/token)",
                 n=heldout_scope(table),
                 setup="Qwen 0.5B master; SmolLM2 / Gemma 270M slaves; blend fusers (lstsq warm start + rank-32 "
                       "residual + a slave-free table, so the constant control isolates the slave), trained on this CPU",
                 verdict=verdict, claim_id="X02", notebook=NB)


def never_worse(table: pd.DataFrame, pass_pairs: pd.DataFrame | None = None) -> pd.DataFrame:
    """The target: held-out NLL not above the master's (CI reaches 0 or lies below) and HumanEval not significantly
    below (McNemar p > 0.05, or more passes)."""
    rows = []
    for slave, g in table[table["against"] == "master alone"].groupby("slave", sort=False):
        r = g.iloc[0]
        rows.append({"slave": slave, "nll_ok": bool(r["lo"] <= 0), "delta_nll": r["delta_nll"],
                     "ci": f"{interval(r['lo'], r['hi'], '+.3f')}"})
    out = pd.DataFrame(rows)
    if pass_pairs is not None and len(pass_pairs):
        ok = {s: bool(p > 0.05 or b >= a) for s, p, a, b in pass_pairs[["setting", "p_value", "only_baseline",
                                                                          "only_setting"]].itertuples(index=False)}
        out["humaneval_ok"] = [next((v for k, v in ok.items() if s in k), None) for s in out["slave"]]
    return out


def _budget(b: float) -> str:
    return "never" if not np.isfinite(b) else f"{b / 1000:,.0f}K" if b < 1e7 else f"{b:.1e}"


def curve_claim(nll: pd.DataFrame, slave: str = "Gemma 270M") -> Claim:
    """X08. Supported iff some fuser beats the constant (and shuffled) control at some budget. Otherwise
    inconclusive: a same-text fuser has no positive control here (a slave that knows more than the master), so
    "no budget gets there" is reported as a trend, never judged."""
    table = curve_table(nll)
    v = verdicts(nll, table)
    pooled = table[(table["domain"] == "pooled") & (table["against"] == CONSTANT)]
    parts = []
    for r in v.itertuples():
        last = pooled[pooled["variant"] == r.variant].sort_values("budget").tail(1)
        at = (f"at {_budget(last['budget'].iloc[0])} tokens {last['delta'].iloc[0]:+.3f} "
              f"{interval(last['lo'].iloc[0], last['hi'].iloc[0], '+.3f')}" if len(last) else "no rows")
        parts.append(f"{r.variant} - constant {at}; slope {r.slope:+.3f}/doubling {interval(r.lo, r.hi, '+.3f')}, "
                     f"crosses 0 at {_budget(r.crossing)}: {r.verdict}")
    verdict = "supported" if (v["verdict"] == "beats the constant control").any() else "inconclusive"
    docs = int(pooled["docs"].max()) if len(pooled) else 0
    seeds = int(nll["seed"].nunique()) if "seed" in nll else 1
    return Claim(claim="with enough training tokens a slave-fed fuser beats learned constant slots on held-out "
                       "documents (information from the slave, not an adapter)",
                 seed_section="2.2 / C2C", seed_value="C2C: fusers carry the sharer's knowledge",
                 measured="; ".join(parts) + " (held-out NLL, nats/token)",
                 n=f"{docs} held-out documents pooled (domains with >= {MIN_DOCS}), budgets "
                   + ", ".join(_budget(b) for b in sorted(set(nll['budget']) - {0}))
                   + (f"; {seeds} training seeds (a gain must hold in each)" if seeds > 1 else ""),
                 setup=f"Qwen 0.5B master; {slave} slave; blend fusers with a slave-free table, best by validation",
                 verdict=verdict, claim_id="X08", notebook="07_learned_fuser")
