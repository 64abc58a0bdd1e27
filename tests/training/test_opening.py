"""An offload fuser that can open: with opening='log' the gate and the key scale both get a gradient at step one
(with 'zero' the key scale gets none until the gate opens: the trap notebook 07's fusers fell into); the key scale
starts calibrated to the master's own key RMS; files round-trip; bad settings are refused."""
from __future__ import annotations

import math

import pytest
import torch

import fusionlab as fl
from fusionlab.errors import FusionLabError
from fusionlab.models.siblings import sibling
from fusionlab.training.chunks import TrainChunk, loss_of, prepare
from fusionlab.training.fuser import FuserConfig, LearnedFuser
from fusionlab.training.train import TrainConfig, train_fuser

TEXTS = ["The quick brown fox jumps over the lazy dog near the river bank.",
         "def add(a, b):\n    return a + b  # a small function",
         "A library keeps old maps of the valley and the harbour, and lends them out.",
         "An old harbour town keeps its maps in a library by the river."]
OFFLOAD = [TrainChunk(t, context=TEXTS[(i + 2) % 4] + " " + TEXTS[(i + 1) % 4], doc=f"d{i}")
           for i, t in enumerate(TEXTS)]


def grads(tiny, opening: str) -> dict[str, torch.Tensor]:
    m, s = tiny("tiny-qwen2"), tiny("tiny-llama")
    proj = fl.fit_lstsq(m, s, texts=TEXTS, holdout_every=0)
    fuser = LearnedFuser(proj, FuserConfig(mode="concat", opening=opening))
    with fl.fuse(m, [fl.Slave(s, layer_map=fuser.layer_map, projector=fuser, mode="concat", align="mean")]) as f:
        p = prepare(f, OFFLOAD[:1], "offload", [0])[0]
        loss_of(f, fuser, p).backward()
    return {"gate": fuser.gate.grad, "key_scale": fuser.key_scale.grad}


def test_log_opening_learns_from_step_one_where_zero_cannot(tiny):
    zero, log = grads(tiny, "zero"), grads(tiny, "log")
    assert torch.count_nonzero(zero["key_scale"]) == 0  # closed gate: the key scale cannot learn yet
    assert torch.count_nonzero(log["gate"]) > 0 and torch.count_nonzero(log["key_scale"]) > 0


def test_log_start_gate_and_calibrated_key_scale(tiny):
    m = tiny("tiny-qwen2")
    copy = sibling(m, "noise:0")
    proj = fl.fit_lstsq(m, copy, texts=TEXTS, holdout_every=0)
    cfg = FuserConfig(mode="concat", opening="log", log_gate=-1.5)
    fresh = LearnedFuser(proj, cfg)
    assert all(g == pytest.approx(math.exp(-1.5)) for g in fresh.learned_gates().values())
    r = train_fuser(m, copy, OFFLOAD, cfg, TrainConfig(task="offload", max_tokens=30, lr=1e-3), projector=proj,
                    progress=False)
    s0 = r.fuser.key_scale0
    assert torch.all((s0 > 0.8) & (s0 < 1.5))  # an exact copy's lstsq keys already have the master's scale


def test_log_fusers_round_trip(tiny, tmp_path):
    m, s = tiny("tiny-qwen2"), tiny("tiny-llama")
    proj = fl.fit_lstsq(m, s, texts=TEXTS, holdout_every=0)
    f = LearnedFuser(proj, FuserConfig(mode="concat", opening="log"))
    with torch.no_grad():
        f.key_scale0.fill_(1.7)
        f.gate.fill_(-0.5)
    back = LearnedFuser.load(f.save(tmp_path / "f.safetensors"))
    assert back.fingerprint() == f.fingerprint() and back.learned_gates() == f.learned_gates()
    assert "key_scale0" not in LearnedFuser(proj, FuserConfig(mode="concat")).state_dict()  # old files unchanged


@pytest.mark.parametrize("kw, match", [
    ({"mode": "blend", "opening": "log"}, "blend has none"),
    ({"mode": "concat", "opening": "wide"}, "unknown FuserConfig opening"),
    ({"mode": "concat", "opening": "log", "log_gate": float("inf")}, "log_gate must be finite"),
])
def test_bad_openings(kw, match):
    with pytest.raises(FusionLabError, match=match):
        FuserConfig(**kw)


def test_gate_lr_must_be_positive():
    with pytest.raises(FusionLabError, match="gate_lr must be > 0"):
        TrainConfig(gate_lr=0)


def test_a_fuser_with_a_constant_term_starts_as_the_master_and_learns_both_parts(tiny):
    """The slave-free table inside a slave-fed fuser starts at 0 (the master exactly) and gets a gradient, as the
    residual does; misuse is refused."""
    from conftest import master_logits

    m, s = tiny("tiny-qwen2"), tiny("tiny-llama")
    proj = fl.fit_lstsq(m, s, texts=TEXTS, holdout_every=0)
    cfg = FuserConfig(width=8, constant_term=True, table=16)
    fuser = LearnedFuser(proj, cfg)
    assert fuser.param_count() == LearnedFuser(proj, FuserConfig(width=8)).param_count() + \
        2 * len(fuser.layers) * 16 * fuser.heads * fuser.head_dim
    with fl.fuse(m, [fl.Slave(s, layer_map=fuser.layer_map, projector=fuser, mode="blend", align="mean")]) as f:
        assert torch.equal(f(TEXTS[0]), master_logits(m, m.encode(TEXTS[0])))
        p = prepare(f, [TrainChunk(TEXTS[0])], "same", [0])[0]
        with torch.no_grad():
            fuser.res[f"k{fuser.layers[0]}"].b.normal_()  # let the loss see the residual path too
        loss_of(f, fuser, p).backward()
    assert torch.count_nonzero(fuser.table_k.grad) > 0 and fuser.res[f"k{fuser.layers[0]}"].b.grad is not None
    for kw in ({"constant_term": True}, {"constant_term": True, "table": 4, "input": "constant"}):
        with pytest.raises(FusionLabError, match="constant_term=True needs"):
            FuserConfig(**kw)
