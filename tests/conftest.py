"""Shared fixtures: tiny models are built once per session (each takes well under a second)."""
from __future__ import annotations

import os

import pytest
import torch

import fusionlab as fl
from fusionlab.models.tiny import TINY

os.environ.setdefault("HF_HUB_OFFLINE", "1")
if os.environ.get("PYTEST_XDIST_WORKER"):
    # Several test workers share the cores: one torch thread each (and in every kernel or subprocess they start), so
    # their thread pools never oversubscribe the machine (two 2-thread processes on 2 cores run several-fold slower).
    os.environ["OMP_NUM_THREADS"] = "1"
    torch.set_num_threads(1)
TINY_NAMES = list(TINY)
SELF_FUSION_TOL = {"tiny models": 1e-3, "Qwen": 1e-3}
"""max |Δlogit| the self-fusion anchor (concat, live) is held to; README's anchors sentence quotes these values."""
TEXT = "The quick brown fox jumps over the lazy dog; 敏捷的狐狸 again and again, the end."


@pytest.fixture(scope="session")
def tiny():
    cache: dict[str, fl.LM] = {}

    def get(name: str, fresh: bool = False) -> fl.LM:
        if fresh:
            return fl.load(name)
        if name not in cache:
            cache[name] = fl.load(name)
        return cache[name]

    return get


def master_logits(lm: fl.LM, ids: torch.Tensor) -> torch.Tensor:
    with torch.no_grad():
        return lm.model(ids).logits


def embedded_available(name: str) -> bool:
    """In CI the bootstrap has fetched the models: never skip there, so a missing model fails loudly."""
    from fusionlab.models.zoo import cached_manifest
    if os.environ.get("CI"):
        return True
    try:
        return cached_manifest(name) is not None
    except Exception:
        return False
