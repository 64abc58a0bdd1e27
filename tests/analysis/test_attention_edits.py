"""edit_attention: an identity edit is the model bit for bit and is removed on exit; the edits the claims use do what
they say on tiny models (a window band, K truncation, fake quantization)."""
from __future__ import annotations

import pytest
import torch

import fusionlab as fl
from fusionlab.analysis.attention_edits import EDITS, causal_band, edit_attention, fake_quantize
from fusionlab.errors import FusionLabError

from conftest import master_logits


@pytest.mark.parametrize("name", ["tiny-qwen2", "tiny-gemma3", "tiny-phi3"])
def test_identity_edit_is_exact_and_removed(tiny, name):
    lm = tiny(name)
    ids = lm.encode("The quick brown fox jumps over the lazy dog, again and again.")
    ref = master_logits(lm, ids)
    seen = []
    with edit_attention(lm, lambda i, q, k, v, m: (seen.append(i), (k, v, m))[1]):
        with torch.no_grad():
            out = lm.model(ids).logits
    assert torch.equal(out, ref) and sorted(set(seen)) == list(range(lm.spec.layers))
    assert lm.model.config._attn_implementation == "sdpa" and not any(m in EDITS for m in lm.model.modules())
    assert torch.equal(master_logits(lm, ids), ref)


def test_window_band_and_truncation(tiny):
    lm = tiny("tiny-qwen2")
    ids = lm.encode("one two three four five six seven eight nine ten eleven twelve thirteen fourteen")
    ref = master_logits(lm, ids)
    wide = lambda i, q, k, v, m: (k, v, causal_band(q, k, m, window=10_000))  # noqa: E731
    narrow = lambda i, q, k, v, m: (k, v, causal_band(q, k, m, window=2))  # noqa: E731
    with edit_attention(lm, wide), torch.no_grad():
        assert (lm.model(ids).logits - ref).abs().max() < 1e-5  # a band wider than the text = causal attention
    with edit_attention(lm, narrow), torch.no_grad():
        assert (lm.model(ids).logits - ref).abs().max() > 1e-3  # the control: a narrow band changes the output
    q, k = torch.zeros(1, 1, 3, 4), torch.zeros(1, 1, 5, 4)
    band = causal_band(q, k, None, window=2)[0, 0]
    assert band.tolist() == [[False, True, True, False, False], [False, False, True, True, False],
                             [False, False, False, True, True]]


def test_fake_quantize_error_shrinks_with_bits():
    x = torch.randn(2, 3, 7, 64, generator=torch.Generator().manual_seed(0))
    errs = [float((fake_quantize(x, b, 64) - x).abs().max()) for b in (4, 8)]
    span = float(x.amax(-1).sub(x.amin(-1)).max())
    assert errs[1] < errs[0] <= span / 15 and errs[1] <= span / 255
    assert fake_quantize(x, 8, 64).shape == x.shape
    with pytest.raises(FusionLabError, match="axis must be -1"):  # another axis would quantize the wrong groups
        fake_quantize(x, 8, 64, axis=1)


def test_bad_input(tiny):
    with pytest.raises(fl.FusionLabError, match="edit_attention needs an fl.LM"):
        with edit_attention("tiny-qwen2", lambda *a: a[2:]):
            pass


def test_fake_quantize_along_tokens_handles_outlier_channels():
    x = torch.randn(1, 2, 70, 64, generator=torch.Generator().manual_seed(1))
    x[..., 3] *= 50  # an outlier channel, as post-RoPE keys have
    per_token = (fake_quantize(x, 4, 64) - x).abs().mean()
    per_channel = fake_quantize(x, 4, 64, axis=-2)
    assert per_channel.shape == x.shape and (per_channel - x).abs().mean() < per_token  # 70 tokens: one padded group
