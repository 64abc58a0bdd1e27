"""Masks read directly from the attention weights; cross-architecture pairs (shapes, masks, finiteness, close)."""
from __future__ import annotations

import pytest
import torch

import fusionlab as fl
from fusionlab.engine.attention_core import visible
from fusionlab.models.variants import rope_variant

from conftest import TEXT, TINY_NAMES, master_logits


def record(f, ids, layers=None, prompt_len=None):
    rows = []
    with f.recording(lambda layer, p, kp, ks, *_: rows.append((layer, p.clone(), kp.clone(), ks.clone())), layers):
        f(ids, prompt_len=prompt_len)
    return rows


@pytest.mark.parametrize("name", TINY_NAMES)
def test_no_query_attends_to_a_later_slot(tiny, name):
    m, s = tiny(name), tiny(name, fresh=True)
    ids = m.encode(TEXT)
    with fl.fuse(m, [fl.Slave(s, mode="concat")], timing="live") as f:
        rows = record(f, ids, prompt_len=9)
    assert rows
    checked = 0
    for layer, probs, k_pos, k_src in rows:
        q = probs.shape[2]
        q_pos = torch.arange(k_pos.max() + 1 - q, k_pos.max() + 1)
        later = k_pos[None, :] > q_pos[:, None]  # (Q, N)
        checked += int(later.sum())
        assert probs[0][:, later].abs().sum() == 0, layer
        slots = k_src >= 0
        assert probs[0][:, :, slots].sum() > 0  # slots are really attended
    assert checked > 0

def test_sliding_layers_hide_slots_outside_the_window(tiny):
    m, s = tiny("tiny-gemma3"), tiny("tiny-gemma3", fresh=True)
    ids = m.encode(TEXT)
    window = m.model.config.sliding_window
    with fl.fuse(m, [fl.Slave(s, mode="concat")]) as f:
        rows = record(f, ids, layers=[0])
    (_, probs, k_pos, k_src), = rows
    q_pos = torch.arange(ids.shape[1])
    outside = (q_pos[:, None] - k_pos[None, :]) >= window
    assert outside.any() and probs[0][:, outside].abs().max() == 0
    with fl.fuse(m, [fl.Slave(s, mode="concat", window_slots=False)]) as f:
        (_, probs, k_pos, k_src), = record(f, ids, layers=[0])
    far_slots = ((q_pos[:, None] - k_pos[None, :]) >= window) & (k_src[None, :] >= 0)
    assert probs[0][:, far_slots].sum() > 0


def test_visibility_is_bottom_right_when_lengths_differ():
    q_pos = torch.tensor([5, 6])
    k_pos = torch.arange(7)
    mask = visible(q_pos, k_pos, None)
    assert mask[0].tolist() == [True] * 6 + [False]
    assert mask[1].all()


def test_recorded_probabilities_equal_eager_attentions(tiny):
    """With no slave, the recorder's eager math equals HF eager output_attentions."""
    m = fl.load("tiny-qwen2", attn_implementation="eager")
    ids = m.encode(TEXT)
    with torch.no_grad():
        ref = m.model(ids, output_attentions=True).attentions
    with fl.fuse(m, []) as f:
        rows = record(f, ids)
    for layer, probs, _, _ in rows:
        assert torch.allclose(probs, ref[layer], atol=1e-6)


CROSS = [("tiny-qwen2", "tiny-phi3", "heads", None),
         ("tiny-qwen2", "tiny-llama", "heads", "mean"),
         ("tiny-llama", "tiny-gemma3", "lstsq", None),
         ("tiny-gemma3", "tiny-qwen2", "lstsq", "first"),
         ("tiny-phi3", "tiny-gemma3", "lstsq", "last")]


@pytest.mark.parametrize("master,slave,proj,align", CROSS)
@pytest.mark.parametrize("mode", ["concat", "replace", "blend"])
def test_cross_pairs(tiny, master, slave, proj, align, mode):
    m, s = tiny(master), tiny(slave)
    if proj == "lstsq":
        proj = fl.fit_lstsq(m, s, "proportional", texts=[TEXT, "more calibration text, 你好世界", "x = 1 + 2"],
                            align=align or "mean", holdout_every=0)
    same = m.vocab_hash == s.vocab_hash
    align = align or (None if same else "mean")
    ids = m.encode(TEXT)
    before = master_logits(m, ids)
    with fl.fuse(m, [fl.Slave(s, projector=proj, mode=mode, align=align)]) as f:
        logits = f(TEXT)
        assert logits.shape == before.shape and torch.isfinite(logits).all()
        assert (logits - before).abs().max() > 1e-4
        for layer, probs, k_pos, _ in record(f, TEXT):
            q_pos = torch.arange(ids.shape[1])
            assert probs[0][:, k_pos[None, :] > q_pos[:, None]].abs().sum() == 0, layer
        text = f.generate("hello", max_new_tokens=5)
        assert isinstance(text, str)
    assert torch.equal(master_logits(m, ids), before)


def test_bf16_slave_into_fp32_master(tiny):
    m = tiny("tiny-qwen2")
    s = fl.load("tiny-qwen2", dtype="bfloat16")
    ids = m.encode(TEXT)
    with fl.fuse(m, [fl.Slave(s, mode="concat")], timing="live") as f:
        out = f(ids)
    assert out.dtype == torch.float32
    assert (out - master_logits(m, ids)).abs().max() < 0.5  # bf16 rounding of the duplicate K/V only


def test_two_slaves_concat_and_zero_gates(tiny):
    m, a, b = tiny("tiny-qwen2"), tiny("tiny-qwen2", fresh=True), tiny("tiny-phi3")
    ids = m.encode(TEXT)
    ref = master_logits(m, ids)
    with fl.fuse(m, [fl.Slave(a, gate=0.0), fl.Slave(b, projector="heads", gate=0.0)]) as f:
        assert torch.allclose(f(ids), ref, atol=1e-5, rtol=0)
    with fl.fuse(m, [fl.Slave(a), fl.Slave(b, projector="heads")]) as f:
        df = f.describe()
        assert list(df["slave"]) == ["tiny-qwen2", "tiny-phi3"]
        assert (df.filter(like="extra_kv_bytes").iloc[:, 0] > 0).all()
        assert torch.isfinite(f(ids)).all()


@pytest.mark.parametrize("name", TINY_NAMES)
@pytest.mark.parametrize("timing,gate", [("prefix", 1.0), ("prefix", 0.6), ("live", 1.0)])
def test_fast_paths_equal_the_masked_reference(tiny, name, timing, gate):
    """Prefill split (causal flash + LSE merge) and mask-free decode == the explicit-mask eager path."""
    m, s = tiny(name), rope_variant(name, theta_factor=2.0)
    ids = m.encode(TEXT)
    with fl.fuse(m, [fl.Slave(s, gate=gate)], timing=timing) as f:
        fast_prefill = f(ids)
        fast_decode = f(ids, prompt_len=10)
        with f.recording(lambda *a: None):  # forces the reference path everywhere
            ref_prefill = f(ids)
            ref_decode = f(ids, prompt_len=10)
    assert (fast_prefill - ref_prefill).abs().max() < 1e-4
    assert (fast_decode - ref_decode).abs().max() < 1e-4
    assert (ref_prefill - master_logits(m, ids)).abs().max() > 1e-3  # the slave really changed something


def test_bus_of_all_four_architectures(tiny):
    """One master, three slaves that differ in tokenizer, layers, KV heads, head_dim and RoPE."""
    m = tiny("tiny-qwen2")
    llama, phi3, gemma = tiny("tiny-llama"), tiny("tiny-phi3"), tiny("tiny-gemma3")
    proj = fl.fit_lstsq(m, gemma, texts=[TEXT, "more text, 更多文字", "def f(x): return x"], holdout_every=0)
    slaves = [fl.Slave(llama, projector="heads", align="mean"), fl.Slave(phi3, projector="heads"),
              fl.Slave(gemma, layer_map=proj.layer_map, projector=proj, align="first")]
    ids = m.encode(TEXT)
    ref = master_logits(m, ids)
    with fl.fuse(m, slaves) as f:
        out = f(TEXT)
        assert torch.isfinite(out).all() and (out - ref).abs().max() > 1e-3
        assert len(f.describe()) == 3 and all(v > 0 for v in f.slot_bytes().values())
        rows = record(f, TEXT)
        assert {int(s) for _, _, _, src in rows for s in src.unique()} == {-1, 0, 1, 2}
        for layer, probs, k_pos, _ in rows:
            assert probs[0][:, k_pos[None, :] > torch.arange(ids.shape[1])[:, None]].abs().sum() == 0, layer
    for s in slaves:
        s.gate = 0.0
    with fl.fuse(m, slaves) as f:
        assert torch.allclose(f(TEXT), ref, atol=1e-5, rtol=0)
    assert torch.equal(master_logits(m, ids), ref)


def test_slave_tokenizer_without_offsets_is_refused(tiny):
    from fusionlab.engine.token_align import align_tokens
    from fusionlab.errors import FusionLabError

    class Slow:
        is_fast = False

    with pytest.raises(FusionLabError, match="not a fast tokenizer.*character offsets"):
        align_tokens(tiny("tiny-qwen2").tokenizer, Slow(), "text", "mean")


def test_sentinels_are_distinct_and_say_their_domain():
    """A slot index of 'none' must never read as a pad position (they once shared -1)."""
    from fusionlab.engine.slot_buffer import FAR, NO_SLOT, PAD_POSITION

    assert len({NO_SLOT, FAR, PAD_POSITION}) == 3
    assert PAD_POSITION < 0 <= FAR and NO_SLOT < 0


def test_one_visibility_rule_serves_one_sequence_a_batch_and_a_window():
    """`visible` broadcasts: a (B, Q) x (B, N) batch equals each row alone; windowed keys obey the window."""
    q = torch.tensor([[3, 4], [5, 6]])
    k = torch.tensor([[0, 1, 2, 3, 4], [2, 3, 4, 5, 6]])
    win = torch.tensor([True, True, True, False, True])
    batch = visible(q, k, 2, win)
    assert batch.shape == (2, 2, 5)
    for b in range(2):
        assert torch.equal(batch[b], visible(q[b], k[b], 2, win))
    assert batch[0, 0].tolist() == [False, False, True, True, False]  # q=3: p=2 in window, p=3 self, p=4 future
    assert visible(q[0], k[0], 2, None)[1].tolist() == [False, False, False, True, True]  # q=4: p=3, 4 only
