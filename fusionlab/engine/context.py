"""Context offload: slaves read text the master never sees, and their slots sit where that text would have been.

    fused.generate(question, context=document)

Every slave reads `document`; its slots take the master positions [0, C) that the document would occupy had the master
read it, C counted in *master* tokens (a cross-tokenizer slave's tokens land on those positions by characters, as
everywhere else); the master's own tokens start at C. So with an exact copy of the master as the slave (concat,
re-rotated keys) the fused logits equal the master reading `ids(document) + ids(question)` itself: the skyline of the
transfer-rate measure. The document is tokenized with the tokenizer's special tokens (a BOS goes first), the master's
prompt without them (it continues the sequence).

A list gives each slave its own document (a bus whose slaves remember different things): the documents are laid out
one after another, in slave order, as if the master had read them in turn, and the master's tokens start after the
last. Only the first of several documents is an exact anchor (a slave reading the second one never saw the first).

Prefix timing and concat mode only: live slaves would read tokens the master's positions do not continue, and
replace / blend have no master keys at the context's positions to act on.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from ..errors import ContextTooLong, FusionLabError
from .lm import LM
from .slave import ResolvedSlave


@dataclass(frozen=True)
class ContextSpan:
    """What one slave reads, and where its slots go."""

    text: str
    master_ids: torch.Tensor
    """(1, C) the text as the master would have read it (used to count positions and to align tokens)."""
    start: int
    """Master position of the text's first token."""

    @property
    def length(self) -> int:
        return int(self.master_ids.shape[1])


@dataclass(frozen=True)
class ContextLayout:
    spans: list[ContextSpan]
    """One per slave, in slave order."""
    length: int
    """Master positions the contexts take: the master's own tokens start here."""


def _check_text(text: object, where: str) -> str:
    if not isinstance(text, str):
        raise FusionLabError(f"{where} must be a string (the text a slave reads), got {type(text).__name__}.")
    if not text.strip():
        raise FusionLabError(f"{where} is empty: give the slave a document to read, or call without context=.")
    return text


def layout(master: LM, slaves: list[ResolvedSlave], context: str | list[str], timing: str) -> ContextLayout:
    """Validate `context` for these slaves and place each text on the master's positions."""
    if not slaves:
        raise FusionLabError("context= needs at least one slave to read it; the master alone never sees the context "
                             "(to have the master read it, put it in the prompt: that is the skyline).")
    if timing != "prefix":
        raise FusionLabError(f"context= works with timing='prefix' only (got timing={timing!r}): the slaves read the "
                             "context once, before the master's prompt.")
    for s in slaves:
        if s.slave.mode != "concat":
            raise FusionLabError(f"context= needs mode='concat' for every slave; slave {s.lm.name} has "
                                 f"mode={s.slave.mode!r}, which edits master keys that do not exist at the context's "
                                 "positions.")
    if isinstance(context, (list, tuple)):
        if len(context) != len(slaves):
            raise FusionLabError(f"context= has {len(context)} texts for {len(slaves)} slaves; pass one per slave "
                                 "(in slave order), or one string for all of them.")
        texts = [_check_text(t, f"context[{i}]") for i, t in enumerate(context)]
    else:
        texts = [_check_text(context, "context")] * len(slaves)
    shared = not isinstance(context, (list, tuple))
    spans, start = [], 0
    for text in texts:
        ids = master.encode(text, special_tokens=start == 0)
        spans.append(ContextSpan(text, ids, 0 if shared else start))
        start = ids.shape[1] if shared else start + ids.shape[1]
    for s, span in zip(slaves, spans):
        n = span.master_ids.shape[1] if s.same_tokenizer else len(s.lm.tokenizer(span.text)["input_ids"])
        if n > s.lm.spec.max_positions:
            raise ContextTooLong(f"context of {n} tokens for slave {s.lm.name}, beyond its max positions "
                                 f"{s.lm.spec.max_positions}; shorten the document.")
    return ContextLayout(spans, start)
