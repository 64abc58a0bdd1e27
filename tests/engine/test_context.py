"""Context offload: slaves read a document the master never sees. The anchor: an exact copy of the master as the
slave equals the master reading document + question itself (the skyline), on every tiny architecture."""
from __future__ import annotations

import pytest
import torch

import fusionlab as fl
from fusionlab.errors import ContextTooLong, FusionLabError

from conftest import TINY_NAMES, master_logits

DOC = "The river conference will be held in Lisbon next spring; the harbour decided it. Other notes follow here."
Q = " Where is the river conference held?"


def skyline_ids(m: fl.LM, doc: str, q: str) -> tuple[torch.Tensor, int]:
    d = m.encode(doc)
    return torch.cat([d, m.encode(q, special_tokens=False)], dim=1), d.shape[1]


@pytest.mark.parametrize("name", TINY_NAMES)
def test_self_offload_equals_the_master_reading_the_document(tiny, name):
    m, s = tiny(name), tiny(name, fresh=True)
    ids, c = skyline_ids(m, DOC, Q)
    ref = master_logits(m, ids)[:, c:]
    with fl.fuse(m, [fl.Slave(s, mode="concat", rope="master")]) as f:
        out = f(Q, context=DOC)
        assert out.shape == ref.shape
        assert (out - ref).abs().max() <= 1e-4
        fused = f.generate(Q, context=DOC, max_new_tokens=10)
    with fl.fuse(m, []) as plain:
        sky = plain.generate(ids, max_new_tokens=10)
    assert fused == m.tokenizer.decode(sky[0, ids.shape[1]:], skip_special_tokens=True)


@pytest.mark.parametrize("name", TINY_NAMES)
def test_floor_is_not_the_skyline_and_naive_keys_differ(tiny, name):
    """Controls: the master without the document differs from the skyline; so does a naive post-RoPE θ-variant."""
    from fusionlab.models.variants import rope_variant

    m = tiny(name)
    ids, c = skyline_ids(m, DOC, Q)
    ref = master_logits(m, ids)[:, c:]
    floor = master_logits(m, m.encode(Q, special_tokens=False))
    assert (floor - ref).abs().max() > 1e-2
    v = rope_variant(name, theta_factor=4.0)
    with fl.fuse(m, [fl.Slave(v, layer_map={0: 0}, rope="master")]) as good:
        rerotated = good(Q, context=DOC)
    with fl.fuse(m, [fl.Slave(v, layer_map={0: 0}, rope="slave")]) as bad:
        naive = bad(Q, context=DOC)
    assert (naive - rerotated).abs().max() > 1e-3


@pytest.mark.parametrize("name", TINY_NAMES)
def test_closed_gates_equal_the_master_alone_at_shifted_positions(tiny, name):
    """Gate 0 hides every slot: the master reads the question at positions C.. (RoPE is relative) = master alone."""
    m, s = tiny(name), tiny(name, fresh=True)
    q = m.encode(Q, special_tokens=False)
    with fl.fuse(m, [fl.Slave(s, gate=0.0)]) as f:
        out = f(Q, context=DOC)
    assert (out - master_logits(m, q)).abs().max() <= 1e-4


def record(f, prompt, context, layers=None):
    rows = []
    with f.recording(lambda layer, p, kp, ks, qp, *_: rows.append((layer, p.clone(), kp.clone(), ks.clone(),
                                                                     qp.clone())), layers):
        f(prompt, context=context)
    return rows


@pytest.mark.parametrize("name", TINY_NAMES)
def test_every_query_sees_the_context_slots_and_fast_path_equals_reference(tiny, name):
    m, s = tiny(name), tiny(name, fresh=True)
    c = m.encode(DOC).shape[1]
    with fl.fuse(m, [fl.Slave(s, gate=0.7)]) as f:
        fast = f(Q, context=DOC)
        rows = record(f, Q, DOC)
        with f.recording(lambda *a: None):  # the explicit-mask reference path everywhere
            ref = f(Q, context=DOC)
    assert (fast - ref).abs().max() < 1e-4
    window = m.model.config.sliding_window if "sliding_attention" in m.spec.layer_types else None
    for layer, probs, k_pos, k_src, q_pos in rows:
        assert int(q_pos[0]) == c and bool((k_pos[k_src == 0] < c).all())  # own tokens start after the context
        later = k_pos[None, :] > q_pos[:, None]
        assert probs[0][:, later].abs().sum() == 0
        sliding = m.spec.layer_types[layer] == "sliding_attention"
        if sliding:
            outside = (q_pos[:, None] - k_pos[None, :]) >= window
            assert probs[0][:, outside].abs().max() == 0, layer
        else:
            assert probs[0][:, :, k_src == 0].sum() > 0


def test_cross_tokenizer_bus_with_one_document_per_slave(tiny):
    m, llama, gemma = tiny("tiny-qwen2"), tiny("tiny-llama"), tiny("tiny-gemma3")
    proj = fl.fit_lstsq(m, gemma, texts=[DOC, "more text 更多", "def f(x): return x"], holdout_every=0)
    docs = [DOC, "A second document: the archive keeps 217 maps of the valley."]
    c0, c1 = m.encode(docs[0]).shape[1], m.encode(docs[1], special_tokens=False).shape[1]
    slaves = [fl.Slave(llama, projector="heads", align="mean"),
              fl.Slave(gemma, layer_map=proj.layer_map, projector=proj, align="first")]
    with fl.fuse(m, slaves) as f:
        out = f(Q, context=docs)
        rows = record(f, Q, docs)
        text = f.generate(Q, context=docs, max_new_tokens=4)
    assert torch.isfinite(out).all() and isinstance(text, str)
    floor = master_logits(m, m.encode(Q, special_tokens=False))
    assert (out - floor).abs().max() > 1e-3
    src0 = torch.cat([kp[ks == 0] for _, _, kp, ks, _ in rows])
    src1 = torch.cat([kp[ks == 1] for _, _, kp, ks, _ in rows])
    assert int(src0.max()) < c0 <= int(src1.min()) and int(src1.max()) < c0 + c1
    assert all(int(qp[0]) == c0 + c1 for *_, qp in rows)


def test_bad_context_inputs(tiny):
    m, s = tiny("tiny-qwen2"), tiny("tiny-qwen2", fresh=True)
    with fl.fuse(m, []) as f:
        with pytest.raises(FusionLabError, match="needs at least one slave"):
            f(Q, context=DOC)
    with fl.fuse(m, [fl.Slave(s)]) as f:
        with pytest.raises(FusionLabError, match="context is empty"):
            f(Q, context="  ")
        with pytest.raises(FusionLabError, match="context= has 2 texts for 1 slaves"):
            f(Q, context=[DOC, DOC])
        with pytest.raises(FusionLabError, match=r"context\[0\] must be a string"):
            f(Q, context=[3])
        with pytest.raises(FusionLabError, match="prompt_len has no meaning"):
            f(Q, context=DOC, prompt_len=2)
        with pytest.raises(ContextTooLong, match="plus .* own tokens exceeds master tiny-qwen2's max positions 512"):
            f(Q, context="a" * 505)
        with pytest.raises(ContextTooLong, match="exceeds master"):
            f.generate(Q, context="a" * 450, max_new_tokens=80)
    with fl.fuse(m, [fl.Slave(s)], timing="live") as f:
        with pytest.raises(FusionLabError, match="timing='prefix' only"):
            f(Q, context=DOC)
    for mode in ("replace", "blend"):
        with fl.fuse(m, [fl.Slave(s, mode=mode)]) as f:
            with pytest.raises(FusionLabError, match=f"needs mode='concat'.*mode='{mode}'"):
                f(Q, context=DOC)


def test_a_context_longer_than_the_slave_can_read(tiny):
    """A document of 600 slave tokens for a slave of 512 positions: refused, naming the slave (checked first)."""
    m, g = tiny("tiny-qwen2"), tiny("tiny-gemma3")
    proj = fl.fit_lstsq(m, g, texts=[DOC], holdout_every=0)
    with fl.fuse(m, [fl.Slave(g, layer_map=proj.layer_map, projector=proj, align="mean")]) as f:
        with pytest.raises(ContextTooLong, match="context of 600 tokens for slave tiny-gemma3, beyond its max positions"):
            f("q", context="敏" * 200)  # 3 byte tokens per character
