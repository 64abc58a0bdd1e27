"""A continuous-batching run replayed from its rows' lengths alone, no model: how busy would the seats have been had
the prompts come in another order, or had several settings shared one run?

A run's occupancy depends only on the order prompts are admitted and on how many tokens each row generates
(`ContinuousBatcher`: free seats take the next waiting prompts; a row's first token comes from its prefill, each
further token costs one decode step of the whole batch). Replaying the committed per-row token counts therefore asks
"what would another order have done?" without spending hours of decoding, and a test holds the replay to the
scheduler's own counts on a real run.
"""
from __future__ import annotations

import random
from dataclasses import dataclass
from typing import Sequence

from ..engine import checks


@dataclass(frozen=True)
class SeatReplay:
    """What a scheduler run with these rows, in this order, does (as `ScheduleStats` counts it)."""

    seats: int
    decode_steps: int
    busy_seats: int
    """Rows decoding, summed over decode steps."""

    @property
    def occupancy(self) -> float:
        return self.busy_seats / (self.decode_steps * self.seats) if self.decode_steps else float("nan")


def replay(new_tokens: Sequence[int], seats: int) -> SeatReplay:
    """The decode steps and busy seat-steps of one scheduler run admitting rows in this order; `new_tokens[i]`: the
    tokens row i generates (a row of n tokens decodes for n - 1 steps: its first token comes from its prefill)."""
    checks.integer("seats", seats, 1)
    left = [checks.integer(f"new_tokens[{i}]", n, 0) for i, n in enumerate(new_tokens)]
    waiting, active, steps, busy = 0, [], 0, 0
    while waiting < len(left) or active:
        while len(active) < seats and waiting < len(left):
            active.append(left[waiting])
            waiting += 1
        active = [n - 1 for n in active if n > 1]  # one token each; rows that reached their length leave
        if active:
            steps, busy = steps + 1, busy + len(active)
    return SeatReplay(seats, steps, busy)


def random_orders(new_tokens: Sequence[int], seats: int, orders: int = 200, seed: int = 0) -> list[SeatReplay]:
    """`replay` over `orders` seeded shuffles of the rows: what an order that knows nothing about lengths gives."""
    checks.integer("orders", orders, 1)
    rng, rows = random.Random(seed), list(new_tokens)
    return [replay(rng.sample(rows, len(rows)), seats) for _ in range(orders)]


__all__ = ["SeatReplay", "random_orders", "replay"]
