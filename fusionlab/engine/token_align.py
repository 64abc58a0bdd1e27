"""Token alignment across tokenizers by character offsets: which slave tokens cover each master token.

Used to fit projectors (pair master and slave states on the same text) and to inject a slave that
tokenizes differently (its K/V land on the master positions whose characters they cover).
Zero-width tokens (special tokens such as Gemma's <bos> at (0, 0)) cover no characters and get no slot.
"""
from __future__ import annotations

from dataclasses import dataclass

import pandas as pd
import torch

from ..errors import FusionLabError

STRATEGIES = ("first", "last", "mean")


@dataclass
class TokenAlignment:
    master_index: torch.Tensor
    """(S,) master token indices that some slave token covers."""
    groups: list[list[int]]
    """Per aligned master token: the covering slave token indices, in order."""
    strategy: str
    n_master: int
    n_slave: int

    def gather(self, x: torch.Tensor) -> torch.Tensor:
        """Slave states (B, H, T_s, D) -> one state per aligned master token (B, H, S, D)."""
        if self.strategy == "first":
            return x[:, :, [g[0] for g in self.groups]]
        if self.strategy == "last":
            return x[:, :, [g[-1] for g in self.groups]]
        rows, cols, weights = self._mean_index()
        picked = x[:, :, cols.to(x.device)] * weights.to(x.device, x.dtype)[:, None]  # (B, H, sum|g|, D)
        out = torch.zeros(*x.shape[:2], len(self.groups), x.shape[3], dtype=x.dtype, device=x.device)
        return out.index_add_(2, rows.to(x.device), picked)  # (B, H, S, D)

    def _mean_index(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """(target row, source column, weight 1/|g|) per covering pair; built once per alignment."""
        if not hasattr(self, "_mean_cache"):
            lens = torch.tensor([len(g) for g in self.groups])
            rows = torch.repeat_interleave(torch.arange(len(self.groups)), lens)
            cols = torch.tensor([j for g in self.groups for j in g], dtype=torch.long)
            self._mean_cache = (rows, cols, 1.0 / lens[rows].float())
        return self._mean_cache

    @property
    def coverage(self) -> float:
        return len(self.groups) / max(self.n_master, 1)


def identity_alignment(n: int, device: torch.device | str = "cpu") -> TokenAlignment:
    return TokenAlignment(torch.arange(n, device=device), [[i] for i in range(n)], "first", n, n)


def offsets(tokenizer, text: str, special_tokens: bool = True) -> list[tuple[int, int]]:
    if not getattr(tokenizer, "is_fast", False):
        raise FusionLabError(f"{type(tokenizer).__name__} is not a fast tokenizer, so it has no character "
                             "offsets; cross-tokenizer alignment needs one (load the model's tokenizer.json).")
    enc = tokenizer(text, return_offsets_mapping=True, add_special_tokens=special_tokens)
    return [tuple(o) for o in enc["offset_mapping"]]


def align_tokens(master_tok, slave_tok, text: str, strategy: str = "mean",
                 master_special_tokens: bool = True) -> TokenAlignment:
    """Pair each master token with the slave tokens whose character spans overlap it. `master_special_tokens`:
    whether the master's ids of `text` carry its special tokens (False when the text continues a sequence)."""
    if strategy not in STRATEGIES:
        raise FusionLabError(f"unknown alignment strategy {strategy!r}; use one of {STRATEGIES}.")
    mo, so = offsets(master_tok, text, master_special_tokens), offsets(slave_tok, text)
    index, groups, j0 = [], [], 0
    for i, (a, b) in enumerate(mo):
        if b <= a:
            continue
        while j0 < len(so) and (so[j0][1] <= a or so[j0][1] <= so[j0][0]):
            j0 += 1  # slave tokens wholly before this master token (or zero-width) never match again
        g, j = [], j0
        while j < len(so) and so[j][0] < b:
            c, d = so[j]
            if d > c and c < b and a < d:
                g.append(j)
            j += 1
        if g:
            index.append(i)
            groups.append(g)
    return TokenAlignment(torch.tensor(index, dtype=torch.long), groups, strategy, len(mo), len(so))


def alignment_frame(master_tok, slave_tok, text: str, strategy: str = "mean") -> pd.DataFrame:
    """A readable view: master token <-> covering slave tokens."""
    al = align_tokens(master_tok, slave_tok, text, strategy)
    m_ids = master_tok(text)["input_ids"]
    s_ids = slave_tok(text)["input_ids"]
    rows = []
    for i, g in zip(al.master_index.tolist(), al.groups):
        rows.append({"master_pos": i, "master_token": master_tok.decode([m_ids[i]]),
                     "slave_pos": g, "slave_tokens": [slave_tok.decode([s_ids[j]]) for j in g]})
    return pd.DataFrame(rows)
