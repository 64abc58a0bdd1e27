"""Siblings of the master (the transfer map's rungs): each recipe does what its name says, reproducibly, and the
zero-change recipe is an exact copy, so the ladder's first rung is anchored to the engine's exact self-offload."""
from __future__ import annotations

import math

import pytest
import torch

import fusionlab as fl
from fusionlab.analysis.divergence import divergence
from fusionlab.errors import FusionLabError
from fusionlab.models.siblings import fake_quantise, kept_layers, parse_recipe, sibling, sibling_layer_map

from conftest import TINY_NAMES, master_logits

DOC = "The river conference will be held in Lisbon next spring; the harbour decided it. Other notes follow here."
Q = " Where is the river conference held?"
TEXTS = ["Some held-out words about rivers and harbours, and 港口 too.", "Another text: numbers 12, 345 and codes."]


def params(lm: fl.LM) -> dict[str, torch.Tensor]:
    return dict(lm.model.named_parameters())


@pytest.mark.parametrize("name", TINY_NAMES)
def test_zero_noise_sibling_is_an_exact_copy_and_offloads_exactly(tiny, name):
    m = tiny(name)
    s = sibling(m, "noise:0")
    assert all(torch.equal(p, params(m)[n]) for n, p in params(s).items())
    d = m.encode(DOC)
    ids = torch.cat([d, m.encode(Q, special_tokens=False)], dim=1)
    ref = master_logits(m, ids)[:, d.shape[1]:]
    with fl.fuse(m, [fl.Slave(s, mode="concat", rope="master")]) as f:
        assert (f(Q, context=DOC) - ref).abs().max() <= 1e-4


@pytest.mark.parametrize("name", TINY_NAMES)
def test_noise_has_the_stated_relative_scale_is_seeded_and_leaves_the_master_alone(tiny, name):
    m = tiny(name)
    before = {n: p.clone() for n, p in params(m).items()}
    a, b, c = sibling(m, "noise:0.05"), sibling(m, "noise:0.05"), sibling(m, "noise:0.05,seed=1")
    for n, p in params(a).items():
        rms = before[n].pow(2).mean().sqrt()
        if rms == 0:  # an all-zero tensor (the tiny models' biases) has RMS 0, so relative noise leaves it be
            assert torch.equal(p, before[n])
            continue
        rel = (p - before[n]).pow(2).mean().sqrt() / rms
        if p.numel() >= 512:  # small tensors' sample std wanders
            assert 0.04 < rel < 0.06, (n, float(rel))
        assert torch.equal(p, params(b)[n])
        assert not torch.equal(p, params(c)[n])
    assert all(torch.equal(p, before[n]) for n, p in params(m).items())
    assert a.fingerprint == b.fingerprint != c.fingerprint != m.fingerprint
    assert a.name.endswith("~ noise:0.05") and a.extra["recipe"] == "noise:0.05"


def test_fake_quantisation_keeps_the_levels_and_the_error_it_promises():
    w = torch.randn(6, 64)
    q8 = fake_quantise(w, 8, None)
    step8 = w.abs().amax(1, keepdim=True) / 127
    assert ((q8 - w).abs() <= step8 / 2 + 1e-7).all()
    assert all(len(torch.unique(torch.round(r / s))) <= 255 for r, s in zip(q8, step8))
    q4 = fake_quantise(w, 4, 16).reshape(6, 4, 16)
    step4 = w.reshape(6, 4, 16).abs().amax(-1, keepdim=True) / 7
    assert ((q4 - w.reshape(6, 4, 16)).abs() <= step4 / 2 + 1e-7).all()
    assert all(len(torch.unique(g)) <= 15 for g in q4.reshape(-1, 16))
    assert torch.equal(fake_quantise(torch.zeros(2, 16), 4, 16), torch.zeros(2, 16))  # no 0/0


@pytest.mark.parametrize("recipe", ["int8", "int4:g16"])
def test_quantised_siblings_change_linears_only(tiny, recipe):
    m = tiny("tiny-llama")
    s = sibling(m, recipe)
    for n, p in params(s).items():
        linear = n.startswith("model.layers.") and "proj" in n and n.endswith("weight")
        assert torch.equal(p, params(m)[n]) != linear, n


@pytest.mark.parametrize("name", TINY_NAMES)
def test_pruned_sibling_keeps_first_and_last_and_maps_each_layer_home(tiny, name):
    m = tiny(name)
    n = m.spec.layers
    if n <= 2:
        pytest.skip(f"{name} has {n} layers: nothing to prune between first and last")
    drop = n - 2
    s = sibling(m, f"prune:{drop}")
    keep = s.extra["kept_layers"]
    assert keep[0] == 0 and keep[-1] == n - 1 and len(keep) == n - drop == s.spec.layers
    lmap = sibling_layer_map(m, s)
    assert lmap.pairs == {k: j for j, k in enumerate(keep)}
    div = divergence(m, s, TEXTS, lmap, lstsq=False)
    first = div.r2.set_index("layer").loc[0]
    assert first.k_identity == pytest.approx(1.0, abs=1e-6) and first.v_identity == pytest.approx(1.0, abs=1e-6)
    assert div.kl > 1e-4
    with fl.fuse(m, [fl.Slave(s, layer_map=lmap, rope="master")]) as f:
        assert torch.isfinite(f(Q, context=DOC)).all()


def test_kept_layers_are_evenly_spaced():
    keep = kept_layers(24, 6, "prune:6")
    assert len(keep) == 18 and keep[0] == 0 and keep[-1] == 23
    gaps = [b - a for a, b in zip(keep, keep[1:])]
    assert max(gaps) == 2 and gaps.count(2) == 6


def test_divergence_orders_the_rungs_and_anchors_at_zero(tiny):
    m = tiny("tiny-qwen2")
    lmap = sibling_layer_map(m, m)
    rows = {r: divergence(m, sibling(m, r), TEXTS, lmap).row() for r in ("noise:0", "noise:0.01", "noise:0.1")}
    assert abs(rows["noise:0"]["kl"]) <= 1e-6
    assert rows["noise:0"]["k_identity"] == pytest.approx(1.0, abs=1e-9)
    assert 0 < rows["noise:0.01"]["kl"] < rows["noise:0.1"]["kl"]
    assert rows["noise:0.1"]["k_identity"] < rows["noise:0.01"]["k_identity"] < 1
    assert rows["noise:0.1"]["k_lstsq"] >= rows["noise:0.1"]["k_identity"] - 0.05  # a fit never loses much
    assert rows["noise:0.1"]["kl_low"] <= rows["noise:0.1"]["kl"] <= rows["noise:0.1"]["kl_high"]


def test_divergence_refuses_a_foreign_tokenizer(tiny):
    m, other = tiny("tiny-qwen2"), tiny("tiny-llama")
    with pytest.raises(FusionLabError, match="tokenizer"):
        divergence(m, other, TEXTS, fl.LayerMap({0: 0}))


@pytest.mark.parametrize("recipe, says", [
    ("", "non-empty"), ("blur:0.1", "unknown kind"), ("noise:-0.1", ">= 0"), ("noise:nan", "finite"),
    ("noise:abc", "number"), ("noise:0.1,sede=2", "seed=N"), ("int8:4", "no argument"), ("int4:32", "gN"),
    ("int4:g0", "gN"), ("prune:0", ">= 1"), ("prune:x", ">= 1"), (None, "non-empty"),
])
def test_bad_recipes_say_what_to_write(recipe, says):
    with pytest.raises(FusionLabError, match=says) as err:
        parse_recipe(recipe)
    assert "Recipes:" in str(err.value)


def test_recipes_that_do_not_fit_the_model_name_the_limit(tiny):
    with pytest.raises(FusionLabError, match="at most 1"):
        sibling(tiny("tiny-llama"), "prune:2")  # 3 layers: first and last stay
    with pytest.raises(FusionLabError, match="multiple of the group 32"):
        sibling(tiny("tiny-llama"), "int4")  # 48 inputs
    with pytest.raises(FusionLabError, match="fl.LM"):
        sibling("tiny-qwen2", "int8")


def test_canonical_recipe_spelling_round_trips():
    for text in ("noise:0.01", "noise:0.01,seed=3", "int8", "int4", "int4:g64", "prune:6"):
        assert str(parse_recipe(text)) == text
    assert str(parse_recipe("noise:1e-2")) == "noise:0.01" and math.isclose(parse_recipe("noise:1e-2").scale, 0.01)
