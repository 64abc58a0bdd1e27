"""capture_attention equals HF eager output_attentions; fused captures split own keys vs slots; bad input."""
from __future__ import annotations

import pytest
import torch

import fusionlab as fl
from fusionlab.analysis.attention_capture import capture_attention, token_labels
from fusionlab.errors import FusionLabError

from conftest import TEXT, TINY_NAMES


@pytest.mark.parametrize("name", TINY_NAMES)
def test_full_capture_equals_hf_eager(tiny, name):
    lm = tiny(name)  # runs sdpa; the reference below is a separate eager copy with the same weights
    ref_lm = fl.load(name, attn_implementation="eager")
    ids = lm.encode(TEXT)
    with torch.no_grad():
        ref = ref_lm.model(ids, output_attentions=True).attentions
        with capture_attention(lm, keep="full") as cap:
            out = lm.model(ids).logits
    assert torch.allclose(out, ref_lm.model(ids).logits, atol=1e-4)  # outputs unchanged by capturing
    for m in cap.maps:
        layer = m["layer"]
        assert torch.allclose(m["probs"], ref[layer][0].float(), atol=1e-5), (name, layer)
        assert (m["key_src"] == -1).all()


@pytest.mark.parametrize("name", TINY_NAMES)
def test_aggregate_equals_sum_of_full_rows(tiny, name):
    lm = tiny(name)
    ids = lm.encode(TEXT)
    with torch.no_grad(), capture_attention(lm, layers=[0, lm.spec.layers - 1], heads=[0], queries=[5, 9]) as agg:
        lm.model(ids)
    ref_lm = fl.load(name, attn_implementation="eager")
    with torch.no_grad():
        ref = ref_lm.model(ids, output_attentions=True).attentions
    for layer in agg.layers:
        want = ref[layer][0, 0, [5, 9]].sum(0)  # (T,)
        assert torch.allclose(agg.mass(layer)[0].float(), want, atol=1e-5)
        assert agg.n_queries[layer] == 2


@pytest.mark.parametrize("name", TINY_NAMES)
def test_every_row_aggregate_computes_the_output_from_its_probabilities(tiny, name):
    """All rows and heads: one pass gives probabilities and the layer output (no second attention call)."""
    lm = tiny(name)
    ids = lm.encode(TEXT)
    ref_lm = fl.load(name, attn_implementation="eager")
    with torch.no_grad():
        ref = ref_lm.model(ids, output_attentions=True)
        with capture_attention(lm) as agg:
            out = lm.model(ids).logits
    assert torch.allclose(out, ref.logits, atol=1e-4)
    for layer in agg.layers:
        assert torch.allclose(agg.mass(layer).float(), ref.attentions[layer][0].sum(1), atol=1e-5), layer
        assert agg.n_queries[layer] == ids.shape[1]


def test_partial_capture_leaves_the_output_bit_identical(tiny):
    """Capturing some heads or rows of an unfused model: its output is the base backend's own, bit for bit."""
    lm = tiny("tiny-llama")
    ids = lm.encode(TEXT)
    with torch.no_grad():
        plain = lm.model(ids).logits
        with capture_attention(lm, heads=[1], queries="last"):
            captured = lm.model(ids).logits
    assert torch.equal(plain, captured)


def test_trimmed_keys_change_nothing(tiny):
    """The aggregate skips causally masked future keys; the masses equal those over every key."""
    from fusionlab.engine.attention_core import Recorder
    from fusionlab.analysis.attention_capture import AttentionCapture

    lm = tiny("tiny-gemma3")  # sliding + global layers
    ids = lm.encode(TEXT)
    layers, heads = list(range(lm.spec.layers)), list(range(lm.spec.heads))
    got = {}
    with fl.fuse(lm, []) as f:
        for trim in (False, True):
            cap = AttentionCapture(layers, heads, "aggregate", 2**20)
            rows = lambda q_pos: torch.tensor([3, 40, 41, 70])  # noqa: E731
            with torch.no_grad(), f.recording(Recorder(cap._on, rows=rows, trim=trim, chunk=2)):
                f(ids)
            got[trim] = cap
    for layer in layers:
        assert got[True].own[layer].shape == got[False].own[layer].shape == (len(heads), ids.shape[1])
        assert torch.allclose(got[True].own[layer], got[False].own[layer], atol=1e-7), layer


def test_fused_capture_splits_own_and_slots(tiny):
    m, s = tiny("tiny-qwen2"), tiny("tiny-qwen2", fresh=True)
    with fl.fuse(m, [fl.Slave(s, layer_map={1: 1, 3: 3})], timing="live") as f:
        with capture_attention(f, queries="last") as cap:
            out = f.generate(TEXT, max_new_tokens=4)
    split = cap.source_split()
    total = split.drop(columns=["layer", "head"]).fillna(0).sum(axis=1)
    assert torch.allclose(torch.tensor(total.values), torch.ones(len(total), dtype=torch.float64), atol=1e-5)
    mapped = split[split["layer"].isin([1, 3])]
    assert (mapped["slave0"] > 0).all() and split[~split["layer"].isin([1, 3])].get("slave0", 0).fillna(0).eq(0).all()
    # self-fusion, live: a slot is an exact copy of the own key at its position, so they share mass equally
    assert torch.allclose(cap.mass(1, "own"), cap.mass(1, "slots"), atol=1e-5)
    assert isinstance(out, str)


def test_labels_and_bad_input(tiny):
    lm = tiny("tiny-llama")
    labels = token_labels(lm, "the cat 你")
    assert list(labels.columns) == ["pos", "id", "piece", "start", "end"] and labels["piece"].iloc[0] == "the"
    with pytest.raises(FusionLabError, match=r"layers \[7\] / heads \[\] out of range: tiny-llama has 3 layers"):
        with capture_attention(lm, layers=[7]):
            pass
    with pytest.raises(FusionLabError, match="keep must be one of"):
        with capture_attention(lm, keep="some"):
            pass
    with pytest.raises(FusionLabError, match=r"keep='full' would hold more than 0 MiB.*keep='aggregate'"):
        with torch.no_grad(), capture_attention(lm, keep="full", max_full_bytes=1000):
            lm.model(lm.encode(TEXT))
    with pytest.raises(FusionLabError, match="expects an fl.LM or a FusedModel"):
        with capture_attention(lm.model):
            pass
    assert lm.model.config._attn_implementation == "sdpa"  # every capture closed cleanly
