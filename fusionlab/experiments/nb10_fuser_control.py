"""A learned offload fuser on rungs where the channel is known to work (notebook 10): the positive control the
fuser verdicts of notebook 07 lack.

Notebook 07's offload fusers stayed closed (gate <= 0.06, key scale <= 0.07) on foreign slaves, and nobody could tell
"nothing to carry" from "training cannot open this parametrisation". Here the same recipe trains on an exact copy of
the master (the training-free channel carries everything) and on a partial rung (noise 10 %: two thirds of the NLL
gap), warm-started from the rung's own training-free channel (a sibling shares the master's geometry: the identity
map, written as an `lstsq` projector so the fuser's code path is notebook 07's), once per gate parametrisation
(`FuserConfig.opening`: 'zero', the old one, and 'log'), plus a shuffled-pairing fuser (trained on another document's
K/V: what training alone buys). Validation by document, early stopping, best state kept. Scored on held-out offload
windows of many files (the slave reads window k, the master only k+1):

    floor      the master alone                 skyline    the master reads window k too
    start      the rung's training-free channel (identity, gate 1)
    fuser      each trained fuser, and the same fuser reading window k of *another document*
    shuffled   the shuffled-pairing fuser reading the right document

transfer = (floor - x) / (floor - skyline), bootstrap over documents; each control is also compared paired, on the same
windows (the fuser's NLL minus the control's, bootstrap over documents); `nb10_fuser_claims.control_verdict` judges each
fuser. The default run adds noise 20 %, where the training-free channel has failed (X09: can training find one?).
"""
from __future__ import annotations

import hashlib
import json
import math
from contextlib import nullcontext
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Iterator

import pandas as pd
import torch

from ..cells import Cell, CellCache, cell_key, run_cells
from ..engine.lm import LM
from ..engine.projector import LstsqProjector
from ..errors import FusionLabError
from ..models.siblings import sibling, sibling_layer_map
from ..paths import cache_dir, data_dir
from ..training.chunks import TrainChunk
from ..training.fuser import FuserConfig, LearnedFuser
from ..training.loop import TrainingDiverged
from ..training.train import TrainConfig, train_fuser
from . import nb07_corpora as corpora
from . import nb07_fusers as fz
from .nb10_fuser_claims import control_verdict



@dataclass
class ControlPlan:
    rungs: list[str]
    openings: list[str]
    budget_tokens: int
    tokens: int = 128
    """Window length: the slave reads one window, the master the next."""
    eval_per_domain: int = 10
    """Held-out chunks per domain, at most `per_doc` from each document."""
    val_per_domain: int = 4
    per_doc: int = 2
    eval_every: int = 6
    patience: int = 3
    lr: float = 2e-3
    gate_lr: float = 2e-2
    width: int = 32
    committed: bool = True
    """Write the trained fusers to data/fusers (committed) rather than the cache."""
    domains: tuple[str, ...] = field(default=corpora.DOMAINS)
    foreign: list[str] = field(default_factory=list)
    """Foreign slaves (model names) trained with the same recipe, warm-started from their lstsq projectors."""
    foreign_openings: list[str] = field(default_factory=lambda: ["log"])


def control_plan(size: str) -> ControlPlan:
    if size == "quick":
        return ControlPlan(["noise:0"], ["log"], 128, tokens=48, eval_per_domain=2, val_per_domain=1, eval_every=1,
                           patience=2, committed=False, domains=("code", "english"), per_doc=1)
    if size == "default":
        return ControlPlan(["noise:0", "noise:0.1", "noise:0.2"], ["zero", "log"], 6144,
                           foreign=["smollm2-135m-instruct", "gemma3-270m"])
    if size == "full":
        return ControlPlan(["noise:0", "noise:0.1", "noise:0.2", "int4"], ["zero", "log"], 40_000, tokens=256,
                           eval_per_domain=16, val_per_domain=8, eval_every=10,
                           foreign=["smollm2-135m-instruct", "gemma3-270m"])
    raise FusionLabError(f"unknown run size {size!r}: use 'quick', 'default' or 'full'.")


def config_for(p: ControlPlan, opening: str, source: str = "slave") -> FuserConfig:
    """'zero' starts closed (the master); 'log' starts *at* the warm start's channel (g = 1, keys as they are): on
    a sibling that is its training-free transfer exactly, so training has to beat the rung, not reach it."""
    return FuserConfig(mode="concat", width=p.width, opening=opening, input=source, log_gate=0.0,
                       calibrate_keys=False)


def train_config(p: ControlPlan) -> TrainConfig:
    return TrainConfig(task="offload", lr=p.lr, gate_lr=p.gate_lr, max_tokens=p.budget_tokens, eval_every=p.eval_every,
                       patience=p.patience, threads=2)


def splits(tokenizer: Any, docs: list[corpora.Doc], p: ControlPlan) -> dict[str, list[TrainChunk]]:
    """Offload chunks of each split (documents disjoint): train (capped so every domain shows in the budget),
    validation and held-out (per domain caps)."""
    docs = [d for d in docs if d.domain in p.domains]
    per_train = p.budget_tokens // p.tokens // len(p.domains) + 1

    def cut(split: str, n: int) -> list[TrainChunk]:
        return corpora.chunks(tokenizer, docs, split, p.tokens, per_domain=n, task="offload", per_doc=p.per_doc)
    return {"train": cut("train", per_train), "validation": cut("validation", p.val_per_domain),
            "heldout": cut("heldout", p.eval_per_domain)}


def fuser_path(master: LM, recipe: str, opening: str, p: ControlPlan, source: str = "slave") -> Path:
    root = data_dir() / "fusers" if p.committed else cache_dir() / "fusers"
    return root / f"{master.name}__{recipe.replace(':', '-')}__offload_{opening}_{source}_{p.budget_tokens}.safetensors"


def identity_start(master: LM, sib: LM) -> LstsqProjector:
    """A sibling's training-free channel (its keys and values as they are, on its home layer map) as an `lstsq`
    projector: W = [I; 0] per mapped layer, so a fuser warm-starts from what the rung already carries."""
    home = sibling_layer_map(master, sib)
    f = master.spec.kv_heads * master.spec.head_dim
    eye = torch.cat([torch.eye(f), torch.zeros(1, f)])  # (F + 1, F): the last row is the bias
    geo = lambda lm: {"name": lm.name, "fingerprint": lm.fingerprint, "kv_heads": lm.spec.kv_heads,  # noqa: E731
                      "head_dim": lm.spec.head_dim}
    meta = {"master": geo(master), "slave": geo(sib), "layer_map": home.to_dict(), "ridge": 0.0, "start": "identity"}
    return LstsqProjector({f"{kind}.{i}": eye.clone() for i in home.pairs for kind in "kv"}, meta)


def obtain(master: LM, sib: LM, recipe: str, opening: str, p: ControlPlan, data: dict[str, list[TrainChunk]],
           start: LstsqProjector, source: str = "slave") -> tuple[LearnedFuser, pd.DataFrame, str]:
    """The trained fuser of one (rung, opening, input): reloaded when a finished run of this exact recipe exists
    (its manifest's configs and both fingerprints match), else trained (resumable from its checkpoint) and saved."""
    path, cfg, tc = fuser_path(master, recipe, opening, p, source), config_for(p, opening, source), train_config(p)
    done = path.with_suffix(".done")
    if path.exists() and done.exists():
        f = LearnedFuser.load(path)
        t = f.meta.get("training", {})
        if (f.meta["master"]["fingerprint"], f.meta["slave"]["fingerprint"]) == (master.fingerprint, sib.fingerprint) \
                and f.config == cfg and t.get("train") == json.loads(json.dumps(asdict(tc))):
            return f, pd.read_csv(path.with_suffix(".history.csv")), "committed" if p.committed else "cache"
    proj = start
    digest = hashlib.sha256(json.dumps([asdict(cfg), asdict(tc)], sort_keys=True).encode()).hexdigest()[:12]
    ck = cache_dir() / "fusers" / f"{path.stem}.{digest}.ckpt"  # a changed recipe never meets an old checkpoint
    r = train_fuser(master, sib, data["train"], cfg, tc, projector=proj, checkpoint=ck, validation=data["validation"])
    r.fuser.save(path, training={**r.manifest, "recipe": recipe})
    r.history.to_csv(path.with_suffix(".history.csv"), index=False)
    done.write_text(json.dumps(r.manifest, indent=2))
    return r.fuser, r.history, "trained now"


def train_runs(master: LM, p: ControlPlan, data: dict[str, list[TrainChunk]],
               foreign: dict[str, tuple[LM, LstsqProjector]]) -> dict[tuple[str, str, str], dict[str, Any]]:
    """Every fuser of the plan trained (or found finished) as a grid of cells, one per (slave, opening, input), so
    the runs spread over Ray's workers when asked (`cells.run_cells`); each saves its fuser where `obtain` reloads
    it. Returns, per run, {"diverged": why it has no fuser ('' when it has one: a shuffled-pairing start past the
    divergence bound is recorded, never retried), "trained_now": whether this call trained it}."""
    runs = [(label, o, "slave") for label, openings in _openings(p, foreign) for o in openings]
    runs += [(label, openings[-1], "shuffled") for label, openings in _openings(p, foreign)]
    cells = [Cell(cell_key("fuser control run", master.fingerprint, label, opening, source,
                           foreign[label][0].fingerprint if label in foreign else label,
                           asdict(config_for(p, opening, source)), asdict(train_config(p)),
                           [c.text for c in data["train"]], [c.text for c in data["validation"]]),
                  {"rung": label, "opening": opening, "source": source}, (label, opening, source))
             for label, opening, source in runs]

    def compute(_: Any, c: Cell) -> dict[str, Any]:
        label, opening, source = c.item
        lm, warm = foreign[label] if label in foreign else (sib := sibling(master, label), identity_start(master, sib))
        try:
            return {"fuser": obtain(master, lm, label, opening, p, data, warm, source=source)[2], "diverged": ""}
        except TrainingDiverged as e:  # its start (the warm start fed another document's K/V) is past the bound
            return {"fuser": None, "diverged": str(e).split(";")[0]}

    store = CellCache((data_dir() / "results" if p.committed else cache_dir()) / "10_fuser_control_runs.jsonl")
    todo = {c.key for c in cells if c.key not in store}
    recs = run_cells(store, cells, nullcontext, compute, desc="fuser control: training")
    return {c.item: {"diverged": r["diverged"], "trained_now": c.key in todo and r["fuser"] == "trained now"}
            for c, r in zip(cells, recs)}


def _openings(p: ControlPlan, foreign: dict[str, Any]) -> list[tuple[str, list[str]]]:
    return [(r, p.openings) for r in p.rungs] + [(label, p.foreign_openings) for label in foreign]


def measure(master: LM, p: ControlPlan, docs: list[corpora.Doc],
            foreign: dict[str, tuple[LM, LstsqProjector]] | None = None) -> tuple[pd.DataFrame, pd.DataFrame, dict]:
    """Every rung's fusers (one per opening, warm-started from the rung's identity channel) and each foreign
    slave's (`p.foreign_openings`, warm-started from its lstsq projector), each slave with a shuffled-pairing fuser:
    trained or reloaded, then scored on the held-out chunks. Returns the per-chunk NLL table, one summary row per
    slave-fed fuser, and the training histories."""
    data = splits(master.tokenizer, docs, p)
    held = {d: [c for c in data["heldout"] if c.doc and c.doc.startswith(d + "/")] for d in p.domains}
    held = {d: v for d, v in held.items() if len({c.doc for c in v}) >= 2}  # a control needs another document
    if not held:
        raise FusionLabError("no domain has held-out chunks from 2 documents: lower ControlPlan.tokens.")
    runs = train_runs(master, p, data, foreign or {})
    base = [fz.Evaluated(FLOOR, None, role="floor"), fz.Evaluated(SKYLINE, None, role="skyline")]
    floor_sky = fz.nll_table(master, base, held, "offload")
    tables, rows, histories, diverged = [floor_sky], [], {}, {}

    def slaves() -> Iterator[tuple[str, LM, LstsqProjector, str, list[str]]]:
        for recipe in p.rungs:  # one sibling in memory at a time
            sib = sibling(master, recipe)
            yield recipe, sib, identity_start(master, sib), "identity", p.openings
        for label, (lm, proj) in (foreign or {}).items():
            yield label, lm, proj, "lstsq", p.foreign_openings

    for label, lm, warm, how, openings in slaves():
        start = f"{label} training-free ({how}, g=1)"
        ev = [fz.Evaluated(start, warm, lm, mode="concat", role="start")]
        trained = {}
        for opening in openings:
            f, hist, source = obtain(master, lm, label, opening, p, data, warm)  # finished by train_runs: reloads
            trained[opening] = f, hist, "trained now" if runs[(label, opening, "slave")]["trained_now"] else source
            name = f"{label} fuser ({opening})"
            ev += [fz.Evaluated(name, trained[opening][0], lm, mode="concat", role="fuser"),
                   fz.Evaluated(f"{name}, other document", trained[opening][0], lm, mode="concat", reads="shuffled",
                                role="control")]
            histories[f"{label} {opening}"] = trained[opening][1]
        diverged_why = runs[(label, openings[-1], "shuffled")]["diverged"]
        if diverged_why:  # no such control then: the rule cannot call the fuser above it
            diverged[label] = diverged_why
        else:
            shuffled = obtain(master, lm, label, openings[-1], p, data, warm, source="shuffled")
            histories[f"{label} {openings[-1]}, shuffled pairing"] = shuffled[1]
            ev.append(fz.Evaluated(f"{label} shuffled-pairing fuser", shuffled[0], lm, mode="concat", role="control"))
        nll = pd.concat([floor_sky, fz.nll_table(master, ev, held, "offload")], ignore_index=True)
        tables.append(nll.iloc[len(floor_sky):].assign(rung=label))
        rows += [{**_row(nll, label, opening, f, hist, source, start), "start": how,
                  "shuffled_diverged": diverged.get(label, "")} for opening, (f, hist, source) in trained.items()]
        del lm, warm
    table = pd.DataFrame(rows)
    table["verdict"] = [control_verdict(r) for r in table.to_dict("records")]
    return pd.concat(tables, ignore_index=True), table, histories


FLOOR, SKYLINE = "floor (master alone)", "skyline (master reads it)"


def _row(nll: pd.DataFrame, recipe: str, opening: str, f: LearnedFuser, hist: pd.DataFrame, source: str,
         start: str) -> dict[str, Any]:
    """One slave-fed fuser's summary: transfer, its two controls, its change against the rung's start."""
    name = f"{recipe} fuser ({opening})"
    tr = lambda s: fz.nll_transfer(nll, FLOOR, SKYLINE, s)  # noqa: E731
    pairing_name = f"{recipe} shuffled-pairing fuser"
    nan = {"transfer": float("nan"), "hi": float("nan")}
    own, other, first = tr(name), tr(f"{name}, other document"), tr(start)
    pairing = tr(pairing_name) if pairing_name in set(nll["setting"]) else nan  # NaN: never beaten
    vs, other_doc, shuffled = (_paired(nll, name, b) for b in (start, f"{name}, other document", pairing_name))
    t = f.meta.get("training", {})
    return {"rung": recipe, "opening": opening, "source": source, "docs": own["docs"], "n": own["n"],
            "start_transfer": first["transfer"], "start_lo": first["lo"], "start_hi": first["hi"],
            "transfer": own["transfer"], "lo": own["lo"], "hi": own["hi"],
            "control_transfer": other["transfer"], "control_hi": other["hi"],
            "shuffled_transfer": pairing["transfer"], "shuffled_hi": pairing["hi"],
            "vs_start": vs["delta"], "vs_start_lo": vs["lo"], "vs_start_hi": vs["hi"],
            "vs_control": other_doc["delta"], "vs_control_lo": other_doc["lo"], "vs_control_hi": other_doc["hi"],
            "vs_shuffled": shuffled["delta"], "vs_shuffled_lo": shuffled["lo"], "vs_shuffled_hi": shuffled["hi"],
            "gate_start": _gate_start(f.config), "gate_end": float(sum(f.learned_gates().values()) / len(f.layers)),
            "steps": t.get("steps"), "best_step": t.get("best_step"), "stopped_early": t.get("stopped_early"),
            "val_gain_start": _val_gain_start(hist), "best_val_gain": t.get("best_val_gain"),
            "seconds": t.get("seconds")}


def _paired(nll: pd.DataFrame, setting: str, baseline: str) -> dict[str, float]:
    """`setting`'s NLL minus `baseline`'s on the same held-out windows (negative = better), pooled over domains,
    bootstrap CI over documents (`nb07_fusers.paired_gain`); NaN when `baseline` was not scored."""
    if baseline not in set(nll["setting"]):
        return {"delta": float("nan"), "lo": float("nan"), "hi": float("nan")}
    vs = fz.paired_gain(nll[nll["setting"].isin([setting, baseline])], baseline)
    return vs[vs["domain"] == "all"].iloc[0][["delta", "lo", "hi"]].to_dict()


def _gate_start(cfg: FuserConfig) -> float:
    """The gate every layer starts at: 0 ('zero', closed) or exp(log_gate) ('log')."""
    return math.exp(cfg.log_gate) if cfg.opening == "log" else 0.0


def _val_gain_start(hist: pd.DataFrame) -> float:
    v = hist["val_gain"].dropna() if "val_gain" in hist else pd.Series(dtype=float)
    return float(v.iloc[0]) if len(v) else float("nan")
