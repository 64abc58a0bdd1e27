"""Fine-tuned siblings of the master (notebook 10's ladder): DroidSpeak's setting, a model and its own fine-tune.

`sibling(master, "finetune:english:200")` reads weights that this module makes: the master trained for 200 optimiser
steps on one domain's *training* documents (`nb07_corpora`), minus every document the transfer map may read (the
full plan's (A, B) pairs), so no rung has been trained on a text it is scored on.

The recipe: the decoder's weights train (embeddings and the untied head stay frozen: a vocabulary the domain barely
moves, and 2 x 136 M parameters of optimiser state saved), AdamW at a constant `LR`, no weight decay, gradients clipped
at 1, one `TOKENS`-token window per step, windows in a seeded order, cycled. Fixed threads and seeds: the same steps
give bit-identical weights on one machine. One growing run per domain writes a snapshot at each step count asked for
(50, 200 and 800 steps of one run, not three runs); a snapshot is the trained tensors (safetensors) and a manifest
(data, losses, seconds, the weights' sha256, which the sibling's fingerprint includes).
"""
from __future__ import annotations

import argparse
import copy
import hashlib
import json
import random
import time
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import save_file

from ..engine.determinism import fixed_threads
from ..engine.lm import LM
from ..errors import FusionLabError
from ..files import atomic_write_text
from ..models.siblings import finetuned_path, parse_recipe
from ..models.zoo import load
from . import nb07_corpora as corpora
from . import nb10_nll_transfer as nll
from .nb10_transfer_map import plan as ladder_plan

LR = 2e-5
TOKENS = 256
SEED = 0
THREADS = 2


def evaluated_names(tokenizer: Any, docs: list[corpora.Doc]) -> set[str]:
    """Documents the transfer map may read at any run size (the full plan's pairs, their controls among them)."""
    p = ladder_plan("full")
    return {x.doc for x in nll.pairs(tokenizer, docs, p.a_tokens, p.b_tokens, p.per_domain)}


def training_windows(tokenizer: Any, docs: list[corpora.Doc], domain: str, exclude: set[str],
                     tokens: int = TOKENS) -> tuple[list[str], list[str]]:
    """(windows in the seeded training order, the documents they come from): the domain's training split only."""
    used = [d for d in docs if d.domain == domain and d.split == "train" and d.name not in exclude]
    windows = [w for d in used for w in corpora.windows(tokenizer, d.text, tokens)]
    if not windows:
        raise FusionLabError(f"no {domain} training windows of {tokens} tokens outside the evaluated documents; "
                             "pick another domain or shorter windows.")
    random.Random(SEED).shuffle(windows)
    return windows, [d.name for d in used]


def missing(master: LM, recipes: list[str]) -> list[str]:
    """The fine-tune recipes among `recipes` whose weights are not made yet."""
    return [r for r in recipes if parse_recipe(r).kind == "finetune" and
            not (finetuned_path(master, r).exists() and finetuned_path(master, r).with_suffix(".json").exists())]


def ensure(master: LM, recipes: list[str], docs: list[corpora.Doc], tokens: int = TOKENS) -> list[str]:
    """Make every fine-tuned sibling among `recipes` that is not made yet: one growing run per domain, snapshots at
    each step count of that domain (made ones are not rewritten: the run replays them bit for bit). Returns the
    recipes it made."""
    todo = missing(master, recipes)
    by_domain: dict[str, list[int]] = {}
    for r in todo:
        spec = parse_recipe(r)
        by_domain.setdefault(spec.domain, []).append(spec.steps)
    exclude = evaluated_names(master.tokenizer, docs) if by_domain else set()
    for domain, steps in by_domain.items():
        run(master, domain, sorted(set(steps)), docs, exclude, tokens)
    return todo


def run(master: LM, domain: str, snapshots: list[int], docs: list[corpora.Doc], exclude: set[str],
        tokens: int = TOKENS) -> None:
    """One training run of the master on `domain`, writing a snapshot at each step count in `snapshots`."""
    windows, used = training_windows(master.tokenizer, docs, domain, exclude, tokens)
    model = copy.deepcopy(master.model).train()
    for name, p in model.named_parameters():
        p.requires_grad_(".layers." in f".{name}")  # the decoder trains; embeddings and head stay frozen
    trained = [p for p in model.parameters() if p.requires_grad]
    torch.manual_seed(SEED)
    opt = torch.optim.AdamW(trained, lr=LR, weight_decay=0.0)
    losses: list[float] = []
    t0 = time.perf_counter()
    with fixed_threads(THREADS):
        for step in range(1, max(snapshots) + 1):
            ids = master.tokenizer(windows[(step - 1) % len(windows)], return_tensors="pt").input_ids[:, :tokens]
            loss = model(input_ids=ids.to(master.device), labels=ids.to(master.device)).loss  # (B=1, T) -> scalar
            loss.backward()
            torch.nn.utils.clip_grad_norm_(trained, 1.0)
            opt.step()
            opt.zero_grad(set_to_none=True)
            losses.append(float(loss.detach()))
            if step in snapshots:
                _save(master, model, f"finetune:{domain}:{step}", {
                    "domain": domain, "steps": step, "lr": LR, "tokens_per_step": tokens, "seed": SEED,
                    "threads": THREADS, "documents": used, "excluded": sorted(exclude), "losses": losses[:],
                    "seconds": round(time.perf_counter() - t0, 1), "torch": torch.__version__})


def _save(master: LM, model: torch.nn.Module, recipe: str, manifest: dict[str, Any]) -> None:
    path = finetuned_path(master, recipe)
    if path.exists() and path.with_suffix(".json").exists():
        return  # made by an earlier run of the same recipe: the same bits
    path.parent.mkdir(parents=True, exist_ok=True)
    state = {n: p.detach().contiguous().clone() for n, p in model.named_parameters() if p.requires_grad}
    tmp = path.with_suffix(".tmp")
    save_file(state, str(tmp))
    digest = hashlib.sha256(tmp.read_bytes()).hexdigest()
    tmp.replace(path)
    atomic_write_text(path.with_suffix(".json"), json.dumps({"recipe": recipe, **manifest, "weights_sha256": digest,
                                                             "master": master.fingerprint}, indent=1))


def main(argv: list[str] | None = None) -> int:
    """`python -m fusionlab.experiments.nb10_finetune finetune:english:50 ...`: make these siblings' weights."""
    ap = argparse.ArgumentParser(prog="python -m fusionlab.experiments.nb10_finetune")
    ap.add_argument("recipes", nargs="+")
    ap.add_argument("--master", default="qwen2.5-coder-0.5b-instruct")
    a = ap.parse_args(argv)
    made = ensure(load(a.master), a.recipes, corpora.documents())
    print("made:", ", ".join(made) or "nothing (all made already)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
