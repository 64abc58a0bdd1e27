"""The seat replay counts what the scheduler counts: by hand on small cases, and against a real ContinuousBatcher run
whose rows end at different steps (the same decode steps and busy seat-steps, exactly)."""
from __future__ import annotations

import math

import pytest
import torch

import fusionlab as fl
from fusionlab.analysis.seat_replay import random_orders, replay
from fusionlab.engine.continuous import ContinuousBatcher
from fusionlab.errors import FusionLabError


def test_by_hand():
    full = replay([5, 5, 5, 5], seats=2)  # two waves of 4 decode steps, both seats busy throughout
    assert (full.decode_steps, full.busy_seats, full.occupancy) == (8, 16, 1.0)
    tail = replay([9, 1, 1], seats=2)  # the short rows end at their prefill; the long one decodes 8 steps alone
    assert (tail.decode_steps, tail.busy_seats, tail.occupancy) == (8, 8, 0.5)
    refill = replay([2, 4, 3], seats=2)  # step 1: both; row 0 ends at its 2nd token, so step 2 decodes row 1 alone;
    assert (refill.decode_steps, refill.busy_seats) == (4, 6)  # row 2 takes the seat: steps 3 both, 4 row 2 alone
    assert math.isnan(replay([1, 1, 0], seats=4).occupancy)  # nothing decoded: undefined, never a division by zero
    assert replay([], seats=3).decode_steps == 0


def test_order_matters_and_random_orders_are_seeded():
    rows = [40, 2, 2, 2, 2, 2, 2, 2]
    longest_last, longest_first = replay(rows[1:] + rows[:1], 4), replay(rows, 4)
    assert longest_first.occupancy > longest_last.occupancy
    a, b = random_orders(rows, 4, orders=20, seed=3), random_orders(rows, 4, orders=20, seed=3)
    assert a == b and len(a) == 20 and len({r.decode_steps for r in a}) > 1


@pytest.mark.parametrize("bad", [{"seats": 0}, {"seats": True}, {"new_tokens": [3, -1]}, {"new_tokens": [2.5]}])
def test_bad_input_names_the_argument(bad):
    kw = {"new_tokens": [3, 4], "seats": 2} | bad
    with pytest.raises(FusionLabError, match=next(iter(bad))):
        replay(**kw)
    with pytest.raises(FusionLabError, match="orders"):
        random_orders([3], 1, orders=0)


def test_the_replay_counts_what_the_scheduler_counted(tiny):
    m = tiny("tiny-qwen2")
    prompts = [m.encode(p)[0] for p in ("Hi.", "A medium sized prompt about maps.", "Zebra.", "def f(x):",
                                         "The quick brown fox jumps over the lazy dog.", "Once upon a time.")]
    with fl.fuse(m, []) as f:
        first = sorted({int(f.generate(p.view(1, -1), max_new_tokens=1)[0, -1]) for p in prompts[:2]})
        cb = ContinuousBatcher(f, batch_size=3)
        outs = cb.generate(prompts, max_new_tokens=9, eos_token_id=first)  # rows end at different steps
    lengths = [int(o.shape[1] - p.numel()) for o, p in zip(outs, prompts)]
    assert len(set(lengths)) > 1
    r = replay(lengths, 3)
    assert (r.decode_steps, r.busy_seats) == (cb.last_stats.decode_steps, cb.last_stats.busy_seats)
    assert torch.isclose(torch.tensor(r.occupancy), torch.tensor(cb.last_stats.occupancy))
