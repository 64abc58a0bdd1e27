"""A master layer outside the slave's layer map sees no slots: partial maps (KVComm's selection, a pruned sibling's
map) rest on it. Checked where it can be computed exactly: everything before the first mapped layer must equal the
master alone on the same tokens at the same positions, and the last mapped layer's output must differ from it."""
from __future__ import annotations

import pytest
import torch

from fusionlab.analysis.layer_selection import restrict
from fusionlab.engine.arch import decoder_layers
from fusionlab.engine.fuse import fuse
from fusionlab.engine.layermap import LayerMap
from fusionlab.engine.slave import Slave
from fusionlab.errors import FusionLabError
from fusionlab.models.siblings import sibling, sibling_layer_map

A = "river harbour lantern copper meadow signal orchard violet " * 3
B = "granite falcon said the copper river to the violet meadow"


@pytest.mark.parametrize("arch", ["tiny-qwen2", "tiny-llama"])
def test_layers_before_the_first_mapped_one_compute_as_the_master_alone(tiny, arch):
    m = tiny(arch)
    last = m.spec.layers - 1
    sib = sibling(m, "noise:0")
    only_last = restrict(sibling_layer_map(m, sib), [last], "last layer only")
    b_ids = m.encode(B, special_tokens=False)  # (1, T_b)
    n_a = m.encode(A).shape[1]
    seen: dict[str, torch.Tensor] = {}

    def grab(name: str):
        def hook(_mod, args, kwargs):
            seen[name] = (args[0] if args else kwargs["hidden_states"]).detach().clone()  # (1, T_b, d)
        return hook

    layer = decoder_layers(m.model)[last]
    with torch.no_grad():
        handle = layer.register_forward_pre_hook(grab("alone"), with_kwargs=True)
        try:
            alone = m.model(b_ids, position_ids=torch.arange(n_a, n_a + b_ids.shape[1])[None]).logits
        finally:
            handle.remove()
        with fuse(m, [Slave(sib, layer_map=only_last, align="mean")]) as f:
            handle = layer.register_forward_pre_hook(grab("fused"), with_kwargs=True)
            try:
                fused = f(b_ids, context=A)
            finally:
                handle.remove()
    assert torch.allclose(seen["fused"], seen["alone"], atol=1e-5)  # no phantom slots in layers 0 .. last - 1
    assert not torch.allclose(fused[:, -b_ids.shape[1]:], alone, atol=1e-3)  # the mapped layer did read A


@pytest.mark.parametrize("arch", ["tiny-qwen2", "tiny-llama"])
def test_sink_only_layers_equal_the_master_reading_the_first_token_then_its_own(tiny, arch):
    """Every layer sink-only (first 1 slot): the exact copy's slot is the document's first token at position 0, so
    the fused logits equal the master reading that token and then B at B's offload positions (C, C + 1, ...)."""
    m = tiny(arch)
    sib = sibling(m, "noise:0")
    sink_only = restrict(sibling_layer_map(m, sib), [], "sink only", sink=1)
    assert set(sink_only.first_slots) == set(range(m.spec.layers))
    a_ids, b_ids = m.encode(A), m.encode(B, special_tokens=False)  # (1, C), (1, T_b)
    c, t = a_ids.shape[1], b_ids.shape[1]
    pos = torch.cat([torch.zeros(1, dtype=torch.long), torch.arange(c, c + t)])[None]  # (1, 1 + T_b)
    with torch.no_grad():
        want = m.model(torch.cat([a_ids[:, :1], b_ids], 1), position_ids=pos).logits[:, 1:]
        with fuse(m, [Slave(sib, layer_map=sink_only, align="mean")]) as f:
            got = f(b_ids, context=A)[:, -t:]
    assert torch.allclose(got, want, atol=1e-4)


@pytest.mark.parametrize("arch", ["tiny-qwen2", "tiny-llama"])
def test_a_sink_as_long_as_the_document_is_the_whole_map(tiny, arch):
    """first_slots of at least the document's length changes nothing; a sink-only layer feeds less than all."""
    m = tiny(arch)
    sib = sibling(m, "noise:0")
    home = sibling_layer_map(m, sib)
    c = m.encode(A).shape[1]
    b_ids = m.encode(B, special_tokens=False)
    with torch.no_grad(), fuse(m, [Slave(sib, layer_map=home, align="mean")]) as f:
        full = f(b_ids, context=A)
    long_sink = restrict(home, [0], "long sink", sink=c)
    short_sink = restrict(home, [0], "short sink", sink=2)
    with torch.no_grad():
        with fuse(m, [Slave(sib, layer_map=long_sink, align="mean")]) as f:
            assert torch.allclose(f(b_ids, context=A), full, atol=1e-5)
        with fuse(m, [Slave(sib, layer_map=short_sink, align="mean")]) as f:
            assert not torch.allclose(f(b_ids, context=A), full, atol=1e-3)


def test_sink_maps_round_trip_and_bad_first_slots(tiny):
    m = tiny("tiny-qwen2")
    home = sibling_layer_map(m, sibling(m, "noise:0"))
    sel = restrict(home, [0], "kvcomm + sink", sink=1)
    assert sel.pairs == home.pairs and sel.first_slots == {i: 1 for i in home.pairs if i != 0}
    assert LayerMap.from_dict(sel.to_dict()).first_slots == sel.first_slots
    assert "first_slots" not in home.to_dict()  # a map without them keeps its dict, and the fit keys built on it
    assert "[:1]" in repr(sel)
    assert restrict(home, [0], "no sink").pairs == {0: home.pairs[0]}  # sink=0: as before, the rest left out
    for bad, says in [({0: 0}, "at least 1 slot"), ({0: 1.5}, "at least 1 slot"), ({99: 1}, "does not map")]:
        with pytest.raises(FusionLabError, match=says):
            LayerMap(dict(home.pairs), first_slots=bad)
    with pytest.raises(FusionLabError, match="sink must be an int"):
        restrict(home, [0], "bad", sink=-1)
