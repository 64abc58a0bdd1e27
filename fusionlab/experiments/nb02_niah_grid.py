"""NIAH grid runner: (setting x length x depth x needle) cells, a resumable on-disk cache, the analyses.

One model build per setting (the slave is loaded, used for all its cells, then freed); every finished cell
is appended to a JSONL cache at once, so an interrupted run resumes where it stopped.
"""
from __future__ import annotations

import hashlib
import json
from contextlib import closing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import pandas as pd

from ..analysis.stats import wilson
from ..cells import Cell, CellCache, cell_key, run_cells
from ..engine import checks
from ..engine.continuous import GROUP_SEATS, ContinuousBatcher, records_as_rows_end
from ..engine.fit import fit_lstsq
from ..engine.fuse import FusedModel, fuse
from ..engine.lm import LM
from ..engine.slave import Slave
from ..errors import FusionLabError
from ..models.variants import rope_variant
from ..models.zoo import load, short_name
from ..paths import cache_dir
from .nb02_niah import Needle, build_context, load_haystack, load_needles, prompt_for, score


@dataclass
class Setting:
    """A named way to answer: `build()` returns an open FusedModel (no slaves = the master alone)."""

    name: str
    build: Callable[[], FusedModel]
    key: str
    """Everything that changes its answers (models, RoPE variant, mode, projector), for the cache key."""


def default_cache() -> Path:
    return cache_dir() / "niah.jsonl"


def grid_cells(setting: Setting, needles: list[Needle], lengths: list[int], depths: list[float],
               texts: dict[str, str], max_new: int) -> list[Cell]:
    """One cell per needle x length x depth; the key fixes everything that changes the answer."""
    cells = []
    for nd in needles:
        hay = hashlib.sha256(texts[nd.lang].encode()).hexdigest()[:16]
        for n in lengths:
            for d in depths:
                key = cell_key(setting.key, nd.id, nd.needle, n, d, hay, max_new)
                cells.append(Cell(key, {"setting": setting.name, "needle": nd.id, "lang": nd.lang, "length": n,
                                        "depth": d}, nd))
    return cells


def run_grid(master: LM, settings: list[Setting], needles: list[Needle], lengths: list[int], depths: list[float],
             haystacks: dict[str, str], cache: Path | None = None, max_new_tokens: int = 24,
             batch_size: int = 4) -> pd.DataFrame:
    """Run every missing cell (tqdm shows progress; cells of one length together, `batch_size` seats of continuous
    batching; in-process a setting's missing cells are one scheduler run, each saved as its row ends) and return all
    requested cells. `seconds` is the wall time since the previous row ended (sums are wall time)."""
    if not settings or not needles or not lengths or not depths:
        raise FusionLabError("run_grid needs at least one setting, needle, length and depth.")
    for n in lengths:
        checks.integer("lengths[]", n, 1, master.spec.max_positions)
    for d in depths:
        checks.number("depths[]", d, 0.0, 100.0)
    checks.integer("max_new_tokens", max_new_tokens, 1)
    checks.integer("batch_size", batch_size, 1)
    missing = sorted({nd.lang for nd in needles} - set(haystacks))
    if missing:
        raise FusionLabError(f"no haystack for needle language(s) {missing}; pass haystacks={{lang: name}} for them.")
    store = CellCache(cache or default_cache())
    texts = {lang: load_haystack(name) for lang, name in haystacks.items()}

    def answer_batch(fused: FusedModel, cs: list[Cell],
                     emit: Callable[[int, dict[str, Any]], None] | None = None) -> list[dict[str, Any]]:
        prompts = []  # a haystack too short, or a slave that cannot hold the prompt: ContextTooLong
        for c in cs:
            context, _ = build_context(master.tokenizer, texts[c.item.lang], c.item, c.fields["length"],
                                       c.fields["depth"], max_positions=master.spec.max_positions)
            prompts.append(prompt_for(master, context, c.item))
        seats = ContinuousBatcher(fused, min(batch_size, len(cs)))
        return records_as_rows_end(seats, prompts, lambda j, text, cost: {
            "answer": text, **score(text, cs[j].item), "seconds": round(cost.seconds, 2), "batch": seats.batch_size},
            emit, max_new_tokens=max_new_tokens)

    def answer(fused: FusedModel, c: Cell) -> dict[str, Any]:
        return answer_batch(fused, [c])[0] | {"batch": 1}

    rows, skipped = [], []
    for st in settings:
        cells = grid_cells(st, needles, lengths, depths, texts, max_new_tokens)
        for rec in run_cells(store, cells, lambda st=st: closing(st.build()), answer, desc=st.name,
                             compute_batch=answer_batch, batch_size=GROUP_SEATS * batch_size,
                             batch_key=lambda c: (c.fields["length"], c.item.lang), streams=True):
            if "skipped" in rec:
                where = {k: rec[k] for k in ("setting", "needle", "length", "depth")}
                skipped.append(where | {"reason": rec["skipped"]})
            else:
                rows.append(rec)
    df = pd.DataFrame(rows)
    df.attrs["skipped"] = skipped
    return df


def accuracy_grid(df: pd.DataFrame, setting: str) -> pd.DataFrame:
    """depth x length accuracy for one setting (the classic NIAH heatmap)."""
    d = df[df["setting"] == setting].assign(correct=lambda x: x["label"] == "correct")
    return d.pivot_table(index="depth", columns="length", values="correct", aggfunc="mean")


def rates(df: pd.DataFrame, by: list[str] = ["setting", "length"]) -> pd.DataFrame:  # noqa: B006
    """Accuracy, hallucination (wrong) and abstain rates with Wilson 95% intervals."""
    out = []
    for keys, g in df.groupby(by):
        n = len(g)
        row = dict(zip(by, keys if isinstance(keys, tuple) else (keys,)), n=n)
        for label in ("correct", "wrong", "abstain"):
            k = int((g["label"] == label).sum())
            lo, hi = wilson(k, n)
            row.update({label: k / n, f"{label}_lo": lo, f"{label}_hi": hi})
        row["distractor"] = int(g["distractor"].sum())
        out.append(row)
    return pd.DataFrame(out)


def effective_length(df: pd.DataFrame, threshold: float = 0.8) -> pd.DataFrame:
    """Per setting: the longest tested length whose accuracy is >= threshold (and the grid it was read from)."""
    r = rates(df)
    rows = []
    for setting, g in r.groupby("setting"):
        ok = g[g["correct"] >= threshold]["length"]
        rows.append({"setting": setting, "effective_length": int(ok.max()) if len(ok) else 0,
                     "grid_max": int(g["length"].max()), "threshold": threshold,
                     "lengths": sorted(g["length"].tolist())})
    return pd.DataFrame(rows)


def heatmaps(df: pd.DataFrame, settings: list[str]) -> Any:
    import matplotlib.pyplot as plt
    import seaborn as sns

    cols = min(4, len(settings))  # rows of 4 keep a paper page readable
    rows = -(-len(settings) // cols)
    fig, axes = plt.subplots(rows, cols, figsize=(3.2 * cols, 2.8 * rows), squeeze=False)
    for ax, st in zip(axes.flat, settings):
        sns.heatmap(accuracy_grid(df, st), vmin=0, vmax=1, cmap="RdYlGn", annot=True, fmt=".2f", cbar=False, ax=ax)
        ax.set_title(st, fontsize=8)
    for ax in axes.flat[len(settings):]:
        ax.set_visible(False)
    fig.tight_layout()
    return fig


def rope_settings(master: LM, variants: list[dict[str, Any]], cross: LM | None = None,
                  matched: bool = True, single: bool = True) -> list[Setting]:
    """single; fused with an exact copy (matched); for each RoPE variant of the master, naive post-RoPE vs
    re-rotated keys (concat, every layer); optionally a cross-model slave with a fitted projector."""
    fp = master.fingerprint[:12]
    out = [Setting("single", lambda: fuse(master, []), f"single|{fp}")] if single else []
    if matched:
        out.append(Setting("fused, matched RoPE",
                           lambda: fuse(master, [Slave(load(master.name), layer_map="identity")]), f"matched|{fp}"))
    for v in variants:
        label = (f"θ×{v.get('theta_factor', 1):g}" if "scaling" not in v
                 else f"{v['scaling']['rope_type']} ×{v['scaling']['factor']:g}")
        for rope, how in (("slave", "naive"), ("master", "re-rotated")):
            out.append(Setting(f"{label}, {how}", lambda v=v, rope=rope: fuse(master, [
                Slave(rope_variant(master.name, **v), layer_map="identity", rope=rope)]),
                f"variant|{fp}|{json.dumps(v, sort_keys=True)}|{rope}"))
    if cross is not None:
        proj: dict[str, Any] = {}

        def build_cross(rope: str) -> FusedModel:
            proj.setdefault("p", fit_lstsq(master, cross))
            p = proj["p"]
            return fuse(master, [Slave(cross, layer_map=p.layer_map, projector=p, align="mean", rope=rope)])

        for rope, how in (("slave", "naive"), ("master", "re-rotated")):
            out.append(Setting(f"+{short_name(cross.name)}, {how}", lambda rope=rope: build_cross(rope),
                               f"cross|{fp}|{cross.fingerprint[:12]}|{rope}"))
    return out


@dataclass
class GridPlan:
    """What one run size measures: a main grid (heatmaps, rates vs length) and an optional wider RoPE-variant
    sweep at short lengths only (each 8K fused cell costs ~2 min on a 2-core CPU, so the sweep stays short)."""

    lengths: list[int]
    depths: list[float]
    needles: list[str]
    variants: list[dict[str, Any]]
    cross: bool
    max_new_tokens: int
    sweep_variants: list[dict[str, Any]] = field(default_factory=list)
    sweep_lengths: list[int] = field(default_factory=list)


def plan(size: str) -> GridPlan:
    """The grid for a run size ('quick' | 'default' | 'full'); full reuses every cached default cell."""
    needles = ["en-city", "en-number", "zh-city"]
    if size == "quick":
        return GridPlan([256, 512], [50], ["en-city", "zh-city"], [{"theta_factor": 4.0}], False, 8)
    if size == "default":
        return GridPlan([1024, 2048], [10, 50, 90], needles, [{"theta_factor": 4.0}], True, 24)
    if size == "full":
        return GridPlan([1024, 2048, 4096, 8192], [10, 50, 90], needles,
                        [{"theta_factor": 4.0}, {"scaling": {"rope_type": "linear", "factor": 2.0}}], True, 24,
                        sweep_variants=[{"theta_factor": f} for f in (0.25, 0.5, 2.0)]
                        + [{"scaling": {"rope_type": "dynamic", "factor": 2.0}}], sweep_lengths=[1024])
    raise FusionLabError(f"unknown run size {size!r}: use 'quick', 'default' or 'full'")


def run_plan(master: LM, p: GridPlan, cross: LM | None, haystacks: dict[str, str]) -> pd.DataFrame:
    """Main grid, then the sweep (variants only; its baselines come from the main grid), as one DataFrame."""
    needles = {n.id: n for n in load_needles()}
    chosen = [needles[i] for i in p.needles]
    main = run_grid(master, rope_settings(master, p.variants, cross), chosen, p.lengths, p.depths, haystacks,
                    max_new_tokens=p.max_new_tokens)
    if not p.sweep_variants:
        return main
    sweep = run_grid(master, rope_settings(master, p.sweep_variants, None, matched=False, single=False), chosen,
                     p.sweep_lengths, p.depths, haystacks, max_new_tokens=p.max_new_tokens)
    df = pd.concat([main, sweep], ignore_index=True)
    df.attrs["skipped"] = main.attrs["skipped"] + sweep.attrs["skipped"]
    return df


def grid_cost(df: pd.DataFrame) -> pd.DataFrame:
    """Seconds per cell by length (cells cached before timing was recorded are left out): what the grid costs."""
    if "seconds" not in df:
        return pd.DataFrame(columns=["length", "timed_cells", "mean_s", "total_s"])
    t = df.dropna(subset=["seconds"])
    return t.groupby("length")["seconds"].agg(timed_cells="count", mean_s="mean", total_s="sum").reset_index()
