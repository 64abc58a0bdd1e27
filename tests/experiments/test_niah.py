"""NIAH harness: insertion position, token counts, scoring rules, resume, bad input."""
from __future__ import annotations

import pytest

import fusionlab as fl
from fusionlab.experiments import nb02_niah as niah
from fusionlab.errors import FusionLabError
from fusionlab.experiments.nb02_niah_grid import Setting, effective_length, rates, run_grid
from fusionlab.models.tiny import tiny_tokenizer

HAY = " ".join(f"Sentence number {i} talks about rivers, bread and lighthouses." for i in range(400))
NEEDLE = niah.load_needles()[0]


@pytest.mark.parametrize("depth", [0, 25, 50, 75, 100])
def test_needle_at_depth_on_a_sentence_boundary(depth):
    tok = tiny_tokenizer(True)
    ctx, at = niah.build_context(tok, HAY, NEEDLE, 3000, depth)
    assert at >= 0 and ctx.count(NEEDLE.needle) == 1 and ctx.count(NEEDLE.distractor) == 1
    assert abs(at / len(ctx) - depth / 100) < 0.06
    assert at == 0 or ctx[:at].rstrip().endswith(".")  # placed after a full sentence
    assert abs(niah.n_tokens(tok, ctx) - 3000) <= 6


def test_scoring_rules_on_hand_made_answers():
    nd = NEEDLE
    assert niah.score("They picked Lisbon.", nd)["label"] == "correct"
    assert niah.score("LISBON, for its harbour", nd)["label"] == "correct"
    assert niah.score("The document does not say which city.", nd)["label"] == "abstain"
    assert niah.score("It is not mentioned in the text.", nd)["label"] == "abstain"
    assert niah.score("Madrid.", nd) == {"label": "wrong", "distractor": False}
    assert niah.score("Porto was chosen.", nd) == {"label": "wrong", "distractor": True}
    zh = niah.load_needles()[4]
    assert niah.score("杭州。", zh)["label"] == "correct"
    assert niah.score("文中没有提到。", zh)["label"] == "abstain"
    assert niah.score("苏州", zh) == {"label": "wrong", "distractor": True}


def test_bad_input():
    tok = tiny_tokenizer()
    with pytest.raises(FusionLabError, match="depth must be within 0-100"):
        niah.build_context(tok, HAY, NEEDLE, 500, 120)
    with pytest.raises(FusionLabError, match="exceeds the model's max positions 512"):
        niah.build_context(tok, HAY, NEEDLE, 600, 50, max_positions=512)
    with pytest.raises(FusionLabError, match="needs .* tokens, more than the context of 50"):
        niah.build_context(tok, HAY, NEEDLE, 50, 50)
    with pytest.raises(FusionLabError, match="haystack has only .* too short"):
        niah.build_context(tok, "Short. Text.", NEEDLE, 400, 50)
    with pytest.raises(FusionLabError, match="haystack 'nope' not found"):
        niah.load_haystack("nope")


def test_grid_runs_scores_and_resumes(tiny, tmp_path, monkeypatch):
    m = tiny("tiny-qwen2")
    hay = tmp_path / "hay.txt"
    hay.write_text(HAY)
    builds = []

    def build():
        builds.append(1)
        return fl.fuse(m, [])

    st = Setting("single", build, "tiny-qwen2")
    args = dict(needles=[NEEDLE], lengths=[200, 300], depths=[10, 90], haystacks={"en": str(hay)},
                cache=tmp_path / "c.jsonl", max_new_tokens=4)
    df = run_grid(m, [st], **args)
    assert len(df) == 4 and set(df["label"]) <= {"correct", "wrong", "abstain"} and builds == [1]
    again = run_grid(m, [st], **args)  # everything cached: no model build, same rows
    assert builds == [1] and again["answer"].tolist() == df["answer"].tolist()
    r = rates(df)
    assert (r["n"] == 2).all() and r[["correct", "wrong", "abstain"]].sum(axis=1).round(6).eq(1).all()
    eff = effective_length(df.assign(label="correct"))
    assert eff["effective_length"].iloc[0] == 300 and eff["grid_max"].iloc[0] == 300


def test_niah_claim_rules():
    import pandas as pd

    from fusionlab.experiments.nb02_claims import hallucination_claim, remembers_longer_claim

    def rates(single, naive, n=6):
        rows = []
        for s, (w, lo, hi) in (("single", single), ("θ×4, naive", naive), ("θ×4, re-rotated", single)):
            rows.append({"setting": s, "length": 8192, "n": n, "wrong": w, "wrong_lo": lo, "wrong_hi": hi})
        rows.append({"setting": "single", "length": 1024, "n": n, "wrong": 0, "wrong_lo": 0, "wrong_hi": 0.3})
        # a short-length sweep variant: it must neither move the reading length nor decide the verdict
        rows.append({"setting": "θ×0.5, naive", "length": 1024, "n": n, "wrong": 1, "wrong_lo": 0.6, "wrong_hi": 1})
        return pd.DataFrame(rows)

    assert hallucination_claim(rates((0.1, 0.0, 0.2), (0.6, 0.4, 0.8))).verdict == "supported"
    assert hallucination_claim(rates((0.1, 0.0, 0.2), (0.1, 0.0, 0.3), n=60)).verdict == "not supported"
    c = hallucination_claim(rates((0.0, 0.0, 0.39), (0.17, 0.03, 0.56)))
    assert c.verdict == "inconclusive" and c.measured.startswith("at 8192 tokens: single 0%")
    assert "θ×0.5" not in c.measured
    # θ×4 naive is measured at 8192 only: no second shared length, nothing pooled
    assert "pooled" not in c.measured
    two = pd.DataFrame([{"setting": st, "length": n, "n": 6, "wrong": w, "wrong_lo": 0.0, "wrong_hi": 0.39 + w}
                        for st, n, w in (("single", 1024, 0), ("single", 8192, 0), ("θ×4, naive", 1024, 1 / 6),
                                         ("θ×4, naive", 8192, 0.5), ("θ×4, re-rotated", 1024, 0),
                                         ("θ×4, re-rotated", 8192, 0))])
    m = hallucination_claim(two)
    assert m.measured.endswith("pooled over 1024-8192 tokens (n=12 each): single 0% [0%, 24%], "
                               "θ×4, naive 33% [14%, 61%], θ×4, re-rotated 0% [0%, 24%]")
    uneven = hallucination_claim(two.assign(n=[5, 6, 6, 6, 6, 6]))  # a skipped cell: n differs, said per setting
    assert "pooled over 1024-8192 tokens: single 0% [0%, 26%] (n=11), θ×4, naive" in uneven.measured
    eff = pd.DataFrame({"setting": ["single", "fused, matched RoPE", "θ×0.5, naive"],
                        "effective_length": [4096, 8192, 0], "grid_max": [8192, 8192, 1024]})
    r = rates((0.1, 0.0, 0.2), (0.1, 0.0, 0.2), n=12)
    m = remembers_longer_claim(r, eff, [4096, 8192])
    assert m.verdict == "supported" and "θ×0.5" not in m.measured
    assert remembers_longer_claim(r, eff.assign(effective_length=8192), [4096, 8192]).verdict == "inconclusive"


def test_our_chinese_haystack_holds_an_8k_context_without_the_answers():
    """data/haystack/zh.txt is long enough for the full grid's 8K cells (Qwen tokens) and never mentions a
    Chinese needle's answer or distractor (which would make a 'correct' answer meaningless)."""
    from conftest import embedded_available

    text = niah.load_haystack("zh")
    for nd in niah.load_needles():
        if nd.lang == "zh":
            assert not any(a in text for a in nd.answers + nd.distractor_answers), nd.id
    if not embedded_available("qwen2.5-coder-0.5b-instruct"):
        pytest.skip("run `fusionlab fetch` first")
    from transformers import AutoTokenizer

    from fusionlab.models.zoo import converted_dir

    tok = AutoTokenizer.from_pretrained(converted_dir("qwen2.5-coder-0.5b-instruct"))
    zh = next(n for n in niah.load_needles() if n.lang == "zh")
    ctx, at = niah.build_context(tok, text, zh, 8192, 50)
    assert abs(niah.n_tokens(tok, ctx) - 8192) <= 6 and at > 0


def test_grid_skips_a_cell_whose_prompt_a_slave_cannot_hold(tiny, tmp_path):
    """A slave with a shorter context (SmolLM2's 8192 positions under an 8K Qwen prompt) skips the cell with the
    reason and goes on; any other error still stops the run."""
    from fusionlab.errors import ContextTooLong

    m = tiny("tiny-qwen2")
    hay = tmp_path / "hay.txt"
    hay.write_text(HAY)

    class ShortSlave(fl.FusedModel):  # the master fused with a slave that holds 420 tokens: longer prompts refused
        def __init__(self):
            super().__init__(m, [])

        def prefill(self, prompt, *a, **kw):
            for p in prompt if isinstance(prompt, list) else [prompt]:
                n = niah.n_tokens(m.tokenizer, p)
                if n > 420:
                    raise ContextTooLong(f"prompt is {n} tokens for slave s, beyond its max positions 420.")
            return super().prefill(prompt, *a, **kw)

    args = dict(needles=[NEEDLE], lengths=[200, 300], depths=[10, 90], haystacks={"en": str(hay)},
                cache=tmp_path / "c.jsonl", max_new_tokens=4)
    df = run_grid(m, [Setting("short", ShortSlave, "short")], **args)
    assert df["length"].tolist() == [200, 200] and df["answer"].notna().all()
    skipped = df.attrs["skipped"]
    assert [(s["length"], s["depth"]) for s in skipped] == [(300, 10), (300, 90)]
    assert "beyond its max positions 420" in skipped[0]["reason"]
    built = []
    again = run_grid(m, [Setting("short", lambda: built.append(1) or ShortSlave(), "short")], **args)
    assert built == [] and again.attrs["skipped"] == skipped  # skipped cells are cached: no rebuild, same reasons

    class Broken(ShortSlave):
        def prefill(self, prompt, *a, **kw):
            raise FusionLabError("something else is wrong")

    with pytest.raises(FusionLabError, match="something else"):
        run_grid(m, [Setting("broken", Broken, "broken")], **{**args, "cache": tmp_path / "d.jsonl"})
