"""Notebook 09's data and rules: the translated prompts, alignment statistics, arithmetic scoring, the verdicts."""
from __future__ import annotations

import re

import pandas as pd
import pytest

from fusionlab.experiments import nb04_humaneval as he, nb09_prompt_variants as pv, nb09_claims as claims


def test_translated_prompts_keep_code_examples_and_tests():
    zh = pv.zh_problems()
    assert len(zh) == 40 and [p["task_id"] for p in zh] == [p["task_id"] for p in he.subset(40, seed=pv.ZH_SEED)]
    for z, e in zip(zh, pv.english_of(zh)):
        assert re.search(r"[\u4e00-\u9fff]", z["prompt"]) and z["entry_point"] == e["entry_point"]
        before = e["prompt"][: e["prompt"].index('"""')]
        assert z["prompt"].startswith(before) and z["prompt"].rstrip().endswith('"""')  # signature and imports kept
        compile(z["prompt"] + "    pass\n", z["task_id"], "exec")
        for line in e["prompt"].splitlines():
            if line.strip().startswith(">>>"):
                assert line in z["prompt"], (z["task_id"], line)  # doctest examples verbatim


def test_alignment_quality_on_tiny(tiny):
    df = pv.alignment_quality(tiny("tiny-qwen2"), tiny("tiny-llama"), ["def add(a, b): return a + b", "加法 add 函数"])
    assert list(df.columns) == ["text", "english_tokens", "same_split", "slave_per_master"] and len(df) == 2
    en = pd.DataFrame({"same_split": [0.9, 0.8, 0.95, 0.9]})
    assert claims.split_verdict(en, en.assign(same_split=en["same_split"] - 0.2))[0] == "supported"
    assert claims.split_verdict(en, en.assign(same_split=en["same_split"] + 0.2))[0] == "not supported"
    assert claims.split_verdict(en, en)[0] == "not supported"  # identical: within +-0.01 of 0


def test_arithmetic_tasks_and_scoring():
    tasks = pv.arithmetic_tasks(12)
    assert tasks[0].answer == "0.8660254038" and len({t.question for t in tasks}) == 12
    mul = next(t for t in tasks if "*" in t.question)
    a, b = map(int, re.findall(r"\d+", mul.question)[:2])
    assert mul.answer == str(a * b)
    assert pv.arithmetic_correct(f"The answer is {int(mul.answer):,}.", mul)
    assert not pv.arithmetic_correct("I think 12", mul) and pv.arithmetic_correct("0.8660254038", tasks[0])
    df = pd.DataFrame([{"task": i, "setting": s, "correct": c} for i in range(20)
                       for s, c in (("master", i < 5), ("fused", i < 18))])
    assert claims.arithmetic_verdict(df, "master")[0] == "not supported"  # a significant gain
    worse = df.assign(correct=(df["setting"] == "master") & (df["task"] < 10))
    assert claims.arithmetic_verdict(worse, "master")[0] == "supported"  # 0/20 vs 10/20: a gain is ruled out
    assert claims.arithmetic_verdict(df.assign(correct=df["task"] < 5), "master")[0] == "inconclusive"  # 5/20 each
    assert claims.arithmetic_verdict(df.assign(correct=False), "master")[0] == "inconclusive"  # all wrong: no power


def _lang(master_zh: list[int], fused_zh: list[int]) -> pd.DataFrame:
    rows = []
    for i, (m, f) in enumerate(zip(master_zh, fused_zh)):
        rows += [{"setting": "master", "lang": "en", "task_id": i, "passed": 1},
                 {"setting": "master", "lang": "zh", "task_id": i, "passed": m},
                 {"setting": "fused", "lang": "en", "task_id": i, "passed": 1},
                 {"setting": "fused", "lang": "zh", "task_id": i, "passed": f}]
    return pd.DataFrame(rows)


def test_mixed_prompt_rule():
    hurt = pv.language_effect(_lang([1] * 40, [0] * 20 + [1] * 20), "master")
    assert claims.mixed_prompt_verdict(hurt, "master") == "supported"
    helped = pv.language_effect(_lang([0] * 20 + [1] * 20, [1] * 40), "master")
    assert claims.mixed_prompt_verdict(helped, "master") == "not supported"
    same = pv.language_effect(_lang([1, 0] * 20, [1, 0] * 20), "master")
    assert claims.mixed_prompt_verdict(same, "master") == "inconclusive"
    assert claims.mixed_prompt_verdict(pv.language_effect(_lang([1] * 10, [0] * 10), "master"), "master") == "inconclusive"


def test_temperature_rule():
    def df(p: dict[float, list[int]]) -> pd.DataFrame:
        return pd.DataFrame([{"setting": "f", "temperature": t, "task_id": i, "passed": v}
                             for t, vs in p.items() for i, v in enumerate(vs)])
    good = {0.3: [0] * 20, 0.55: [1] * 20, 0.7: [0] * 20, 0.9: [0] * 20}
    assert claims.temperature_verdict(df(good), "f")[0] == "supported"
    assert claims.temperature_verdict(df({**good, 0.3: [1] * 20, 0.55: [0] * 20}), "f")[0] == "not supported"
    assert claims.temperature_verdict(df({t: [1, 0] * 10 for t in good}), "f")[0] == "inconclusive"
    s = pv.sampled_pass_at_1(df(good))
    assert s.set_index("temperature").loc[0.55, "pass@1"] == 1.0
    with pytest.raises(Exception, match="0.55 was not sampled"):
        claims.temperature_verdict(df({0.3: [1] * 4}), "f")
