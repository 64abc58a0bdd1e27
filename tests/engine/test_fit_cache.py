"""fit_lstsq saves a fit of the calibration text and reloads it, equal to the bit; any changed input refits."""
from __future__ import annotations

import torch

import fusionlab as fl
import fusionlab.engine.fit as fit_mod

TEXTS = ["A short calibration paragraph about rivers and libraries.", "x = 1 + 2  # 代码", "More text, 更多文字."]


def test_saved_fit_reloads_bit_identical_and_any_change_refits(tiny, tmp_path, monkeypatch):
    monkeypatch.setattr(fit_mod, "cache_dir", lambda: tmp_path)
    monkeypatch.setattr(fit_mod, "calibration_paragraphs", lambda folder=None: list(TEXTS))
    calls = []
    real = fit_mod._fit
    monkeypatch.setattr(fit_mod, "_fit", lambda *a: calls.append(1) or real(*a))
    m, s = tiny("tiny-qwen2"), tiny("tiny-llama")

    first = fl.fit_lstsq(m, s, holdout_every=2)  # texts=None: the calibration text, saved
    again = fl.fit_lstsq(m, s, holdout_every=2)
    assert len(calls) == 1 and len(list(tmp_path.glob("projectors/*.safetensors"))) == 1
    assert first.weights.keys() == again.weights.keys()
    assert all(torch.equal(first.weights[k], again.weights[k]) for k in first.weights) and first.meta == again.meta
    fresh = fl.fit_lstsq(m, s, holdout_every=2, cache=False)  # the control: a recomputed fit is the same bits
    assert len(calls) == 2 and all(torch.equal(fresh.weights[k], again.weights[k]) for k in fresh.weights)

    fl.fit_lstsq(m, s, holdout_every=2, ridge=0.5)  # another input: refit, saved apart
    fl.fit_lstsq(m, s, holdout_every=2, layer_map="last_aligned")
    fl.fit_lstsq(m, s, texts=TEXTS, holdout_every=2)  # explicit texts: not cached unless asked
    fl.fit_lstsq(m, s, texts=TEXTS, holdout_every=2)
    assert len(calls) == 6 and len(list(tmp_path.glob("projectors/*.safetensors"))) == 3

    saved = next(tmp_path.glob("projectors/*.safetensors"))
    for f in tmp_path.glob("projectors/*.safetensors"):
        f.write_bytes(b"damaged")  # a damaged saved fit is refitted, never a deserializer's error
    n = len(calls)
    fl.fit_lstsq(m, s, holdout_every=2)
    assert len(calls) == n + 1 and saved.parent.exists()


def test_cache_argument_is_checked(tiny):
    import pytest

    with pytest.raises(fl.FusionLabError, match="cache must be True, False or None"):
        fl.fit_lstsq(tiny("tiny-qwen2"), tiny("tiny-llama"), texts=TEXTS, cache="yes")
