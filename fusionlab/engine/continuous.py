"""Continuous batching for fused generation: up to B rows decode together, and a finished row's seat goes to the
next waiting prompt at once (static batches decode until their longest row ends, leaving seats idle).

    while prompts wait or rows decode:
        free seats -> prefill each of the next waiting prompts alone (its slaves read it, its slots are placed; no
                      padding to a longer prompt) and `join` it to the running batch
        one token for every row (each from its own sampling stream: seed i belongs to prompt i, not to a seat)
        rows that ended (EOS, stop string, max_new_tokens) leave; `compact` drops the padding nobody needs
        decode_one_token for the rest

Every row equals its prompt run alone through `FusedModel.generate` (greedy tokens identical; logits within the
batch tests' tolerance): joining only left-pads entries that no real query sees.
"""
from __future__ import annotations

import time
from collections import deque
from dataclasses import dataclass, field
from typing import Any, Callable

import torch

from ..errors import ContextTooLong, FusionLabError
from . import checks
from .batch_inputs import check_lengths, rows_of
from .fuse import FusedModel
from .join import compact, join, stash
from .sampling import cut_at_stop, eos_ids, next_token, row_ends, sampling_configs


GROUP_SEATS = 4
"""Where a grid's records come back per group (on Ray, a worker's batch), the scheduler gets this many prompts per
seat at a time: enough waiting prompts to refill freed seats, and a stopped run loses at most one group. In-process
the grids stream (`run_cells(..., streams=True)`): every missing cell goes to one scheduler run and each record is
saved as its row ends (`on_row`), so no seat waits for a group's longest row."""


@dataclass(frozen=True)
class RowCost:
    """What the run spent between the previous row's end (or the start) and this row's end. Summed over a run's rows
    these give its wall time and its seat-steps, so any set of rows has occupancy = busy / seat-steps of its costs."""

    seconds: float
    seat_steps: int
    """Decode steps x batch_size in that span."""
    busy_seat_steps: int
    """Rows decoding, summed over those steps."""


@dataclass
class ScheduleStats:
    """What a run of the scheduler did: how busy its seats were."""

    batch_size: int
    decode_steps: int = 0
    busy_seats: int = 0
    """Rows decoding, summed over decode steps."""
    joins: int = 0
    """Groups of waiting prompts prefilled into free seats."""
    compacted: int = 0
    """Leading pad entries dropped, summed over compactions."""

    _mark: tuple[float, int, int] = field(default_factory=lambda: (time.perf_counter(), 0, 0), repr=False)
    """When the previous row ended (or the run began): clock, seat-steps, busy seat-steps."""

    def row_cost(self) -> RowCost:
        """What the run spent since the previous row ended, charged to the row ending now."""
        now, seats = time.perf_counter(), self.decode_steps * self.batch_size
        t, s, b = self._mark
        self._mark = (now, seats, self.busy_seats)
        return RowCost(now - t, seats - s, self.busy_seats - b)

    @property
    def occupancy(self) -> float:
        """Share of seat-steps that decoded a row (1.0: no seat ever idle while the batch decoded)."""
        return self.busy_seats / (self.decode_steps * self.batch_size) if self.decode_steps else float("nan")


def _prompts(prompts: Any) -> list[Any]:
    """Non-empty strings, or non-empty 1-D token id tensors (not mixed)."""
    if not isinstance(prompts, (list, tuple)) or not prompts:
        raise FusionLabError(f"prompts must be a non-empty list of strings (or of 1-D token id tensors), got "
                             f"{type(prompts).__name__}.")
    ids = isinstance(prompts[0], torch.Tensor)
    for i, p in enumerate(prompts):
        if ids and not (isinstance(p, torch.Tensor) and p.dim() == 1 and p.numel() > 0):
            raise FusionLabError(f"prompts[{i}] must be a non-empty 1-D token id tensor like prompts[0], got "
                                 f"{type(p).__name__}{tuple(p.shape) if isinstance(p, torch.Tensor) else ''}.")
        if not ids and (not isinstance(p, str) or not p):
            raise FusionLabError(f"prompts[{i}] must be a non-empty string, got {p!r}; give it some text or drop it.")
    return list(prompts)


def _per_prompt(name: str, value: Any, n: int, one: str) -> list[Any]:
    """None for every prompt, or a list of n (one per prompt); `one` says what else may stand for every prompt."""
    if value is None:
        return [None] * n
    if not isinstance(value, (list, tuple)) or len(value) != n:
        got = f"{type(value).__name__}{f' of {len(value)}' if isinstance(value, (list, tuple)) else ''}"
        raise FusionLabError(f"{name}= must be {one} for every prompt or a list of {n} (one per prompt); got {got}.")
    return list(value)


class ContinuousBatcher:
    """Keeps up to `batch_size` rows of a FusedModel decoding; see the module docstring."""

    def __init__(self, fused: FusedModel, batch_size: int):
        if not isinstance(fused, FusedModel):
            raise FusionLabError(f"ContinuousBatcher needs a FusedModel (fl.fuse(...)), got {type(fused).__name__}.")
        self.fused = fused
        self.batch_size = checks.integer("batch_size", batch_size, 1)
        self.last_stats: ScheduleStats | None = None
        self.slot_bytes: list[dict[str, int]] = []
        """Per prompt of the last run: bytes of the slots each slave placed for it (as FusedModel.row_slot_bytes)."""

    def _refusal(self, prompt: Any, chat: bool, context: Any, max_new_tokens: int) -> str | None:
        """Why the prompt cannot run (it outgrows a model's positions), or None."""
        one = prompt.view(1, -1) if isinstance(prompt, torch.Tensor) else [prompt]  # a batch of one, either way
        mask = torch.ones_like(one) if isinstance(one, torch.Tensor) else None
        try:
            rows, _ = rows_of(self.fused, one, chat, None if context is None else [context], None, mask)
            check_lengths(self.fused, rows, max_new_tokens)
        except ContextTooLong as e:
            return str(e)
        return None

    def _prefill_one(self, prompt: Any, max_new_tokens: int, chat: bool, context: Any, slaves: Any
                     ) -> tuple[Any, torch.Tensor]:
        """One prompt's sequence state and last logits (1, V). Prompts join a running batch one by one, never as a
        padded group: HumanEval's prompts run 38-391 tokens, and a group of 8 padded to its longest did 1.7x the
        prefill work of its real tokens (6,024 vs 3,453 for the benchmark's first 24; transformers' `generate_batch`
        packs prompts unpadded); joining pads only cache entries, which cost attention, not matmuls."""
        ctx = None if context is None else [context]
        if isinstance(prompt, torch.Tensor):
            ids = prompt.to(self.fused.master.device).view(1, -1)
            seq, _, first = self.fused.prefill(ids, max_new_tokens, chat, ctx, attention_mask=torch.ones_like(ids),
                                               slaves=slaves)
        else:
            seq, _, first = self.fused.prefill([prompt], max_new_tokens, chat, ctx, slaves=slaves)
        return seq, first

    def _output(self, prompt: Any, new: list[int], stop: list[str] | None) -> Any:
        """One prompt's result: its new text cut at the first stop string, or (1, T + new) ids for id prompts."""
        if isinstance(prompt, torch.Tensor):
            return torch.cat([prompt.view(1, -1), torch.tensor([new], dtype=prompt.dtype, device=prompt.device)], dim=1)
        return cut_at_stop(self.fused.master.tokenizer.decode(new, skip_special_tokens=True), stop)

    def generate(self, prompts: list[Any], max_new_tokens: int = 32, do_sample: bool = False,
                 temperature: float = 1.0, top_p: float = 1.0, seed: int | list[int] | None = None,
                 eos_token_id: int | list[int] | None = None, chat: bool = False, stop: list[str] | None = None,
                 context: str | list[Any] | None = None,
                 on_row: Callable[[int, Any, RowCost], None] | None = None,
                 slaves: list[list[int | str] | None] | None = None) -> list[Any]:
        """The new text of every prompt, in order; arguments as `FusedModel.generate`. Prompts given as 1-D token
        ids give (1, T + new) ids each, as `FusedModel.generate` does. A prompt too long for the models' positions
        fails alone: the others finish, and one FusionLabError names it, with every finished output in its
        `.results` (None for the failed ones). `on_row(i, output, cost)` is called the moment prompt i's row ends, in
        the order rows end, so a grid can save each result then instead of after the whole list; `cost` is the
        RowCost since the previous row ended. `slaves[i]`: the slaves prompt i reads (None: all; [] the master
        alone), so the settings of a grid that share slaves share the seats too (`FusedModel.prefill(slaves=)`)."""
        f = self.fused
        f._check_open()
        prompts = _prompts(prompts)
        checks.integer("max_new_tokens", max_new_tokens, 0)
        checks.flag("do_sample", do_sample)
        checks.flag("chat", chat)
        stop = None if stop is None else checks.strings("stop", stop)
        contexts = [context] * len(prompts) if isinstance(context, str) else \
            _per_prompt("context", context, len(prompts), "one string")
        reads = _per_prompt("slaves", slaves, len(prompts), "None (all)")
        names = [s.lm.name for s in f.slaves]
        for r in reads:
            checks.slave_subset(names, r, f.timing == "live")  # every prompt's, before any row runs
        cfgs = sampling_configs(len(prompts), do_sample, temperature, top_p, seed)
        eos = eos_ids(f.master, eos_token_id)
        failed = {i: why for i, p in enumerate(prompts)
                  if (why := self._refusal(p, chat, contexts[i], max_new_tokens)) is not None}
        waiting = deque(i for i in range(len(prompts)) if i not in failed and max_new_tokens > 0)  # 0: nothing new
        new: list[list[int]] = [[] for _ in prompts]
        stats = self.last_stats = ScheduleStats(self.batch_size)
        self.slot_bytes = [{} for _ in prompts]
        seq, logits, active = None, None, []  # active[i]: the prompt in batch row i; logits (len(active), V)

        def ended(i: int) -> None:
            if on_row is not None:
                on_row(i, self._output(prompts[i], new[i], stop), stats.row_cost())

        while waiting or active:
            free = self.batch_size - len(active)
            if free and waiting:
                group = [waiting.popleft() for _ in range(min(free, len(waiting)))]
                for i in group:  # each alone: a group prefilled together is padded to its longest prompt
                    running = stash(f._runtimes) if seq is not None else None
                    joined, first = self._prefill_one(prompts[i], max_new_tokens, chat, contexts[i], reads[i])
                    self.slot_bytes[i] = f.row_slot_bytes[0]
                    seq = joined if seq is None else join(f._runtimes, seq, running, joined)
                    logits = first if logits is None else torch.cat([logits, first])
                active, stats.joins = active + group, stats.joins + 1
            toks = torch.cat([next_token(logits[i:i + 1], cfgs[r]) for i, r in enumerate(active)])  # (A, 1)
            going = []
            for i, r in enumerate(active):
                new[r].append(int(toks[i]))
                if not row_ends(f.master.tokenizer, new[r], eos, max_new_tokens, stop):
                    going.append(i)
                else:
                    ended(r)
            if not going:
                seq, logits, active = None, None, []
                continue
            if len(going) < len(active):
                keep = torch.tensor(going, device=toks.device)
                seq.select(keep)
                stats.compacted += compact(seq)
                toks, active = toks[keep], [active[i] for i in going]
            logits = f.decode_one_token(seq, toks)
            stats.decode_steps, stats.busy_seats = stats.decode_steps + 1, stats.busy_seats + len(active)
        if max_new_tokens == 0:  # no row decoded: each prompt's (empty) output ends here
            for i in range(len(prompts)):
                if i not in failed:
                    ended(i)
        texts = [self._output(p, n, stop) for p, n in zip(prompts, new)]
        if failed and len(prompts) == 1:
            raise ContextTooLong(failed[0])  # one prompt: its own reason, as generate() gives it
        if failed:
            reasons = "; ".join(f"prompt {i}: {why.rstrip('.')}" for i, why in failed.items())
            err = ContextTooLong(f"{len(failed)} of {len(prompts)} prompts could not run (the others finished; their "
                                 f"texts are in this error's .results): {reasons}.")
            err.results = [None if i in failed else t for i, t in enumerate(texts)]
            raise err
        return texts


def records_as_rows_end(batcher: ContinuousBatcher, prompts: list[Any], record: Callable[[int, Any, RowCost], Any],
                        emit: Callable[[int, Any], None] | None = None, **kw: Any) -> list[Any]:
    """`batcher.generate(prompts, **kw)` as a grid wants it: each row, the moment it ends, becomes
    `record(i, output, cost)`, handed to `emit(i, record)` at once (the cell cache saves it then); returns the records
    in prompt order."""
    recs: dict[int, Any] = {}

    def ended(i: int, output: Any, cost: RowCost) -> None:
        recs[i] = record(i, output, cost)
        if emit is not None:
            emit(i, recs[i])

    batcher.generate(prompts, on_row=ended, **kw)
    return [recs[i] for i in range(len(prompts))]


def generate_continuous(fused: FusedModel, prompts: list[Any], batch_size: int = 8, **kw: Any) -> list[Any]:
    """`ContinuousBatcher(fused, batch_size).generate(prompts, **kw)`."""
    return ContinuousBatcher(fused, batch_size).generate(prompts, **kw)


__all__ = ["GROUP_SEATS", "ContinuousBatcher", "RowCost", "ScheduleStats", "generate_continuous",
           "records_as_rows_end"]
