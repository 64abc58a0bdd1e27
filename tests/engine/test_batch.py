"""Batched fusion: every row of a batch equals the same prompt run alone (logits within fp32 tolerance, identical
greedy tokens), for every tiny architecture, mode and timing, rows of very different lengths; and a mutation check:
a per-row mask that lets real queries see left pads makes these comparisons fail."""
from __future__ import annotations

import pytest
import torch

import fusionlab as fl
from fusionlab.engine import batch_attention as ba
from fusionlab.errors import ContextTooLong, FusionLabError
from fusionlab.models.variants import rope_variant

from conftest import TINY_NAMES

PROMPTS = ["Hi.", "The quick brown fox jumps over the lazy dog near the river bank, twice over.",
           "def f(x):\n    return x * 2  # 注释", "A medium sized prompt about maps."]


def rows_equal_alone(f, prompts, tol=1e-4, **kw):
    batch = f(prompts, **kw)
    for b, p in enumerate(prompts):
        alone = f(p, **({"context": kw["context"][b]} if "context" in kw else {}))
        t = alone.shape[1]
        assert (batch[b, -t:] - alone[0]).abs().max() <= tol, (b, p)
    return batch


@pytest.mark.parametrize("name", TINY_NAMES)
@pytest.mark.parametrize("mode,timing", [("concat", "prefix"), ("replace", "prefix"), ("blend", "prefix"),
                                         ("concat", "live"), ("blend", "live")])
def test_every_row_equals_the_prompt_alone(tiny, name, mode, timing):
    m, s = tiny(name), rope_variant(name, theta_factor=2.0)
    with fl.fuse(m, [fl.Slave(s, mode=mode, gate=0.7)], timing=timing) as f:
        rows_equal_alone(f, PROMPTS)
        batch = f.generate(PROMPTS, max_new_tokens=6)
        assert batch == [f.generate(p, max_new_tokens=6) for p in PROMPTS]


@pytest.mark.parametrize("master,slave,proj,align", [("tiny-qwen2", "tiny-llama", "heads", "mean"),
                                                     ("tiny-llama", "tiny-gemma3", "lstsq", "first")])
def test_cross_tokenizer_bus_rows_equal_alone(tiny, master, slave, proj, align):
    m, s, other = tiny(master), tiny(slave), tiny("tiny-phi3")
    if proj == "lstsq":
        proj = fl.fit_lstsq(m, s, texts=PROMPTS, holdout_every=0)
    p2 = fl.fit_lstsq(m, other, texts=PROMPTS, holdout_every=0)
    slaves = [fl.Slave(s, projector=proj, align=align, layer_map=getattr(proj, "layer_map", None)),
              fl.Slave(other, projector=p2, layer_map=p2.layer_map, align="mean", gate=0.5)]
    with fl.fuse(m, slaves) as f:
        rows_equal_alone(f, PROMPTS)
        assert f.generate(PROMPTS, max_new_tokens=5) == [f.generate(p, max_new_tokens=5) for p in PROMPTS]


@pytest.mark.parametrize("mode", ["concat", "blend"])
def test_live_rows_that_end_early_leave_the_others_exact(tiny, mode):
    """Rows leaving a live batch must not detach the others' slot views (live slots are appended through them)."""
    m, s = tiny("tiny-qwen2"), rope_variant("tiny-qwen2", theta_factor=2.0)
    with fl.fuse(m, [fl.Slave(s, mode=mode, gate=0.7)], timing="live") as f:
        ids = [m.encode(p) for p in PROMPTS[:2]]
        eos = sorted({int(f.generate(x, max_new_tokens=1)[0, -1]) for x in ids})  # rows 0, 1 end at once, not all
        assert f.generate(PROMPTS, max_new_tokens=8, eos_token_id=eos) == \
            [f.generate(p, max_new_tokens=8, eos_token_id=eos) for p in PROMPTS]


def test_context_offload_per_row(tiny):
    m, s = tiny("tiny-gemma3"), tiny("tiny-gemma3", fresh=True)  # sliding windows too
    docs = ["A short note.", "The river conference will be held in Lisbon next spring; the harbour decided it."]
    with fl.fuse(m, [fl.Slave(s)]) as f:
        rows_equal_alone(f, PROMPTS[:2], context=docs)
        assert f.generate(PROMPTS[:2], context=docs, max_new_tokens=5) == \
            [f.generate(p, context=d, max_new_tokens=5) for p, d in zip(PROMPTS[:2], docs)]


def test_padded_ids_with_a_mask_equal_the_strings(tiny):
    m, s = tiny("tiny-qwen2"), tiny("tiny-qwen2", fresh=True)
    ids = [m.encode(p)[0] for p in PROMPTS[:3]]
    width = max(len(x) for x in ids)
    right = torch.zeros(3, width, dtype=torch.long)
    mask = torch.zeros(3, width, dtype=torch.long)
    for b, x in enumerate(ids):  # right padding on purpose: rows are re-laid out left padded inside
        right[b, :len(x)], mask[b, :len(x)] = x, 1
    with fl.fuse(m, [fl.Slave(s)]) as f:
        assert torch.allclose(f(right, attention_mask=mask), f(PROMPTS[:3]), atol=1e-5)
        outs = f.generate(right, attention_mask=mask, max_new_tokens=4)
        assert [o.tolist() for o in outs] == [f.generate(x, max_new_tokens=4).tolist() for x in ids]


def test_seeded_sampling_does_not_depend_on_the_batch(tiny):
    m = tiny("tiny-llama")
    with fl.fuse(m, [fl.Slave(tiny("tiny-llama", fresh=True))]) as f:
        kw = dict(max_new_tokens=8, do_sample=True, temperature=0.9)
        both = f.generate(PROMPTS[:2], seed=[11, 22], **kw)
        swapped = f.generate(PROMPTS[1::-1], seed=[22, 11], **kw)
        alone = f.generate(PROMPTS[1], seed=22, **kw)
    assert both == swapped[::-1] and both[1] == alone


def test_finished_rows_leave_and_stop_per_row(tiny):
    m = tiny("tiny-qwen2")
    with fl.fuse(m, []) as f:
        full = [f.generate(p, max_new_tokens=12) for p in PROMPTS]
        stop = [full[1][2:4]]
        assert f.generate(PROMPTS, max_new_tokens=12, stop=stop) == [f.generate(p, max_new_tokens=12, stop=stop)
                                                                     for p in PROMPTS]


def test_recording_per_row_equals_recording_alone(tiny):
    m, s = tiny("tiny-qwen2"), tiny("tiny-qwen2", fresh=True)
    with fl.fuse(m, [fl.Slave(s)]) as f:
        with fl.capture_attention(f, queries="last") as cap:
            f(PROMPTS[:2])
        for b, p in enumerate(PROMPTS[:2]):
            with fl.capture_attention(f, queries="last") as one:
                f(p)
            row = cap.row(b)
            for layer in one.layers:
                assert torch.allclose(row.mass(layer, "all"), one.mass(layer, "all"), atol=1e-5)
                assert row.n_queries[layer] == one.n_queries[layer]


def test_the_tests_catch_a_mask_that_lets_pads_through(tiny, monkeypatch):
    """Mutation check: if real queries may see the left pads, a padded row no longer equals the prompt alone."""
    m, s = tiny("tiny-qwen2"), tiny("tiny-qwen2", fresh=True)
    broken = lambda q_pos, k_pos, window, windowed: (k_pos[:, None, :] <= q_pos[:, :, None])  # noqa: E731
    monkeypatch.setattr(ba, "row_mask", broken)
    with fl.fuse(m, [fl.Slave(s)]) as f:
        with pytest.raises(AssertionError):
            rows_equal_alone(f, PROMPTS)


@pytest.mark.parametrize("name", TINY_NAMES)
def test_one_mask_per_step_for_layers_that_share_a_slot_layout(tiny, name, monkeypatch):
    """The score bias is built once per forward for every layer with the same layout (slaves, gates, window):
    one layout -> one build per forward (two on a model with sliding layers); giving half the layers another gate
    adds a layout, and the rows stay equal to their prompts alone (a stale bias from another layout would break
    them)."""
    m, s = tiny(name), rope_variant(name, theta_factor=2.0)
    builds = []
    real_mask = ba.row_mask
    monkeypatch.setattr(ba, "row_mask", lambda *a: builds.append(1) or real_mask(*a))
    windows = len({t for t in m.spec.layer_types if t in ("full_attention", "sliding_attention")})
    layers = m.spec.layers
    with fl.fuse(m, [fl.Slave(s, gate=0.7)]) as f:
        seq, _, _ = f.prefill(PROMPTS, max_new_tokens=2)
        builds.clear()
        f.decode_one_token(seq, torch.zeros(len(PROMPTS), 1, dtype=torch.long))
        assert len(builds) == windows
    gates = {i: (0.7 if i % 2 else 0.4) for i in range(layers)}
    with fl.fuse(m, [fl.Slave(s, gate=gates)]) as f:
        rows_equal_alone(f, PROMPTS)
        seq, _, _ = f.prefill(PROMPTS, max_new_tokens=2)
        builds.clear()
        f.decode_one_token(seq, torch.zeros(len(PROMPTS), 1, dtype=torch.long))
        assert windows < len(builds) <= 2 * windows


def test_bad_batch_inputs(tiny):
    m = tiny("tiny-qwen2")
    with fl.fuse(m, [fl.Slave(tiny("tiny-qwen2", fresh=True))]) as f:
        with pytest.raises(FusionLabError, match="the batch is empty"):
            f.generate([])
        with pytest.raises(FusionLabError, match="prompt 1 of the batch is an empty string"):
            f(["a", ""])
        with pytest.raises(FusionLabError, match="mixes"):
            f(["a", torch.tensor([1, 2])])
        ids = torch.ones(2, 5, dtype=torch.long)
        with pytest.raises(FusionLabError, match=r"attention_mask has shape \(2, 4\) but input_ids \(2, 5\)"):
            f(ids, attention_mask=torch.ones(2, 4))
        with pytest.raises(FusionLabError, match="only 0 \\(padding\\) and 1"):
            f(ids, attention_mask=torch.full((2, 5), 2))
        with pytest.raises(FusionLabError, match="row 1 of the batch has no tokens"):
            f(ids, attention_mask=torch.tensor([[1] * 5, [0] * 5]))
        with pytest.raises(ContextTooLong, match="row 1: sequence of 5\\d\\d tokens exceeds master"):
            f.generate(["short", "a" * 480], max_new_tokens=40)
        with pytest.raises(FusionLabError, match="seed= has 1 seeds for 2 prompts"):
            f.generate(["a", "b"], do_sample=True, seed=[1])
        with pytest.raises(FusionLabError, match="context= is one string for every row or a list of 2"):
            f(["a", "b"], context=["x"])
        with pytest.raises(FusionLabError, match="prompt_len has no meaning"):
            f(["a", "b"], prompt_len=1)
