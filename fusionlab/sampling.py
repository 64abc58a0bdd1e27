"""Next-token choice: greedy, or temperature + top-p sampling with an explicit seeded generator."""
from __future__ import annotations

from dataclasses import dataclass, field

import torch

from .errors import FusionLabError


@dataclass
class SamplingConfig:
    do_sample: bool = False
    temperature: float = 1.0
    top_p: float = 1.0
    seed: int | None = None
    generator: torch.Generator | None = field(default=None, repr=False)

    def __post_init__(self) -> None:
        if self.temperature <= 0:
            raise FusionLabError(f"temperature must be > 0, got {self.temperature} (use do_sample=False for greedy).")
        if not 0 < self.top_p <= 1:
            raise FusionLabError(f"top_p must be in (0, 1], got {self.top_p}.")
        if self.do_sample:
            self.generator = torch.Generator()
            self.generator.manual_seed(self.seed if self.seed is not None else torch.seed())


def next_token(logits: torch.Tensor, cfg: SamplingConfig) -> torch.Tensor:
    """logits (1, V) -> token id (1, 1)."""
    if not cfg.do_sample:
        return logits.argmax(dim=-1, keepdim=True)
    probs = torch.softmax(logits.float().cpu() / cfg.temperature, dim=-1)  # (1, V)
    if cfg.top_p < 1.0:
        sorted_p, order = probs.sort(dim=-1, descending=True)
        keep = sorted_p.cumsum(-1) - sorted_p < cfg.top_p  # always keeps the top token
        sorted_p = sorted_p * keep
        probs = torch.zeros_like(probs).scatter(-1, order, sorted_p)
    tok = torch.multinomial(probs / probs.sum(-1, keepdim=True), 1, generator=cfg.generator)
    return tok.to(logits.device)
