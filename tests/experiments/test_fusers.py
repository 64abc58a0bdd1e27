"""Notebook 07's pieces: corpora splits, held-out NLL through the tested training path, paired gains, and the claim
rules on hand-made frames (each verdict branch)."""
from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

import fusionlab as fl
from fusionlab.training.fuser import FuserConfig, LearnedFuser
from fusionlab.training.chunks import TrainChunk
from fusionlab.experiments import nb07_corpora as corpora, nb07_claims as fc, nb07_fusers as fusers

TEXTS = ["The quick brown fox jumps over the lazy dog near the river bank.",
         "def add(a, b):\n    return a + b  # a small function",
         "A library keeps old maps of the valley and the harbour, and lends them out."]


def test_corpora_never_mix_splits_and_skip_the_evaluation_essays():
    docs = corpora.chinese_docs() + corpora.code_docs()
    assert {d.split for d in docs} == {"train", "validation", "heldout"}
    assert any(d.name == "haystack/zh.txt" and d.split == "heldout" for d in docs)  # evaluated on, never trained
    m = corpora.manifest(docs)
    for domain in ("code", "chinese"):
        train, val, held = ({n for n, _ in m[domain][s]} for s in ("train", "validation", "heldout"))
        assert train and val and held and not (train & val or train & held or val & held)  # disjoint by document
    assert corpora._split("abc.py") == corpora._split("abc.py")


def test_windows_and_interleaved_chunks(tiny):
    tok = tiny("tiny-qwen2").tokenizer
    docs = [corpora.Doc(d, f"{d}.txt", (t + " ") * 30, "train") for d, t in zip(corpora.DOMAINS, TEXTS)]
    ch = corpora.chunks(tok, docs, "train", tokens=64, per_domain=3)
    assert [corpora.domain_of(c, docs) for c in ch[:3]] == list(corpora.DOMAINS)
    assert all(len(tok(c.text, add_special_tokens=False)["input_ids"]) in (63, 64, 65) for c in ch)
    off = corpora.chunks(tok, docs, "train", tokens=64, task="offload")
    assert all(c.context and c.context != c.text for c in off)


def test_heldout_nll_of_master_lstsq_and_fuser(tiny):
    m, s = tiny("tiny-qwen2"), tiny("tiny-llama")
    proj = fl.fit_lstsq(m, s, texts=TEXTS, holdout_every=0)
    fresh = LearnedFuser(proj, FuserConfig(width=4))
    chunks = {"en": [TrainChunk(t) for t in TEXTS]}
    ev = [fusers.Evaluated("master alone", None, role="master"),
          fusers.Evaluated("fuser at start", fresh, s),
          fusers.Evaluated("+lstsq concat", proj, s, mode="concat", role="lstsq"),
          fusers.Evaluated("fuser, other text", fresh, s, reads="shuffled")]
    nll = fusers.nll_table(m, ev, chunks, "same")
    wide = nll.pivot_table(index="chunk", columns="setting", values="nll")
    assert np.allclose(wide["fuser at start"], wide["master alone"], atol=1e-5)  # a fresh fuser is the master
    assert np.allclose(wide["fuser, other text"], wide["master alone"], atol=1e-5)
    assert not np.allclose(wide["+lstsq concat"], wide["master alone"], atol=1e-3)
    gain = fusers.paired_gain(nll, "master alone")
    assert set(gain["domain"]) == {"en", "all"} and (gain["n"] == 3).all()


def table(deltas: dict[str, tuple[float, float, float]], n: int = 30, slave: str = "s") -> pd.DataFrame:
    return pd.DataFrame([{"slave": slave, "fuser": "f", "against": k, "n": n, "delta_nll": d, "lo": lo, "hi": hi,
                          "beats": hi < 0} for k, (d, lo, hi) in deltas.items()])


def test_information_claim_branches():
    win = {"master alone": (-0.2, -0.3, -0.1), "shuffled": (-0.1, -0.2, -0.05), "noise": (-0.15, -0.2, -0.1),
           "constant": (-0.05, -0.1, -0.01)}
    assert fc.information_claim(table(win)).verdict == "supported"
    adapter = win | {"shuffled": (0.0, -0.05, 0.05)}  # better than the master, but so is another text: an adapter
    assert fc.information_claim(table(adapter)).verdict == "inconclusive"
    closed = {k: (0.0, -0.01, 0.01) for k in win}
    assert fc.information_claim(table(closed)).verdict == "not supported"
    assert fc.information_claim(table(win, n=5)).verdict == "inconclusive"


def test_information_claim_n_names_the_pooled_domains_of_its_table():
    t = table({"master alone": (-0.2, -0.3, -0.1)}).assign(docs=12, pooled="code, en")
    assert fc.information_claim(t).n == "n=30 held-out chunks from 12 documents (domains pooled: code, en)"
    assert "Chinese" not in fc.information_claim(t).n
    assert fc.information_claim(t.iloc[:0]).n == "n=0 held-out chunks"


def test_never_worse_target():
    t = table({"master alone": (0.01, -0.02, 0.04)})
    pairs = pd.DataFrame({"setting": ["+s (fuser)"], "p_value": [0.5], "only_baseline": [3], "only_setting": [2]})
    out = fc.never_worse(t, pairs)
    assert out["nll_ok"].item() and out["humaneval_ok"].item()
    worse = table({"master alone": (0.2, 0.1, 0.3)})
    assert not fc.never_worse(worse)["nll_ok"].item()


def test_control_table_pools_domains():
    gains = pd.DataFrame([{"setting": "f", "vs": v, "domain": "all", "n": 24, "delta": -0.1, "lo": -0.2, "hi": -0.05}
                          for v in ("master", "c1")])
    t = fc.control_table(gains, {"s": "f"}, {"s": {"shuffled": "c1"}}, "master")
    assert t["against"].tolist() == ["master alone", "shuffled"] and t["beats"].all()


def test_a_fuser_is_reloaded_only_for_its_exact_recipe_and_budget(tiny, monkeypatch, tmp_path):
    """Default and full runs commit their fusers under names that carry the budget; a changed training config (or
    budget) trains anew rather than reloading a fuser made another way; QUICK writes to the cache only."""
    monkeypatch.setattr(fusers, "data_dir", lambda: tmp_path / "data")
    monkeypatch.setattr(fusers, "cache_dir", lambda: tmp_path / "cache")
    m, s = tiny("tiny-qwen2"), tiny("tiny-llama")
    proj = fl.fit_lstsq(m, s, texts=TEXTS, holdout_every=0)
    chunks = [TrainChunk(t, doc=f"d{k}") for k, t in enumerate(TEXTS * 2)]
    p = fusers.FuserPlan(["s"], ["slave"], False, 64, 1, 1, 1, [64], [64], width=4, tokens=32, train=True)
    cfg = fusers.config_for("slave", "same", None, p.width)
    f, _, how = fusers.obtain(m, s, proj, chunks, cfg, "same", p, "default")
    path = tmp_path / "data" / "fusers" / f"{fusers.name_of(m, s, 'same', cfg, 64)}.safetensors"
    assert how == "trained now" and path.exists() and path.with_suffix(".done").exists()
    assert fusers.obtain(m, s, proj, chunks, cfg, "same", p, "default")[2] == "committed"
    p.lr = 1e-3  # the same name, another recipe: never reloaded
    assert fusers.obtain(m, s, proj, chunks, cfg, "same", p, "default")[2] == "trained now"
    p.budget_tokens = 96
    assert fusers.obtain(m, s, proj, chunks, cfg, "same", p, "quick")[2] == "trained now"
    assert not (tmp_path / "data" / "fusers" / f"{fusers.name_of(m, s, 'same', cfg, 96)}.safetensors").exists()


def test_same_text_fusers_carry_a_slave_free_term_the_constant_control_matches(tiny):
    """The main table's fuser vs constant isolates the slave only if the fuser can learn the constant's adapter too,
    and the constant is matched to the fuser's whole parameter count, its table included."""
    m, s = tiny("tiny-qwen2"), tiny("tiny-llama")
    proj = fl.fit_lstsq(m, s, texts=TEXTS, holdout_every=0)
    for v in ("slave", "shuffled", "noise"):
        cfg = fusers.config_for(v, "same", None, 4)
        assert cfg.constant_term and cfg.table == fusers.SLAVE_FREE_TABLE and cfg.input == v
    f = LearnedFuser(proj, fusers.config_for("slave", "same", None, 4))
    without = LearnedFuser(proj, FuserConfig(mode="blend", width=4, input="slave"))
    const = fusers.config_for("constant", "same", f, 4)
    assert const.table > fusers.config_for("constant", "same", without, 4).table
    one_position = len(f.layers) * 2 * f.heads * f.head_dim  # match_table rounds to whole positions
    assert abs(LearnedFuser(proj, const).param_count() - f.param_count()) <= one_position
    assert not fusers.config_for("slave", "offload", None, 4).constant_term


def test_offload_fusers_use_the_recipe_that_opens():
    cfg = fusers.config_for("slave", "offload", None, 32)
    assert (cfg.mode, cfg.opening, cfg.log_gate, cfg.calibrate_keys) == ("concat", "log", 0.0, False)
    assert fusers.train_config(fusers.plan("default"), "offload").gate_lr == fusers.plan("default").gate_lr
    assert fusers.train_config(fusers.plan("default"), "same").gate_lr is None


def test_the_opening_figure_draws_concat_runs_only():
    import matplotlib.pyplot as plt

    from fusionlab.experiments import nb07_plots

    steps = np.arange(10)
    concat = pd.DataFrame({"step": steps, "gate_mean": 1 + 0.01 * steps, "key_scale_mean": 1 - 0.02 * steps})
    blend = pd.DataFrame({"step": steps, "gate_mean": 1.0, "key_scale_mean": np.nan})
    fig = nb07_plots.plot_opening({"gemma offload": concat, "gemma same": blend})
    assert [len(ax.lines) for ax in fig.axes] == [1, 1]
    plt.close(fig)


def test_the_training_history_records_gate_and_key_scale(tiny):
    m, s = tiny("tiny-qwen2"), tiny("tiny-llama")
    proj = fl.fit_lstsq(m, s, texts=TEXTS, holdout_every=0)
    chunks = [TrainChunk(t, context=u, doc=f"d{k}") for k, (t, u) in enumerate(zip(TEXTS, TEXTS[1:] + TEXTS[:1]))]
    r = fl.train_fuser(m, s, chunks, fusers.config_for("slave", "offload", None, 4),
                       fl.TrainConfig(task="offload", max_tokens=60, gate_lr=2e-2), projector=proj)
    h = r.history
    assert h["key_scale_mean"].notna().all() and h["gate_mean"].iloc[0] != 1.0  # moved at the first step
