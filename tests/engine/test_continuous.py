"""Continuous batching: a row that joins a running batch mid-run equals its prompt run alone (its logits within the
batch tests' tolerance, greedy and seeded tokens identical), for every tiny architecture, mode and timing, with
rows ending at different steps; seats are reused; a prompt too long fails alone; and a mutation check: joined
padding that real queries could see makes these comparisons fail."""
from __future__ import annotations

import time

import pytest
import torch

import fusionlab as fl
from fusionlab.engine import join as join_mod
from fusionlab.engine.continuous import ContinuousBatcher, generate_continuous
from fusionlab.engine.join import compact, join, stash
from fusionlab.errors import FusionLabError
from fusionlab.models.variants import rope_variant

from conftest import TINY_NAMES

PROMPTS = ["Hi.", "The quick brown fox jumps over the lazy dog near the river bank, twice over.",
           "def f(x):\n    return x * 2  # 注释", "A medium sized prompt about maps.", "Zebra.",
           "Once upon a time in a city by the sea there lived a very patient clockmaker."]
MODES = [("concat", "prefix"), ("replace", "prefix"), ("blend", "prefix"), ("concat", "live"), ("blend", "live")]


def joined_logits_equal_alone(f, tol=1e-4):
    """Two rows decode 3 steps; a third prompt joins (fewer entries than the batch), then a long one (more): each
    joined batch's next logits equal each prompt's own, decoded alone."""
    def alone(p, toks):
        seq, _, lg = f.prefill(p, 8)
        out = [lg]
        for t in toks:
            out.append(f.decode_one_token(seq, torch.tensor([[t]])))
        return out

    seq, _, lg = f.prefill(PROMPTS[:2], 8)
    fed = [[], []]
    for _ in range(3):
        tok = lg.argmax(-1, keepdim=True)
        for r in range(2):
            fed[r].append(int(tok[r]))
        lg = f.decode_one_token(seq, tok)
    for newcomer in (PROMPTS[4], PROMPTS[5]):
        running = stash(f._runtimes)
        s2, _, lg2 = f.prefill([newcomer], 8)
        seq = join(f._runtimes, seq, running, s2)
        lg = torch.cat([lg, lg2])
        fed.append([])
    tok = lg.argmax(-1, keepdim=True)
    for r in range(4):
        fed[r].append(int(tok[r]))
    lg = f.decode_one_token(seq, tok)
    for r, p in enumerate([PROMPTS[0], PROMPTS[1], PROMPTS[4], PROMPTS[5]]):
        ref = alone(p, fed[r])[-1]
        assert (lg[r] - ref[0]).abs().max() <= tol, (r, p)


@pytest.mark.parametrize("name", TINY_NAMES)
@pytest.mark.parametrize("mode,timing", MODES)
def test_rows_joining_mid_run_equal_the_prompt_alone(tiny, name, mode, timing):
    m, s = tiny(name), rope_variant(name, theta_factor=2.0)
    with fl.fuse(m, [fl.Slave(s, mode=mode, gate=0.7)], timing=timing) as f:
        joined_logits_equal_alone(f)
        eos = sorted({int(f.generate(m.encode(p), max_new_tokens=1)[0, -1]) for p in PROMPTS[:2]})  # rows 0, 1 end
        # at once, the others when they meet these tokens or at max_new_tokens: seats free up mid-run
        alone = [f.generate(p, max_new_tokens=8, eos_token_id=eos) for p in PROMPTS]
        cb = ContinuousBatcher(f, batch_size=3)  # rows 0, 1 leave at once: prompts 3, 4 join row 2 mid-run
        assert cb.generate(PROMPTS, max_new_tokens=8, eos_token_id=eos) == alone
        assert cb.last_stats.joins >= 2 and cb.last_stats.decode_steps > 0


def test_context_offload_and_seeded_sampling_join_mid_run(tiny):
    m, s = tiny("tiny-gemma3"), tiny("tiny-gemma3", fresh=True)  # sliding windows: cache layers keep window - 1
    docs = ["A short note.", "The river conference will be held in Lisbon next spring; the harbour decided it.",
            "Numbers: 17, 42, 99.", "Another document entirely, about glaciers and the ice they carry."]
    kw = dict(max_new_tokens=12, do_sample=True, temperature=0.9)
    with fl.fuse(m, [fl.Slave(s)]) as f:
        alone = [f.generate(p, context=d, seed=7 + i, **kw) for i, (p, d) in enumerate(zip(PROMPTS[:4], docs))]
        assert generate_continuous(f, PROMPTS[:4], batch_size=3, context=docs, seed=7, **kw) == alone


def test_seats_are_reused_and_padding_is_compacted(tiny):
    m = tiny("tiny-qwen2")
    with fl.fuse(m, []) as f:
        full = [f.generate(p, max_new_tokens=10) for p in PROMPTS]
        stop = [full[0][1:3]]  # row 0 stops early: its seat goes to the next prompt
        cb = ContinuousBatcher(f, batch_size=3)
        assert cb.generate(PROMPTS, max_new_tokens=10, stop=stop) == \
            [f.generate(p, max_new_tokens=10, stop=stop) for p in PROMPTS]
        st = cb.last_stats
        assert st.joins >= 2 and 0 < st.occupancy <= 1 and st.busy_seats <= st.decode_steps * 3


def test_each_row_is_reported_as_it_ends_with_costs_that_add_up_to_the_run(tiny):
    """on_row(i, output, cost) fires once per prompt, the moment its row ends (a short row before a long one that
    started earlier), with the output generate() returns; the costs sum to the run's seat-steps and its wall time."""
    m = tiny("tiny-qwen2")
    with fl.fuse(m, []) as f:
        full = [f.generate(p, max_new_tokens=10) for p in PROMPTS]
        stop = [full[2][1:3]]  # prompt 2 stops early, the others run 10 tokens
        cb, seen = ContinuousBatcher(f, batch_size=3), []
        t0 = time.perf_counter()
        out = cb.generate(PROMPTS, max_new_tokens=10, stop=stop, on_row=lambda i, o, c: seen.append((i, o, c)))
        wall = time.perf_counter() - t0
        assert sorted(i for i, _, _ in seen) == list(range(len(PROMPTS))) and seen[0][0] == 2
        assert all(o == out[i] for i, o, _ in seen)
        st, costs = cb.last_stats, [c for _, _, c in seen]
        assert sum(c.seat_steps for c in costs) == st.decode_steps * 3
        assert sum(c.busy_seat_steps for c in costs) == st.busy_seats
        assert 0 < sum(c.seconds for c in costs) <= wall
        empty = []
        assert cb.generate(PROMPTS[:2], max_new_tokens=0, on_row=lambda i, o, c: empty.append((i, o))) == ["", ""]
        assert sorted(empty) == [(0, ""), (1, "")]


def test_joining_prompts_are_prefilled_alone_never_padded_to_a_longer_one(tiny, monkeypatch):
    """A group padded to its longest prompt does the padding's matmuls too (1.7x the real prefill tokens on
    HumanEval's first 24): every prefill the scheduler runs holds one prompt, whatever the seats free at once."""
    m = tiny("tiny-qwen2")
    with fl.fuse(m, []) as f:
        widths = []
        real = f.prefill

        def spy(prompt, *a, **kw):
            seq, ids, lg = real(prompt, *a, **kw)
            widths.append(tuple(ids.shape))
            return seq, ids, lg
        monkeypatch.setattr(f, "prefill", spy)
        out = ContinuousBatcher(f, batch_size=4).generate(PROMPTS, max_new_tokens=3)
        assert len(widths) == len(PROMPTS) and all(b == 1 for b, _ in widths)
        assert sorted(w for _, w in widths) == sorted(m.encode(p).shape[1] for p in PROMPTS)
        monkeypatch.undo()
        assert out == [f.generate(p, max_new_tokens=3) for p in PROMPTS]


def test_token_id_prompts_give_ids_like_generate(tiny):
    m = tiny("tiny-phi3")
    with fl.fuse(m, [fl.Slave(tiny("tiny-phi3", fresh=True), mode="blend", gate=0.5)]) as f:
        rows = [m.encode(p)[0] for p in PROMPTS]
        got = ContinuousBatcher(f, 2).generate(rows, max_new_tokens=6)
        assert [g.tolist() for g in got] == [f.generate(r, max_new_tokens=6).tolist() for r in rows]
        assert ContinuousBatcher(f, 2).generate(PROMPTS[:2], max_new_tokens=0) == ["", ""]  # as generate() gives
        with pytest.raises(FusionLabError, match=r"prompts\[1\] must be a non-empty 1-D token id tensor"):
            ContinuousBatcher(f, 2).generate([rows[0], "text"])


def test_compact_drops_only_padding_every_row_has(tiny):
    m = tiny("tiny-llama")
    with fl.fuse(m, [fl.Slave(tiny("tiny-llama", fresh=True))]) as f:
        seq, _, lg = f.prefill([PROMPTS[1], PROMPTS[0]], 4)  # row 1 is mostly left pads
        assert compact(seq) == 0  # row 0 has none
        seq.select(torch.tensor([1]))
        e = seq.entries
        n = compact(seq)
        assert n > 0 and seq.entries == e - n and bool((seq.pos[0, :seq.entries] >= 0).all())
        nxt = f.decode_one_token(seq, lg[1:].argmax(-1, keepdim=True))
        s2, _, lg2 = f.prefill(PROMPTS[0], 4)
        ref = f.decode_one_token(s2, lg2.argmax(-1, keepdim=True))
        assert (nxt - ref).abs().max() <= 1e-4


def test_the_tests_catch_padding_that_real_queries_see(tiny, monkeypatch):
    """Mutation check: joined padding at position 0 (visible to every real query) must break the comparison."""
    m, s = tiny("tiny-qwen2"), tiny("tiny-qwen2", fresh=True)
    monkeypatch.setattr(join_mod, "PAD_POSITION", 0)
    with fl.fuse(m, [fl.Slave(s)]) as f:
        with pytest.raises(AssertionError):
            joined_logits_equal_alone(f)


def test_bad_continuous_inputs(tiny):
    m = tiny("tiny-qwen2")
    with fl.fuse(m, [fl.Slave(tiny("tiny-qwen2", fresh=True))]) as f:
        for b in (0, -2, 1.5, True):
            with pytest.raises(FusionLabError, match="batch_size"):
                ContinuousBatcher(f, b)
        cb = ContinuousBatcher(f, 2)
        with pytest.raises(FusionLabError, match=r"stop\[1\] must be a non-empty string"):
            cb.generate(["a", "b"], stop=["x", ""])
        with pytest.raises(FusionLabError, match="seed= has 1 seeds for 2 prompts"):
            cb.generate(["a", "b"], do_sample=True, seed=[1])
        with pytest.raises(FusionLabError, match=r"prompts\[1\] must be a non-empty string"):
            cb.generate(["a", ""])
        with pytest.raises(FusionLabError, match="context= must be one string for every prompt or a list of 2"):
            cb.generate(["a", "b"], context=["x"])
        with pytest.raises(FusionLabError, match=r"1 of 3 prompts could not run.*prompt 1: sequence of 5\d\d") as e:
            cb.generate(["short", "a" * 480, "fine"], max_new_tokens=40)
        assert e.value.results[1] is None
        assert e.value.results[0] == f.generate("short", max_new_tokens=40)
        assert e.value.results[2] == f.generate("fine", max_new_tokens=40)


SUBSETS = [None, [0], [1], []]
"""What each prompt reads in the shared-settings tests: both slaves, each alone, none (the master alone)."""


@pytest.mark.parametrize("name", TINY_NAMES)
@pytest.mark.parametrize("mode", ["concat", "replace", "blend"])
def test_rows_of_different_settings_share_seats_and_each_equals_its_own_setting(tiny, name, mode):
    """One FusedModel with two slaves runs prompts that read both, one or none of them (a grid's settings sharing
    seats): each row's logits equal its prompt through a FusedModel with just those slaves, and the continuous run
    gives every prompt its own setting's greedy text, rows of all four settings joining one another mid-run."""
    m = tiny(name)
    slaves = [fl.Slave(rope_variant(name, theta_factor=2.0), mode=mode, gate=0.7),
              fl.Slave(rope_variant(name, theta_factor=0.5), mode=mode, gate=0.4)]
    prompts = [PROMPTS[i % len(PROMPTS)] for i in range(8)]
    reads = [SUBSETS[i % 4] for i in range(8)]
    ref_logits, ref_texts = {}, {}
    for k, sub in enumerate(SUBSETS):
        with fl.fuse(m, slaves if sub is None else [slaves[i] for i in sub]) as own:
            ref_logits[k] = own.prefill(PROMPTS[1], 8)[2]
            ref_texts.update({i: own.generate(p, max_new_tokens=8) for i, p in enumerate(prompts) if i % 4 == k})
    with fl.fuse(m, slaves) as f:
        for k, sub in enumerate(SUBSETS):
            assert (f.prefill(PROMPTS[1], 8, slaves=sub)[2] - ref_logits[k]).abs().max() <= 1e-4, sub
        cb = ContinuousBatcher(f, batch_size=3)
        out = cb.generate(prompts, max_new_tokens=8, slaves=reads)
        assert out == [ref_texts[i] for i in range(8)]
        assert cb.last_stats.joins >= 2
        alone = [i for i, r in enumerate(reads) if r == []]
        assert all(cb.slot_bytes[i] == {s.lm.name: 0 for s in f.slaves} for i in alone)
        assert all(cb.slot_bytes[i][f.slaves[1].lm.name] == 0 < cb.slot_bytes[i][f.slaves[0].lm.name]
                   for i, r in enumerate(reads) if r == [0])


def test_bad_slave_subsets(tiny):
    m = tiny("tiny-qwen2")
    s = tiny("tiny-qwen2", fresh=True)
    with fl.fuse(m, [fl.Slave(s)]) as f:
        for bad, msg in ((["nope"], r"slaves= has 'nope'"), ([3], "use an index 0..0"), ([True], "True"),
                         ("tiny-qwen2", "must be None \\(all\\) or a list")):
            with pytest.raises(FusionLabError, match=msg):
                f.generate("a", max_new_tokens=2, slaves=bad)
        cb = ContinuousBatcher(f, 2)
        with pytest.raises(FusionLabError, match="slaves= must be None \\(all\\) for every prompt or a list of 2"):
            cb.generate(["a", "b"], slaves=[[0]])
        with pytest.raises(FusionLabError, match=r"slaves= has 5"):
            cb.generate(["a", "b"], slaves=[[0], [5]])
    with fl.fuse(m, [fl.Slave(s)], timing="live") as f:
        with pytest.raises(FusionLabError, match="timing='live' must list every slave"):
            f.generate("a", max_new_tokens=2, slaves=[])
        assert f.generate("a", max_new_tokens=2, slaves=[0]) == f.generate("a", max_new_tokens=2)
