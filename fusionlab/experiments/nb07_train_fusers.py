"""`python -m fusionlab.experiments.nb07_train_fusers [--size full]`: train every fuser of a run size's plan, in order,
resumable (each run checkpoints; finished ones are skipped), so the long full-mode training can run apart from the
notebook. Notebook 07 then reloads what this wrote (data/fusers/ for full mode)."""
from __future__ import annotations

import argparse
import time

from ..engine.fit import fit_lstsq
from ..models.zoo import load
from . import nb07_corpora as corpora
from . import nb07_fusers as fz


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m fusionlab.experiments.nb07_train_fusers")
    ap.add_argument("--size", default="full", choices=["quick", "default", "full"])
    ap.add_argument("--slaves", nargs="*", default=None)
    args = ap.parse_args(argv)
    plan = fz.plan(args.size)
    master = load("qwen2.5-coder-0.5b-instruct")
    docs = corpora.documents()
    same = fz.training_chunks(master.tokenizer, docs, plan, "same")
    off = fz.training_chunks(master.tokenizer, docs, plan, "offload")
    for name in args.slaves or plan.slaves:
        slave = load(name)
        proj = fit_lstsq(master, slave)
        t0 = time.perf_counter()
        main_fuser, _, src = fz.obtain(master, slave, proj, same, fz.config_for("slave", "same", None, plan.width),
                                       "same", plan, args.size)
        print(f"{name} fuser: {src} ({time.perf_counter() - t0:.0f} s)", flush=True)
        for v in plan.variants[1:]:
            t0 = time.perf_counter()
            _, _, src = fz.obtain(master, slave, proj, same, fz.config_for(v, "same", main_fuser, plan.width), "same",
                                  plan, args.size)
            print(f"{name} control {v}: {src} ({time.perf_counter() - t0:.0f} s)", flush=True)
        if plan.offload:
            t0 = time.perf_counter()
            _, _, src = fz.obtain(master, slave, proj, off, fz.config_for("slave", "offload", None, plan.width),
                                  "offload", plan, args.size)
            print(f"{name} offload fuser: {src} ({time.perf_counter() - t0:.0f} s)", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
