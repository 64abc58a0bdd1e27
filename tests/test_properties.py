"""Property-based tests (hypothesis) for the pure pieces: they must hold for any input, not only the hand-picked."""
from __future__ import annotations

import math
from functools import lru_cache

import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from fusionlab import kv, stats
from fusionlab.engine.layermap import LayerMap
from fusionlab.engine.sampling import SamplingConfig
from fusionlab.engine.token_align import align_tokens, offsets
from fusionlab.errors import FusionLabError
from fusionlab.experiments import nb02_niah as niah
from fusionlab.models.tiny import tiny_tokenizer

from conftest import embedded_available

FAST = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
layers = st.integers(1, 64)


@FAST
@given(lm=layers, ls=layers, strategy=st.sampled_from(LayerMap.STRATEGIES), step=st.integers(1, 6))
def test_every_layer_map_strategy_stays_in_range(lm, ls, strategy, step):
    m = LayerMap.build(strategy, lm, ls, **({"step": step} if strategy == "stride" else {}))
    assert m.pairs and all(0 <= i < lm and 0 <= j < ls for i, j in m.pairs.items())
    assert LayerMap.from_dict(m.to_dict()).pairs == m.pairs
    if strategy in ("identity", "last_aligned"):
        assert len(m) == min(lm, ls)
    if strategy == "proportional":
        assert len(m) == min(lm, ls) and sorted(m.pairs) == sorted(set(m.pairs))
    if strategy == "interpolate":
        assert len(m) == lm and m.pairs[0] == 0
        assert m.pairs[lm - 1] == (ls - 1 if lm > 1 else 0)  # one master layer: it takes the slave's first


@lru_cache(maxsize=None)
def tokenizer(name: str):
    if name.startswith("tiny"):
        return tiny_tokenizer(name == "tiny-merged")
    from transformers import AutoTokenizer

    from fusionlab.models.zoo import converted_dir

    return AutoTokenizer.from_pretrained(converted_dir(name))


TOKENIZERS = ["tiny", "tiny-merged"] + [n for n in ("qwen2.5-coder-0.5b-instruct", "smollm2-135m-instruct",
                                                    "gemma3-270m") if embedded_available(n)]
texts = st.text(st.characters(blacklist_categories=("Cs",)), min_size=1, max_size=80) | \
    st.sampled_from(["def f(x):\n    return x  # 注释", "请对比这两种方案。", "  spaced\tout  ", "ümlaut café", "a\u200bb"])


@FAST
@given(text=texts, a=st.sampled_from(TOKENIZERS), b=st.sampled_from(TOKENIZERS),
       strategy=st.sampled_from(["first", "last", "mean"]))
def test_alignment_never_loses_a_covered_master_token(text, a, b, strategy):
    ta, tb = tokenizer(a), tokenizer(b)
    al = align_tokens(ta, tb, text, strategy)
    mo, so = offsets(ta, text), offsets(tb, text)
    idx = al.master_index.tolist()
    assert idx == sorted(set(idx)) and all(0 <= i < len(mo) for i in idx)
    for i, g in zip(idx, al.groups):  # every group really overlaps its master token's characters
        assert g and all(so[j][0] < mo[i][1] and mo[i][0] < so[j][1] for j in g)
    for i, (s0, e0) in enumerate(mo):  # a master token with characters that some slave token covers is aligned
        if e0 > s0 and any(c < e0 and s0 < d and d > c for c, d in so):
            assert i in idx


@FAST
@given(n=st.integers(1, 5000), m=st.integers(1, 5000), batch=st.integers(1, 8),
       dtype=st.sampled_from(["float32", "bfloat16"]))
def test_kv_budget_is_monotone_and_equals_the_formula(n, m, batch, dtype):
    cfg = {"num_hidden_layers": 6, "num_attention_heads": 8, "num_key_value_heads": 2, "head_dim": 32}
    a, b = kv.budget(cfg, n, batch, dtype).total_bytes, kv.budget(cfg, m, batch, dtype).total_bytes
    assert (a <= b) == (n <= m) or a == b
    assert a == 2 * batch * n * 6 * 2 * 32 * (4 if dtype == "float32" else 2)
    slid = {**cfg, "sliding_window": 64, "layer_types": ["sliding_attention"] * 5 + ["full_attention"]}
    assert kv.budget(slid, n, batch, dtype).total_bytes <= a


@FAST
@given(t=st.floats(allow_nan=True, allow_infinity=True), p=st.floats(allow_nan=True, allow_infinity=True))
def test_sampling_config_accepts_exactly_the_valid_ranges(t, p):
    valid = math.isfinite(t) and t > 0 and math.isfinite(p) and 0 < p <= 1
    if valid:
        SamplingConfig(True, t, p, seed=0)
    else:
        with pytest.raises(FusionLabError):
            SamplingConfig(True, t, p, seed=0)


@FAST
@given(n=st.integers(0, 400), data=st.data())
def test_wilson_contains_the_rate(n, data):
    k = data.draw(st.integers(0, n))
    lo, hi = stats.wilson(k, n)
    assert 0 <= lo <= hi <= 1 and (n == 0 or lo <= k / n <= hi)


@FAST
@given(xs=st.lists(st.floats(-1e6, 1e6), min_size=1, max_size=50))
def test_bootstrap_ci_contains_the_mean_of_constant_or_is_ordered(xs):
    lo, hi = stats.bootstrap_ci(xs, n_boot=200)
    assert lo <= hi
    if len(set(xs)) == 1:
        assert lo == hi == pytest.approx(xs[0])
    assert min(xs) - 1e-6 <= lo and hi <= max(xs) + 1e-6


HAY = " ".join(f"Sentence {i} is about rivers, roads and old maps." for i in range(600))


@FAST
@given(length=st.integers(120, 700), depth=st.floats(0, 100), which=st.integers(0, 3))
def test_niah_context_holds_the_needle_meets_the_length_and_never_repeats_the_answer(length, depth, which):
    tok = tiny_tokenizer(True)
    needle = [n for n in niah.load_needles() if n.lang == "en"][which]
    assume(niah.n_tokens(tok, " " + needle.needle + " " + (needle.distractor or "")) < length)
    text, at = niah.build_context(tok, HAY, needle, length, depth)
    assert at >= 0 and text.count(needle.needle) == 1
    assert abs(niah.n_tokens(tok, text) - length) <= 4
    rest = text.replace(needle.needle, "")
    assert not any(a.lower() in rest.lower() for a in needle.answers)
