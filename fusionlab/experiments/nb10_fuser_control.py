"""A learned offload fuser on rungs where the channel is known to work (notebook 10): the positive control the
fuser verdicts of notebook 07 lack.

Notebook 07's offload fusers stayed closed (gate <= 0.06, key scale <= 0.07) on foreign slaves, and nobody could tell
"nothing to carry" from "training cannot open this parametrisation". Here the same recipe trains on an exact copy of
the master (the training-free channel carries everything) and on a partial rung (noise 10 %: two thirds), once per
gate parametrisation (`FuserConfig.opening`: 'zero', the old one, and 'log'), with validation by document, early
stopping and the best state kept. Scored on held-out offload chunks (the slave reads window k, the master only k+1):

    floor      the master alone                 skyline    the master reads window k too
    lstsq      the warm start, gate 1           fuser      the trained fuser
    control    the trained fuser reading window k of *another document* (document derangement)

transfer = (floor - x) / (floor - skyline), bootstrap over documents. A fuser that can open should keep the copy's
channel open (transfer near the lstsq start or above) and, on the partial rung, beat its warm start.
"""
from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import pandas as pd

from ..engine.fit import fit_lstsq
from ..engine.lm import LM
from ..errors import FusionLabError
from ..models.siblings import sibling, sibling_layer_map
from ..paths import cache_dir, data_dir
from ..training.chunks import TrainChunk
from ..training.fuser import FuserConfig, LearnedFuser
from ..training.train import TrainConfig, train_fuser
from . import nb07_corpora as corpora
from . import nb07_fusers as fz

VERDICTS = ("opens and beats its start", "keeps the channel", "closes the channel", "inconclusive")


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


def control_plan(size: str) -> ControlPlan:
    if size == "quick":
        return ControlPlan(["noise:0"], ["log"], 128, tokens=48, eval_per_domain=2, val_per_domain=1, eval_every=1,
                           patience=2, committed=False, domains=("code", "english"), per_doc=1)
    if size == "default":
        return ControlPlan(["noise:0", "noise:0.1"], ["zero", "log"], 6144)
    if size == "full":
        return ControlPlan(["noise:0", "noise:0.1", "noise:0.2", "int4"], ["zero", "log"], 40_000, tokens=256,
                           eval_per_domain=16, val_per_domain=8, eval_every=10)
    raise FusionLabError(f"unknown run size {size!r}: use 'quick', 'default' or 'full'.")


def config_for(p: ControlPlan, opening: str) -> FuserConfig:
    return FuserConfig(mode="concat", width=p.width, opening=opening)


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


def fuser_path(master: LM, recipe: str, opening: str, p: ControlPlan) -> Path:
    root = data_dir() / "fusers" if p.committed else cache_dir() / "fusers"
    return root / f"{master.name}__{recipe.replace(':', '-')}__offload_{opening}_{p.budget_tokens}.safetensors"


def obtain(master: LM, sib: LM, recipe: str, opening: str, p: ControlPlan,
           data: dict[str, list[TrainChunk]]) -> tuple[LearnedFuser, pd.DataFrame, str]:
    """The trained fuser of one (rung, opening): reloaded when a finished run of this exact recipe exists (its
    manifest's configs and both fingerprints match), else trained (resumable from its checkpoint) and saved."""
    path, cfg, tc = fuser_path(master, recipe, opening, p), config_for(p, opening), train_config(p)
    done = path.with_suffix(".done")
    if path.exists() and done.exists():
        f = LearnedFuser.load(path)
        t = f.meta.get("training", {})
        if (f.meta["master"]["fingerprint"], f.meta["slave"]["fingerprint"]) == (master.fingerprint, sib.fingerprint) \
                and f.config == cfg and t.get("train") == json.loads(json.dumps(asdict(tc))):
            return f, pd.read_csv(path.with_suffix(".history.csv")), "committed" if p.committed else "cache"
    proj = fit_lstsq(master, sib, sibling_layer_map(master, sib))
    ck = cache_dir() / "fusers" / f"{path.stem}.ckpt"
    r = train_fuser(master, sib, data["train"], cfg, tc, projector=proj, checkpoint=ck, validation=data["validation"])
    r.fuser.save(path, training={**r.manifest, "recipe": recipe})
    r.history.to_csv(path.with_suffix(".history.csv"), index=False)
    done.write_text(json.dumps(r.manifest, indent=2))
    return r.fuser, r.history, "trained now"


def measure(master: LM, p: ControlPlan, docs: list[corpora.Doc]) -> tuple[pd.DataFrame, pd.DataFrame, dict]:
    """Every (rung, opening): trained or reloaded, then scored on the held-out chunks. Returns the per-chunk NLL
    table, one summary row per fuser, and the training histories."""
    data = splits(master.tokenizer, docs, p)
    held = {d: [c for c in data["heldout"] if c.doc and c.doc.startswith(d + "/")] for d in p.domains}
    held = {d: v for d, v in held.items() if len({c.doc for c in v}) >= 2}  # a control needs another document
    if not held:
        raise FusionLabError("no domain has held-out chunks from 2 documents: lower ControlPlan.tokens.")
    base = [fz.Evaluated("floor (master alone)", None, role="floor"),
            fz.Evaluated("skyline (master reads it)", None, role="skyline")]
    tables, rows, histories = [fz.nll_table(master, base, held, "offload")], [], {}
    for recipe in p.rungs:
        sib = sibling(master, recipe)
        proj = fit_lstsq(master, sib, sibling_layer_map(master, sib))
        ev = [fz.Evaluated(f"{recipe} lstsq start (g=1)", proj, sib, mode="concat", role="lstsq")]
        fusers = {}
        for opening in p.openings:
            f, hist, source = obtain(master, sib, recipe, opening, p, data)
            fusers[opening] = (f, hist, source)
            histories[f"{recipe} {opening}"] = hist
            name = f"{recipe} fuser ({opening})"
            ev += [fz.Evaluated(name, f, sib, mode="concat", role="fuser"),
                   fz.Evaluated(f"{name}, other document", f, sib, mode="concat", reads="shuffled", role="control")]
        nll = fz.nll_table(master, ev, held, "offload").assign(rung=recipe)
        tables.append(nll)
        both = pd.concat([tables[0], nll], ignore_index=True)
        start = fz.nll_transfer(both, "floor (master alone)", "skyline (master reads it)", ev[0].name)
        for opening, (f, hist, source) in fusers.items():
            name = f"{recipe} fuser ({opening})"
            tr = fz.nll_transfer(both, "floor (master alone)", "skyline (master reads it)", name)
            ctrl = fz.nll_transfer(both, "floor (master alone)", "skyline (master reads it)", f"{name}, other document")
            vs = fz.paired_gain(both[both["setting"].isin([name, ev[0].name])], ev[0].name)
            vs = vs[vs["domain"] == "all"].iloc[0]
            t = f.meta.get("training", {})
            rows.append({"rung": recipe, "opening": opening, "source": source, "docs": tr["docs"], "n": tr["n"],
                         "start_transfer": start["transfer"], "transfer": tr["transfer"], "lo": tr["lo"],
                         "hi": tr["hi"], "control_transfer": ctrl["transfer"], "control_hi": ctrl["hi"],
                         "vs_start": vs["delta"], "vs_start_lo": vs["lo"], "vs_start_hi": vs["hi"],
                         "gate_start": _gate_start(f.config), "gate_end": float(sum(f.learned_gates().values()) /
                                                                            len(f.layers)),
                         "steps": t.get("steps"), "best_step": t.get("best_step"),
                         "stopped_early": t.get("stopped_early"), "val_gain_start": _val_gain_start(hist),
                         "best_val_gain": t.get("best_val_gain"), "seconds": t.get("seconds")})
        del sib
    table = pd.DataFrame(rows)
    table["verdict"] = [control_verdict(r) for r in table.to_dict("records")]
    return pd.concat(tables, ignore_index=True), table, histories


def _gate_start(cfg: FuserConfig) -> float:
    """The gate every layer starts at: 0 ('zero', closed) or exp(log_gate) ('log')."""
    return math.exp(cfg.log_gate) if cfg.opening == "log" else 0.0


def _val_gain_start(hist: pd.DataFrame) -> float:
    v = hist["val_gain"].dropna() if "val_gain" in hist else pd.Series(dtype=float)
    return float(v.iloc[0]) if len(v) else float("nan")


def control_verdict(row: dict) -> str:
    """One trained fuser on a rung whose training-free channel works, from its held-out transfer CI (lo, hi), its
    control's transfer (control_hi: the upper end reading another document) and its paired NLL change against the
    lstsq warm start (vs_start_lo / vs_start_hi, nats/token; negative = better):
      opens and beats its start  transfer CI above its control's, and lower NLL than the warm start (CI below 0)
      keeps the channel          transfer CI above its control's, no worse than the start (CI reaches 0)
      closes the channel         worse than the start (CI above 0) and transfer CI not above the control's
      inconclusive               otherwise."""
    above_control = row["lo"] > row["control_hi"]
    if above_control and row["vs_start_hi"] < 0:
        return "opens and beats its start"
    if above_control and row["vs_start_lo"] <= 0:
        return "keeps the channel"
    if row["vs_start_lo"] > 0 and not above_control:
        return "closes the channel"
    return "inconclusive"
