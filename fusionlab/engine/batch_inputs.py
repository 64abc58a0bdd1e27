"""What a FusedModel accepts as input, turned into rows: one string, token ids, a list of strings, or padded ids
with an attention mask (either padding side; rows are re-laid out left padded inside), each row with its context.

Every mistake names the argument, the row and the fix: an empty list, an empty string at index i, ids and mask of
different shapes, a mask that is not 0/1, a row without tokens, mixed strings and ids, a context list of the wrong
length, a row that (with max_new_tokens) outgrows a model's positions.
"""
from __future__ import annotations

from typing import Any

import torch

from ..errors import ContextTooLong, FusionLabError
from . import checks
from .context import layout
from .placement import Row


def _ids_rows(ids: torch.Tensor, mask: torch.Tensor | None) -> list[torch.Tensor]:
    if ids.dtype in (torch.float16, torch.bfloat16, torch.float32, torch.float64) or ids.dtype == torch.bool:
        raise FusionLabError(f"input_ids must be integer token ids, got dtype {ids.dtype}.")
    ids = ids.view(1, -1) if ids.dim() == 1 else ids
    if ids.dim() != 2:
        raise FusionLabError(f"input_ids must be (T,) or (B, T), got shape {tuple(ids.shape)}.")
    if mask is None:
        mask = torch.ones_like(ids)
    mask = torch.as_tensor(mask)
    if tuple(mask.shape) != tuple(ids.shape):
        raise FusionLabError(f"attention_mask has shape {tuple(mask.shape)} but input_ids {tuple(ids.shape)}; "
                             "pass one 0/1 entry per token.")
    if not bool(((mask == 0) | (mask == 1)).all()):
        raise FusionLabError("attention_mask must hold only 0 (padding) and 1 (token); got other values.")
    rows = []
    for r in range(ids.shape[0]):
        keep = mask[r].bool()
        if not bool(keep.any()):
            raise FusionLabError(f"row {r} of the batch has no tokens (its attention_mask is all 0).")
        rows.append(ids[r][keep].view(1, -1))
    return rows


def rows_of(fused: Any, prompt: Any, chat: bool = False, context: Any = None, prompt_len: int | None = None,
            attention_mask: Any = None) -> tuple[list[Row], bool]:
    """(rows, batched). A batch is a list of strings, or ids with more than one row (or with a mask)."""
    master = fused.master
    if isinstance(prompt, (list, tuple)) and prompt and not isinstance(prompt[0], str) and \
            all(isinstance(x, int) and not isinstance(x, bool) for x in prompt):
        prompt = torch.tensor([prompt])  # a plain list of token ids
    if isinstance(prompt, (list, tuple)):
        if not prompt:
            raise FusionLabError("the batch is empty: pass at least one prompt.")
        kinds = {type(p) for p in prompt}
        if kinds != {str}:
            raise FusionLabError(f"a batch mixes {sorted(k.__name__ for k in kinds)}: pass a list of strings, or one "
                                 "padded ids tensor with its attention_mask.")
        for i, p in enumerate(prompt):
            if not p:
                raise FusionLabError(f"prompt {i} of the batch is an empty string; give it some text or drop it.")
        texts = [master.chat_prompt(p) if chat else p for p in prompt]
        raw: list[tuple[torch.Tensor | None, str | None]] = [(None, t) for t in texts]
        batched = True
    elif prompt is None:
        raise FusionLabError("prompt is None: pass a string, a list of strings, or token ids.")
    elif isinstance(prompt, str):
        if not prompt:
            raise FusionLabError("the prompt is empty; pass some text.")
        raw, batched = [(None, master.chat_prompt(prompt) if chat else prompt)], False
    else:
        ids = torch.as_tensor(prompt)
        if ids.numel() == 0 or (ids.dim() == 2 and ids.shape[1] == 0):
            raise FusionLabError("the prompt is empty (0 tokens).")
        batched = attention_mask is not None or (ids.dim() == 2 and ids.shape[0] > 1)
        raw = [(r, None) for r in _ids_rows(ids, attention_mask)]
        for r, _ in raw:
            checks.token_ids("input_ids", r, master.spec.vocab_size)
    n = len(raw)
    if batched and context is not None and not isinstance(context, str):
        if not isinstance(context, (list, tuple)) or len(context) != n:
            raise FusionLabError(f"with a batch of {n} prompts, context= is one string for every row or a list of "
                                 f"{n} (one per row, each a string or a per-slave list); got "
                                 f"{type(context).__name__}{f' of {len(context)}' if isinstance(context, (list, tuple)) else ''}.")
        contexts = list(context)
    else:
        contexts = [context] * n
    if prompt_len is not None and (batched or contexts[0] is not None):
        raise FusionLabError("prompt_len has no meaning with context= (the slaves read the context, not the "
                             "prompt) or with a batch (each row's slaves read its whole prompt).")
    rows = []
    for (ids, text), ctx in zip(raw, contexts):
        lay = None if ctx is None else layout(master, fused.slaves, ctx, fused.timing)
        if ids is None:
            ids = master.encode(text, special_tokens=lay is None)
        ids = ids.to(master.device)
        if prompt_len is not None and not 0 < prompt_len <= ids.shape[1]:
            raise FusionLabError(f"prompt_len must be in 1..{ids.shape[1]} (the prompt's tokens), got {prompt_len}.")
        rows.append(Row(ids, text, ids.shape[1] if prompt_len is None else prompt_len, lay))
    return rows, batched


def check_lengths(fused: Any, rows: list[Row], new_tokens: int) -> None:
    """Each row, with `new_tokens` more, must fit the master's positions (and a live or same-tokenizer slave's)."""
    limit = fused.master.spec.max_positions
    for r, row in enumerate(rows):
        n, where = row.base + row.ids.shape[1] + new_tokens, f"row {r}: " if len(rows) > 1 else ""
        if row.context is not None and n > limit:
            raise ContextTooLong(f"{where}context of {row.base} master tokens plus {n - row.base} own tokens exceeds "
                                 f"master {fused.master.name}'s max positions {limit}.")
        if n > limit:
            raise ContextTooLong(f"{where}sequence of {n} tokens exceeds master {fused.master.name}'s max positions "
                                 f"{limit}; shorten the prompt or max_new_tokens.")
        for s in fused.slaves:
            if s.same_tokenizer and row.context is None and n > s.lm.spec.max_positions:
                raise ContextTooLong(f"{where}sequence of {n} tokens exceeds slave {s.lm.name}'s max positions "
                                     f"{s.lm.spec.max_positions}.")


def pad_id(master: Any) -> int:
    tok = master.tokenizer
    for cand in (tok.pad_token_id, tok.eos_token_id, 0):
        if cand is not None:
            return int(cand)
    return 0


def left_padded(rows: list[Row], pad: int) -> torch.Tensor:
    """(B, W) ids, each row right-aligned."""
    width = max(r.ids.shape[1] for r in rows)
    out = torch.full((len(rows), width), pad, dtype=rows[0].ids.dtype, device=rows[0].ids.device)
    for i, r in enumerate(rows):
        out[i, width - r.ids.shape[1]:] = r.ids[0]
    return out
