"""The exactness anchors of DESIGN.md, on every tiny architecture (fp32)."""
from __future__ import annotations

import pytest
import torch

import fusionlab as fl
from fusionlab.engine.kv_capture import capture_kv
from fusionlab.models.variants import rope_variant
from fusionlab.engine.arch import rope_cos_sin
from fusionlab.engine.rope import apply_rope
from transformers import DynamicCache

from conftest import SELF_FUSION_TOL, TEXT, TINY_NAMES, master_logits


@pytest.mark.parametrize("name", TINY_NAMES)
def test_no_slave_equals_master(tiny, name):
    m = tiny(name)
    ids = m.encode(TEXT)
    ref = master_logits(m, ids)
    with fl.fuse(m, []) as f:
        assert torch.allclose(f(ids), ref, atol=1e-5, rtol=0)


@pytest.mark.parametrize("name", TINY_NAMES)
def test_self_fusion_live_concat_equals_master(tiny, name):
    m, s = tiny(name), tiny(name, fresh=True)
    ids = m.encode(TEXT)
    ref = master_logits(m, ids)
    with fl.fuse(m, [fl.Slave(s, mode="concat")], timing="live") as f:
        assert (f(ids) - ref).abs().max() <= SELF_FUSION_TOL["tiny models"]
        assert (f(ids, prompt_len=7) - ref).abs().max() <= SELF_FUSION_TOL["tiny models"]  # prefill 7, then decode
        fused_tokens = f.generate(ids, max_new_tokens=12)
    with fl.fuse(m, []) as plain:
        assert fused_tokens.tolist() == plain.generate(ids, max_new_tokens=12).tolist()


@pytest.mark.parametrize("name", TINY_NAMES)
def test_prefix_self_fusion_differs_after_prompt(tiny, name):
    """Control: with prefix timing, generated tokens have no duplicate, so the anchor must NOT hold there."""
    m, s = tiny(name), tiny(name, fresh=True)
    ids = m.encode(TEXT)
    ref = master_logits(m, ids)
    with fl.fuse(m, [fl.Slave(s, mode="concat")], timing="prefix") as f:
        out = f(ids, prompt_len=7)
    assert (out[:, :7] - ref[:, :7]).abs().max() <= 1e-3
    assert (out[:, 7:] - ref[:, 7:]).abs().max() > 1e-2


@pytest.mark.parametrize("name", TINY_NAMES)
def test_replace_with_self_equals_master(tiny, name):
    m, s = tiny(name), tiny(name, fresh=True)
    ids = m.encode(TEXT)
    with fl.fuse(m, [fl.Slave(s, mode="replace")]) as f:
        assert torch.allclose(f(ids), master_logits(m, ids), atol=1e-5, rtol=0)


@pytest.mark.parametrize("name", TINY_NAMES)
def test_theta_shifted_slave_rerotated_equals_master_naive_does_not(tiny, name):
    """Layer 0 only: deeper slave layers differ anyway (their inputs saw the other θ)."""
    m, s = tiny(name), rope_variant(name, theta_factor=4.0)
    ids = m.encode(TEXT)
    ref = master_logits(m, ids)
    with fl.fuse(m, [fl.Slave(s, layer_map={0: 0}, mode="replace", rope="master")]) as f:
        assert torch.allclose(f(ids), ref, atol=1e-5, rtol=0)
    with fl.fuse(m, [fl.Slave(s, layer_map={0: 0}, mode="replace", rope="slave")]) as f:
        assert (f(ids) - ref).abs().max() > 0.1


@pytest.mark.parametrize("name", TINY_NAMES)
def test_rerotated_keys_equal_master_cache(tiny, name):
    m, s = tiny(name), rope_variant(name, theta_factor=0.25)
    ids = m.encode(TEXT)
    cache = DynamicCache(config=m.model.config)
    with torch.no_grad():
        m.model(ids, cache=cache, use_cache=True)
    cap = capture_kv(s, ids, [0])
    cached = cache.layers[0].keys  # Gemma's sliding layers keep only the last window-1 positions
    n = cached.shape[2]
    cos, sin = rope_cos_sin(m.model, 0, cap.positions, cap.keys[0])
    assert torch.allclose(apply_rope(cap.keys[0], cos, sin)[:, :, -n:], cached, atol=1e-6)
    cos_s, sin_s = rope_cos_sin(s.model, 0, cap.positions, cap.keys[0])
    assert (apply_rope(cap.keys[0], cos_s, sin_s)[:, :, -n:] - cached).abs().max() > 1e-2


@pytest.mark.parametrize("name", TINY_NAMES)
def test_close_restores_bit_identical(tiny, name):
    m, s = tiny(name), rope_variant(name, theta_factor=2.0)
    ids = m.encode(TEXT)
    before = master_logits(m, ids)
    f = fl.fuse(m, [fl.Slave(s, mode="blend", gate=0.5)])
    assert (f(ids) - before).abs().max() > 1e-3  # the fusion did something
    f.close()
    assert torch.equal(master_logits(m, ids), before)
    assert m.model.config._attn_implementation == "sdpa"


@pytest.mark.parametrize("name", TINY_NAMES)
@pytest.mark.parametrize("mode,gate", [("replace", 0.7), ("blend", 0.7), ("concat", 0.7), ("concat", 1.0)])
def test_decode_matches_full_forward(tiny, name, mode, gate):
    """Incremental decoding (cache edits, slot reuse, mask-free decode) == one forward over prompt + generated."""
    m, s = tiny(name), rope_variant(name, theta_factor=0.5)
    ids = m.encode(TEXT)
    with fl.fuse(m, [fl.Slave(s, mode=mode, gate=gate)]) as f:
        out = f.generate(ids, max_new_tokens=8)
        logits = f(out, prompt_len=ids.shape[1])
    t = ids.shape[1]
    assert logits[0, t - 1:-1].argmax(-1).tolist() == out[0, t:].tolist()


@pytest.mark.parametrize("name", TINY_NAMES)
def test_gate_zero_equals_master(tiny, name):
    m, s = tiny(name), rope_variant(name, theta_factor=2.0)
    ids = m.encode(TEXT)
    ref = master_logits(m, ids)
    for mode in ("concat", "replace", "blend"):
        with fl.fuse(m, [fl.Slave(s, mode=mode, gate=0.0)]) as f:
            assert torch.allclose(f(ids), ref, atol=1e-5, rtol=0), mode


@pytest.mark.parametrize("name", TINY_NAMES)
def test_master_used_directly_inside_fuse_is_the_plain_master(tiny, name):
    """Injection is active only in the FusedModel's own passes: no stale slots leak into direct calls."""
    m, s = tiny(name), rope_variant(name, theta_factor=2.0)
    long_ids, short_ids = m.encode(TEXT), m.encode("short")
    ref_long, ref_short = master_logits(m, long_ids), master_logits(m, short_ids)
    with fl.fuse(m, [fl.Slave(s)]) as f:
        f(short_ids)
        assert torch.equal(master_logits(m, long_ids), ref_long)
        f(long_ids)
        assert torch.equal(master_logits(m, short_ids), ref_short)


def test_master_as_its_own_slave_object(tiny):
    """The very same LM as master and slave: the slave's capture must see the plain model."""
    m = tiny("tiny-llama")
    ids = m.encode(TEXT)
    with fl.fuse(m, [fl.Slave(m, mode="concat")], timing="live") as f:
        assert (f(ids) - master_logits(m, ids)).abs().max() <= 1e-3


def test_generate_stop_strings(tiny):
    m = tiny("tiny-qwen2")
    with fl.fuse(m, []) as f:
        full = f.generate(TEXT, max_new_tokens=30)
        assert len(full) > 4
        stop = full[2:4]
        cut = f.generate(TEXT, max_new_tokens=30, stop=[stop])
    assert cut == full[: full.find(stop)] and stop not in cut


@pytest.mark.parametrize("name", TINY_NAMES)
def test_eager_master_anchors(name):
    m = fl.load(name, attn_implementation="eager")
    s = fl.load(name, attn_implementation="eager")  # same kernels on both sides: exact up to rounding
    ids = m.encode(TEXT)
    ref = master_logits(m, ids)
    with fl.fuse(m, [fl.Slave(s, mode="concat")], timing="live") as f:
        assert (f(ids) - ref).abs().max() <= 1e-3
    with fl.fuse(m, [fl.Slave(s, mode="replace")]) as f:
        assert torch.allclose(f(ids), ref, atol=1e-5, rtol=0)
    assert m.model.config._attn_implementation == "eager"
