"""Notebook 09's verdict rules: Chinese docstrings, word splits, exact arithmetic and temperatures (C39-C41, C49).

The harness that measures is `nb09_prompt_variants`; this module only judges (rules tested on hand-made data).
"""
from __future__ import annotations

from typing import Any

import numpy as np
import pandas as pd

from ..analysis.stats import bootstrap_ci, interval, mcnemar, wilson
from ..errors import FusionLabError
from .claim import Claim

NB = "09_prompt_variants"


def mixed_prompt_verdict(effect: pd.DataFrame, master: str, min_n: int = 30) -> str:
    """Supported if for some fused setting Chinese prompts cost it more than the master (interaction CI below 0);
    not supported if every fused setting's CI excludes the post's direction (above 0) or all lie within +-0.05 of
    0 with CIs across it; inconclusive otherwise, or below `min_n` problems."""
    fused = effect[effect["setting"] != master]
    if fused.empty or fused["n"].min() < min_n:
        return "inconclusive"
    if (fused["hi"] < 0).any():
        return "supported"
    if (fused["lo"] > 0).all():
        return "not supported"
    return "inconclusive"


def split_verdict(en: pd.DataFrame, zh: pd.DataFrame) -> tuple[str, dict[str, Any]]:
    """Paired by problem: same-split share of English-word tokens in the Chinese prompt minus in the English one.
    Supported if the CI lies below 0 (the slave splits English subwords differently inside mixed text), not
    supported if it lies above 0 or within +-0.01 of 0, inconclusive otherwise."""
    d = (zh["same_split"].to_numpy() - en["same_split"].to_numpy())
    d = d[np.isfinite(d)]
    lo, hi = bootstrap_ci(d)
    stats = {"n": len(d), "en": float(en["same_split"].mean()), "zh": float(zh["same_split"].mean()),
             "delta": float(d.mean()), "lo": lo, "hi": hi}
    if hi < 0:
        return "supported", stats
    return ("not supported" if lo > 0 or (lo > -0.01 and hi < 0.01) else "inconclusive"), stats


GAIN_MARGIN = 0.10
"""'No gain' is shown only when a gain of this many points is ruled out (the Wilson bound, not a bootstrap that
collapses to [0, 0] on an all-wrong grid)."""


def arithmetic_verdict(df: pd.DataFrame, master: str) -> tuple[str, dict[str, Any]]:
    """'No gain on exact arithmetic': not supported if some fused setting is right significantly more often than the
    master (McNemar p < 0.05 and more right); supported if for every fused setting the upper Wilson bound of its
    accuracy lies less than GAIN_MARGIN above the master's accuracy (a gain that size is ruled out); inconclusive
    otherwise (e.g. an all-wrong grid: 0/24 everywhere rules out nothing)."""
    wide = df.pivot_table(index="task", columns="setting", values="correct", aggfunc="first").astype(bool)
    stats = {s: {"correct": int(wide[s].sum()), **mcnemar(wide[master], wide[s])} for s in wide.columns}
    n, base = len(wide), float(wide[master].mean())
    gain = any(v["p_value"] < 0.05 and v["only_setting"] > v["only_baseline"] for s, v in stats.items() if s != master)
    ruled_out = all(wilson(v["correct"], n)[1] - base < GAIN_MARGIN for s, v in stats.items() if s != master)
    return ("not supported" if gain else "supported" if ruled_out else "inconclusive"), {"n": n, **stats}


def temperature_verdict(df: pd.DataFrame, fused: str, best: float = 0.55, worse: float = 0.7) -> tuple[str, dict]:
    """Paired over problems for the fused setting: pass@1 at `best` minus at each other temperature, bootstrap CIs.
    Supported if 0.55 is the highest and beats 0.7 (CI above 0); not supported if some temperature beats 0.55 (CI
    above 0); inconclusive otherwise."""
    per = df[df["setting"] == fused].groupby(["temperature", "task_id"])["passed"].mean().unstack(0)
    if best not in per.columns:
        raise FusionLabError(f"temperature {best} was not sampled for {fused!r}.")
    diffs = {}
    for t in per.columns:
        if t != best:
            d = (per[best] - per[t]).to_numpy()
            diffs[t] = (float(d.mean()), *bootstrap_ci(d))
    means = per.mean()
    if any(hi < 0 for _, lo, hi in diffs.values()):
        return "not supported", {"means": means.to_dict(), "diffs": diffs}
    top = means.idxmax() == best
    ok = worse in diffs and diffs[worse][1] > 0
    return ("supported" if top and ok else "inconclusive"), {"means": means.to_dict(), "diffs": diffs}


# --- the claims -----------------------------------------------------------------------------------------------
def splits_verdict(splits: dict[str, tuple[str, dict]]) -> str:
    """C40 over every slave: supported if any slave's split differs (the cause can sit in one slave), not supported if
    none does, inconclusive otherwise."""
    vs = [v for v, _ in splits.values()]
    return "supported" if "supported" in vs else ("not supported" if set(vs) == {"not supported"} else "inconclusive")


def claims(effect: pd.DataFrame, master: str, splits: dict[str, tuple[str, dict]], arith: tuple[str, dict],
           temps: pd.DataFrame, temp: tuple[str, dict], fused: str, setup: str) -> list[Claim]:
    f = effect[effect["setting"] != master]
    m = effect[effect["setting"] == master].iloc[0]
    lang = "; ".join(f"{r.setting}: en {r.pass_en:.0%} -> zh {r.pass_zh:.0%}, interaction {r.interaction:+.2f} "
                     f"{interval(r.lo, r.hi, '+.2f')}, zh vs master McNemar p={r.p_zh_vs_master:.2g}" for r in f.itertuples())
    split_text = "; ".join(f"{name}: {ss['en']:.1%} in the English prompts, {ss['zh']:.1%} in the Chinese ones "
                           f"(Δ {ss['delta']:+.3f} {interval(ss['lo'], ss['hi'], '+.3f')})" for name, (_, ss) in splits.items())
    n_pairs = min(ss["n"] for _, ss in splits.values())
    av, ast = arith
    arith_text = ", ".join(f"{s}: {v['correct']}/{ast['n']}" + ("" if s == master else f" (p={v['p_value']:.2g})")
                           for s, v in ast.items() if s != "n")
    tv, ts = temp
    t_text = ", ".join(f"T={r.temperature:g}: {r.setting} {r.p:.0%} {interval(r.lo, r.hi, '.0%')}"
                       for r in temps.rename(columns={"pass@1": "p"}).itertuples())
    return [
        Claim(claim="mixed Chinese–English code prompts: the stitched model does 8.5 % worse", seed_section="A§4.3",
              seed_value="−8.5 %",
              measured=f"HumanEval with our Chinese docstrings (code, examples, tests unchanged): master en {m.pass_en:.0%} -> "
                       f"zh {m.pass_zh:.0%}; {lang}",
              n=f"n={int(m.n)} problems, paired (interaction: bootstrap CI)", setup=setup,
              verdict=mixed_prompt_verdict(effect, master), notebook=NB, claim_id="C39"),
        Claim(claim="cause of C39: the slave splits English subwords differently", seed_section="A§4.3",
              seed_value="qualitative",
              measured=f"English-word tokens each slave splits exactly as the master: {split_text}",
              n=f"n={n_pairs} prompt pairs, paired bootstrap", setup=setup, verdict=splits_verdict(splits), notebook=NB,
              claim_id="C40"),
        Claim(claim="no gain on exact arithmetic (sin(π/3) to 10 places)", seed_section="A§4.3",
              seed_value="qualitative", measured=f"exact answers right: {arith_text}",
              n=f"n={ast['n']} tasks, McNemar vs the master", setup=setup, verdict=av, notebook=NB, claim_id="C41"),
        Claim(claim="temperature 0.55 is best for the stitched model (0.7 too divergent)", seed_section="A§5.4",
              seed_value="0.55", measured=f"sampled pass@1 (unbiased, c/n per problem): {t_text}",
              n="bootstrap CIs over problems",
              setup=setup + f"; "
                    f"the stitched model: {fused}",
              verdict=tv, notebook=NB, claim_id="C49"),
    ]
