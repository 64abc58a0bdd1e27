"""Notebook 09's logic: the posts' claims about prompt kinds, on HumanEval and exact arithmetic.

    C39 mixed Chinese-English code prompts: the stitched model does 8.5 % worse
    C40 because the slave splits English subwords differently
    C41 no gain on exact arithmetic (sin(pi/3) to 10 places)
    C49 temperature 0.55 is best for the stitched model (0.7 too divergent)

Chinese prompts: 40 HumanEval problems (a seeded subset) whose docstring prose we translated ourselves
(data/prompts/humaneval_zh.jsonl); signatures, identifiers, examples and tests are unchanged, so the same checker
scores them. Arithmetic: seeded exact tasks whose answers Python computes.
"""
from __future__ import annotations

import json
import math
import random
import re
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd

from ..analysis.stats import bootstrap_ci, mcnemar
from ..engine.lm import LM
from ..engine.token_align import align_tokens, offsets
from ..errors import FusionLabError
from ..paths import asset
from .claim import Claim

NB = "09_prompt_variants"
ZH_SEED = 39
"""humaneval.subset(40, seed=39) is the set we translated."""


def zh_problems(n: int | None = None) -> list[dict[str, Any]]:
    """The translated problems (task_id, prompt, entry_point), in task order; the first `n`."""
    rows = [json.loads(x) for x in asset("prompts", "humaneval_zh.jsonl").read_text(encoding="utf-8").splitlines()
            if x.strip()]
    return rows[:n] if n is not None else rows


def english_of(zh: list[dict[str, Any]]) -> list[dict[str, Any]]:
    from .humaneval import problems

    by_id = {p["task_id"]: p for p in problems()}
    return [by_id[p["task_id"]] for p in zh]


# --- C39: Chinese docstrings --------------------------------------------------------------------------------
def language_effect(df: pd.DataFrame, master: str) -> pd.DataFrame:
    """Per fused setting, paired by problem (columns setting, lang 'en'/'zh', task_id, passed): pass@1 in each language,
    McNemar fused vs master on the Chinese prompts, and the interaction (fused zh - en) - (master zh - en) with a
    bootstrap CI (negative: Chinese hurts the fused model more than the master)."""
    wide = df.pivot_table(index="task_id", columns=["setting", "lang"], values="passed", aggfunc="first").astype(float)
    rows = []
    m_zh, m_en = wide[(master, "zh")], wide[(master, "en")]
    for s in dict.fromkeys(df["setting"]):
        f_zh, f_en = wide[(s, "zh")], wide[(s, "en")]
        d = ((f_zh - f_en) - (m_zh - m_en)).to_numpy()
        lo, hi = bootstrap_ci(d) if s != master else (0.0, 0.0)
        test = mcnemar(m_zh.astype(bool), f_zh.astype(bool))
        rows.append({"setting": s, "n": len(wide), "pass_en": f_en.mean(), "pass_zh": f_zh.mean(),
                     "interaction": float(d.mean()), "lo": lo, "hi": hi, "p_zh_vs_master": test["p_value"]})
    return pd.DataFrame(rows)


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


# --- C40: token alignment on mixed text ---------------------------------------------------------------------
ASCII_WORD = re.compile(r"^\s?[A-Za-z]+$")


def alignment_quality(master: LM, slave: LM, texts: list[str]) -> pd.DataFrame:
    """Per text: of the master's English-word tokens (ASCII letters), the share the slave covers with exactly one
    token of the same span (the same subword split), and slave tokens per aligned master token overall."""
    rows = []
    for i, text in enumerate(texts):
        al = align_tokens(master.tokenizer, slave.tokenizer, text, "mean")
        mo, so = offsets(master.tokenizer, text, True), offsets(slave.tokenizer, text)
        words = same = 0
        for k, g in zip(al.master_index.tolist(), al.groups):
            a, b = mo[k]
            if ASCII_WORD.match(text[a:b]):
                words += 1
                same += int(len(g) == 1 and so[g[0]] == (a, b))
        rows.append({"text": i, "english_tokens": words, "same_split": same / words if words else float("nan"),
                     "slave_per_master": float(np.mean([len(g) for g in al.groups])) if al.groups else float("nan")})
    return pd.DataFrame(rows)


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


# --- C41: exact arithmetic ------------------------------------------------------------------------------------
@dataclass(frozen=True)
class ArithmeticTask:
    question: str
    answer: str
    """The exact answer as a decimal string."""


def arithmetic_tasks(n: int, seed: int = 41) -> list[ArithmeticTask]:
    """The post's sin(pi/3) to 10 places first, then seeded products, sums, powers, remainders and roots."""
    rng = random.Random(seed)
    out = [ArithmeticTask("What is sin(pi/3) to 10 decimal places? Answer with the number only.",
                          f"{math.sin(math.pi / 3):.10f}")]
    kinds = ["mul", "add", "pow", "mod", "sqrt"]
    while len(out) < n:
        kind = kinds[len(out) % len(kinds)]
        if kind == "mul":
            a, b = rng.randint(100, 999), rng.randint(100, 999)
            out.append(ArithmeticTask(f"What is {a} * {b}? Answer with the number only.", str(a * b)))
        elif kind == "add":
            a, b = rng.randint(10_000, 999_999), rng.randint(10_000, 999_999)
            out.append(ArithmeticTask(f"What is {a} + {b}? Answer with the number only.", str(a + b)))
        elif kind == "pow":
            a, k = rng.randint(2, 9), rng.randint(5, 12)
            out.append(ArithmeticTask(f"What is {a} to the power of {k}? Answer with the number only.", str(a ** k)))
        elif kind == "mod":
            a, b = rng.randint(1_000, 99_999), rng.randint(7, 97)
            out.append(ArithmeticTask(f"What is the remainder of {a} divided by {b}? Answer with the number only.",
                                      str(a % b)))
        else:
            a = rng.randint(2, 99)
            out.append(ArithmeticTask(f"What is the square root of {a} to 6 decimal places? Answer with the number "
                                      "only.", f"{math.sqrt(a):.6f}"))
    return out


def arithmetic_correct(answer: str, task: ArithmeticTask) -> bool:
    """The first number in the answer (commas and spaces inside it removed) equals the exact answer's digits."""
    m = re.search(r"-?\d[\d,]*(?:\.\d+)?", answer.replace(" ", ""))
    return bool(m) and m.group(0).replace(",", "") == task.answer


def arithmetic_verdict(df: pd.DataFrame, master: str) -> tuple[str, dict[str, Any]]:
    """'No gain on exact arithmetic': supported if no fused setting is right significantly more often than the master
    (McNemar p >= 0.05, or fewer right); not supported if one is (p < 0.05 and more right)."""
    wide = df.pivot_table(index="task", columns="setting", values="correct", aggfunc="first").astype(bool)
    stats = {s: {"correct": int(wide[s].sum()), **mcnemar(wide[master], wide[s])} for s in wide.columns}
    gain = any(v["p_value"] < 0.05 and v["only_setting"] > v["only_baseline"] for s, v in stats.items() if s != master)
    return ("not supported" if gain else "supported"), {"n": len(wide), **stats}


# --- C49: temperature -----------------------------------------------------------------------------------------
def sampled_pass_at_1(df: pd.DataFrame) -> pd.DataFrame:
    """Unbiased pass@1 from n samples per problem (c/n, averaged over problems), bootstrap CI over problems, per
    setting and temperature."""
    per = df.groupby(["setting", "temperature", "task_id"])["passed"].mean().reset_index()
    rows = []
    for (s, t), g in per.groupby(["setting", "temperature"], sort=False):
        lo, hi = bootstrap_ci(g["passed"].to_numpy())
        rows.append({"setting": s, "temperature": t, "problems": len(g), "pass@1": g["passed"].mean(), "lo": lo,
                     "hi": hi})
    return pd.DataFrame(rows)


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
                     f"[{r.lo:+.2f}, {r.hi:+.2f}], zh vs master McNemar p={r.p_zh_vs_master:.2g}" for r in f.itertuples())
    split_text = "; ".join(f"{name}: {ss['en']:.1%} in the English prompts, {ss['zh']:.1%} in the Chinese ones "
                           f"(Δ {ss['delta']:+.3f} [{ss['lo']:+.3f}, {ss['hi']:+.3f}])" for name, (_, ss) in splits.items())
    n_pairs = min(ss["n"] for _, ss in splits.values())
    av, ast = arith
    arith_text = ", ".join(f"{s}: {v['correct']}/{ast['n']}" + ("" if s == master else f" (p={v['p_value']:.2g})")
                           for s, v in ast.items() if s != "n")
    tv, ts = temp
    t_text = ", ".join(f"T={r.temperature:g}: {r.setting} {r.p:.0%} [{r.lo:.0%}, {r.hi:.0%}]"
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
