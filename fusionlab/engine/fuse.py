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

from ..errors import ContextTooLong, FusionLabError
from . import attention as att
from . import registry
from .arch import attn_module
from .context import ContextLayout, layout
from .lm import LM
from .placement import SequenceState, live_step, place_slots
from .sampling import SamplingConfig, cut_at_stop, eos_ids, hit_stop, next_token
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
        self.master, self.timing = master, timing
        self.slaves: list[ResolvedSlave] = [s.resolve(master) for s in slaves]
        if strict:
            from .preflight import check_alignment

            for s in self.slaves:
                check_alignment(master, s.lm).raise_if_incompatible()
        if timing == "live" and not all(s.same_tokenizer for s in self.slaves):
            raise FusionLabError("timing='live' needs slaves with the master's tokenizer (generated tokens are "
                                 "fed to them as ids); use timing='prefix' for cross-tokenizer slaves.")
        self._base = master.model.config._attn_implementation
        if self._base.startswith("fusionlab_"):
            raise FusionLabError(f"{master.name} is already fused; close() the other FusedModel first.")
        self._runtimes = {i: att.LayerRuntime(i, self._base) for i in range(master.spec.layers)}
        registry.install(master.model, {attn_module(master.model, i): rt for i, rt in self._runtimes.items()}, self)
        master.model.set_attn_implementation(att.install_interface(self._base))
        self._open = True
        self.last_text: str | None = None

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

    # --- inputs -----------------------------------------------------------------------------------------
    def encode(self, prompt: str | torch.Tensor, chat: bool = False,
               special_tokens: bool = True) -> tuple[torch.Tensor, str | None]:
        """(ids (1, T), text or None); `special_tokens=False` when the prompt continues a context."""
        if isinstance(prompt, str):
            if not prompt:
                raise FusionLabError("the prompt is empty; pass some text.")
            text = self.master.chat_prompt(prompt) if chat else prompt
            return self.master.encode(text, special_tokens), text
        ids = torch.as_tensor(prompt)
        ids = ids.view(1, -1) if ids.dim() == 1 else ids
        if ids.shape[0] != 1:
            raise FusionLabError(f"FusedModel runs batch size 1; got input_ids of shape {tuple(ids.shape)}.")
        if ids.shape[1] == 0:
            raise FusionLabError("the prompt is empty (0 tokens).")
        return ids.to(self.master.device), None

    def _layout(self, context: str | list[str] | None) -> ContextLayout | None:
        return None if context is None else layout(self.master, self.slaves, context, self.timing)

    def _check_length(self, n: int, context: ContextLayout | None = None) -> None:
        if context is not None and context.length + n > self.master.spec.max_positions:
            raise ContextTooLong(f"context of {context.length} master tokens plus {n} own tokens exceeds master "
                                 f"{self.master.name}'s max positions {self.master.spec.max_positions}.")
        if n > self.master.spec.max_positions:
            raise ContextTooLong(f"sequence of {n} tokens exceeds master {self.master.name}'s max positions "
                                 f"{self.master.spec.max_positions}; shorten the prompt or max_new_tokens.")
        for s in self.slaves:
            if s.same_tokenizer and n > s.lm.spec.max_positions:
                raise ContextTooLong(f"sequence of {n} tokens exceeds slave {s.lm.name}'s max positions "
                                     f"{s.lm.spec.max_positions}.")

    # --- forward ----------------------------------------------------------------------------------------
    @torch.inference_mode()
    def _forward(self, seq: SequenceState, ids: torch.Tensor, logits_to_keep: int = 0) -> torch.Tensor:
        start = seq.length
        pos = torch.arange(start, start + ids.shape[1], device=self.master.device).view(1, -1)
        for rt in self._runtimes.values():
            rt.active = True
        try:
            out = self.master.model(input_ids=ids, position_ids=pos, cache=seq.master_cache, use_cache=True,
                                    logits_to_keep=logits_to_keep)
        finally:
            for rt in self._runtimes.values():
                rt.active = False
        seq.length += ids.shape[1]
        return out.logits

    def train_logits(self, ids: torch.Tensor, slots: dict[int, list[Any]], start: int = 0) -> torch.Tensor:
        """The training path: logits (1, T, V) of ids (1, T) at positions start.., with gradients through `slots`
        ({master layer: [TrainSlots]}, built by the trainer from this fusion's slaves). No cache, nothing placed."""
        self._check_open()
        pos = torch.arange(start, start + ids.shape[1], device=self.master.device).view(1, -1)
        for i, rt in self._runtimes.items():
            rt.train, rt.active = slots.get(i) or None, True
        try:
            with torch.enable_grad():
                return self.master.model(input_ids=ids, position_ids=pos, use_cache=False).logits
        finally:
            for rt in self._runtimes.values():
                rt.train, rt.active = None, False

    @torch.inference_mode()
    def __call__(self, prompt: str | torch.Tensor, prompt_len: int | None = None,
                 context: str | list[str] | None = None) -> torch.Tensor:
        """Logits (1, T, V) of the whole input. Slaves read the first `prompt_len` tokens (default all), or, with
        `context`, only the context (see context.py): the master's tokens then start after it."""
        self._check_open()
        ctx = self._layout(context)
        if ctx is not None and prompt_len is not None:
            raise FusionLabError("prompt_len has no meaning with context=: the slaves read the context, not the prompt.")
        ids, text = self.encode(prompt, special_tokens=ctx is None)
        self._check_length(ids.shape[1], ctx)
        prompt_len = ids.shape[1] if prompt_len is None else prompt_len
        seq = place_slots(self._runtimes, self.master, self.slaves, ids, text, prompt_len, ids.shape[1], self.timing,
                          ctx)
        if self.timing == "live" and prompt_len < ids.shape[1]:
            logits = [self._forward(seq, ids[:, :prompt_len])]
            for t in range(prompt_len, ids.shape[1]):
                live_step(self._runtimes, self.master, self.slaves, seq, ids[:, t:t + 1], t)
                logits.append(self._forward(seq, ids[:, t:t + 1]))
            return torch.cat(logits, dim=1)
        return self._forward(seq, ids)

    @torch.inference_mode()
    def prefill(self, prompt: str | torch.Tensor, max_new_tokens: int = 0, chat: bool = False,
                context: str | list[str] | None = None) -> tuple[SequenceState, torch.Tensor, torch.Tensor]:
        """Slaves read the prompt (or the context), slots are placed, the master reads the prompt:
        (sequence, prompt ids, last logits)."""
        self._check_open()
        ctx = self._layout(context)
        ids, text = self.encode(prompt, chat=chat, special_tokens=ctx is None)
        self._check_length(ids.shape[1] + max_new_tokens, ctx)
        seq = place_slots(self._runtimes, self.master, self.slaves, ids, text, ids.shape[1],
                          ids.shape[1] + max_new_tokens, self.timing, ctx)
        return seq, ids, self._forward(seq, ids, logits_to_keep=1)[:, -1]

    @torch.inference_mode()
    def decode_one_token(self, seq: SequenceState, token: torch.Tensor) -> torch.Tensor:
        """Feed one token (1, 1) at the next position; returns the next logits (1, V)."""
        if self.timing == "live":
            live_step(self._runtimes, self.master, self.slaves, seq, token, seq.length)
        return self._forward(seq, token, logits_to_keep=1)[:, -1]

    @torch.inference_mode()
    def generate(self, prompt: str | torch.Tensor, max_new_tokens: int = 32, do_sample: bool = False,
                 temperature: float = 1.0, top_p: float = 1.0, seed: int | None = None,
                 eos_token_id: int | list[int] | None = None, chat: bool = False,
                 stop: list[str] | None = None, context: str | list[str] | None = None) -> str | torch.Tensor:
        """Like HF generate (greedy or sampling). A string in -> the new text out; ids in -> all ids out.
        `stop`: strings that end generation; the returned text is cut before the first one.
        `context`: a text only the slaves read (context offload, see context.py)."""
        cfg = SamplingConfig(do_sample, temperature, top_p, seed)
        eos = eos_ids(self.master, eos_token_id)
        seq, ids, logits = self.prefill(prompt, max_new_tokens, chat=chat, context=context)
        new: list[int] = []
        for _ in range(max_new_tokens):
            tok = next_token(logits, cfg)  # (1, 1)
            new.append(int(tok))
            if int(tok) in eos or len(new) == max_new_tokens or hit_stop(self.master.tokenizer, new, stop):
                break
            logits = self.decode_one_token(seq, tok)
        if isinstance(prompt, str):
            text = self.master.tokenizer.decode(new, skip_special_tokens=True)
            self.last_text = cut_at_stop(text, stop)
            return self.last_text
        return torch.cat([ids, torch.tensor([new], device=ids.device, dtype=ids.dtype)], dim=1)

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
    return FusedModel(master, list(slaves or []), timing=timing, strict=strict)
