"""Notebook 07's logic: learned fusers per pair with their controls, trained (full mode) or reloaded, and measured.

Per slave: the fuser (blend, same-text task), its three controls (shuffled pairing, noise input, constant slots of
matched size), and an offload-task fuser (concat: the slave reads the preceding window, the master the next). Full
mode trains and writes them to data/fusers/ (committed, with their loss curves); the default and QUICK runs reload
those, and train a short run only where none exists. Everything here reads held-out text only.
"""
from __future__ import annotations

import hashlib
import json
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import torch

from ..analysis.stats import cluster_bootstrap_ci
from ..engine.fuse import fuse
from ..training.fuser import FuserConfig, LearnedFuser, match_table
from ..engine.kv_capture import capture_kv
from ..engine.lm import LM
from ..engine.projector import LstsqProjector
from ..engine.slave import Slave
from ..training.chunks import TrainChunk, document_derangement, loss_of, prepare
from ..training.train import TrainConfig, train_fuser
from ..errors import FusionLabError
from ..paths import cache_dir, data_dir
from . import nb07_corpora as corpora
from .nb07_curve_stats import pooled_domains

VARIANTS = ("slave", "shuffled", "noise", "constant")


@dataclass
class FuserPlan:
    slaves: list[str]
    variants: list[str]
    offload: bool
    budget_tokens: int
    """Training budget per run when a run trains (full: the committed fusers)."""
    eval_chunks: int
    """Held-out chunks per domain for the NLL tables."""
    humaneval: int | None
    """HumanEval problems for the fuser settings (None: all 164)."""
    sweep_problems: int
    niah_lengths: list[int]
    offload_lengths: list[int]
    width: int = 32
    tokens: int = 256
    sweep_gates: tuple[float, ...] = (0.1, 0.3, 1.0)
    """lstsq gates of the training-free sweep (gate 0 is the master alone, measured once)."""
    train: bool = False
    """Train where no committed fuser exists (else: say so and skip that setting)."""
    lr: float = 2e-3
    gate_lr: float = 2e-2
    """The offload fusers' gate and key scale ('log' opening) learn at this rate (notebook 10's recipe)."""
    eval_every: int | None = None
    """Validation passes (chunks of the 'validation' documents) every this many steps when a run trains; the best
    state is kept (None: no validation, the committed fusers' recipe)."""
    patience: int | None = None
    val_chunks: int = 4
    """Validation chunks per domain (at most 2 per document)."""
    eval_per_doc: int = 2
    """Held-out chunks per document at most: the held-out set spans files, and every control has another document."""


def plan(size: str) -> FuserPlan:
    slaves = ["smollm2-135m-instruct", "gemma3-270m"]
    if size == "quick":
        return FuserPlan(slaves[:1], ["slave", "shuffled"], False, 512, 2, 2, 2, [512], [256], tokens=128, train=True,
                         sweep_gates=(1.0,), eval_per_doc=1)
    if size == "default":
        return FuserPlan(slaves, list(VARIANTS), True, 8_000, 12, 16, 8, [1024], [256, 1024], train=True,
                         eval_every=8, patience=4)
    if size == "full":
        return FuserPlan(slaves, list(VARIANTS), True, 40_000, 32, None, 16, [1024, 2048, 4096], [256, 1024, 2048],
                         train=True, eval_every=20, patience=5)
    raise FusionLabError(f"unknown run size {size!r}: use 'quick', 'default' or 'full'.")


def fuser_dir(committed: bool) -> Path:
    return data_dir() / "fusers" if committed else cache_dir() / "fusers"


SLAVE_FREE_TABLE = 64
"""Positions of a same-text fuser's own slave-free table (`FuserConfig.constant_term`), here and in the learning
curve (the old constant controls used about 64)."""


def config_for(variant: str, task: str, base: LearnedFuser | None, width: int) -> FuserConfig:
    """Same-text fusers blend (a zero-initialised residual: they start as the master) and carry a slave-free table
    (`constant_term`), so that one against the constant control (matched to the fuser's whole parameter count, table
    included) isolates what the slave adds, not what any adapter buys. Offload fusers concat with the
    recipe notebook 10's positive control showed can open (`FuserConfig.opening='log'`): they start at the lstsq
    channel at full gate, keys as projected, and gate and key scale both learn from step one; validation keeps the
    best state, so a start worse than the master is never what is kept unless nothing beats it."""
    mode = "concat" if task == "offload" else "blend"
    if variant == "constant":
        if base is None:
            raise FusionLabError("a constant-slot control needs its fuser first (to match the parameter count).")
        return FuserConfig(mode=mode, input="constant",
                           table=match_table(base.param_count(), len(base.layers), base.heads, base.head_dim))
    if task == "offload":
        return FuserConfig(mode=mode, kind="linear", width=width, input=variant, opening="log", log_gate=0.0,
                           calibrate_keys=False)
    return FuserConfig(mode=mode, kind="linear", width=width, input=variant, constant_term=True,
                       table=SLAVE_FREE_TABLE)


def name_of(master: LM, slave: LM, task: str, cfg: FuserConfig, budget: int) -> str:
    return f"{master.name}__{slave.name}__{task}_{cfg.mode}_{cfg.input}_{budget}"


def train_config(p: FuserPlan, task: str) -> TrainConfig:
    return TrainConfig(task=task, max_tokens=p.budget_tokens, lr=p.lr, gate_lr=p.gate_lr if task == "offload" else None,
                       threads=2, eval_every=p.eval_every, patience=p.patience)


def obtain(master: LM, slave: LM, proj: LstsqProjector, chunks: list[TrainChunk], cfg: FuserConfig, task: str,
           p: FuserPlan, size: str) -> tuple[LearnedFuser | None, pd.DataFrame, str]:
    """(fuser, loss curve, where it came from). A finished run of this exact recipe (both fingerprints, the fuser
    config and the training config, budget included) is reloaded; else it trains (resumable from its checkpoint,
    with validation by document when the plan asks) and is saved: committed under data/fusers/ for the default and
    full sizes, in the cache for QUICK (or skipped when p.train is False)."""
    name = name_of(master, slave, task, cfg, p.budget_tokens)
    tc = train_config(p, task)
    committed = size != "quick"
    path = fuser_dir(committed) / f"{name}.safetensors"
    if path.exists() and path.with_suffix(".done").exists():
        fuser = LearnedFuser.load(path)
        same = (fuser.meta["master"]["fingerprint"], fuser.meta["slave"]["fingerprint"]) == \
            (master.fingerprint, slave.fingerprint)
        if same and fuser.config == cfg and fuser.meta.get("training", {}).get("train") == json.loads(
                json.dumps(asdict(tc))):
            hist = path.with_suffix(".history.csv")
            return fuser, pd.read_csv(hist) if hist.exists() else pd.DataFrame(), \
                "committed" if committed else "cache"
    if not p.train:
        return None, pd.DataFrame(), "missing"
    digest = hashlib.sha256(json.dumps([asdict(cfg), asdict(tc)], sort_keys=True).encode()).hexdigest()[:12]
    ck = cache_dir() / "fusers" / f"{name}.{digest}.ckpt"  # a changed recipe never meets an old checkpoint
    validation = validation_chunks(master.tokenizer, corpora.documents(), p, task) if p.eval_every else None
    result = train_fuser(master, slave, chunks, cfg, tc, projector=proj, checkpoint=ck, validation=validation)
    path = result.fuser.save(path, training={**result.manifest, "data": corpora.manifest(corpora.documents())})
    result.history.to_csv(path.with_suffix(".history.csv"), index=False)
    path.with_suffix(".done").write_text(json.dumps(result.manifest, indent=2))
    return result.fuser, result.history, "trained now"


# --- held-out loss ---------------------------------------------------------------------------------------------
@dataclass
class Evaluated:
    """A way to score a held-out chunk: the master alone, or a fuser (reads: 'matched' or 'shuffled' slave text)."""

    name: str
    fuser: LearnedFuser | LstsqProjector | None
    slave: LM | None = None
    mode: str = "blend"
    reads: str = "matched"
    role: str = "fuser"
    gate: float = 1.0


@torch.no_grad()
def chunk_nll(master: LM, e: Evaluated, chunks: list[TrainChunk], task: str) -> list[float]:
    """Mean next-token loss per chunk (offload: on the continuation; the master alone = the floor)."""
    import torch.nn.functional as F

    if e.fuser is None:
        out = []
        for ch in chunks:
            start = master.encode(ch.context).shape[1] if task == "offload" else 0
            ids = master.encode(ch.text, special_tokens=task != "offload")
            if e.role == "skyline":  # the master reads the context too; loss on the continuation only
                ctx = master.encode(ch.context)
                logits = master.model(torch.cat([ctx, ids], 1)).logits[:, ctx.shape[1]:]
            else:
                logits = master.model(input_ids=ids, position_ids=torch.arange(start, start + ids.shape[1])[None]).logits
            out.append(float(F.cross_entropy(logits[0, :-1].float(), ids[0, 1:])))
        return out
    with fuse(master, [Slave(e.slave, layer_map=e.fuser.layer_map, projector=e.fuser, mode=e.mode, gate=e.gate,
                             align="mean")]) as fused:
        n = len(chunks)  # the control reads a chunk of another document (a neighbouring window would leak)
        reads = document_derangement(chunks, 0) if e.reads == "shuffled" else list(range(n))
        data = prepare(fused, chunks, task, reads)
        learned = e.fuser if isinstance(e.fuser, LearnedFuser) else None
        return [float(loss_of(fused, learned, p)) for p in data]


def nll_table(master: LM, evaluated: list[Evaluated], chunks: dict[str, list[TrainChunk]], task: str) -> pd.DataFrame:
    from tqdm.auto import tqdm

    rows = []
    for e in tqdm(evaluated, desc=f"held-out NLL ({task})", leave=False):
        for domain, chs in chunks.items():
            for k, (ch, v) in enumerate(zip(chs, chunk_nll(master, e, chs, task))):
                rows.append({"setting": e.name, "role": e.role, "domain": domain, "chunk": k,
                             "doc": ch.doc or f"{domain}/{k}", "nll": v})
    return pd.DataFrame(rows)


def paired_gain(nll: pd.DataFrame, baseline: str) -> pd.DataFrame:
    """Per setting and domain: mean NLL change vs `baseline` (negative = better) over chunks, with a paired 95 % CI
    that resamples *documents* (chunks of one file are not independent; tables without a `doc` column fall back to
    one document per chunk). `n` chunks, `docs` documents. Domain 'all' pools the domains with at least `MIN_DOCS`
    held-out documents (a thin domain is shown alone, never in the pooled verdict; `pooled` names those pooled);
    when none has that many, it pools every domain and says so."""
    if "doc" not in nll:
        nll = nll.assign(doc=nll["domain"] + "/" + nll["chunk"].astype(str))
    wide = nll.pivot_table(index=["domain", "doc", "chunk"], columns="setting", values="nll")
    enough = pooled_domains(nll) or sorted(set(nll["domain"]))
    pooled = wide[wide.index.get_level_values("domain").isin(enough)]
    rows = []
    for s in wide.columns:
        if s == baseline:
            continue
        parts = [(domain, g) for domain, g in wide.groupby(level="domain")] + [("all", pooled)]
        for domain, g in parts:
            d = (g[s] - g[baseline]).dropna()
            docs = d.index.get_level_values("doc")
            lo, hi = cluster_bootstrap_ci(d.to_numpy(), docs)
            rows.append({"setting": s, "vs": baseline, "domain": domain, "n": len(d), "docs": docs.nunique(),
                         "delta": float(d.mean()) if len(d) else float("nan"), "lo": lo, "hi": hi,
                         "pooled": ", ".join(enough) if domain == "all" else domain})
    return pd.DataFrame(rows)


@torch.no_grad()
def edit_size(fuser: LearnedFuser, master: LM, slave: LM, chunks: list[TrainChunk]) -> pd.DataFrame:
    """Where the master listens: per layer, the learned gate (concat) and the RMS of the fuser's output relative to
    the master's own keys / values at those positions (blend: how much the residual edits)."""
    rows = []
    with fuse(master, [Slave(slave, layer_map=fuser.layer_map, projector=fuser, mode=fuser.config.mode,
                             align="mean")]) as fused:
        data = prepare(fused, chunks, "same", list(range(len(chunks))))
        rs = fused.slaves[0]
        for p in data:
            own = capture_kv(master, p.ids, fuser.layers)
            for i in fuser.layers:
                k, v = rs.to_master(master, p.cap, p.al, i, p.pos)
                ok = own.keys[i].index_select(2, p.pos)
                ov = own.values[i].index_select(2, p.pos)
                rows.append({"layer": i, "gate": fuser.learned_gates()[i],
                             "k_edit": float(k.pow(2).mean().sqrt() / ok.pow(2).mean().sqrt().clamp_min(1e-9)),
                             "v_edit": float(v.pow(2).mean().sqrt() / ov.pow(2).mean().sqrt().clamp_min(1e-9))})
    return pd.DataFrame(rows).groupby("layer", as_index=False).mean()


def nll_transfer(nll: pd.DataFrame, floor: str, skyline: str, setting: str, n_boot: int = 2000,
                 seed: int = 0) -> dict[str, Any]:
    """Offload on held-out text: (floor - fused) / (floor - skyline) of the mean NLL, paired bootstrap over
    documents (whole files resampled with their chunks; one document per chunk without a `doc` column)."""
    if "doc" not in nll:
        nll = nll.assign(doc=nll["domain"] + "/" + nll["chunk"].astype(str))
    wide = nll.pivot_table(index=["domain", "doc", "chunk"], columns="setting", values="nll")[[floor, skyline, setting]]
    by_doc = wide.dropna().groupby(level="doc")
    f, k, s = (by_doc[c].sum().to_numpy() for c in (floor, skyline, setting))  # per-document sums: ratio of means
    rate = lambda i: (f[i].sum() - s[i].sum()) / (f[i].sum() - k[i].sum())  # noqa: E731
    rng = np.random.default_rng(seed)
    with np.errstate(divide="ignore", invalid="ignore"):
        draws = np.array([rate(rng.integers(0, len(f), len(f))) for _ in range(n_boot)])
    lo, hi = np.quantile(draws[np.isfinite(draws)], [0.025, 0.975])
    return {"setting": setting, "n": int(by_doc.size().sum()), "docs": len(f), "transfer": float(rate(np.arange(len(f)))),
            "lo": float(lo), "hi": float(hi)}


def summary(runs: dict[tuple[str, str], tuple[Any, pd.DataFrame, str]]) -> pd.DataFrame:
    """One row per fuser: where it came from, its size, what training cost and how far it moved from the master."""
    rows = []
    for (slave, variant), (f, h, source) in runs.items():
        if f is None:
            rows.append({"slave": slave, "variant": variant, "source": source})
            continue
        t = f.meta.get("training", {})
        rows.append({"slave": slave, "variant": variant, "source": source, "mode": f.config.mode,
                     "trainable_params": f.param_count(), "tokens": t.get("tokens"), "seconds": t.get("seconds"),
                     "tokens_per_s": (t.get("tokens") or 0) / max(t.get("seconds") or 1e-9, 1e-9),
                     "gain_first20": float(h["gain"].head(20).mean()) if len(h) else None,
                     "gain_last20": float(h["gain"].tail(20).mean()) if len(h) else None})
    return pd.DataFrame(rows)


def training_chunks(tokenizer: Any, docs: list[Any], p: FuserPlan, task: str) -> list[TrainChunk]:
    """The training set of a plan: each domain capped at a third of the budget's chunks, so a budget that covers
    less than one epoch still sees code, English and Chinese alike (Chinese, the smallest, repeats)."""
    per = p.budget_tokens // p.tokens // 3 + 1
    return corpora.chunks(tokenizer, docs, "train", p.tokens, per_domain=per, task=task)


def validation_chunks(tokenizer: Any, docs: list[Any], p: FuserPlan, task: str) -> list[TrainChunk]:
    """The early-stopping set: chunks of the 'validation' documents (disjoint from training and held-out files), at
    most 2 per document so that one long file cannot be the whole set."""
    return corpora.chunks(tokenizer, docs, "validation", p.tokens, per_domain=p.val_chunks, task=task, per_doc=2)
