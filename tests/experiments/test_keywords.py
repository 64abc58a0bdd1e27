"""Keyword spans by character offsets, controls, the prompt set, and the study on tiny models."""
from __future__ import annotations

import pytest

import fusionlab as fl
from fusionlab.experiments import nb03_keywords as kwm, nb03_claims as claims
from fusionlab.analysis.attention_views import interactive_view, layer_head_heatmap, token_strip_html
from fusionlab.analysis.attention_capture import token_labels
from fusionlab.errors import FusionLabError
from fusionlab.models.tiny import tiny_tokenizer


def test_prompt_set():
    ps = kwm.load_prompts()
    assert len(ps) >= 40 and sum(p["lang"] == "zh" for p in ps) == sum(p["lang"] == "en" for p in ps)
    assert {p["kind"] for p in ps} == {"compare", "emphasise", "summarise", "list", "translate"}
    assert all(k in p["prompt"] for p in ps for k in p["keywords"])


@pytest.mark.parametrize("merged", [False, True])
def test_spans_cover_exactly_the_keyword_characters(merged):
    tok = tiny_tokenizer(merged)
    text = "请对比 the two plans, 侧重 cost"
    spans = kwm.keyword_positions(tok, text, ["对比", "侧重", "the"])
    offsets = tok(text, return_offsets_mapping=True)["offset_mapping"]
    for kw, pos in spans.items():
        at = text.find(kw)
        covered = {c for p in pos for c in range(*offsets[p])}
        assert covered >= set(range(at, at + len(kw)))  # every keyword character is covered
        assert all(offsets[p][0] < at + len(kw) and offsets[p][1] > at for p in pos)  # nothing outside
    assert len(spans["对比"]) == 6  # byte-level: 3 tokens per Chinese character


def test_keyword_not_found_says_which_and_shows_the_prompt():
    with pytest.raises(FusionLabError, match=r"keyword '侧重' not found in the prompt: 'compare these\.\.\.'"):
        kwm.keyword_positions(tiny_tokenizer(), "compare these", ["侧重"])


def test_control_excludes_keywords_and_is_seeded():
    tok = tiny_tokenizer()
    text = "please compare the two plans carefully"
    kw = kwm.keyword_positions(tok, text, ["compare"])["compare"]
    a = kwm.control_positions(tok, text, set(kw), len(kw), 0, seed=1)
    assert len(a) == len(kw) and not set(a) & set(kw)
    assert a == kwm.control_positions(tok, text, set(kw), len(kw), 0, seed=1)


def test_study_and_ratios_on_tiny(tiny):
    m, s = tiny("tiny-qwen2"), tiny("tiny-qwen2", fresh=True)
    prompts = kwm.load_prompts()[:2] + kwm.load_prompts()[-2:]
    with fl.fuse(m, [fl.Slave(s)]) as f:
        df = kwm.study({"single": (m, "own"), "fused": (f, "all")}, m, prompts)
    assert set(df["tokens"]) == {"keyword", "control"} and df["mass"].between(0, 1).all()
    r = kwm.ratios(df, "single")
    assert set(r["setting"]) == {"fused"} and len(r) == 2 * len(prompts)
    # self-fusion with prefix slots: every prompt key has an exact copy, so own+slots mass equals the single model's
    assert r["ratio"].sub(1).abs().max() < 1e-4
    fig = layer_head_heatmap(df[df["tokens"] == "keyword"])
    assert fig.axes


def test_views(tiny):
    lm = tiny("tiny-llama")
    labels = token_labels(lm, "the cat sat")
    html = token_strip_html(labels, [0.1] * len(labels), highlight={0})
    assert "underline" in html and "<span" in html
    with fl.capture_attention(lm, queries="last") as cap:
        lm.model(lm.encode("the cat sat"))
    view = interactive_view(cap, labels)
    view.children[0].children[0].value = cap.layers[-1]  # layer picker redraws without error
    assert "<span" in view.children[1].value


def test_answer_queries_equal_eager_attentions_over_the_generated_sequence(tiny):
    """queries='answer': the mass from every query that produced an answer token (greedy) equals HF eager
    attentions on the prompt + answer, read at the same rows."""
    import torch

    m = tiny("tiny-llama")
    p = kwm.load_prompts()[0]
    df = kwm.run_prompt(m, m, p, queries="answer", answer_tokens=5)
    text = m.chat_prompt(p["prompt"])
    ids = m.encode(text)
    n = ids.shape[1]
    with fl.fuse(m, []) as f:
        full = f.generate(ids, max_new_tokens=5)  # (1, n + generated)
    eager = fl.load("tiny-llama", attn_implementation="eager")
    with torch.no_grad():
        att = eager.model(full[:, :-1], output_attentions=True).attentions  # the last token is never fed
    rows = list(range(n - 1, full.shape[1] - 1))
    kw = sorted({q for ps in kwm.keyword_positions(m.tokenizer, text, p["keywords"], text.find(p["prompt"])).values()
                 for q in ps})
    got = df[df["tokens"] == "keyword"].set_index(["layer", "head"])["mass"]
    assert (df["n_queries"] == len(rows)).all() and len(rows) > 1
    for layer, a in enumerate(att):
        want = a[0][:, rows][:, :, kw].sum(-1).mean(1)  # (H,)
        assert torch.allclose(torch.tensor([got[(layer, h)] for h in range(a.shape[1])]).float(), want, atol=1e-5)


def test_answer_queries_on_a_fused_model_and_bad_queries(tiny):
    m, s = tiny("tiny-qwen2"), tiny("tiny-qwen2", fresh=True)
    p = kwm.load_prompts()[-1]
    with fl.fuse(m, [fl.Slave(s)]) as f:
        df = kwm.run_prompt(f, m, p, source="all", queries="answer", answer_tokens=3)
        assert df["mass"].between(0, 1).all() and (df["queries"] == "answer").all()
        f(m.chat_prompt(p["prompt"]))  # the caller's fusion is still open and usable
    with pytest.raises(FusionLabError, match="queries must be one of"):
        kwm.run_prompt(m, m, p, queries="first")


def test_keyword_claim_needs_a_keyword_specific_rise():
    import pandas as pd

    def summary(kw, ctrl):
        return pd.DataFrame([{"setting": "s", "tokens": "keyword", "n_prompts": 40, "mean_ratio": kw[0],
                              "ci_low": kw[1], "ci_high": kw[2]},
                             {"setting": "s", "tokens": "control", "n_prompts": 40, "mean_ratio": ctrl[0],
                              "ci_low": ctrl[1], "ci_high": ctrl[2]}])

    assert claims.keyword_claim(summary((2.4, 2.1, 2.7), (1.0, 0.9, 1.1))).verdict == "supported"
    assert claims.keyword_claim(summary((2.4, 2.1, 2.7), (2.6, 2.2, 3.0))).verdict == "not supported"  # all tokens rise
    assert claims.keyword_claim(summary((1.2, 1.0, 1.4), (1.0, 0.9, 1.1))).verdict == "not supported"
    both = claims.keyword_claim(summary((1.2, 1.0, 1.4), (1.0, 0.9, 1.1)), summary((2.4, 2.1, 2.7), (1.0, 0.9, 1.1)), 16)
    assert both.verdict == "supported" and "16 answer tokens" in both.measured
