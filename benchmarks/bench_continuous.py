"""Continuous batching against its anchor, side by side in one process: the master alone on HumanEval prompts through
(a) transformers' own continuous batching (`model.generate_batch`, paged cache), (b) our `ContinuousBatcher` with no
slave (no-op fusion), (c) our static batches (`FusedModel.generate` on groups of B). Greedy, EOS only (transformers'
scheduler takes no stop strings), the same max_new_tokens, in turns; then (b) against (c) with HumanEval's stop
strings, where rows end at different steps and a freed seat matters (both must give the same completions).

Writes benchmarks/results/continuous.json: wall seconds and new tokens per second of each, ours / transformers' and
continuous / static per pair (median), our occupancy, and how many completions agree token for token with (a).
Usage: python benchmarks/bench_continuous.py [--model qwen2.5-coder-0.5b-instruct] [--n 32] [--seats 8]
                                              [--new 128] [--reps 2]
"""
from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

import torch
from transformers import GenerationConfig
from transformers.generation.configuration_utils import ContinuousBatchingConfig

import fusionlab as fl
from fusionlab.engine.continuous import ContinuousBatcher
from fusionlab.experiments import nb04_humaneval as he

OUT = Path(__file__).parent / "results"


def theirs(lm: fl.LM, prompts: list[str], new: int, seats: int) -> tuple[float, list[list[int]]]:
    """transformers' scheduler with the same number of seats as ours. Its seat count is
    `ContinuousBatchingConfig.max_requests_per_batch` (default 1024): a `max_batch_tokens` on the GenerationConfig
    is ignored in transformers 5, and before 2026-12-06 this benchmark set only that, so transformers decoded all
    prompts at once (24 rows a step) against our 8 — the 1.23x "gap" it reported was that difference."""
    ids = [lm.encode(p)[0].tolist() for p in prompts]
    cfg = GenerationConfig(max_new_tokens=new, do_sample=False, eos_token_id=lm.model.generation_config.eos_token_id,
                           pad_token_id=lm.tokenizer.pad_token_id or 0)
    t0 = time.perf_counter()
    out = lm.model.generate_batch(inputs=ids, generation_config=cfg, warmup=False,
                                  continuous_batching_config=ContinuousBatchingConfig(max_requests_per_batch=seats))
    wall = time.perf_counter() - t0
    by_prompt = [out[k].generated_tokens for k in sorted(out, key=lambda k: int(k.split("_")[-1]))]
    return wall, by_prompt


def ours(lm: fl.LM, prompts: list[str], new: int, seats: int, continuous: bool,
         stop: list[str] | None = None) -> tuple[float, list[str], float]:
    with fl.fuse(lm, []) as f:
        t0 = time.perf_counter()
        if continuous:
            cb = ContinuousBatcher(f, seats)
            texts = cb.generate(prompts, max_new_tokens=new, stop=stop)
            occ = cb.last_stats.occupancy
        else:
            texts = [t for at in range(0, len(prompts), seats) for t in f.generate(prompts[at:at + seats],
                                                                                    max_new_tokens=new, stop=stop)]
            occ = float("nan")
        wall = time.perf_counter() - t0
    return wall, texts, occ


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="qwen2.5-coder-0.5b-instruct")
    ap.add_argument("--n", type=int, default=32)
    ap.add_argument("--seats", type=int, default=8)
    ap.add_argument("--new", type=int, default=128)
    ap.add_argument("--reps", type=int, default=2)
    ap.add_argument("--out", default=str(OUT / "continuous.json"))
    a = ap.parse_args()
    torch.manual_seed(0)
    lm = fl.load(a.model)
    fits = [t["prompt"] for t in he.problems() if lm.encode(t["prompt"]).shape[1] + a.new <= lm.spec.max_positions]
    prompts = fits[:a.n]
    runs: dict[str, list[float]] = {"transformers": [], "ours continuous": [], "ours static": [],
                                    "ours continuous, stop strings": [], "ours static, stop strings": []}
    toks: dict[str, int] = {}
    agree, occ, occ_stop, same_stop = None, [], [], None
    for _ in range(a.reps):
        wall, ref = theirs(lm, prompts, a.new, a.seats)
        runs["transformers"].append(wall)
        toks["transformers"] = sum(len(x) for x in ref)
        ref_text = [lm.tokenizer.decode(x, skip_special_tokens=True) for x in ref]
        for name, cont in (("ours continuous", True), ("ours static", False)):
            wall, got, o = ours(lm, prompts, a.new, a.seats, cont)
            runs[name].append(wall)
            toks[name] = sum(len(lm.tokenizer(x, add_special_tokens=False)["input_ids"]) for x in got)
            if cont:
                occ.append(o)
                agree = sum(x == y for x, y in zip(got, ref_text))
        for name, cont in (("ours continuous, stop strings", True), ("ours static, stop strings", False)):
            wall, got, o = ours(lm, prompts, a.new, a.seats, cont, he.STOP)  # HumanEval's stops: rows end apart
            runs[name].append(wall)
            toks[name] = sum(len(lm.tokenizer(x, add_special_tokens=False)["input_ids"]) for x in got)
            if cont:
                occ_stop.append(o)
                same_stop = got
            elif got != same_stop:
                raise SystemExit("continuous and static batching gave different completions with stop strings")
    ratio = lambda x, y: statistics.median(a_ / b_ for a_, b_ in zip(runs[x], runs[y]))  # noqa: E731
    rec = {"model": a.model, "prompts": a.n, "seats": a.seats, "transformers_max_requests_per_batch": a.seats, "max_new_tokens": a.new, "reps": a.reps,
           "threads": torch.get_num_threads(), "torch": torch.__version__, "wall_s": runs,
           "tok_per_s": {k: toks[k] / statistics.median(v) for k, v in runs.items()},
           "ours_continuous_over_transformers_wall": ratio("ours continuous", "transformers"),
           "continuous_over_static_wall": ratio("ours continuous", "ours static"),
           "continuous_over_static_wall_with_stop_strings": ratio("ours continuous, stop strings",
                                                                 "ours static, stop strings"),
           "occupancy": statistics.mean(occ), "occupancy_with_stop_strings": statistics.mean(occ_stop),
           "completions_agreeing_with_transformers": f"{agree} of {len(prompts)}",
           "date": time.strftime("%Y-%m-%d")}
    Path(a.out).parent.mkdir(parents=True, exist_ok=True)
    Path(a.out).write_text(json.dumps(rec, indent=2))
    print(json.dumps(rec, indent=2))


if __name__ == "__main__":
    main()
