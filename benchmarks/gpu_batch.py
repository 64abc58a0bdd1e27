"""The exactness anchors and the batched decode benchmark on a lent GPU (CUDA, bf16 by default); writes JSON.

    anchors: no slave = master; self-fusion (concat, live) = master, same greedy tokens; replace with itself = master;
             layer-0 keys of a θ-shifted copy re-rotated = master's; every row of a batch = its prompt alone (cross slave, lstsq)
    benchmark: fused / master decode throughput at batch 1, 4, 8, 16 (ABAB pairs, bootstrap CI), batch-8 / batch-1

Differences are reported as measured (bf16 rounds differently from fp32; the CPU tests assert fp32 tolerances).
`--device cpu --dtype float32` on tiny models is the dry run the tests execute.

    python benchmarks/gpu_batch.py --out $OUT/gpu_batch.json          # on the device machine, a few minutes
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

import fusionlab as fl
from fusionlab.analysis.paired_timing import paired_ratio
from fusionlab.models.variants import rope_variant

sys.path.insert(0, str(Path(__file__).parent))
from bench_fusion import fused_decode, inverse, long_text, master_decode  # noqa: E402
from gpu_claims import write  # noqa: E402

PROMPTS = ["Hi.", "The quick brown fox jumps over the lazy dog near the river bank, twice over.",
           "def f(x):\n    return x * 2  # 注释", "A medium sized prompt about maps and rivers."]


@torch.inference_mode()
def anchors(m: fl.LM, s: fl.LM, name: str, dtype: str, device: str) -> dict[str, object]:
    ids = m.encode(PROMPTS[1])
    ref = m.model(ids).logits
    diff = lambda x: float((x.float() - ref.float()).abs().max())  # noqa: E731
    out: dict[str, object] = {}
    with fl.fuse(m, []) as f:
        out["no_slave"] = diff(f(ids))
    copy = fl.load(name, dtype=dtype, device=device)
    with fl.fuse(m, [fl.Slave(copy, mode="concat")], timing="live") as f:
        out["self_fusion_live"] = diff(f(ids))
        out["self_fusion_greedy_equal"] = f.generate(PROMPTS[1], max_new_tokens=16) == \
            m.tokenizer.decode(m.model.generate(ids, max_new_tokens=16, do_sample=False)[0, ids.shape[1]:],
                               skip_special_tokens=True)
    with fl.fuse(m, [fl.Slave(copy, mode="replace")]) as f:
        out["replace_self"] = diff(f(ids))
    shifted = rope_variant(name, theta_factor=4.0)
    shifted.model.to(device=device, dtype=m.dtype)
    with fl.fuse(m, [fl.Slave(shifted, layer_map={0: 0}, mode="replace", rope="master")]) as f:
        out["theta_shifted_rerotated_layer0"] = diff(f(ids))  # layer 0 only: deeper layers' inputs differ
    proj = fl.fit_lstsq(m, s)
    with fl.fuse(m, [fl.Slave(s, layer_map=proj.layer_map, projector=proj, align="mean")]) as f:
        batch = f(PROMPTS)
        rows = [float((batch[b, -f(p).shape[1]:].float() - f(p)[0].float()).abs().max()) for b, p in enumerate(PROMPTS)]
        out["batch_rows_vs_alone_max"] = max(rows)
        out["batch_greedy_equal"] = f.generate(PROMPTS, max_new_tokens=8) == \
            [f.generate(p, max_new_tokens=8) for p in PROMPTS]
    return out


@torch.inference_mode()
def batch_bench(m: fl.LM, s: fl.LM, batches: list[int], steps: int, max_reps: int, sync) -> dict[str, object]:  # noqa: ANN001
    proj = fl.fit_lstsq(m, s)
    res: dict[str, object] = {}
    with fl.fuse(m, [fl.Slave(s, layer_map=proj.layer_map, projector=proj, align="mean")]) as f:
        for b in batches:
            prompts = [long_text(m, 300 + (200 * i) // max(b - 1, 1), offset=i) for i in range(b)]
            r = inverse(paired_ratio(lambda: master_decode(m, prompts, steps, sync),
                                     lambda: fused_decode(f, prompts, steps, sync), min_reps=3, max_reps=max_reps))
            r["fused_tok_s"], r["master_tok_s"] = b * steps / r["fused_s"], b * steps / r["master_s"]
            res[str(b)] = r
    if "1" in res and "8" in res:
        res["batch8_over_batch1"] = res["8"]["fused_tok_s"] / res["1"]["fused_tok_s"]
    return res


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser()
    ap.add_argument("--master", default="qwen2.5-coder-0.5b-instruct")
    ap.add_argument("--slave", default="smollm2-135m-instruct")
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--dtype", default="bfloat16")
    ap.add_argument("--batches", type=int, nargs="*", default=[1, 4, 8, 16])
    ap.add_argument("--steps", type=int, default=32)
    ap.add_argument("--max-reps", type=int, default=10)
    ap.add_argument("--out", default=str(Path(__file__).parent / "results" / "gpu_batch.json"))
    args = ap.parse_args(argv)
    cuda = args.device.startswith("cuda")
    m = fl.load(args.master, dtype=args.dtype, device=args.device)
    s = fl.load(args.slave, dtype=args.dtype, device=args.device)
    res = {"device": torch.cuda.get_device_name() if cuda else args.device, "dtype": args.dtype,
           "torch": torch.__version__, "master": args.master, "slave": args.slave,
           "anchors": anchors(m, s, args.master, args.dtype, args.device),
           "batch_decode": batch_bench(m, s, args.batches, args.steps, args.max_reps,
                                       torch.cuda.synchronize if cuda else (lambda: None))}
    return write(res, args.out)


if __name__ == "__main__":
    main()
