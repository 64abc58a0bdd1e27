"""Attention on instruction keywords: spans by character offsets, masses per layer/head, and controls.

The blog claims attention on keywords such as "对比" / "侧重" is 2.3x higher in the stitched model. Here a
keyword's tokens are found by character offsets (so it works across tokenizers and for Chinese), the mass
the chosen queries put on them is read from `capture_attention`, normalised per token and against a
uniform baseline, and compared with non-keyword tokens of the same count (is any change keyword-specific?).
"""
from __future__ import annotations

import json
import random
from contextlib import nullcontext
from pathlib import Path
from typing import Any

import pandas as pd
import torch

from ..analysis.attention_capture import AttentionCapture, capture_attention
from ..analysis.stats import bootstrap_ci
from ..engine.fuse import FusedModel, fuse
from ..engine.lm import LM
from ..engine.slave import Slave
from ..errors import FusionLabError
from ..paths import asset

def load_prompts(path: Path | None = None) -> list[dict[str, Any]]:
    path = path or asset("prompts", "instruction_keywords.jsonl")
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]


def keyword_positions(tokenizer: Any, text: str, keywords: list[str], start: int = 0) -> dict[str, list[int]]:
    """Token positions whose characters overlap each keyword's first occurrence at or after `start`."""
    offsets = tokenizer(text, return_offsets_mapping=True)["offset_mapping"]
    out = {}
    for kw in keywords:
        at = text.find(kw, start)
        if at < 0:
            excerpt = text[start:start + 80].replace("\n", " ")
            raise FusionLabError(f"keyword {kw!r} not found in the prompt: '{excerpt}...'")
        end = at + len(kw)
        out[kw] = [i for i, (a, b) in enumerate(offsets) if b > a and a < end and at < b]
    return out


def control_positions(tokenizer: Any, text: str, exclude: set[int], count: int, start: int, seed: int = 0) -> list[int]:
    """`count` non-keyword tokens (with characters, inside the user text), seeded: the control."""
    offsets = tokenizer(text, return_offsets_mapping=True)["offset_mapping"]
    pool = [i for i, (a, b) in enumerate(offsets) if b > a and a >= start and i not in exclude]
    if len(pool) < count:
        raise FusionLabError(f"only {len(pool)} non-keyword tokens for a control of {count}.")
    return sorted(random.Random(seed).sample(pool, count))


def mass_on(cap: AttentionCapture, layer: int, positions: list[int], source: str) -> torch.Tensor:
    """(heads,) mean mass per selected query on `positions` (own keys, or own keys + slots)."""
    m = cap.mass(layer, "all" if source == "all" else "own")
    return m[:, positions].sum(1) / cap.n_queries[layer]


def visible_keys(cap: AttentionCapture, layer: int, source: str) -> int:
    own = cap.own[layer].shape[1]
    if source != "all":
        return own
    return own + sum(int((t.abs().sum(0) > 0).sum()) for t in cap.slots.get(layer, {}).values())


def prompt_rows(cap: AttentionCapture, kw: list[int], ctrl: list[int], source: str) -> list[dict[str, Any]]:
    rows = []
    for layer in cap.layers:
        n = visible_keys(cap, layer, source)
        for kind, pos in (("keyword", kw), ("control", ctrl)):
            mass = mass_on(cap, layer, pos, source)  # (heads,)
            for hi, h in enumerate(cap.heads):
                rows.append({"layer": layer, "head": h, "tokens": kind, "mass": float(mass[hi]),
                             "per_token": float(mass[hi]) / len(pos),
                             "rel_uniform": float(mass[hi]) / (len(pos) / n)})
    return rows


QUERIES = ("last", "answer")


def _capture_prompt(target: LM | FusedModel, text: str, queries: str, answer_tokens: int) -> AttentionCapture:
    """'last': one forward, the last prompt token's row. 'answer': greedy generation, the rows of every query
    that produces an answer token (the last prompt token, then each fed answer token)."""
    if queries == "last":
        with capture_attention(target, queries="last") as cap, torch.no_grad():
            target(text) if isinstance(target, FusedModel) else target.model(target.encode(text))
        return cap
    master = target.master if isinstance(target, FusedModel) else target
    n = master.encode(text).shape[1]
    rows = range(n - 1, n - 1 + answer_tokens)
    with fuse(target, []) if isinstance(target, LM) else nullcontext(target) as f:  # don't close the caller's
        with capture_attention(f, queries=rows) as cap:
            f.generate(text, max_new_tokens=answer_tokens)
    return cap


def run_prompt(target: LM | FusedModel, master: LM, prompt: dict[str, Any], source: str | dict[str, str] = "own",
               seed: int = 0, queries: str = "last", answer_tokens: int = 16) -> pd.DataFrame:
    """Attention from the chosen queries (the last prompt token, where the answer starts, or every query that
    produces an answer token during greedy generation) to the keywords and to an equal-count control.
    source: 'own' | 'all', or {setting name: source} to read several views from one capture."""
    if queries not in QUERIES:
        raise FusionLabError(f"queries must be one of {QUERIES}, got {queries!r}.")
    text = master.chat_prompt(prompt["prompt"])
    start = text.find(prompt["prompt"])
    spans = keyword_positions(master.tokenizer, text, prompt["keywords"], start)
    kw = sorted({p for ps in spans.values() for p in ps})
    ctrl = control_positions(master.tokenizer, text, set(kw), len(kw), start, seed)
    cap = _capture_prompt(target, text, queries, answer_tokens)
    views = source if isinstance(source, dict) else {None: source}
    df = pd.concat([pd.DataFrame(prompt_rows(cap, kw, ctrl, src)).assign(setting=name, source=src)
                    for name, src in views.items()], ignore_index=True)
    df["prompt"], df["lang"], df["n_keyword_tokens"] = prompt["id"], prompt["lang"], len(kw)
    df["queries"], df["n_queries"] = queries, cap.n_queries[cap.layers[0]]
    return df if isinstance(source, dict) else df.drop(columns=["setting"])


def study(settings: dict[str, tuple[LM | FusedModel, str]], master: LM, prompts: list[dict[str, Any]],
          queries: str = "last", answer_tokens: int = 16) -> pd.DataFrame:
    """One row per (setting, prompt, layer, head, token kind). settings: name -> (model, source); settings
    that share a model are read from one capture per prompt."""
    from tqdm.auto import tqdm

    groups: dict[int, tuple[LM | FusedModel, dict[str, str]]] = {}
    for name, (target, source) in settings.items():
        groups.setdefault(id(target), (target, {}))[1][name] = source
    frames = []
    for target, views in groups.values():
        for p in tqdm(prompts, desc=", ".join(views), leave=False):
            frames.append(run_prompt(target, master, p, views, queries=queries, answer_tokens=answer_tokens))
    return pd.concat(frames, ignore_index=True)


def ratios(df: pd.DataFrame, baseline: str, measure: str = "mass") -> pd.DataFrame:
    """Per prompt: (setting / baseline) of the layer-and-head-mean measure, for keywords and controls."""
    per = df.groupby(["setting", "prompt", "tokens"])[measure].mean().unstack("setting")
    out = per.drop(columns=baseline).div(per[baseline], axis=0)
    return out.reset_index().melt(id_vars=["prompt", "tokens"], var_name="setting", value_name="ratio")


def fused_settings_study(master: LM, slaves: dict[str, tuple[LM, Any]], modes: list[str],
                         prompts: list[dict[str, Any]], queries: str = "last", answer_tokens: int = 16) -> pd.DataFrame:
    """The single master, then master + each slave in each mode (opened and closed in turn).

    slaves: label -> (slave LM, fitted projector). concat is measured on own keys + slots ('all') and on own
    keys only; blend edits the own keys, so 'own' is the whole story there.
    """
    q = {"queries": queries, "answer_tokens": answer_tokens}
    frames = [study({"single": (master, "own")}, master, prompts, **q)]
    for label, (slave, proj) in slaves.items():
        for mode in modes:
            with fuse(master, [Slave(slave, layer_map=proj.layer_map, projector=proj, mode=mode, align="mean",
                                     gate=1.0 if mode == "concat" else 0.5)]) as f:
                sources = {"all": "own+slots", "own": "own keys"} if mode == "concat" else {"own": "own keys"}
                views = {f"+{label} {mode} ({what})": (f, source) for source, what in sources.items()}
                frames.append(study(views, master, prompts, **q))  # one capture per prompt, both views
    return pd.concat(frames, ignore_index=True)


def ratio_summary(r: pd.DataFrame) -> pd.DataFrame:
    """Mean fused/single ratio per setting and token kind, with a bootstrap 95% CI over prompts."""
    rows = []
    for (setting, kind), g in r.groupby(["setting", "tokens"]):
        lo, hi = bootstrap_ci(g["ratio"].dropna().values)
        rows.append({"setting": setting, "tokens": kind, "n_prompts": int(g["ratio"].notna().sum()),
                     "mean_ratio": float(g["ratio"].mean()), "ci_low": lo, "ci_high": hi})
    return pd.DataFrame(rows)
