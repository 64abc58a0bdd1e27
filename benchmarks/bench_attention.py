"""Cost of capturing aggregated attention (all layers, every query) on a 2K-token Qwen prompt, side by side
with a plain sdpa forward and with HF eager `output_attentions` (issue #5 target: capture <= 1.5x plain).
Writes benchmarks/results/attention.json. Usage: python benchmarks/bench_attention.py [--tokens 2048] [--reps 3]
"""
from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

import torch

import fusionlab as fl
from fusionlab.engine.fit import calibration_paragraphs

OUT = Path(__file__).parent / "results"


@torch.inference_mode()
def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--tokens", type=int, default=2048)
    ap.add_argument("--reps", type=int, default=3)
    args = ap.parse_args()
    m = fl.load("qwen2.5-coder-0.5b-instruct")
    eager = fl.load("qwen2.5-coder-0.5b-instruct", attn_implementation="eager")
    ids = m.encode(" ".join(calibration_paragraphs()))
    while ids.shape[1] < args.tokens:
        ids = torch.cat([ids, ids], 1)
    ids = ids[:, : args.tokens]

    def plain() -> None:
        m.model(ids, logits_to_keep=1)

    def capture() -> None:
        with fl.capture_attention(m, keep="aggregate"):
            m.model(ids, logits_to_keep=1)

    def hf_eager() -> None:
        eager.model(ids, logits_to_keep=1, output_attentions=True)

    fns = {"plain_sdpa": plain, "capture_aggregate": capture, "hf_eager_output_attentions": hf_eager}
    times: dict[str, list[float]] = {k: [] for k in fns}
    for f in fns.values():
        f()
    for _ in range(args.reps):
        for k, f in fns.items():
            t = time.perf_counter()
            f()
            times[k].append(time.perf_counter() - t)
    med = {k: statistics.median(v) for k, v in times.items()}
    res = {"tokens": ids.shape[1], "reps": args.reps, "seconds": med,
           "capture_over_plain": med["capture_aggregate"] / med["plain_sdpa"],
           "hf_eager_over_plain": med["hf_eager_output_attentions"] / med["plain_sdpa"]}
    OUT.mkdir(exist_ok=True)
    (OUT / "attention.json").write_text(json.dumps(res, indent=2))
    print(json.dumps(res, indent=2))


if __name__ == "__main__":
    main()
