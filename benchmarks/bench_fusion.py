"""Speed of fusion vs the master alone, side by side in one process (Qwen master + SmolLM2 slave, lstsq, concat,
prefix), every ratio from ABAB pairs with a bootstrap 95% CI (benchmarks/paired.py: repetitions continue until the CI
is within ±0.03 or the budget ends).

    no-op fusion forward / master forward (512 tokens)                                  target <= 1.03
    fused / master decode throughput at a 2048-token prompt, batch 1                     target >= 0.95
    fused prefill / (master prefill + slave capture)                                      target <= 1.10
    fused / master decode throughput at batch 1, 4, 8, 16 (master: transformers' own
        left-padded batch; prompts of 300-500 tokens), in --runs whole runs (default 2)   target >= 0.95 each
    batch-8 aggregate tokens/s / batch-1 tokens/s (fused)                                 target >= 4
    cold vs warm time-to-first-token in a fresh process (the blog: 3.2 s -> 0.78 s)

Writes benchmarks/results/fusion.json. Usage: python benchmarks/bench_fusion.py [--max-reps 12] [--steps 16]
[--parts batch] (measure only some parts; the others keep their saved values; `measured` dates each part)
"""
from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import torch
from transformers import DynamicCache

import fusionlab as fl
from fusionlab.engine.fit import calibration_paragraphs
from fusionlab.engine.kv_capture import capture_kv
from fusionlab.files import atomic_write_text
from fusionlab.experiments.nb00_ttft import measure
from fusionlab.lab.readme import BENCH_PARTS

from fusionlab.analysis.paired_timing import paired_ratio

OUT = Path(__file__).parent / "results"


def long_text(lm: fl.LM, n: int, offset: int = 0) -> str:
    paras = calibration_paragraphs()
    ids = lm.encode(" ".join(paras[offset:] + paras[:offset]))
    while ids.shape[1] < n:
        ids = torch.cat([ids, ids], dim=1)
    return lm.tokenizer.decode(ids[0, :n])


def no_sync() -> None:
    """CPU work is done when a call returns; on CUDA pass torch.cuda.synchronize to time the kernels too."""


def master_decode(m: fl.LM, prompts: list[str], steps: int, sync=no_sync, prof=None) -> float:  # noqa: ANN001
    """transformers' own left-padded batch: prefill (untimed), then `steps` decode steps (timed; profiled by `prof`,
    a cProfile.Profile, if given)."""
    enc = m.tokenizer(prompts, return_tensors="pt", padding=True, padding_side="left")
    ids, mask = enc["input_ids"].to(m.device), enc["attention_mask"].to(m.device)
    pos = (mask.cumsum(1) - 1).clamp(min=0)
    cache = DynamicCache(config=m.model.config)
    m.model(input_ids=ids, attention_mask=mask, position_ids=pos, cache=cache, use_cache=True, logits_to_keep=1)
    tok = torch.full((len(prompts), 1), m.tokenizer.encode(" the")[0], device=m.device)
    sync()
    if prof:
        prof.enable()
    t = time.perf_counter()
    for _ in range(steps):
        mask = torch.cat([mask, torch.ones_like(tok)], dim=1)
        pos = pos[:, -1:] + 1
        m.model(input_ids=tok, attention_mask=mask, position_ids=pos, cache=cache, use_cache=True, logits_to_keep=1)
    sync()
    if prof:
        prof.disable()
    return time.perf_counter() - t


def fused_decode(f: fl.FusedModel, prompts: list[str], steps: int, sync=no_sync, prof=None) -> float:  # noqa: ANN001
    seq, _, _ = f.prefill(prompts if len(prompts) > 1 else prompts[0], max_new_tokens=steps)
    tok = torch.full((len(prompts), 1), f.master.tokenizer.encode(" the")[0], device=f.master.device)
    sync()
    if prof:
        prof.enable()
    t = time.perf_counter()
    for _ in range(steps):
        f.decode_one_token(seq, tok)
    sync()
    if prof:
        prof.disable()
    return time.perf_counter() - t


def attention_ms(decode, steps: int) -> float:  # noqa: ANN001
    """Milliseconds per decode step spent in the attention kernel (torch's scaled_dot_product_attention) during the
    decode steps of `decode(prof)` (prefill not profiled), from cProfile: splits a fused/master gap into attention
    over more keys (the slots) and the rest."""
    import cProfile
    import pstats

    prof = cProfile.Profile()
    decode(prof)
    stats = pstats.Stats(prof).stats  # (file, line, name) -> (calls, primitive calls, tottime, cumtime, callers)
    return 1000 * sum(v[2] for k, v in stats.items() if "scaled_dot_product_attention" in k[2]) / steps


def inverse(r: dict) -> dict:
    """A time ratio b/a as a throughput ratio a/b (bounds swap)."""
    return {"ratio": 1 / r["ratio"], "ci_low": 1 / r["ci_high"], "ci_high": 1 / r["ci_low"], "reps": r["reps"],
            "converged": r["converged"], "master_s": r["a_median_s"], "fused_s": r["b_median_s"]}


def summarise_batches(res: dict) -> None:
    """The README's batch rows read the first run; batch-8 / batch-1 scaling from it too."""
    batches = res["batch_decode"] = res["batch_decode_runs"][0]
    res.pop("batch8_over_batch1", None)
    if "1" in batches and "8" in batches:
        res["batch8_over_batch1"] = batches["8"]["fused_tok_s"] / batches["1"]["fused_tok_s"]


@torch.inference_mode()
def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--max-reps", type=int, default=12)
    ap.add_argument("--steps", type=int, default=16)
    ap.add_argument("--batches", type=int, nargs="*", default=[1, 4, 8, 16])
    ap.add_argument("--runs", type=int, default=2, help="whole repeats of the batch part, each reported")
    ap.add_argument("--parts", nargs="+", choices=BENCH_PARTS, default=list(BENCH_PARTS),
                    help="measure only these (the others keep their values in fusion.json; each ratio is paired "
                         "within its own part, so parts measured on different days stay comparable)")
    args = ap.parse_args()
    out = OUT / "fusion.json"
    res: dict[str, object] = json.loads(out.read_text()) if out.exists() and set(args.parts) != set(BENCH_PARTS) else {}
    m, s = fl.load("qwen2.5-coder-0.5b-instruct"), fl.load("smollm2-135m-instruct")
    proj = fl.fit_lstsq(m, s)
    slave = fl.Slave(s, layer_map=proj.layer_map, projector=proj, align="mean")
    kw = dict(min_reps=4, max_reps=args.max_reps, halfwidth=0.03)
    res.update({"threads": torch.get_num_threads(), "torch": torch.__version__, "steps": args.steps})
    res.setdefault("measured", {}).update({p: time.strftime("%Y-%m-%d") for p in args.parts})

    if "noop" in args.parts:
        short = m.encode(long_text(m, 512))[:, :512]
        with fl.fuse(m, []) as noop:
            res["noop_forward"] = paired_ratio(lambda: m.model(short, use_cache=True), lambda: noop(short), **kw)

    text = long_text(m, 2048)
    with fl.fuse(m, [slave]) as f:
        if "decode" in args.parts:
            res["decode_2k"] = inverse(paired_ratio(lambda: master_decode(m, [text], args.steps),
                                                    lambda: fused_decode(f, [text], args.steps), **kw))
        layers = sorted(set(proj.layer_map.pairs.values()))
        s_ids, ids = s.encode(text), m.encode(text)

        def separate() -> None:
            m.model(ids, use_cache=True, logits_to_keep=1)
            capture_kv(s, s_ids, layers)

        if "prefill" in args.parts:
            res["prefill_2k"] = paired_ratio(separate, lambda: f.prefill(text), **kw)
        res["prompt_tokens"] = int(ids.shape[1])
        if "batch" in args.parts:
            res["batch_decode_runs"] = []
            for run in range(args.runs):  # whole repeats: a ratio that holds in one run only is not claimed
                batches = {}
                for b in args.batches:
                    prompts = [long_text(m, 300 + (200 * i) // max(b - 1, 1), offset=i) for i in range(b)]
                    r = inverse(paired_ratio(lambda: master_decode(m, prompts, args.steps),
                                             lambda: fused_decode(f, prompts, args.steps), **kw))
                    r["fused_tok_s"] = b * args.steps / r["fused_s"]
                    r["master_tok_s"] = b * args.steps / r["master_s"]
                    r["master_attention_ms"] = attention_ms(lambda p: master_decode(m, prompts, args.steps, prof=p),
                                                            args.steps)
                    r["fused_attention_ms"] = attention_ms(lambda p: fused_decode(f, prompts, args.steps, prof=p),
                                                           args.steps)
                    batches[str(b)] = r
                    print(f"run {run + 1}, batch {b}: {r}", flush=True)
                res["batch_decode_runs"].append(batches)
                summarise_batches(res)
                atomic_write_text(out, json.dumps(res, indent=2))  # a benchmark stopped later keeps these runs
    if "ttft" in args.parts:
        res["ttft"] = measure(m.name, s.name, warm_runs=5)
        res["ttft_warm_over_cold"] = res["ttft"]["warm_median_s"] / res["ttft"]["cold_s"]
    atomic_write_text(out, json.dumps(res, indent=2))
    print(json.dumps(res, indent=2))


if __name__ == "__main__":
    main()
