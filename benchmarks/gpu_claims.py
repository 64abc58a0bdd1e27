"""The posts' GPU-only claims, as one short prepared script for a lent GPU (the `device` tool); writes JSON the lab reads.

    C14  batch 1, 1024 new tokens: first token < 800 ms (fused)       C15  fp16 beats bf16 (decode tokens/s, fused)
    C28  pre-allocating the cache cuts allocations (allocator counts, DynamicCache vs StaticCache, plain master)
    C29  pre-allocation lowers peak memory (same runs: peak allocated)  C50  memory_reserved / memory_allocated
    C27  a side CUDA stream runs the slave in the background (decode step: master then slave on one stream, vs the
         slave on its own stream)                                        C36  training through the stitched model
         raises an illegal memory access (FusionLab's fuser training, a few steps)
    C47  memory stays at one level over repeated generations (allocated after each of N calls: spread)

Our embedded models by default (any HF id or local path works: --master / --slave). Nothing here needs the network.
`--device cpu --tokens 8` is the dry run the tests execute (CUDA counters are then absent and reported as such).

    python benchmarks/gpu_claims.py --out $OUT/gpu_claims.json            # on the device machine, ~3-5 min on an H200
    cp <fetched>/gpu_claims.json benchmarks/results/                       # then `fusionlab ledger`

The ledger reads the JSON (fusionlab/experiments/gpu_claims.py: one verdict rule per claim); until a session with a GPU
has run this, benchmarks/results/gpu_claims.json is absent and the ledger says "not run yet".
"""
from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import torch
from transformers import DynamicCache, StaticCache

import fusionlab as fl


def sync(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize()


def fused_pair(master: str, slave: str, dtype: str, device: str) -> tuple[fl.LM, fl.LM, fl.FusedModel]:
    m, s = fl.load(master, dtype=dtype, device=device), fl.load(slave, dtype=dtype, device=device)
    proj = fl.fit_lstsq(m, s)
    return m, s, fl.fuse(m, [fl.Slave(s, layer_map=proj.layer_map, projector=proj, align="mean")])


@torch.inference_mode()
def first_token_and_decode(f: fl.FusedModel, prompt: str, tokens: int, device: str) -> dict[str, float]:
    """Time to first token (prefill + one step), then tokens/s over `tokens` greedy steps (EOS ignored)."""
    f.generate(prompt, max_new_tokens=2)  # warm-up: kernels, allocator
    sync(device)
    t0 = time.perf_counter()
    seq, _, logits = f.prefill(prompt, max_new_tokens=tokens)  # logits (B, V) of the last prompt token
    tok = logits.argmax(-1, keepdim=True)  # (B, 1)
    sync(device)
    first = time.perf_counter() - t0
    t1 = time.perf_counter()
    for _ in range(tokens - 1):
        tok = f.decode_one_token(seq, tok).argmax(-1, keepdim=True)
    sync(device)
    return {"first_token_s": first, "decode_tok_s": (tokens - 1) / (time.perf_counter() - t1)}


@torch.inference_mode()
def cache_memory(m: fl.LM, prompt: str, tokens: int, static: bool, device: str) -> dict[str, float | None]:
    """Plain greedy decoding with a grown (DynamicCache) or pre-allocated (StaticCache) cache: allocator counts."""
    ids = m.encode(prompt).to(device)
    cuda = device.startswith("cuda")
    if cuda:
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()
        before = torch.cuda.memory_stats()
    cache = StaticCache(config=m.model.config, max_cache_len=ids.shape[1] + tokens) if static else \
        DynamicCache(config=m.model.config)
    pos = torch.arange(ids.shape[1], device=device)
    tok = m.model(input_ids=ids, cache=cache, use_cache=True, cache_position=pos).logits[:, -1:].argmax(-1)
    for i in range(tokens - 1):
        p = torch.tensor([ids.shape[1] + i], device=device)
        tok = m.model(input_ids=tok, cache=cache, use_cache=True, cache_position=p).logits[:, -1:].argmax(-1)
    if not cuda:
        return {"allocations": None, "peak_allocated_gb": None, "reserved_over_allocated": None}
    after = torch.cuda.memory_stats()
    return {"allocations": after["allocation.all.allocated"] - before["allocation.all.allocated"],
            "peak_allocated_gb": torch.cuda.max_memory_allocated() / 1e9,
            "reserved_over_allocated": torch.cuda.memory_reserved() / max(torch.cuda.memory_allocated(), 1)}


@torch.inference_mode()
def stream_overlap(m: fl.LM, s: fl.LM, prompt: str, steps: int, device: str) -> dict[str, float | None]:
    """Per decode step, the master's and the slave's forward one after the other on one stream, vs the slave on a
    side stream while the master runs (plain models, each with its own cache): median seconds per step."""
    if not device.startswith("cuda"):
        return {"one_stream_s": None, "side_stream_s": None}
    side = torch.cuda.Stream()

    def run(streams: bool) -> float:
        caches = [DynamicCache(config=x.model.config) for x in (m, s)]
        toks = [x.model(input_ids=x.encode(prompt).to(device), cache=c, use_cache=True).logits[:, -1:].argmax(-1)
                for x, c in zip((m, s), caches)]
        times = []
        for _ in range(steps):
            sync(device)
            t0 = time.perf_counter()
            if streams:
                side.wait_stream(torch.cuda.current_stream())
                with torch.cuda.stream(side):
                    toks[1] = s.model(input_ids=toks[1], cache=caches[1], use_cache=True).logits[:, -1:].argmax(-1)
                toks[0] = m.model(input_ids=toks[0], cache=caches[0], use_cache=True).logits[:, -1:].argmax(-1)
                torch.cuda.current_stream().wait_stream(side)
            else:
                toks[1] = s.model(input_ids=toks[1], cache=caches[1], use_cache=True).logits[:, -1:].argmax(-1)
                toks[0] = m.model(input_ids=toks[0], cache=caches[0], use_cache=True).logits[:, -1:].argmax(-1)
            sync(device)
            times.append(time.perf_counter() - t0)
        return float(sorted(times)[len(times) // 2])

    run(False)
    return {"one_stream_s": run(False), "side_stream_s": run(True)}


def training_steps(m: fl.LM, s: fl.LM, steps: int) -> dict[str, object]:
    """C36: FusionLab's fuser training (gradients through the stitched model) for a few steps: error or not."""
    from fusionlab.training import TrainChunk, TrainConfig, train_fuser

    chunks = [TrainChunk(p) for p in fl.fit.calibration_paragraphs()[:4]]
    try:
        r = train_fuser(m, s, chunks, train=TrainConfig(max_tokens=steps * 64, threads=None), progress=False)
        return {"steps": int(r.manifest["steps"]), "error": ""}
    except Exception as e:  # noqa: BLE001  (the error, if any, is the measurement)
        return {"steps": 0, "error": f"{type(e).__name__}: {str(e)[:200]}"}


@torch.inference_mode()
def memory_over_calls(f: fl.FusedModel, prompt: str, calls: int, tokens: int, device: str) -> dict[str, object]:
    """C47: memory_allocated after each of `calls` generations (GB): its spread says whether memory creeps."""
    if not device.startswith("cuda"):
        return {"allocated_gb": None}
    after = []
    for _ in range(calls):
        f.generate(prompt, max_new_tokens=tokens)
        sync(device)
        after.append(torch.cuda.memory_allocated() / 1e9)
    return {"allocated_gb": after, "spread_gb": max(after) - min(after)}


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser()
    ap.add_argument("--master", default="qwen2.5-coder-0.5b-instruct")
    ap.add_argument("--slave", default="smollm2-135m-instruct")
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--tokens", type=int, default=1024)
    ap.add_argument("--dtypes", nargs="*", default=["float16", "bfloat16"])
    ap.add_argument("--prompt-chars", type=int, default=None, help="cut the prompt (the tests' tiny models)")
    ap.add_argument("--out", default=str(Path(__file__).parent / "results" / "gpu_claims.json"))
    args = ap.parse_args(argv)
    prompt = (" ".join(fl.fit.calibration_paragraphs()[:4]) + "\n\nSummarise the text above.")[-(args.prompt_chars or 0):]
    res: dict = {"device": torch.cuda.get_device_name() if args.device.startswith("cuda") else args.device,
                 "torch": torch.__version__, "date": time.strftime("%Y-%m-%dT%H:%M:%S"), "master": args.master,
                 "slave": args.slave, "tokens": args.tokens}
    for dtype in args.dtypes:
        m, _, f = fused_pair(args.master, args.slave, dtype, args.device)
        with f:
            res[f"fused_{dtype}"] = first_token_and_decode(f, prompt, args.tokens, args.device)
            res[f"memory_calls_{dtype}"] = memory_over_calls(f, prompt, 10, min(args.tokens, 64), args.device)
        res[f"cache_{dtype}"] = {kind: cache_memory(m, prompt, args.tokens, kind == "static", args.device)
                                 for kind in ("dynamic", "static")}
        s = fl.load(args.slave, dtype=dtype, device=args.device)
        res[f"streams_{dtype}"] = stream_overlap(m, s, prompt, min(args.tokens, 64), args.device)
        del m, f, s
    m, s = fl.load(args.master, device=args.device), fl.load(args.slave, device=args.device)
    res["training"] = training_steps(m, s, 3)
    return write(res, args.out)


def write(res: dict, out: str) -> dict:
    """The JSON the lab reads (fetched from the device machine into benchmarks/results/), also printed."""
    Path(out).parent.mkdir(parents=True, exist_ok=True)
    Path(out).write_text(json.dumps(res, indent=2))
    print(json.dumps(res, indent=2))
    return res


if __name__ == "__main__":
    main()
