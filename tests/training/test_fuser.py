"""Learned fusers on tiny models: the start equals the master exactly, the training path equals the inference path,
the loss falls, training is bit-reproducible, files round-trip and refuse other pairs, resume continues exactly."""
from __future__ import annotations

import math

import pytest
import torch

import fusionlab as fl
import fusionlab.training.loop as loop
from fusionlab.errors import FusionLabError
from fusionlab.training.attention import TrainSlots, fused_logits, train_attention
from fusionlab.training.chunks import TrainChunk, loss_of, prepare, slots_of
from fusionlab.training.fuser import FuserConfig, LearnedFuser, match_table
from fusionlab.training.loop import TrainingDiverged, clip_gradients
from fusionlab.training.train import TrainConfig, train_fuser

from conftest import master_logits

TEXTS = ["The quick brown fox jumps over the lazy dog near the river bank.",
         "def add(a, b):\n    return a + b  # a small function",
         "敏捷的狐狸跳过了懒狗，河边的风很大。",
         "A library keeps old maps of the valley and the harbour, and lends them out."]
CHUNKS = [TrainChunk(t) for t in TEXTS]
OFFLOAD = [TrainChunk(t, context=TEXTS[(i + 1) % 4]) for i, t in enumerate(TEXTS)]


def pair(tiny, master="tiny-qwen2", slave="tiny-llama"):
    m, s = tiny(master), tiny(slave)
    return m, s, fl.fit_lstsq(m, s, texts=TEXTS, holdout_every=0)


def randomize(fuser: LearnedFuser, scale: float = 0.3) -> LearnedFuser:
    """A fuser that does something: random residual outputs (and open gates for concat)."""
    g = torch.Generator().manual_seed(3)
    with torch.no_grad():
        for name, p in fuser.named_parameters():
            if name.endswith(".b") or name.startswith("table"):
                p.copy_(scale * torch.randn(p.shape, generator=g))
        fuser.gate.fill_(0.6)
        if hasattr(fuser, "key_scale"):
            fuser.key_scale.fill_(0.8)
    return fuser


@pytest.mark.parametrize("mode", ["blend", "concat"])
def test_a_fresh_fuser_is_the_master_exactly(tiny, mode):
    m, s, proj = pair(tiny)
    fuser = LearnedFuser(proj, FuserConfig(mode=mode))
    ids = m.encode(TEXTS[0])
    with fl.fuse(m, [fl.Slave(s, layer_map=fuser.layer_map, projector=fuser, mode=mode, align="mean")]) as f:
        assert torch.equal(f(TEXTS[0]), master_logits(m, ids))


@pytest.mark.parametrize("master,slave", [("tiny-qwen2", "tiny-llama"), ("tiny-gemma3", "tiny-phi3")])
@pytest.mark.parametrize("mode,task", [("blend", "same"), ("concat", "same"), ("concat", "offload")])
def test_training_path_equals_inference_path(tiny, master, slave, mode, task):
    m, s, proj = pair(tiny, master, slave)
    fuser = randomize(LearnedFuser(proj, FuserConfig(mode=mode)))
    chunk = (OFFLOAD if task == "offload" else CHUNKS)[0]
    with fl.fuse(m, [fl.Slave(s, layer_map=fuser.layer_map, projector=fuser, mode=mode, align="mean")]) as f:
        p = prepare(f, [chunk], task, [0])[0]
        with torch.no_grad():
            train = fused_logits(f, p.ids, slots_of(f, fuser, p), p.start)
        infer = f(chunk.text, context=chunk.context) if task == "offload" else f(chunk.text)
    assert train.shape == infer.shape
    assert (train - infer).abs().max() < 1e-4
    assert (infer - master_logits(m, p.ids)).abs().max() > 1e-3  # the fuser really changed something


def test_loss_falls_and_training_is_bit_reproducible_across_thread_counts(tiny):
    m, s, proj = pair(tiny)
    cfg = TrainConfig(max_tokens=1500, lr=5e-3, warmup=3, threads=1)
    runs = []
    before = torch.get_num_threads()
    try:
        for n in (1, 2):
            torch.set_num_threads(n)
            runs.append(train_fuser(m, s, CHUNKS, FuserConfig(width=8), cfg, projector=proj, progress=False))
    finally:
        torch.set_num_threads(before)
    h = runs[0].history
    assert h["gain"].iloc[0] == pytest.approx(0.0, abs=1e-5)  # starts at the master
    assert h["gain"].tail(8).mean() > 0.05  # and learns (tiny random models: it can fit these texts)
    a, b = (dict(r.fuser.state_dict()) for r in runs)
    assert all(torch.equal(a[k], b[k]) for k in a)
    assert runs[0].manifest["tokens"] >= 1500 and all(p.requires_grad for p in m.model.parameters())


def test_controls_train_and_run(tiny):
    m, s, proj = pair(tiny)
    base = LearnedFuser(proj, FuserConfig(width=8))
    table = match_table(base.param_count(), len(base.layers), base.heads, base.head_dim)
    for cfg in (FuserConfig(width=8, input="shuffled"), FuserConfig(width=8, input="noise"),
                FuserConfig(input="constant", table=table)):
        r = train_fuser(m, s, CHUNKS, cfg, TrainConfig(max_tokens=300, threads=1), projector=proj, progress=False)
        with fl.fuse(m, [fl.Slave(s, layer_map=r.fuser.layer_map, projector=r.fuser, mode="blend",
                                  align="mean")]) as f:
            assert torch.isfinite(f(TEXTS[1])).all()
    assert abs(LearnedFuser(proj, FuserConfig(input="constant", table=table)).param_count() - base.param_count()) \
        < 2 * len(base.layers) * base.heads * base.head_dim  # matched to within one table row


def test_offload_training_with_a_concat_gate(tiny):
    m, s, proj = pair(tiny)
    r = train_fuser(m, s, OFFLOAD, FuserConfig(mode="concat", width=8),
                    TrainConfig(task="offload", max_tokens=400, threads=1), projector=proj, progress=False)
    assert (r.fuser.gate >= 0).all() and len(r.history) >= 2
    with pytest.raises(FusionLabError, match="needs FuserConfig\\(mode='concat'\\)"):
        train_fuser(m, s, OFFLOAD, FuserConfig(mode="blend"), TrainConfig(task="offload"), projector=proj)


def test_save_load_round_trip_and_refusals(tiny, tmp_path):
    m, s, proj = pair(tiny)
    fuser = randomize(LearnedFuser(proj, FuserConfig(mode="concat", width=4)))
    path = fuser.save(tmp_path / "f.safetensors", training={"note": "test"})
    again = LearnedFuser.load(path)
    assert all(torch.equal(a, b) for a, b in zip(fuser.state_dict().values(), again.state_dict().values()))
    assert again.meta["training"] == {"note": "test"} and again.config == fuser.config
    with fl.fuse(m, [fl.Slave(s, layer_map=again.layer_map, projector=str(path), mode="concat", align="mean")]) as f:
        assert torch.isfinite(f(TEXTS[0])).all()
    with pytest.raises(FusionLabError, match="fitted for master tiny-qwen2 \\+ slave tiny-llama"):
        fl.fuse(tiny("tiny-phi3"), [fl.Slave(s, projector=again, align="mean")])
    bad = tmp_path / "bad.safetensors"
    bad.write_bytes(path.read_bytes()[:200])
    with pytest.raises(FusionLabError, match="not a readable safetensors file"):
        LearnedFuser.load(bad)
    with pytest.raises(FusionLabError, match="not a learned fuser"):
        LearnedFuser.load(proj.save(tmp_path / "p.safetensors"))


def test_resume_continues_exactly_and_refuses_another_config(tiny, tmp_path):
    """400 tokens, stop, resume to 800 == 800 in one go, bit for bit (order, optimizer state, step restored)."""
    m, s, proj = pair(tiny)
    cfg, tc = FuserConfig(width=4), dict(threads=1, checkpoint_every=2)
    whole = train_fuser(m, s, CHUNKS, cfg, TrainConfig(max_tokens=800, **tc), projector=proj, progress=False)
    ck = tmp_path / "ck.pt"
    first = train_fuser(m, s, CHUNKS, cfg, TrainConfig(max_tokens=400, **tc), projector=proj, checkpoint=ck,
                        progress=False)
    assert len(first.history) < len(whole.history)
    with pytest.raises(FusionLabError, match="belongs to another configuration"):
        train_fuser(m, s, CHUNKS, cfg, TrainConfig(max_tokens=800, lr=1e-2, **tc), projector=proj, checkpoint=ck,
                    progress=False)
    resumed = train_fuser(m, s, CHUNKS, cfg, TrainConfig(max_tokens=800, **tc), projector=proj, checkpoint=ck,
                          progress=False)
    assert resumed.history["loss"].tolist() == whole.history["loss"].tolist()
    a, b = resumed.fuser.state_dict(), whole.fuser.state_dict()
    assert all(torch.equal(a[k], b[k]) for k in a)
    ck.write_bytes(b"not a checkpoint")
    with pytest.raises(FusionLabError, match="cannot be read.*delete it"):
        train_fuser(m, s, CHUNKS, cfg, TrainConfig(max_tokens=800, **tc), projector=proj, checkpoint=ck,
                    progress=False)


def test_bad_training_inputs_and_divergence(tiny, tmp_path, monkeypatch):
    m, s, proj = pair(tiny)
    with pytest.raises(FusionLabError, match="needs training chunks"):
        train_fuser(m, s, [], projector=proj)
    with pytest.raises(FusionLabError, match="chunk 0 is empty or too short"):
        train_fuser(m, s, [TrainChunk("hi")], projector=proj)
    with pytest.raises(FusionLabError, match="max_tokens must be >= 1"):
        TrainConfig(max_tokens=0)
    with pytest.raises(FusionLabError, match="needs a budget"):
        TrainConfig(max_tokens=None)
    with pytest.raises(FusionLabError, match="width must be a positive int"):
        FuserConfig(width=0)
    ck = tmp_path / "ck.pt"
    calls = []

    def poisoned(fused, fuser, p):  # the real loss, until step 5 returns NaN
        loss = loss_of(fused, fuser, p)
        calls.append(1)
        return loss * float("nan") if len(calls) > 5 else loss

    monkeypatch.setattr(loop, "loss_of", poisoned)
    with pytest.raises(TrainingDiverged, match=r"diverged at step 5 \(loss nan.*learning rate 0\.0012.*ck\.pt"):
        train_fuser(m, s, CHUNKS, FuserConfig(width=8), TrainConfig(max_tokens=5000, threads=1, checkpoint_every=2),
                    projector=proj, checkpoint=ck, progress=False)
    assert torch.load(ck, weights_only=False)["step"] == 4  # the last good checkpoint stays


def test_closed_gate_with_dominant_slots_stays_finite_and_has_a_gradient():
    """Slots scoring far above the own keys behind a gate of exactly 0: the output is the master's, finite, and the
    gate still gets a finite gradient (a NaN here once stopped an offload training run at step 0)."""
    torch.manual_seed(0)
    q = torch.randn(1, 2, 3, 4)
    k, v = torch.randn(1, 1, 3, 4), torch.randn(1, 1, 3, 4)
    pos = torch.arange(5, 8)
    big = 200 * q[:, :1].mean(2, keepdim=True).expand(1, 1, 4, 4)  # slot keys aligned with the queries: huge scores
    gate = torch.zeros((), requires_grad=True)
    slots = [TrainSlots(big, torch.randn(1, 1, 4, 4), torch.arange(4), gate, "concat")]
    out = train_attention(q, k, v, pos, 1.0, None, None, slots=slots)
    ref = train_attention(q, k, v, pos, 1.0, None, None, slots=[])
    assert torch.isfinite(out).all() and torch.allclose(out, ref, atol=1e-6)
    out.sum().backward()
    assert torch.isfinite(gate.grad) and gate.grad != 0


def test_gate_gradients_are_clipped_elementwise_and_the_rest_by_norm():
    """A concat gate's gradient at g = 0 is e^(slot score - own max): 1e34 or +-inf on real models for queries whose own
    keys all score far below a slot. It is clipped elementwise, sign kept, so it cannot zero the residual's update
    through a global norm; a nan still reports divergence."""
    gate, a, b = (torch.zeros(4, requires_grad=True), torch.zeros(3, requires_grad=True),
                  torch.zeros(2, requires_grad=True))
    gate.grad = torch.tensor([1e34, -float("inf"), 0.3, -2.0])
    a.grad, b.grad = torch.tensor([3.0, 0.0, 4.0]), torch.tensor([0.0, 0.0])
    norm = clip_gradients([gate], [a, b], 1.0)
    assert gate.grad.tolist() == [1.0, -1.0, pytest.approx(0.3), -1.0]
    assert norm == pytest.approx(5.0) and a.grad.tolist() == pytest.approx([0.6, 0.0, 0.8])
    gate.grad = torch.tensor([float("nan"), 0.0, 0.0, 0.0])
    assert math.isnan(clip_gradients([gate], [a], 1.0))

    # the real situation, from the training attention itself: own keys all far below a slot, the gate closed
    q = torch.ones(1, 1, 1, 4)
    own_k, slot_k = -60 * torch.ones(1, 1, 1, 4), torch.zeros(1, 1, 3, 4)
    g = torch.zeros((), requires_grad=True)
    slots = [TrainSlots(slot_k, torch.randn(1, 1, 3, 4), torch.tensor([0, 0, 0]), g, "concat")]
    out = train_attention(q, own_k, torch.ones(1, 1, 1, 4), torch.tensor([5]), 0.5, None, None, slots=slots)
    assert torch.equal(out, torch.ones(1, 1, 1, 4))  # g = 0: the master's own output exactly
    out.sum().backward()
    assert abs(float(g.grad)) > 1e30  # the raw gradient a global norm clip would turn into nothing for the rest
