"""Speed of fusion vs the master alone, side by side in one process (Qwen master + SmolLM2 slave).

Targets (issue #3): no-op fusion forward <= 1.03x master; prefix fused decode >= 0.95x master tokens/s at a
2K-token prompt (blog: 0.90x); fused prefill <= 1.1x (master + slave prefill); cold vs warm TTFT (blog:
3.2 s -> 0.78 s). Runs are interleaved and medians reported, so drift hits both sides alike.
Writes benchmarks/results/fusion.json. Usage: python benchmarks/bench_fusion.py [--tokens 2048] [--reps 5]
"""
from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

import torch
from transformers import DynamicCache

import fusionlab as fl
from fusionlab.engine.kv_capture import capture_kv
from fusionlab.engine.fit import calibration_paragraphs
from fusionlab.experiments.ttft import measure

OUT = Path(__file__).parent / "results"


def long_ids(lm: fl.LM, n: int) -> torch.Tensor:
    text = " ".join(calibration_paragraphs())
    ids = lm.encode(text)
    while ids.shape[1] < n:
        ids = torch.cat([ids, ids], dim=1)
    return ids[:, :n]


def timed(fn, reps: int) -> list[float]:
    out = []
    for _ in range(reps):
        t = time.perf_counter()
        fn()
        out.append(time.perf_counter() - t)
    return out


@torch.inference_mode()
def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--tokens", type=int, default=2048)
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--decode", type=int, default=32)
    args = ap.parse_args()
    m, s = fl.load("qwen2.5-coder-0.5b-instruct"), fl.load("smollm2-135m-instruct")
    proj = fl.fit_lstsq(m, s)
    text = m.tokenizer.decode(long_ids(m, args.tokens)[0])
    ids = m.encode(text)[:, :args.tokens]
    text = m.tokenizer.decode(ids[0])
    ids = m.encode(text)
    res: dict[str, object] = {"prompt_tokens": ids.shape[1], "threads": torch.get_num_threads(),
                              "torch": torch.__version__}

    # 1. no-op fusion forward vs plain master forward (512 tokens, full logits on both sides)
    short = ids[:, :512]
    plain_fwd = lambda: m.model(short, use_cache=True)  # noqa: E731
    plain_fwd()
    fwd: dict[str, list[float]] = {"plain": [], "noop": []}
    for _ in range(args.reps + 2):
        fwd["plain"] += timed(plain_fwd, 1)
        with fl.fuse(m, []) as f:
            fwd["noop"] += timed(lambda: f(short), 1)
    res["noop_forward_ratio"] = statistics.median(fwd["noop"]) / statistics.median(fwd["plain"])

    # 2. decode: per-step time at a long prompt, master alone (plain HF loop) vs fused (prefix concat)
    n = args.decode
    slave = fl.Slave(s, layer_map=proj.layer_map, projector=proj, align="mean")
    tok = torch.tensor([[m.tokenizer.encode(" the")[0]]])

    def master_steps() -> tuple[float, float]:
        cache = DynamicCache(config=m.model.config)
        t = time.perf_counter()
        m.model(ids, cache=cache, use_cache=True, logits_to_keep=1)
        prefill = time.perf_counter() - t
        steps = []
        for i in range(n):
            t = time.perf_counter()
            m.model(tok, cache=cache, use_cache=True, logits_to_keep=1,
                    position_ids=torch.tensor([[ids.shape[1] + i]]))
            steps.append(time.perf_counter() - t)
        return prefill, statistics.median(steps)

    def fused_steps() -> tuple[float, float]:
        with fl.fuse(m, [slave]) as f:
            t = time.perf_counter()
            seq, _, _ = f.prefill(text, max_new_tokens=n)
            prefill = time.perf_counter() - t
            steps = []
            for _ in range(n):
                t = time.perf_counter()
                f.decode_one_token(seq, tok)
                steps.append(time.perf_counter() - t)
        return prefill, statistics.median(steps)

    runs = {"master": [], "fused": [], "slave_prefill": []}
    s_ids = s.encode(text)
    for _ in range(args.reps):
        runs["master"].append(master_steps())
        runs["fused"].append(fused_steps())
        runs["slave_prefill"] += timed(lambda: capture_kv(s, s_ids, sorted(set(proj.layer_map.pairs.values()))), 1)
    med = lambda k, i: statistics.median(r[i] for r in runs[k])  # noqa: E731
    master_step, fused_step = med("master", 1), med("fused", 1)
    slave_prefill = statistics.median(runs["slave_prefill"])
    res.update({"decode_tokens": n, "master_decode_tok_s": 1 / master_step, "fused_decode_tok_s": 1 / fused_step,
                "decode_ratio": master_step / fused_step, "master_prefill_s": med("master", 0),
                "slave_prefill_s": slave_prefill, "fused_prefill_s": med("fused", 0),
                "prefill_ratio": med("fused", 0) / (med("master", 0) + slave_prefill)})

    # 3. cold vs warm TTFT in a fresh process
    res["ttft"] = measure(m.name, s.name, warm_runs=args.reps)
    res["ttft_warm_over_cold"] = res["ttft"]["warm_median_s"] / res["ttft"]["cold_s"]
    res["reps"] = args.reps
    OUT.mkdir(exist_ok=True)
    (OUT / "fusion.json").write_text(json.dumps(res, indent=2))
    print(json.dumps(res, indent=2))


if __name__ == "__main__":
    main()
