"""Notebook 07's learning curve: one growing run per variant scored at every budget (tiny models), re-read from the
cell cache without training; its trend and verdict rules on hand-made frames, degenerate ones included."""
from __future__ import annotations

import dataclasses

import numpy as np
import pandas as pd
import pytest
import torch

import fusionlab as fl
from fusionlab.experiments import nb07_claims as fc, nb07_corpora as corpora, nb07_curve_stats as cs, nb07_learning_curve as lc
from fusionlab.training.fuser import LearnedFuser, match_table

BUDGETS = (10_000, 20_000, 40_000)


def frame(gap, budgets=BUDGETS, docs=6, noise=0.01, seed=0, moved=True) -> pd.DataFrame:
    """Per-chunk NLL: the master at 2.0; the constant control 0.15 below it; each fuser `gap(b)` above the constant,
    the shuffled control and the other-document reading as the constant (no information)."""
    rng = np.random.default_rng(seed)
    rows = []
    for dom in ("code", "english"):
        for d in range(docs):
            for c in range(2):
                base = 2.0 + 0.3 * rng.standard_normal()
                doc, k = f"{dom}/{d}.txt", ((dom == "english") * docs + d) * 2 + c  # the same chunk in every frame
                rows.append({"variant": cs.MASTER, "budget": 0, "domain": dom, "doc": doc, "chunk": k, "nll": base})
                for b in budgets:
                    const = base - (0.15 if moved else 0.0)
                    e = lambda: noise * rng.standard_normal() if moved else 0.0  # noqa: E731
                    for v, x in (("constant", const), ("shuffled r32", const + e()),
                                 ("fuser r32", const + (gap(b) if moved else 0.0) + e()),
                                 ("fuser r32, other document", const + e())):
                        rows.append({"variant": v, "budget": b, "domain": dom, "doc": doc, "chunk": k, "nll": x})
    return pd.DataFrame(rows)


def verdict(nll: pd.DataFrame) -> str:
    return cs.verdicts(nll).set_index("variant").loc["fuser r32", "verdict"]


def test_a_fuser_below_both_controls_beats_the_constant():
    nll = frame(lambda b: -0.1 if b == 40_000 else 0.05)
    assert verdict(nll) == "beats the constant control"
    assert fc.curve_claim(nll).verdict == "supported" and fc.curve_claim(nll).claim_id == "X08"
    for control in ("shuffled r32", "fuser r32, other document"):  # ahead of the constant, a control missing
        alone = nll[nll["variant"] != control]
        assert verdict(alone) == "inconclusive" and fc.curve_claim(alone).verdict == "inconclusive"
    narrow = nll.replace({"variant": {"shuffled r32": "shuffled r4"}})  # another width's control is no control
    assert verdict(narrow) == "inconclusive"


def test_a_fuser_no_better_than_itself_reading_another_document_does_not_beat():
    nll = frame(lambda b: -0.1)
    same = nll[nll["variant"] == "fuser r32"].assign(variant="fuser r32, other document")
    nll = pd.concat([nll[nll["variant"] != "fuser r32, other document"], same], ignore_index=True)
    assert verdict(nll) == "ahead of the constant, not of its controls"
    assert fc.curve_claim(nll).verdict == "inconclusive"


def test_a_closing_gap_trends_and_crosses_where_the_line_says():
    nll = frame(lambda b: 0.2 - 0.05 * np.log2(b / 10_000))  # 0.2, 0.15, 0.10: zero at 10K * 2^4
    tr = cs.trend(nll, "fuser r32")
    assert tr["slope"] == pytest.approx(-0.05, abs=0.01) and tr["hi"] < 0
    assert tr["crossing"] == pytest.approx(160_000, rel=0.25)
    assert verdict(nll) == "trends toward the constant control"
    assert fc.curve_claim(nll).verdict == "inconclusive"  # a trend is reported, never judged a gain


def test_a_flat_gap_does_not_trend_there():
    nll = frame(lambda b: 0.1)
    assert cs.trend(nll, "fuser r32")["crossing"] > cs.REACH * 40_000  # noise may tilt it, never within reach
    assert verdict(nll) == "does not trend there"
    slow = frame(lambda b: 0.5 - 0.02 * np.log2(b / 10_000), noise=0.001)  # a real slope, 0 only at 10K * 2^25
    assert cs.trend(slow, "fuser r32")["hi"] < 0 and verdict(slow) == "does not trend there"


def test_degenerate_grids_are_no_evidence():
    assert verdict(frame(lambda b: 0.0, moved=False)) == "inconclusive"  # all equal to the master: nothing moved
    assert verdict(frame(lambda b: -0.1, budgets=(10_000, 20_000))) == "beats the constant control"  # a gain is one
    assert verdict(frame(lambda b: 0.1, budgets=(10_000, 20_000))) == "inconclusive"  # two budgets: no trend


def test_thin_domains_are_reported_but_not_pooled():
    nll = frame(lambda b: 0.1)
    thin = nll[~((nll["domain"] == "english") & ~nll["doc"].isin(["english/0.txt", "english/1.txt"]))]
    assert cs.pooled_domains(thin) == ["code"]
    t = cs.curve_table(thin)
    pooled = t[(t["domain"] == "pooled") & (t["against"] == "constant")]
    assert (pooled["docs"] == 6).all()  # code's six files; English (two) shows only in its own rows
    assert set(t["domain"]) == {"code", "english", "pooled"}
    assert set(t["against"]) == {"master alone", "constant", "shuffled", "other document"}


def with_seed(nll: pd.DataFrame, seed: int, gap, budgets=(10_000,)) -> pd.DataFrame:
    """`nll` plus a further seed's runs at `budgets` (their own draws), the fuser `gap` above the constant there."""
    extra = frame(gap, budgets=budgets, seed=seed + 10)
    extra = extra[extra["variant"] != cs.MASTER].assign(seed=seed)
    return pd.concat([nll if "seed" in nll else nll.assign(seed=0), extra], ignore_index=True)


def test_a_gain_must_hold_in_every_seed():
    beats = frame(lambda b: -0.1)
    assert verdict(with_seed(beats, 1, lambda b: -0.1)) == "beats the constant control"
    assert verdict(with_seed(beats, 1, lambda b: +0.05)) == "inconclusive"  # one seed's luck
    two = with_seed(with_seed(beats, 1, lambda b: -0.1), 2, lambda b: 0.0)
    assert verdict(two) == "inconclusive"


def test_further_seeds_stay_out_of_the_curve_and_fill_the_seed_table():
    nll = frame(lambda b: 0.05)
    seeded = with_seed(nll, 1, lambda b: -0.3, budgets=(10_000, 20_000))
    pd.testing.assert_frame_equal(cs.curve_table(seeded), cs.curve_table(nll))  # the curve is the first seed's
    pd.testing.assert_frame_equal(cs.verdicts(seeded)[["slope", "verdict"]], cs.verdicts(nll)[["slope", "verdict"]])
    t = cs.seed_table(seeded)
    assert set(t["seed"]) == {0, 1} and set(t["budget"]) == {10_000, 20_000} and set(t["domain"]) == {"pooled"}
    by_seed = t[(t["variant"] == "fuser r32") & (t["against"] == "constant")].groupby("seed")["delta"].mean()
    assert by_seed[0] == pytest.approx(0.05, abs=0.01) and by_seed[1] == pytest.approx(-0.3, abs=0.01)
    assert cs.seed_table(nll).empty and cs.seed_table(nll.assign(seed=0)).empty  # one seed: no spread to show


@pytest.mark.parametrize("kw", [{"budgets": (20_000, 10_000)}, {"budgets": ()}, {"budgets": (0, 5)},
                                {"widths": (0,)}, {"widths": ()}, {"controls": ("noise",)}, {"seeds": ()},
                                {"seeds": (0, 0)}, {"seeds": (-1,)}, {"seeds": (0.5,)}, {"seed_budget": 15_000},
                                {"wide_budget": 5}])
def test_bad_plans_are_refused(kw):
    args = {"slave": "gemma3-270m", "budgets": BUDGETS, "widths": (4, 32), **kw}
    with pytest.raises(fl.FusionLabError, match="CurvePlan"):
        lc.CurvePlan(**args)


def test_the_curve_trains_once_per_variant_and_rereads(tiny, monkeypatch, tmp_path):
    monkeypatch.setattr(lc, "cache_dir", lambda: tmp_path)
    m, s = tiny("tiny-qwen2"), tiny("tiny-llama")
    docs = corpora.code_docs()[:12] + corpora.english_docs()
    proj = fl.fit_lstsq(m, s, texts=[d.text[:2000] for d in docs[:4]], holdout_every=0)
    # budgets that a 64-token chunk does not divide: each run overshoots its budget, as the real ones do
    p = dataclasses.replace(lc.curve_plan("quick"), budgets=(100, 200), seed_budget=100)
    fresh, real = [], lc.train_fuser

    def spy(*a, checkpoint, **k):
        fresh.append(not checkpoint.exists())
        return real(*a, checkpoint=checkpoint, **k)
    monkeypatch.setattr(lc, "train_fuser", spy)
    nll = lc.measure(m, s, proj, p, docs)
    assert set(nll["variant"]) == {"master alone", "fuser r4", "fuser r4, other document", "constant", "shuffled r4"}
    assert len(nll[nll["variant"] == "fuser r4, other document"]) == len(nll[nll["variant"] == "fuser r4"])
    assert sorted(set(nll["budget"])) == [0, *p.budgets]
    grown = nll[nll["variant"] == "fuser r4"].groupby("budget")["tokens"].first()
    assert grown.is_monotonic_increasing and grown.iloc[-1] >= p.budgets[-1]
    assert nll.groupby(["variant", "budget"])["doc"].nunique().min() >= 2
    again_seed = nll[nll["seed"] == 1]  # the further seed repeats the fuser and its two controls up to seed_budget
    assert set(again_seed["variant"]) == {"fuser r4", "fuser r4, other document", "constant", "shuffled r4"}
    assert set(again_seed["budget"]) == {p.seed_budget}
    first = nll[(nll["seed"] == 0) & (nll["budget"] == p.seed_budget) & (nll["variant"] == "fuser r4")]
    assert not np.allclose(first["nll"], again_seed[again_seed["variant"] == "fuser r4"]["nll"])  # another run

    assert sum(fresh) == 6  # one start per run (3 variants x 2 seeds): readings and later budgets resume it
    monkeypatch.setattr(lc, "train_fuser", lambda *a, **k: pytest.fail("a scored cell was trained again"))
    again = lc.measure(m, s, proj, p, docs)
    pd.testing.assert_frame_equal(again, nll)


def test_the_cheapest_complete_comparison_trains_first(tiny):
    m, s = tiny("tiny-qwen2"), tiny("tiny-llama")
    proj = fl.fit_lstsq(m, s, texts=["def f(x):\n    return x + 1\n" * 20], holdout_every=0)
    p = lc.CurvePlan("tiny", (100, 200, 400), (32, 4))
    runs = lc.variants(p, proj)
    assert list(runs) == ["fuser r4", "constant", "shuffled r4", "fuser r32", "shuffled r32"]
    big = LearnedFuser(proj, runs["fuser r32"])
    assert runs["constant"].table == match_table(big.param_count(), len(big.layers), big.heads, big.head_dim)
    assert all(runs[v].constant_term for v in runs if v != "constant")  # every slave-fed run has its own table


def test_each_run_grows_through_its_own_budgets(tiny):
    m, s = tiny("tiny-qwen2"), tiny("tiny-llama")
    proj = fl.fit_lstsq(m, s, texts=["def f(x):\n    return x + 1\n" * 20], holdout_every=0)
    p = lc.CurvePlan("tiny", (100, 200, 400), (4, 32), seeds=(0, 1), seed_budget=200, wide_budget=100)
    runs = lc.variants(p, proj)
    got = {v: lc.run_budgets(p, cfg, 0) for v, cfg in runs.items()}
    assert got == {"fuser r4": [100, 200, 400], "constant": [100, 200, 400], "shuffled r4": [100, 200, 400],
                   "fuser r32": [100], "shuffled r32": [100]}
    assert list(lc.seed_variants(p, proj)) == ["fuser r4", "constant", "shuffled r4"]
    assert all(lc.run_budgets(p, cfg, 1) == [100, 200] for cfg in lc.seed_variants(p, proj).values())
    assert lc.train_config(p, 100, 1).seed == 1 and lc.train_config(p, 100).seed == 0


def test_a_checkpoint_past_the_budget_restarts_the_run(tmp_path):
    ck = tmp_path / "run.ckpt"
    torch.save({"tokens": 20_224, "rows": [{"tokens": 256 * k} for k in range(1, 80)]}, ck)  # 79 steps: 20,224
    lc._rewind_if_past(ck, 30_000)
    assert ck.exists()  # short of the budget: the run goes on from here
    lc._rewind_if_past(ck, 20_000)
    assert ck.exists()  # the step that crossed 20,000 is where a 20K run ends: its other cells resume here
    lc._rewind_if_past(ck, 10_000)
    assert not ck.exists()  # a 10K run stopped 39 steps earlier


@pytest.mark.parametrize("docs", [6, 2])
def test_the_curve_figure_draws_pooled_or_the_largest_domain(docs):
    """With too few documents to pool (QUICK), the figure draws the domain with the most documents instead of an
    empty pooled panel (which once failed on its log axis)."""
    import matplotlib.pyplot as plt

    from fusionlab.experiments import nb07_plots

    fig = nb07_plots.plot_learning_curve(cs.curve_table(frame(lambda b: 0.05, docs=docs)))
    fig.canvas.draw()  # the log axis is resolved here
    assert ("pooled" in fig._suptitle.get_text()) == (docs >= cs.MIN_DOCS)
    assert all(ax.lines for ax in fig.axes)
    plt.close(fig)
