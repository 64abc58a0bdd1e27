"""The engine's one hook for other packages (fusionlab.training): FusedModel.attention_overrides replaces chosen
layers' attention inside a block and nowhere else, is removed on exit (also on error), and refuses a bad layer."""
from __future__ import annotations

import pytest
import torch

import fusionlab as fl
from fusionlab.errors import FusionLabError

from conftest import TEXT, master_logits


def zero_attention(query, key, value, q_pos, scale, window, softcap):  # (B, Q, H, D): a layer that reads nothing
    return torch.zeros_like(query).transpose(1, 2).contiguous()


def forward(f: fl.FusedModel, ids: torch.Tensor) -> torch.Tensor:
    return f.master.model(input_ids=ids, use_cache=False).logits


def test_an_override_runs_only_inside_its_block_and_only_on_its_layer(tiny):
    m, s = tiny("tiny-qwen2"), tiny("tiny-qwen2", fresh=True)
    ids = m.encode(TEXT)
    calls = []

    def spy(query, key, value, q_pos, scale, window, softcap):
        calls.append((tuple(query.shape), q_pos.tolist(), scale))
        return zero_attention(query, key, value, q_pos, scale, window, softcap)

    with fl.fuse(m, [fl.Slave(s)]) as f:
        with torch.no_grad():
            with f.attention_overrides({1: spy}):
                changed = forward(f, ids)
            after = forward(f, ids)
    assert len(calls) == 1 and calls[0][1] == list(range(ids.shape[1]))
    assert calls[0][2] == pytest.approx(m.spec.head_dim ** -0.5)
    assert (changed - master_logits(m, ids)).abs().max() > 1e-3  # layer 1 really ran the override
    assert torch.equal(after, master_logits(m, ids))  # outside the block: the master exactly


def test_an_override_is_removed_when_the_block_raises(tiny):
    m, s = tiny("tiny-qwen2"), tiny("tiny-qwen2", fresh=True)
    ids = m.encode(TEXT)
    with fl.fuse(m, [fl.Slave(s)]) as f:
        with pytest.raises(RuntimeError, match="boom"), f.attention_overrides({0: zero_attention}):
            raise RuntimeError("boom")
        with torch.no_grad():
            assert torch.equal(forward(f, ids), master_logits(m, ids))


def test_an_override_on_a_layer_the_master_lacks_is_refused(tiny):
    m, s = tiny("tiny-qwen2"), tiny("tiny-qwen2", fresh=True)
    with fl.fuse(m, [fl.Slave(s)]) as f:
        with pytest.raises(FusionLabError, match=r"layer 99 out of range.*use layers 0\.\."):
            with f.attention_overrides({99: zero_attention}):
                pass
