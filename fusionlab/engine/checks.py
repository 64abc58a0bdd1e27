"""Argument checks for the public entry points: each failure is one FusionLabError that names the argument, the value
received and what to pass instead. Cheap (plain Python on the arguments, never on tensors in a hot loop)."""
from __future__ import annotations

import math
from typing import Any, Iterable

import torch

from ..errors import FusionLabError


def _show(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def integer(name: str, value: Any, low: int | None = None, high: int | None = None) -> int:
    """An int (not a bool, not a float) within [low, high]."""
    if isinstance(value, bool) or not isinstance(value, int):
        if isinstance(value, torch.Tensor) and value.numel() == 1 and not value.is_floating_point():
            value = int(value)
        else:
            raise FusionLabError(f"{name} must be an int, got {type(value).__name__} {_show(value)}.")
    if low is not None and value < low:
        raise FusionLabError(f"{name} must be >= {low}, got {value}.")
    if high is not None and value > high:
        raise FusionLabError(f"{name} must be <= {high}, got {value}.")
    return value


def number(name: str, value: Any, low: float | None = None, high: float | None = None,
           low_open: bool = False) -> float:
    """A finite real number within its range (low excluded when low_open)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise FusionLabError(f"{name} must be a number, got {type(value).__name__} {_show(value)}.")
    value = float(value)
    if not math.isfinite(value):
        raise FusionLabError(f"{name} must be finite, got {value}.")
    if low is not None and (value <= low if low_open else value < low):
        raise FusionLabError(f"{name} must be {'>' if low_open else '>='} {low:g}, got {value:g}.")
    if high is not None and value > high:
        raise FusionLabError(f"{name} must be <= {high:g}, got {value:g}.")
    return value


def choice(name: str, value: Any, choices: Iterable[Any]) -> Any:
    options = tuple(choices)
    if value not in options:
        raise FusionLabError(f"unknown {name} {_show(value)}; use one of {options}.")
    return value


def text(name: str, value: Any, nonempty: bool = True) -> str:
    if not isinstance(value, str):
        raise FusionLabError(f"{name} must be a string, got {type(value).__name__} {_show(value)}.")
    if nonempty and not value:
        raise FusionLabError(f"{name} is an empty string; give it some text.")
    return value


def strings(name: str, value: Any) -> list[str]:
    """A list of non-empty strings (e.g. stop strings)."""
    if isinstance(value, str) or not isinstance(value, (list, tuple)):
        raise FusionLabError(f"{name} must be a list of strings, got {type(value).__name__} {_show(value)}.")
    for i, v in enumerate(value):
        if not isinstance(v, str) or not v:
            raise FusionLabError(f"{name}[{i}] must be a non-empty string, got {_show(v)} (an empty stop string "
                                 "would stop at once).")
    return list(value)


def token_ids(name: str, ids: torch.Tensor, vocab: int) -> torch.Tensor:
    """Integer token ids within the vocabulary."""
    if ids.is_floating_point() or ids.dtype == torch.bool or ids.is_complex():
        raise FusionLabError(f"{name} must hold integer token ids, got dtype {ids.dtype}.")
    if ids.numel() and (int(ids.min()) < 0 or int(ids.max()) >= vocab):
        raise FusionLabError(f"{name} holds ids outside the vocabulary 0..{vocab - 1} (min {int(ids.min())}, max "
                             f"{int(ids.max())}); encode the text with the master's tokenizer.")
    return ids


def flag(name: str, value: Any) -> bool:
    if not isinstance(value, bool):
        raise FusionLabError(f"{name} must be True or False, got {_show(value)}.")
    return value


def slave_subset(names: list[str], slaves: Any, live: bool) -> frozenset[int] | None:
    """`slaves=` as the indices of the slaves a prompt reads: None (all), or a list of the FusedModel's slaves by
    index or model name ([] = the master alone). Checked, so a typo never silently reads nothing."""
    if slaves is None:
        return None
    if not isinstance(slaves, (list, tuple, set, frozenset)):
        raise FusionLabError(f"slaves= must be None (all) or a list of the fused model's slaves (indices or names), "
                             f"got {type(slaves).__name__}.")
    out = set()
    for x in slaves:
        if isinstance(x, str) and names.count(x) == 1:
            out.add(names.index(x))
        elif isinstance(x, int) and not isinstance(x, bool) and 0 <= x < len(names):
            out.add(x)
        else:
            raise FusionLabError(f"slaves= has {x!r}, not one of the fused model's slaves: use an index "
                                 f"0..{len(names) - 1} or a name from {names}.")
    if live and len(out) < len(names):
        raise FusionLabError("slaves= with timing='live' must list every slave (live slaves read every row's "
                             "generated tokens); use timing='prefix' to let rows read different slaves.")
    return frozenset(out)
