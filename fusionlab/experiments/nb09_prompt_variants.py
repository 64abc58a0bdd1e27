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
from ..paths import asset
from .nb04_humaneval import problems

ZH_SEED = 39
"""humaneval.subset(40, seed=39) is the set we translated."""


def zh_problems(n: int | None = None) -> list[dict[str, Any]]:
    """The translated problems (task_id, prompt, entry_point), in task order; the first `n`."""
    rows = [json.loads(x) for x in asset("prompts", "humaneval_zh.jsonl").read_text(encoding="utf-8").splitlines()
            if x.strip()]
    return rows[:n] if n is not None else rows


def english_of(zh: list[dict[str, Any]]) -> list[dict[str, Any]]:
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


