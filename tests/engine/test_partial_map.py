"""A master layer outside the slave's layer map sees no slots: partial maps (KVComm's selection, a pruned sibling's
map) rest on it. Checked where it can be computed exactly: everything before the first mapped layer must equal the
master alone on the same tokens at the same positions, and the last mapped layer's output must differ from it."""
from __future__ import annotations

import pytest
import torch

from fusionlab.analysis.layer_selection import restrict
from fusionlab.engine.arch import decoder_layers
from fusionlab.engine.fuse import fuse
from fusionlab.engine.slave import Slave
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
