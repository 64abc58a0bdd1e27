"""Layer-map strategies (exact values) and character-offset token alignment on tricky strings."""
from __future__ import annotations

import pytest
import torch

from fusionlab import LayerMap
from fusionlab.align import align_tokens, alignment_frame
from fusionlab.errors import FusionLabError
from fusionlab.tiny import tiny_tokenizer


def test_strategies_exact():
    assert LayerMap.identity(4, 3).pairs == {0: 0, 1: 1, 2: 2}
    assert LayerMap.stride(8, 5, step=2).pairs == {0: 0, 2: 1, 4: 2, 6: 3}
    assert LayerMap.proportional(24, 30).pairs[23] == 29 and len(LayerMap.proportional(24, 30)) == 24
    assert LayerMap.proportional(24, 18).pairs == {round((j + .5) * 24 / 18 - .5): j for j in range(18)}
    assert LayerMap.last_aligned(24, 18).pairs == {23 - k: 17 - k for k in range(18)}
    interp = LayerMap.interpolate(24, 18)
    assert len(interp) == 24 and interp.pairs[0] == 0 and interp.pairs[23] == 17


def test_validation_and_roundtrip():
    with pytest.raises(FusionLabError, match="master layer 5 is out of range"):
        LayerMap({5: 0}, master_layers=4, slave_layers=4)
    with pytest.raises(FusionLabError, match="stride step must be >= 1"):
        LayerMap.stride(4, 4, step=0)
    interp = LayerMap.interpolate(6, 3)
    with pytest.raises(FusionLabError, match="slave layer 0 feeds master layers"):
        interp.require_unique_slave_layers("replace mode")
    lm = LayerMap.proportional(24, 30)
    assert LayerMap.from_dict(lm.to_dict()).pairs == lm.pairs
    assert lm.grid().values.sum() == 24
    assert "<b>LayerMap</b>" in lm._repr_html_()


@pytest.mark.parametrize("text", ["the cat sat", "敏捷的狐狸 jumps", "def f(x):\n    return x  # 注释", "  spaced   out  "])
def test_alignment_covers_same_characters(text):
    a, b = tiny_tokenizer(False), tiny_tokenizer(True)
    al = align_tokens(a, b, text, "mean")
    ao = a(text, return_offsets_mapping=True)["offset_mapping"]
    bo = b(text, return_offsets_mapping=True)["offset_mapping"]
    assert al.coverage == 1.0  # every master token with characters found its slave tokens
    for i, g in zip(al.master_index.tolist(), al.groups):
        for j in g:
            assert bo[j][0] < ao[i][1] and ao[i][0] < bo[j][1]


def test_gather_strategies():
    a, b = tiny_tokenizer(True), tiny_tokenizer(False)  # master merges "the" into one token
    al_first = align_tokens(a, b, "the", "first")
    assert al_first.groups == [[0, 1, 2]]
    x = torch.arange(3.0).view(1, 1, 3, 1)
    assert align_tokens(a, b, "the", "first").gather(x).item() == 0
    assert align_tokens(a, b, "the", "last").gather(x).item() == 2
    assert align_tokens(a, b, "the", "mean").gather(x).item() == 1
    with pytest.raises(FusionLabError, match="unknown alignment strategy"):
        align_tokens(a, b, "the", "median")
    assert list(alignment_frame(a, b, "the cat").columns) == ["master_pos", "master_token", "slave_pos", "slave_tokens"]
