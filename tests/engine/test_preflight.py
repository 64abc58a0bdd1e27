"""Alignment preflight on every tiny pair (and the embedded ones in CI), and strict fuse."""
from __future__ import annotations

import itertools

import pytest

import fusionlab as fl
from fusionlab.engine.preflight import INCOMPATIBLE, OK, check_alignment
from fusionlab.errors import FusionLabError

from conftest import TINY_NAMES, embedded_available

EMBEDDED = ["qwen2.5-coder-0.5b-instruct", "smollm2-135m-instruct", "gemma3-270m"]


def expected_adapters(m: fl.LM, s: fl.LM) -> set[str]:
    """What the report must say, derived independently from the specs."""
    want = set()
    if m.vocab_hash != s.vocab_hash:
        want.add("token alignment")
    if any(m.spec.rope.get(t) != s.spec.rope.get(t) for t in set(m.spec.rope) | set(s.spec.rope)):
        want.add("RoPE re-rotation")
    if m.spec.layers != s.spec.layers:
        want.add("layer map")
    a, b = (m.spec.kv_heads, m.spec.head_dim), (s.spec.kv_heads, s.spec.head_dim)
    if a != b:
        want.add("heads projector" if a[1] == b[1] and (a[0] % b[0] == 0 or b[0] % a[0] == 0) else "lstsq projector")
    km = m.spec.model_type in ("gemma3_text", "qwen3")
    ks = s.spec.model_type in ("gemma3_text", "qwen3")
    if km != ks:
        want.add("lstsq projector")
    return want


def check_pair(m: fl.LM, s: fl.LM) -> None:
    rep = check_alignment(m, s)
    got = {a.split(" (")[0] for a in rep.adapters}
    assert got == expected_adapters(m, s), (m.name, s.name, got)
    assert rep.ok
    df = rep.to_frame()
    assert set(df["area"]) >= {"tokenizer", "rope", "norm", "layers", "attention", "embedding", "dtype"}
    assert "<table>" in rep._repr_html_() and m.name in str(rep)


@pytest.mark.parametrize("a,b", list(itertools.product(TINY_NAMES, TINY_NAMES)))
def test_report_on_every_tiny_pair(tiny, a, b):
    m, s = tiny(a), tiny(b) if a != b else tiny(b, fresh=True)
    check_pair(m, s)
    if a == b:
        assert all(f.severity == OK for f in check_alignment(m, s).findings)


@pytest.mark.integration
@pytest.mark.skipif(not embedded_available("gemma3-270m"), reason="run `fusionlab fetch` first")
def test_report_on_every_embedded_pair():
    lms = {n: fl.load(n) for n in EMBEDDED}
    for a, b in itertools.product(EMBEDDED, EMBEDDED):
        check_pair(lms[a], lms[b] if a != b else fl.load(b))
    rep = check_alignment(lms[EMBEDDED[0]], lms[EMBEDDED[2]])
    geo = rep.to_frame().set_index("item").loc["kv_heads x head_dim"]
    assert (geo["master"], geo["slave"]) == ("2x64", "1x256")


def test_not_models_and_strict(tiny):
    with pytest.raises(FusionLabError, match="expects two fl.LM.*the slave is a str"):
        check_alignment(tiny("tiny-qwen2"), "tiny-llama")
    m, s = tiny("tiny-qwen2"), tiny("tiny-llama")
    rep = check_alignment(m, s)
    rep.findings[0].severity = INCOMPATIBLE
    with pytest.raises(FusionLabError, match="cannot be fused"):
        rep.raise_if_incompatible()
    with fl.fuse(m, [fl.Slave(s, projector="heads", align="mean")], strict=True) as f:  # adapters only: allowed
        assert f("hi").shape[1] == m.encode("hi").shape[1]
