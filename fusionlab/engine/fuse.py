"""`fl.fuse(master, [fl.Slave(...)])` -> FusedModel: logits, generate, describe, close.

gpt-fast style: the model owns its loop (`prefill`, `decode_one_token`), so positions are always explicit.
timing='prefix': slaves read the prompt once, decoding attends to the fused prompt cache.
timing='live': slaves also read every generated token (needs identical tokenizers).
"""
from __future__ import annotations

from contextlib import contextmanager
from typing import Any, Iterator

import pandas as pd
import torch

from ..errors import FusionLabError
from . import attention as att
from . import checks
from . import registry
from .arch import attn_module
from .lm import LM
from .batch_inputs import check_lengths, left_padded, pad_id, rows_of
from .placement import Row, SequenceState, live_step, pad_positions, place_slots
from .preflight import check_alignment
from .sampling import cut_at_stop, eos_ids, next_token, row_ends, sampling_configs
from .slot_buffer import PAD_POSITION
from .slave import ResolvedSlave, Slave

TIMINGS = ("prefix", "live")


def open_fusion(lm: LM) -> "FusedModel | None":
    """The FusedModel installed on `lm` (as master), if any."""
    return registry.fusion_on(lm.model)


class FusedModel:
    """A master with its slaves' injection installed; see the module docstring. Use as a context manager."""

    def __init__(self, master: LM, slaves: list[Slave], timing: str = "prefix", strict: bool = False):
        if not isinstance(master, LM):
            raise FusionLabError(f"fuse() expects an fl.LM as master, got {type(master).__name__}.")
        if timing not in TIMINGS:
            raise FusionLabError(f"unknown timing {timing!r}; use one of {TIMINGS}.")
        if not isinstance(slaves, (list, tuple)) or not all(isinstance(x, Slave) for x in slaves):
            bad = next((type(x).__name__ for x in (slaves if isinstance(slaves, (list, tuple)) else [slaves])
                        if not isinstance(x, Slave)), type(slaves).__name__)
            raise FusionLabError(f"fuse(master, slaves) takes a list of fl.Slave(...); got a {bad}.")
        checks.flag("strict", strict)
        self.master, self.timing = master, timing
        self.slaves: list[ResolvedSlave] = [s.resolve(master) for s in slaves]
        if strict:
            for s in self.slaves:
                check_alignment(master, s.lm).raise_if_incompatible()
        if timing == "live" and not all(s.same_tokenizer for s in self.slaves):
            raise FusionLabError("timing='live' needs slaves with the master's tokenizer (generated tokens are "
                                 "fed to them as ids); use timing='prefix' for cross-tokenizer slaves.")
        if registry.fusion_on(master.model) is not None:
            raise FusionLabError(f"{master.name} is already fused; close() the other FusedModel first.")
        self._base = master.model.config._attn_implementation
        self._runtimes = {i: att.LayerRuntime(i, self._base) for i in range(master.spec.layers)}
        registry.install(master.model, {attn_module(master.model, i): rt for i, rt in self._runtimes.items()}, self)
        master.model.set_attn_implementation(att.install_interface(self._base))
        self._open = True
        self.last_text: str | None = None
        self.row_slot_bytes: list[dict[str, int]] = []
        """Per row of the last prompt or batch: bytes of the slots placed (for the grids' cost columns)."""

    # --- lifecycle ------------------------------------------------------------------------------------
    def close(self) -> None:
        """Remove everything fuse() installed; the master is as it was (bit-identical logits)."""
        if not self._open:
            return
        registry.remove(self.master.model, [attn_module(self.master.model, i) for i in self._runtimes])
        self.master.model.set_attn_implementation(self._base)
        self._open = False

    def __enter__(self) -> "FusedModel":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def _check_open(self) -> None:
        if not self._open:
            raise FusionLabError("this FusedModel is closed; call fl.fuse(...) again.")

    # --- forward ----------------------------------------------------------------------------------------
    @torch.inference_mode()
    def _forward(self, seq: SequenceState, ids: torch.Tensor, pos: torch.Tensor | None = None,
                 real: torch.Tensor | None = None, logits_to_keep: int = 0) -> torch.Tensor:
        """The master reads ids (B, Q) at positions pos (B, Q) (default: each row's next ones); `real` (B, Q) marks
        the tokens of a left-padded prefill. Logits (B, Q or logits_to_keep, V)."""
        b, q = ids.shape
        if pos is None:
            pos = seq.next_pos[:, None] + torch.arange(q, device=ids.device)
        e0 = seq.entries
        seq.pos[:, e0:e0 + q] = pos if real is None else torch.where(real, pos, PAD_POSITION)
        pads = bool((seq.pos[:, :e0 + q] == PAD_POSITION).any())
        mask = (seq.pos[:, :e0 + q] != PAD_POSITION).long() if pads else None  # transformers' own layers need it
        step: dict = {}  # this forward's score biases, shared by the layers with one slot layout
        for rt in self._runtimes.values():
            rt.active, rt.past, rt.seq_pos, rt.step = True, e0, seq.pos[:, :e0 + q], step
            rt.q_real = real if real is not None and not bool(real.all()) else None
        try:
            out = self.master.model(input_ids=ids, position_ids=pos, attention_mask=mask, cache=seq.master_cache,
                                    use_cache=True, logits_to_keep=logits_to_keep)
        finally:
            for rt in self._runtimes.values():
                rt.active, rt.q_real, rt.seq_pos, rt.step = False, None, None, None
        seq.entries += q
        seq.next_pos = seq.next_pos + (q if real is None else real.sum(1))
        return out.logits

    @contextmanager
    def attention_overrides(self, overrides: dict[int, att.AttentionOverride]) -> Iterator[None]:
        """Inside the block, master layer i's attention is `overrides[i]` (see AttentionOverride) instead of the fused
        path; every other layer runs as the master's own. The hook `fusionlab.training` uses for its differentiable
        slots (the engine knows nothing about training). Removed on exit, also on error."""
        self._check_open()
        for i in overrides:
            if i not in self._runtimes:
                raise FusionLabError(f"attention_overrides: layer {i} out of range (master has "
                                     f"{len(self._runtimes)} layers); use layers 0..{len(self._runtimes) - 1}.")
        try:
            for i, fn in overrides.items():
                self._runtimes[i].override, self._runtimes[i].active = fn, True
            yield
        finally:
            for i in overrides:
                self._runtimes[i].override, self._runtimes[i].active = None, False

    def _start(self, prompt: Any, new_tokens: int, chat: bool, context: Any, prompt_len: int | None,
               attention_mask: Any, slaves: Any = None) -> tuple[list[Row], bool, SequenceState, torch.Tensor]:
        """Rows, whether it is a batch, the placed slots, and the left-padded ids (B, W)."""
        self._check_open()
        checks.integer("max_new_tokens", new_tokens, 0)
        checks.flag("chat", chat)
        if prompt_len is not None:
            checks.integer("prompt_len", prompt_len, 1)
        reads = checks.slave_subset([s.lm.name for s in self.slaves], slaves, self.timing == "live")
        rows, batched = rows_of(self, prompt, chat, context, prompt_len, attention_mask)
        for row in rows:
            row.slaves = reads
        check_lengths(self, rows, new_tokens)
        width = max(r.ids.shape[1] for r in rows)
        live_extra = width - rows[0].prompt_len if self.timing == "live" and not batched else 0
        seq = place_slots(self._runtimes, self.master, self.slaves, rows, width, new_tokens + live_extra, self.timing)
        self.row_slot_bytes = self._placed_bytes(len(rows))
        return rows, batched, seq, left_padded(rows, pad_id(self.master))

    def _placed_bytes(self, n_rows: int) -> list[dict[str, int]]:
        """Per row, bytes of the slots each slave placed for its prompt (measured from the fresh buffers)."""
        out = [{s.lm.name: 0 for s in self.slaves} for _ in range(n_rows)]
        for rt in self._runtimes.values():
            for inj in rt.injections:
                per = 2 * inj.k.shape[1] * inj.k.shape[3] * inj.k.element_size()
                for r in range(n_rows):
                    out[r][self.slaves[inj.slave].lm.name] += int(inj.n[r]) * per
        return out

    def _prefill(self, rows: list[Row], seq: SequenceState, ids: torch.Tensor, keep: int = 0) -> torch.Tensor:
        pos, real = pad_positions(rows, ids.shape[1], ids.device)
        return self._forward(seq, ids, pos, None if bool(real.all()) else real, logits_to_keep=keep)

    @torch.inference_mode()
    def __call__(self, prompt: str | list[str] | torch.Tensor, prompt_len: int | None = None,
                 context: str | list[Any] | None = None, attention_mask: torch.Tensor | None = None) -> torch.Tensor:
        """Logits of the whole input: (1, T, V) for one prompt, (B, W, V) for a batch (left padded: row b's tokens
        are the last T_b). Slaves read the first `prompt_len` tokens (default all), or, with `context`, only the
        context (see context.py): the master's tokens then start after it."""
        rows, batched, seq, ids = self._start(prompt, 0, False, context, prompt_len, attention_mask)
        plen = rows[0].prompt_len
        if self.timing == "live" and not batched and plen < ids.shape[1]:  # rows_of refuses prompt_len for a batch
            logits = [self._forward(seq, ids[:, :plen])]
            for t in range(plen, ids.shape[1]):
                live_step(self._runtimes, self.master, self.slaves, seq, ids[:, t:t + 1], seq.next_pos)
                logits.append(self._forward(seq, ids[:, t:t + 1]))
            return torch.cat(logits, dim=1)
        return self._prefill(rows, seq, ids)

    @torch.inference_mode()
    def prefill(self, prompt: str | list[str] | torch.Tensor, max_new_tokens: int = 0, chat: bool = False,
                context: str | list[Any] | None = None, attention_mask: torch.Tensor | None = None,
                slaves: list[int | str] | None = None) -> tuple[SequenceState, torch.Tensor, torch.Tensor]:
        """Slaves read the prompt (or the context), slots are placed, the master reads the prompt:
        (sequence, left-padded prompt ids (B, W), last logits (B, V)). `slaves`: only these read it (indices or
        names; [] = none)."""
        rows, _, seq, ids = self._start(prompt, max_new_tokens, chat, context, None, attention_mask, slaves)
        return seq, ids, self._prefill(rows, seq, ids, keep=1)[:, -1]

    @torch.inference_mode()
    def decode_one_token(self, seq: SequenceState, token: torch.Tensor) -> torch.Tensor:
        """Feed one token per row (B, 1) at each row's next position; returns the next logits (B, V)."""
        self._check_open()
        if not isinstance(seq, SequenceState) or seq.runtimes is not self._runtimes:
            raise FusionLabError("decode_one_token needs the SequenceState that this FusedModel's prefill() returned.")
        token = torch.as_tensor(token, device=self.master.device)
        token = token.view(1, 1) if token.dim() == 0 else token
        if token.dim() != 2 or token.shape != (seq.batch, 1):
            raise FusionLabError(f"token must be (batch, 1) = ({seq.batch}, 1) ids, got shape {tuple(token.shape)}.")
        checks.token_ids("token", token, self.master.spec.vocab_size)
        if self.timing == "live":
            live_step(self._runtimes, self.master, self.slaves, seq, token, seq.next_pos)
        return self._forward(seq, token, logits_to_keep=1)[:, -1]

    @torch.inference_mode()
    def generate(self, prompt: str | list[str] | torch.Tensor, max_new_tokens: int = 32, do_sample: bool = False,
                 temperature: float = 1.0, top_p: float = 1.0, seed: int | list[int] | None = None,
                 eos_token_id: int | list[int] | None = None, chat: bool = False,
                 stop: list[str] | None = None, context: str | list[Any] | None = None,
                 attention_mask: torch.Tensor | None = None, slaves: list[int | str] | None = None
                 ) -> str | list[str] | torch.Tensor | list[torch.Tensor]:
        """Like HF generate (greedy or sampling). A string in -> the new text out; ids in -> all ids out; a batch
        (a list of strings, or ids with several rows / a mask) -> a list, one per row, in order.
        `stop`: strings that end generation; the returned text is cut before the first one. Each row stops on its
        own (EOS, stop string, max_new_tokens) and leaves the batch, so finished rows cost nothing more.
        `seed`: an int seeds row i with seed + i; a list gives each row its own seed (then a prompt's samples do not
        depend on what else is in the batch). `context`: a text only the slaves read (context offload). `slaves`:
        only these slaves read it (indices or names; [] = the master alone through this model's machinery)."""
        checks.flag("do_sample", do_sample)
        if stop is not None:
            stop = checks.strings("stop", stop)
        rows, batched, seq, ids = self._start(prompt, max_new_tokens, chat, context, None, attention_mask, slaves)
        cfgs = sampling_configs(len(rows), do_sample, temperature, top_p, seed)
        eos = eos_ids(self.master, eos_token_id)
        logits = self._prefill(rows, seq, ids, keep=1)[:, -1]
        new: list[list[int]] = [[] for _ in rows]
        active = list(range(len(rows)))
        while active and max_new_tokens > 0:
            toks = torch.cat([next_token(logits[i:i + 1], cfgs[r]) for i, r in enumerate(active)])  # (A, 1)
            going = []
            for i, r in enumerate(active):
                new[r].append(int(toks[i]))
                if not row_ends(self.master.tokenizer, new[r], eos, max_new_tokens, stop):
                    going.append(i)
            if not going:
                break
            if len(going) < len(active):
                keep = torch.tensor(going, device=toks.device)
                seq.select(keep)
                toks, active = toks[keep], [active[i] for i in going]
            logits = self.decode_one_token(seq, toks)
        if all(r.text is not None for r in rows) and not isinstance(prompt, torch.Tensor):
            texts = [cut_at_stop(self.master.tokenizer.decode(n, skip_special_tokens=True), stop) for n in new]
            self.last_text = texts[-1]
            return texts if batched else texts[0]
        outs = [torch.cat([r.ids, torch.tensor([n], device=r.ids.device, dtype=r.ids.dtype)], dim=1)
                for r, n in zip(rows, new)]
        return outs if batched else outs[0]

    # --- introspection ------------------------------------------------------------------------------------
    @contextmanager
    def recording(self, recorder: Any, layers: list[int] | None = None) -> Iterator[None]:
        """Call `fn(layer, probs (B, H, Q, N), key_pos (N,), key_src (N,), query_pos (Q,), heads)` from inside
        attention (key_src -1 = the master's own keys, else the slave index). A plain function records every
        query with reference eager math; pass an attention.Recorder to choose rows/heads and keep fast paths."""
        if not isinstance(recorder, att.Recorder):
            recorder = att.Recorder(recorder, reference=True)
        chosen = list(self._runtimes) if layers is None else layers
        for i in chosen:
            if i not in self._runtimes:
                raise FusionLabError(f"layer {i} out of range (master has {len(self._runtimes)} layers).")
            self._runtimes[i].recorder = recorder
        try:
            yield
        finally:
            for i in chosen:
                self._runtimes[i].recorder = None

    def slot_bytes(self) -> dict[str, int]:
        """Bytes of the slots actually placed for the last sequence, per slave (measured from the buffers)."""
        out = {s.lm.name: 0 for s in self.slaves}
        for rt in self._runtimes.values():
            for inj in rt.injections:
                out[self.slaves[inj.slave].lm.name] += inj.nbytes
        return out

    def extra_kv_bytes(self, prompt_tokens: int) -> dict[str, int]:
        """Bytes of injected K/V per slave for a prompt of `prompt_tokens` master tokens (one slot each)."""
        spec, el = self.master.spec, torch.finfo(self.master.dtype).bits // 8
        return {s.lm.name: 2 * prompt_tokens * spec.kv_heads * spec.head_dim * el * len(s.layer_map)
                for s in self.slaves}

    def describe(self, prompt_tokens: int = 2048) -> pd.DataFrame:
        rows = []
        for s in self.slaves:
            rows.append({"slave": s.lm.name, "mode": s.slave.mode, "timing": self.timing, "rope": s.slave.rope,
                         "layer_map": f"{s.layer_map.strategy} ({len(s.layer_map)} layers)",
                         "pairs": s.layer_map.pairs, "projector": s.projector.describe(),
                         "gates": sorted(set(s.gates.values())), "tokens": "shared" if s.same_tokenizer
                         else f"aligned ({s.slave.align})",
                         f"extra_kv_bytes@{prompt_tokens}": self.extra_kv_bytes(prompt_tokens)[s.lm.name]})
        df = pd.DataFrame(rows)
        df.attrs["master"] = repr(self.master)
        return df

    def __repr__(self) -> str:
        names = ", ".join(s.lm.name for s in self.slaves) or "no slaves"
        return f"FusedModel(master={self.master.name}, slaves=[{names}], timing={self.timing})"


def fuse(master: LM, slaves: list[Slave] | None = None, timing: str = "prefix", strict: bool = False) -> FusedModel:
    """Install the slaves' injection into the master; returns a FusedModel (use as a context manager)."""
    return FusedModel(master, [] if slaves is None else slaves, timing=timing, strict=strict)
