"""Each mistake gives one clear FusionLabError that says what is wrong and how to fix it."""
from __future__ import annotations

import pytest
import torch

import fusionlab as fl
from fusionlab.errors import FusionLabError

from conftest import TEXT


def test_identity_projector_geometry_mismatch_names_shapes_and_fix(tiny):
    with pytest.raises(FusionLabError, match=r"H_kv=4.*H_kv=2.*projector='heads'"):
        fl.fuse(tiny("tiny-qwen2"), [fl.Slave(tiny("tiny-phi3"))])
    with pytest.raises(FusionLabError, match=r"head_dim=32.*head_dim=16.*fit_lstsq"):
        fl.fuse(tiny("tiny-qwen2"), [fl.Slave(tiny("tiny-gemma3"), align="mean")])


def test_different_tokenizers_need_alignment(tiny):
    with pytest.raises(FusionLabError, match="different tokenizers.*align="):
        fl.fuse(tiny("tiny-qwen2"), [fl.Slave(tiny("tiny-llama"), projector="heads")])


def test_layer_map_out_of_range(tiny):
    with pytest.raises(FusionLabError, match="master layer 9 is out of range"):
        fl.fuse(tiny("tiny-qwen2"), [fl.Slave(tiny("tiny-qwen2", fresh=True), layer_map={9: 0})])
    with pytest.raises(FusionLabError, match="slave layer 5 is out of range"):
        fl.fuse(tiny("tiny-qwen2"), [fl.Slave(tiny("tiny-phi3"), projector="heads", layer_map={0: 5})])


def test_projector_for_another_pair_refused(tiny):
    m, s = tiny("tiny-qwen2"), tiny("tiny-gemma3")
    proj = fl.fit_lstsq(m, s, texts=[TEXT], holdout_every=0)
    with pytest.raises(FusionLabError, match="fitted for master tiny-qwen2 \\+ slave tiny-gemma3, not for master tiny-phi3"):
        fl.fuse(tiny("tiny-phi3"), [fl.Slave(s, projector=proj, align="mean")])


def test_projector_save_load_roundtrip(tiny, tmp_path):
    m, s = tiny("tiny-qwen2"), tiny("tiny-gemma3")
    proj = fl.fit_lstsq(m, s, texts=[TEXT, "second text 第二"], holdout_every=2)
    path = proj.save(tmp_path / "p.safetensors")
    again = fl.LstsqProjector.load(path)
    assert again.meta == proj.meta
    assert all(torch.equal(again.weights[k], proj.weights[k]) for k in proj.weights)
    with fl.fuse(m, [fl.Slave(s, projector=str(path), align="mean")]) as f:
        assert torch.isfinite(f(TEXT)).all()


def test_empty_and_too_long_prompts(tiny):
    m = tiny("tiny-qwen2")
    with fl.fuse(m, [fl.Slave(tiny("tiny-qwen2", fresh=True))]) as f:
        with pytest.raises(FusionLabError, match="empty"):
            f("")
        with pytest.raises(FusionLabError, match="empty"):
            f(torch.zeros(1, 0, dtype=torch.long))
        with pytest.raises(FusionLabError, match="exceeds master tiny-qwen2's max positions 512"):
            f("a" * 600)
        with pytest.raises(FusionLabError, match="max positions"):
            f.generate("a" * 500, max_new_tokens=50)


def test_bad_options(tiny):
    m, s = tiny("tiny-qwen2"), tiny("tiny-qwen2", fresh=True)
    with pytest.raises(FusionLabError, match="unknown mode"):
        fl.fuse(m, [fl.Slave(s, mode="mix")])
    with pytest.raises(FusionLabError, match="unknown timing"):
        fl.fuse(m, [fl.Slave(s)], timing="later")
    with pytest.raises(FusionLabError, match="timing='live' needs"):
        fl.fuse(m, [fl.Slave(tiny("tiny-llama"), projector="heads", align="mean")], timing="live")
    with pytest.raises(FusionLabError, match="expects an fl.LM"):
        fl.fuse(m, [fl.Slave(s.model)])
    with pytest.raises(FusionLabError, match="gates must be >= 0"):
        fl.fuse(m, [fl.Slave(s, gate=-1.0)])
    with pytest.raises(FusionLabError, match="unknown layer-map strategy"):
        fl.fuse(m, [fl.Slave(s, layer_map="diagonal")])


def test_double_fuse_and_closed_use(tiny):
    m, s = tiny("tiny-qwen2"), tiny("tiny-qwen2", fresh=True)
    f = fl.fuse(m, [fl.Slave(s)])
    with pytest.raises(FusionLabError, match="already fused"):
        fl.fuse(m, [fl.Slave(s)])
    f.close()
    with pytest.raises(FusionLabError, match="closed"):
        f("hello")


def test_fit_threads_must_be_positive(tiny):
    with pytest.raises(FusionLabError, match="threads must be a positive int"):
        fl.fit_lstsq(tiny("tiny-qwen2"), tiny("tiny-gemma3"), texts=[TEXT], holdout_every=0, threads=0)
