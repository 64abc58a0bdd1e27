"""`train_fuser`: learn a fuser between two frozen models with the master's next-token loss, on this CPU.

    task='same'     both read a text (C2C); loss on the master's tokens, slots at the same positions
    task='offload'  the slave reads a context, the master only the continuation after it (positions start at C);
                    loss on the continuation: the fuser is rewarded only for carrying what the master did not read

Both models are frozen; only the fuser learns. The slave's K/V for every text are captured once and kept. Slots are
built by the engine's own code (`ResolvedSlave.to_master`: alignment, projection, master-frame RoPE) and attended by
`train_attention` (the inference rules as differentiable math), so the trained fuser behaves the same at inference.
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

import numpy as np
import pandas as pd
import torch
import torch.nn.functional as F

from ..errors import FusionLabError
from .determinism import fixed_threads
from .fit import fit_lstsq
from .fuse import FusedModel, fuse
from .fuser import FuserConfig, LearnedFuser
from .lm import LM
from .projector import LstsqProjector
from .slave import Slave
from .train_attention import TrainSlots
from .train_loop import Loop, TrainingDiverged  # noqa: F401  (TrainingDiverged re-exported for callers)

TASKS = ("same", "offload")


@dataclass(frozen=True)
class TrainChunk:
    """One training example: `text` the master reads; `context` the slave reads first (task='offload' only)."""

    text: str
    context: str | None = None


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

    def __post_init__(self) -> None:
        if self.task not in TASKS:
            raise FusionLabError(f"TrainConfig task={self.task!r}; use one of {TASKS}.")
        for name in ("max_tokens", "max_seconds"):
            v = getattr(self, name)
            if v is not None and not v > 0:
                raise FusionLabError(f"TrainConfig {name} must be > 0 (or None), got {v!r}.")
        if self.max_tokens is None and self.max_seconds is None:
            raise FusionLabError("TrainConfig needs a budget: max_tokens, max_seconds, or both.")
        if not self.lr > 0 or not math.isfinite(self.lr):
            raise FusionLabError(f"TrainConfig lr must be a positive number, got {self.lr!r}.")


@dataclass
class Prepared:
    """A chunk ready to train on: master ids and start, the slave's captured K/V, alignment and slot positions."""

    ids: torch.Tensor
    start: int
    cap: Any
    al: Any
    pos: torch.Tensor


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


def _prepare(fused: FusedModel, chunks: list[TrainChunk], task: str, reads: list[int]) -> list[Prepared]:
    """Tokenize each chunk for the master; capture the slave's K/V of chunk reads[i] (a derangement: shuffled)."""
    master, rs = fused.master, fused.slaves[0]
    out = []
    for i, ch in enumerate(chunks):
        other = chunks[reads[i]]
        if task == "offload":
            ctx = master.encode(ch.context)
            ids, start = master.encode(ch.text, special_tokens=False), ctx.shape[1]
            read_text, read_ids = other.context, master.encode(other.context)
        else:
            ids, start = master.encode(ch.text), 0
            read_text, read_ids = other.text, master.encode(other.text)
        s_ids, al = rs.slave_inputs(master, read_ids, read_text)
        cap = rs.capture_kv(s_ids)
        cap.keys = {j: t.clone() for j, t in cap.keys.items()}  # out of inference mode: autograd may save them
        cap.values = {j: t.clone() for j, t in cap.values.items()}
        limit = start if task == "offload" else ids.shape[1]  # another text may be longer: keep what fits
        keep = al.master_index < limit
        if not bool(keep.all()):
            al = type(al)(al.master_index[keep], [g for g, k in zip(al.groups, keep.tolist()) if k], al.strategy,
                          al.n_master, al.n_slave)
        out.append(Prepared(ids, start, cap, al, al.master_index.to(master.device)))
    return out


def _check_chunks(chunks: list[TrainChunk], task: str) -> None:
    if not chunks:
        raise FusionLabError("train_fuser needs training chunks; got none (see experiments.corpora).")
    for n, ch in enumerate(chunks):
        if not isinstance(ch, TrainChunk) or len(ch.text.strip()) < 16:
            raise FusionLabError(f"training chunk {n} is empty or too short (< 16 characters); give real text.")
        if task == "offload" and not (ch.context and ch.context.strip()):
            raise FusionLabError(f"task='offload' needs a context in every chunk; chunk {n} has none.")


def _slots(fused: FusedModel, fuser: LearnedFuser | None, p: Prepared) -> dict[int, list[TrainSlots]]:
    """Slots for every mapped layer, built by the engine's own code; gates from the fuser (learnable) or, for any
    other projector, the resolved slave's fixed gates."""
    rs = fused.slaves[0]
    slots = {}
    for i in rs.layer_map.pairs:
        gate = fuser.gate_tensor(i) if fuser is not None else torch.tensor(rs.gates[i])
        if fuser is None and rs.gates[i] == 0:
            continue
        k, v = rs.to_master(fused.master, p.cap, p.al, i, p.pos)
        slots[i] = [TrainSlots(k, v, p.pos, gate, rs.slave.mode, rs.slave.window_slots)]
    return slots


def loss_of(fused: FusedModel, fuser: LearnedFuser | None, p: Prepared) -> torch.Tensor:
    """The master's mean next-token loss on the chunk with the slave's slots injected (differentiable through a
    fuser; `fuser=None` scores any other projector the same way)."""
    logits = fused.train_logits(p.ids, _slots(fused, fuser, p), p.start)
    return F.cross_entropy(logits[0, :-1].float(), p.ids[0, 1:])


def _derangement(n: int, seed: int) -> list[int]:
    if n < 2:
        raise FusionLabError("a shuffled control needs at least 2 training chunks.")
    rng = np.random.default_rng(seed + 7)
    while True:
        perm = rng.permutation(n)
        if not (perm == np.arange(n)).any():
            return perm.tolist()


def config_hash(fuser: LearnedFuser, train: TrainConfig, chunks: list[TrainChunk]) -> str:
    """What a checkpoint must match to be resumed: models, fuser, data and schedule (a budget may grow)."""
    schedule = {k: v for k, v in asdict(train).items() if k not in ("max_tokens", "max_seconds", "checkpoint_every")}
    raw = json.dumps([asdict(fuser.config), schedule, fuser.meta["master"]["fingerprint"],
                      fuser.meta["slave"]["fingerprint"], fuser.meta["layer_map"],
                      hashlib.sha256("\x00".join(c.text + "\x01" + (c.context or "") for c in chunks).encode())
                      .hexdigest()], sort_keys=True)
    return hashlib.sha256(raw.encode()).hexdigest()


def train_fuser(master: LM, slave: LM, chunks: list[TrainChunk], config: FuserConfig = FuserConfig(),
                train: TrainConfig = TrainConfig(), projector: LstsqProjector | None = None,
                checkpoint: str | Path | None = None, progress: bool = True) -> TrainResult:
    """Train a fuser (its warm start: `projector`, else a fresh fl.fit_lstsq) and return it with its loss curve."""
    from tqdm.auto import tqdm

    _check_chunks(chunks, train.task)
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
            reads = _derangement(n, train.seed) if config.input == "shuffled" else list(range(n))
            data = _prepare(fused, chunks, train.task, reads)
            loop = Loop(fused, fuser, data, train, config_hash(fuser, train, chunks),
                        Path(checkpoint) if checkpoint else None, loss_of)
            with tqdm(desc=f"train {slave.name}->{master.name} ({config.mode}, {config.input})", disable=not progress,
                      total=train.max_tokens) as bar:
                history = loop.run(lambda tok, loss: (bar.update(tok), bar.set_postfix(loss=f"{loss:.3f}")))
    manifest = {"train": asdict(train), "config": asdict(config), "steps": int(history["step"].max()) + 1
                if len(history) else 0, "tokens": int(history["tokens"].max()) if len(history) else 0,
                "seconds": float(history["seconds"].max()) if len(history) else 0.0,
                "start_loss": float(history["loss"].iloc[0]) if len(history) else None,
                "end_gain_mean20": float(history["gain"].tail(20).mean()) if len(history) else None,
                "chunks": n, "date": time.strftime("%Y-%m-%dT%H:%M:%S"), "torch": torch.__version__}
    fuser.meta["training"] = manifest
    return TrainResult(fuser, history, manifest)
