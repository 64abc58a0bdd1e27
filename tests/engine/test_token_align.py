"""Character-offset token alignment across tokenizers on tricky strings, and the gather strategies."""
from __future__ import annotations

import pytest
import torch

from fusionlab.engine.token_align import align_tokens, alignment_frame
from fusionlab.errors import FusionLabError
from fusionlab.models.tiny import tiny_tokenizer


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
