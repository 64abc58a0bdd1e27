"""The master's cache at a concat-fused layer is its JointBuffer (one copy of every own key, no per-step concat),
reports the sizes transformers' own layer would (sliding ones included), and follows the buffer through rows
leaving, joining and compaction."""
from __future__ import annotations

import copy

import pytest
import torch
from transformers import DynamicCache
from transformers.cache_utils import DynamicSlidingWindowLayer

import fusionlab as fl
from fusionlab.errors import FusionLabError
from fusionlab.engine.join import compact, join, stash
from fusionlab.engine.joint_cache import JointLayer, joint_cache

from conftest import TINY_NAMES

PROMPTS = ["The quick brown fox jumps over the lazy dog.", "Hi.", "A medium sized prompt about maps and towns."]


def _joint_layers(seq) -> list[tuple[int, JointLayer]]:
    return [(i, la) for i, la in enumerate(seq.master_cache.layers) if isinstance(la, JointLayer)]


@pytest.mark.parametrize("name", TINY_NAMES)
def test_a_concat_layers_cache_entries_are_its_joint_buffer(tiny, name):
    m, s = tiny(name), tiny(name, fresh=True)
    with fl.fuse(m, [fl.Slave(s)]) as f:
        seq, ids, lg = f.prefill(PROMPTS, 4)
        layers = _joint_layers(seq)
        assert len(layers) == sum(rt.joint is not None for rt in f._runtimes.values()) > 0
        for _ in range(2):
            lg = f.decode_one_token(seq, lg.argmax(-1, keepdim=True))
        for i, la in layers:
            j = f._runtimes[i].joint
            assert la.get_seq_length() == seq.entries == ids.shape[1] + 2
            assert la.keys.data_ptr() == j.k[:, :, j.own_offset:].data_ptr()  # a view: the buffer is the only copy
            assert la.keys.shape[2] == seq.entries


@pytest.mark.parametrize("entries", [0, 3, 7, 8, 20])
def test_sliding_mask_sizes_match_transformers_own_layer(entries):
    ref = DynamicSlidingWindowLayer(sliding_window=8)
    kv = torch.zeros(1, 1, entries, 2)
    ref.update(kv, kv)
    la = JointLayer(runtime=None, sliding_window=8)
    la.entries = entries
    for q in (1, 5):
        assert la.get_mask_sizes(q) == ref.get_mask_sizes(q)
    assert la.is_sliding and la.get_max_length() == 8
    full = JointLayer(runtime=None)
    full.entries = entries
    assert full.get_mask_sizes(3) == (entries + 3, 0) and not full.is_sliding


def test_entries_follow_rows_leaving_joining_and_compaction(tiny):
    m, s = tiny("tiny-qwen2"), tiny("tiny-qwen2", fresh=True)
    with fl.fuse(m, [fl.Slave(s)]) as f:
        seq, _, lg = f.prefill(PROMPTS[:2], 8)
        lg = f.decode_one_token(seq, lg.argmax(-1, keepdim=True))
        running = stash(f._runtimes)
        s2, _, _ = f.prefill([PROMPTS[2]], 8)
        seq = join(f._runtimes, seq, running, s2)
        assert all(la.entries == seq.entries for _, la in _joint_layers(seq))
        seq.select(torch.tensor([2]))  # the longest rows leave: leading pads in every row remain
        dropped = compact(seq)
        assert dropped > 0
        for i, la in _joint_layers(seq):
            assert la.entries == seq.entries and la.keys.shape[:3] == (1, f._runtimes[i].joint.k.shape[1], seq.entries)


def test_the_master_alone_keeps_transformers_own_cache(tiny):
    m = tiny("tiny-qwen2")
    with fl.fuse(m, []) as f:
        seq, _, _ = f.prefill(PROMPTS[:1], 2)
        assert type(seq.master_cache) is DynamicCache
        assert not _joint_layers(seq)


def test_moving_or_reordering_a_joint_layer_alone_is_one_clear_error():
    la = JointLayer(runtime=None)
    for call in (la.offload, la.prefetch, lambda: la.reorder_cache(torch.tensor([0]))):
        with pytest.raises(FusionLabError, match="slot buffers"):
            call()


def test_a_layer_whose_cache_is_not_plain_or_sliding_is_refused_for_concat(tiny):
    """A layer that reuses another's cache (a DummyLayer) would never write its keys into the buffer: one clear
    error, never a buffer of zeros."""
    m, s = tiny("tiny-qwen2"), tiny("tiny-qwen2", fresh=True)
    config = copy.deepcopy(m.model.config)
    config.kv_sharing_modes = ["reuse"] + ["own"] * (config.num_hidden_layers - 1)
    with fl.fuse(m, [fl.Slave(s)]) as f:
        f.prefill(PROMPTS[:1], 2)  # the runtimes now hold their buffers
        with pytest.raises(FusionLabError, match="master layer 0 keeps a DummyLayer cache"):
            joint_cache(config, f._runtimes)
        assert isinstance(joint_cache(m.model.config, f._runtimes).layers[0], JointLayer)
