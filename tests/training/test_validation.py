"""Training that watches itself: validation by document before the first step, every N steps and at the end; the
fuser handed back is the best of those states (the untrained start included); patience stops a run; dropout only
while training; validation documents may not be training documents."""
from __future__ import annotations

import pytest
import torch

import fusionlab as fl
import fusionlab.training.loop as loop
from fusionlab.errors import FusionLabError
from fusionlab.training.chunks import TrainChunk
from fusionlab.training.fuser import FuserConfig, LearnedFuser
from fusionlab.training.train import TrainConfig, train_fuser

from conftest import master_logits

TRAIN = [TrainChunk(t, doc=f"t{i}") for i, t in enumerate([
    "The quick brown fox jumps over the lazy dog near the river bank.",
    "def add(a, b):\n    return a + b  # a small function",
    "敏捷的狐狸跳过了懒狗，河边的风很大。",
    "A library keeps old maps of the valley and the harbour, and lends them out."])]
VAL = [TrainChunk(t, doc=f"v{i}") for i, t in enumerate([
    "An old harbour town keeps its maps in a library by the river.",
    "def mul(a, b):\n    return a * b  # another small function"])]


def pair(tiny):
    m, s = tiny("tiny-qwen2"), tiny("tiny-llama")
    return m, s, fl.fit_lstsq(m, s, texts=[c.text for c in TRAIN], holdout_every=0)


def test_validation_is_recorded_and_the_best_state_is_returned(tiny):
    m, s, proj = pair(tiny)
    r = train_fuser(m, s, TRAIN, FuserConfig(width=8), TrainConfig(max_tokens=600, lr=5e-3, eval_every=4),
                    projector=proj, progress=False, validation=VAL)
    h = r.history
    ev = h[h["val_loss"].notna()]
    steps = int(h["loss"].notna().sum())
    assert ev["step"].tolist() == sorted(set(list(range(0, steps, 4)) + [steps]))  # start, every 4, the end
    assert ev["val_gain"].iloc[0] == pytest.approx(0.0, abs=1e-5)  # the start is the master
    best = ev.loc[ev["val_loss"].idxmin()]
    assert r.manifest["best_step"] == int(best["step"]) and r.manifest["validation_chunks"] == 2
    assert r.manifest["best_val_gain"] == pytest.approx(best["val_gain"]) and not r.manifest["stopped_early"]


def test_a_run_that_never_helps_validation_hands_back_the_master_and_stops(tiny, monkeypatch):
    """Validation that only gets worse (a stand-in loss) after the start: patience 2 stops the run two passes
    later, and the fuser returned is the untrained one, whose fused model *is* the master."""
    m, s, proj = pair(tiny)
    real, passes = loop.loss_of, []

    def worse(fused, fuser, p):
        loss = real(fused, fuser, p)
        if fuser is not None and not fuser.training:  # a validation pass
            passes.append(1)
            return loss + 0.1 * len(passes) * (len(passes) > len(VAL))
        return loss

    monkeypatch.setattr(loop, "loss_of", worse)
    r = train_fuser(m, s, TRAIN, FuserConfig(width=8), TrainConfig(max_tokens=5000, lr=5e-3, eval_every=2,
                    patience=2), projector=proj, progress=False, validation=VAL)
    assert r.manifest["stopped_early"] and r.manifest["best_step"] == 0 and r.manifest["steps"] == 4
    ids = m.encode(TRAIN[0].text)
    with fl.fuse(m, [fl.Slave(s, layer_map=r.fuser.layer_map, projector=r.fuser, mode="blend", align="mean")]) as f:
        assert torch.equal(f(TRAIN[0].text), master_logits(m, ids))


def test_validation_must_be_other_documents_and_eval_needs_it(tiny):
    m, s, proj = pair(tiny)
    with pytest.raises(FusionLabError, match="validation chunks come from training documents"):
        train_fuser(m, s, TRAIN, FuserConfig(width=4), TrainConfig(max_tokens=50), projector=proj,
                    progress=False, validation=TRAIN[:1])
    with pytest.raises(FusionLabError, match="eval_every=3 needs validation chunks"):
        train_fuser(m, s, TRAIN, FuserConfig(width=4), TrainConfig(max_tokens=50, eval_every=3), projector=proj,
                    progress=False)


def test_dropout_acts_only_while_training_and_runs_reproduce(tiny):
    m, s, proj = pair(tiny)
    cfg = FuserConfig(width=8, dropout=0.5)
    fresh = LearnedFuser(proj, cfg)
    assert not fresh.training  # inference mode by default: no dropout outside the loop
    tc = TrainConfig(max_tokens=400, lr=5e-3, eval_every=5)
    a, b = (train_fuser(m, s, TRAIN, cfg, tc, projector=proj, progress=False, validation=VAL) for _ in range(2))
    assert a.history["loss"].dropna().tolist() == b.history["loss"].dropna().tolist()
    plain = train_fuser(m, s, TRAIN, FuserConfig(width=8), tc, projector=proj, progress=False, validation=VAL)
    assert a.history["loss"].dropna().tolist() != plain.history["loss"].dropna().tolist()  # dropout did something
    assert not a.fuser.training
