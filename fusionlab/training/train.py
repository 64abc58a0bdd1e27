"""`train_fuser`: learn a fuser between two frozen models with the master's next-token loss, on this CPU.

    task='same'     both read a text (C2C); loss on the master's tokens, slots at the same positions
    task='offload'  the slave reads a context, the master only the continuation after it (positions start at C);
                    loss on the continuation: the fuser is rewarded only for carrying what the master did not read

Both models are frozen; only the fuser learns. The slave's K/V for every text are captured once and kept (chunks.py);
slots are built by the engine's own code and attended by `train_attention` (the inference rules as differentiable
math, attention.py), so the trained fuser behaves the same at inference.
AdamW with linear warm-up, gradient clipping, a token and/or time budget, a seeded data order and a fixed thread count
(bit-identical weights for the same seed and data), atomic checkpoints with the optimizer state, and resume. A loss
that turns NaN or doubles stops the run with the step and learning rate; the last good checkpoint stays.
"""
from __future__ import annotations

import hashlib
import json
import math
import time
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Iterator

import pandas as pd
import torch
from tqdm.auto import tqdm

from ..engine import checks
from ..errors import FusionLabError
from ..engine.determinism import fixed_threads
from ..engine.fit import fit_lstsq
from ..engine.fuse import fuse
from ..engine.lm import LM
from ..engine.projector import LstsqProjector
from ..engine.slave import Slave
from .chunks import TrainChunk, check_chunks, document_derangement, prepare
from .fuser import FuserConfig, LearnedFuser
from .loop import Loop

TASKS = ("same", "offload")


@dataclass(frozen=True)
class TrainConfig:
    task: str = "same"
    lr: float = 2e-3
    warmup: int = 10
    weight_decay: float = 0.0
    clip: float = 1.0
    max_tokens: int | None = 20_000
    """Master tokens to train on (the budget); None: only `max_seconds` bounds the run."""
    max_seconds: float | None = None
    seed: int = 0
    threads: int | None = 1
    checkpoint_every: int = 20
    diverge_factor: float = 2.0
    """Stop when the running loss exceeds this multiple of the master's own running loss on the same chunks."""
    eval_every: int | None = None
    """Steps between validation passes (needs `validation=` chunks; None: no validation). The fuser kept at the end
    is the one with the lowest validation loss, the untrained start (= the master) included."""
    patience: int | None = None
    """Stop after this many validation passes without a new best (None: run the whole budget)."""
    gate_lr: float | None = None
    """Learning rate of a concat fuser's gate and key scale (None: lr). With FuserConfig(opening='log') Adam moves
    log g by about this much per step: 2e-2 lets a gate change e-fold in 50 steps."""

    def __post_init__(self) -> None:
        checks.choice("TrainConfig task", self.task, TASKS)
        checks.number("TrainConfig lr", self.lr, 0, low_open=True)
        checks.integer("TrainConfig warmup", self.warmup, 0)
        checks.number("TrainConfig weight_decay", self.weight_decay, 0)
        checks.number("TrainConfig clip", self.clip, 0, low_open=True)
        checks.number("TrainConfig diverge_factor", self.diverge_factor, 1, low_open=True)
        checks.integer("TrainConfig seed", self.seed, 0)
        checks.integer("TrainConfig checkpoint_every", self.checkpoint_every, 1)
        for name, low in (("max_tokens", 1), ("threads", 1), ("eval_every", 1), ("patience", 1)):
            if getattr(self, name) is not None:
                checks.integer(f"TrainConfig {name}", getattr(self, name), low)
        if self.gate_lr is not None:
            checks.number("TrainConfig gate_lr", self.gate_lr, 0, low_open=True)
        if self.max_seconds is not None:
            checks.number("TrainConfig max_seconds", self.max_seconds, 0, low_open=True)
        if self.max_tokens is None and self.max_seconds is None:
            raise FusionLabError("TrainConfig needs a budget: max_tokens, max_seconds, or both.")
        if self.patience is not None and self.eval_every is None:
            raise FusionLabError(f"TrainConfig patience={self.patience} needs eval_every (validation passes to be "
                                 "patient over); set eval_every, e.g. 10.")


@dataclass
class TrainResult:
    fuser: LearnedFuser
    history: pd.DataFrame
    manifest: dict[str, Any] = field(default_factory=dict)


@contextmanager
def _frozen(*lms: LM) -> Iterator[None]:
    """Both models frozen for the run (only the fuser learns); their flags restored after."""
    saved = [(p, p.requires_grad) for lm in lms for p in lm.model.parameters()]
    for p, _ in saved:
        p.requires_grad_(False)
    try:
        yield
    finally:
        for p, flag in saved:
            p.requires_grad_(flag)


def config_hash(fuser: LearnedFuser, train: TrainConfig, chunks: list[TrainChunk]) -> str:
    """What a checkpoint must match to be resumed: models, fuser, data and schedule (a budget may grow)."""
    schedule = {k: v for k, v in asdict(train).items() if k not in ("max_tokens", "max_seconds", "checkpoint_every")}
    raw = json.dumps([asdict(fuser.config), schedule, fuser.meta["master"]["fingerprint"],
                      fuser.meta["slave"]["fingerprint"], fuser.meta["layer_map"],
                      hashlib.sha256("\x00".join(c.text + "\x01" + (c.context or "") + "\x02" + (c.doc or "")
                                                for c in chunks).encode())
                      .hexdigest()], sort_keys=True)
    return hashlib.sha256(raw.encode()).hexdigest()


def train_fuser(master: LM, slave: LM, chunks: list[TrainChunk], config: FuserConfig = FuserConfig(),
                train: TrainConfig = TrainConfig(), projector: LstsqProjector | None = None,
                checkpoint: str | Path | None = None, progress: bool = True,
                validation: list[TrainChunk] | None = None) -> TrainResult:
    """Train a fuser (its warm start: `projector`, else a fresh fl.fit_lstsq) and return it with its loss curve.
    `validation`: chunks of documents disjoint from `chunks` (and from any evaluation), scored every
    `train.eval_every` steps; the fuser returned is the one that scored best there."""
    check_chunks(chunks, train.task)
    if validation:
        check_chunks(validation, train.task)
        shared = {c.doc for c in chunks if c.doc} & {c.doc for c in validation if c.doc}
        if shared:
            raise FusionLabError(f"validation chunks come from training documents {sorted(shared)[:3]}: split by "
                                 "document (nb07_corpora's 'validation' split), never by window.")
    if train.task == "offload" and config.mode != "concat":
        raise FusionLabError("task='offload' needs FuserConfig(mode='concat'): the master has no own keys at the "
                             "context's positions for blend to edit.")
    with fixed_threads(train.threads), _frozen(master, slave):
        torch.manual_seed(train.seed)
        base = projector or fit_lstsq(master, slave)
        fuser = LearnedFuser(base, config)
        with fuse(master, [Slave(slave, layer_map=fuser.layer_map, projector=fuser, mode=config.mode,
                                 align="mean")]) as fused:
            n = len(chunks)
            reads = document_derangement(chunks, train.seed) if config.input == "shuffled" else list(range(n))
            data = prepare(fused, chunks, train.task, reads)
            held = None
            if validation:
                v_reads = (document_derangement(validation, train.seed) if config.input == "shuffled"
                           else list(range(len(validation))))
                held = prepare(fused, validation, train.task, v_reads)
            loop = Loop(fused, fuser, data, train, config_hash(fuser, train, chunks + list(validation or [])),
                        Path(checkpoint) if checkpoint else None, held)
            with tqdm(desc=f"train {slave.name}->{master.name} ({config.mode}, {config.input})", disable=not progress,
                      total=train.max_tokens) as bar:
                history = loop.run(lambda tok, loss: (bar.update(tok), bar.set_postfix(loss=f"{loss:.3f}")))
    steps = history["loss"].notna() if "loss" in history else pd.Series([], dtype=bool)
    trained = history[steps]
    manifest = {"train": asdict(train), "config": asdict(config), "steps": len(trained),
                "tokens": int(trained["tokens"].max()) if len(trained) else 0,
                "seconds": float(trained["seconds"].max()) if len(trained) else 0.0,
                "start_loss": float(trained["loss"].iloc[0]) if len(trained) else None,
                "end_gain_mean20": float(trained["gain"].tail(20).mean()) if len(trained) else None,
                "chunks": n, "validation_chunks": len(validation or []),
                "date": time.strftime("%Y-%m-%dT%H:%M:%S"), "torch": torch.__version__}
    if loop.best is not None:
        manifest.update(best_step=loop.best["step"], best_val_loss=loop.best["val_loss"],
                        val_master=loop.evals[0]["val_master"], best_val_gain=loop.evals[0]["val_master"] -
                        loop.best["val_loss"], stopped_early=loop.stopped_early)
    fuser.meta["training"] = manifest
    return TrainResult(fuser, history, manifest)
