"""Next-token choice: greedy, or temperature + top-p sampling with an explicit seeded generator."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch

from ..errors import FusionLabError
from . import checks


@dataclass
class SamplingConfig:
    do_sample: bool = False
    temperature: float = 1.0
    top_p: float = 1.0
    seed: int | None = None
    generator: torch.Generator | None = field(default=None, repr=False)

    def __post_init__(self) -> None:
        if isinstance(self.temperature, bool) or not isinstance(self.temperature, (int, float)) or \
                not self.temperature > 0 or self.temperature != self.temperature or self.temperature == float("inf"):
            raise FusionLabError(f"temperature must be a finite number > 0, got {self.temperature!r} (use "
                                 "do_sample=False for greedy).")
        checks.number("top_p", self.top_p, 0.0, 1.0, low_open=True)
        if self.seed is not None:
            checks.integer("seed", self.seed)
        if self.do_sample:
            self.generator = torch.Generator()
            self.generator.manual_seed(self.seed if self.seed is not None else torch.seed())


def next_token(logits: torch.Tensor, cfg: SamplingConfig) -> torch.Tensor:
    """logits (1, V) -> token id (1, 1)."""
    if not cfg.do_sample:
        return logits.argmax(dim=-1, keepdim=True)
    probs = torch.softmax(logits.float().cpu() / cfg.temperature, dim=-1)  # (1, V)
    if not bool(torch.isfinite(probs).all()):
        raise FusionLabError(f"sampling got non-finite probabilities (temperature {cfg.temperature:g}; the logits hold "
                             f"{int((~torch.isfinite(logits)).sum())} non-finite values): raise the temperature, or check "
                             "the fusion's gates and projector.")
    if cfg.top_p < 1.0:
        sorted_p, order = probs.sort(dim=-1, descending=True)
        keep = sorted_p.cumsum(-1) - sorted_p < cfg.top_p  # always keeps the top token
        sorted_p = sorted_p * keep
        probs = torch.zeros_like(probs).scatter(-1, order, sorted_p)
    tok = torch.multinomial(probs / probs.sum(-1, keepdim=True), 1, generator=cfg.generator)
    return tok.to(logits.device)


# --- when to stop ---------------------------------------------------------------------------------------
def hit_stop(tokenizer: Any, new: list[int], stop: list[str] | None) -> bool:
    """Does the tail of the generated text contain a stop string? (decodes only the last few tokens)"""
    if not stop:
        return False
    tail = tokenizer.decode(new[-8:], skip_special_tokens=True)
    return any(s in tail for s in stop)


def row_ends(tokenizer: Any, new: list[int], eos: set[int], max_new_tokens: int, stop: list[str] | None) -> bool:
    """Does a row that just produced `new[-1]` stop here: an end-of-sequence id, max_new_tokens reached, or a stop
    string in its tail? The one rule every generation loop (static batch, continuous scheduler) applies."""
    return new[-1] in eos or len(new) == max_new_tokens or hit_stop(tokenizer, new, stop)


def cut_at_stop(text: str, stop: list[str] | None) -> str:
    """`text` cut before the first stop string it contains."""
    cuts = [text.find(s) for s in stop or [] if s in text]
    return text[: min(cuts)] if cuts else text


def eos_ids(master: Any, eos: int | list[int] | None) -> set[int]:
    """End-of-sequence ids: the given ones, else the generation config's, else the tokenizer's."""
    if eos is None:
        eos = master.model.generation_config.eos_token_id
        if eos is None:
            eos = master.tokenizer.eos_token_id
    if eos is None:
        return set()
    ids = [eos] if isinstance(eos, int) else list(eos) if isinstance(eos, (list, tuple, set)) else None
    if ids is None or any(isinstance(i, bool) or not isinstance(i, int) for i in ids):
        raise FusionLabError(f"eos_token_id must be an int or a list of ints, got {eos!r}.")
    return set(ids)


def sampling_configs(n: int, do_sample: bool, temperature: float, top_p: float,
                     seed: int | list[int] | None) -> list[SamplingConfig]:
    """One config per batch row: an int seed gives row i seed + i; a list gives each row its own."""
    if isinstance(seed, (list, tuple)):
        if len(seed) != n:
            raise FusionLabError(f"seed= has {len(seed)} seeds for {n} prompts; pass one per prompt, or one int.")
        seeds = list(seed)
    else:
        seeds = [None if seed is None else seed + i for i in range(n)]
    return [SamplingConfig(do_sample, temperature, top_p, s) for s in seeds]
