"""The posts' GPU-only claims, judged from the JSON `benchmarks/gpu_claims.py` writes on a lent GPU.

No GPU here: the measurements come from a file (`benchmarks/results/gpu_claims.json`, fetched from the device
machine); this module only reads it and applies one verdict rule per claim, tested on hand-made results. Without the
file the ledger says so (`claim.unmeasured`); with it, these rows replace the "not run yet" ones. A value the run could
not measure (a CPU dry run has no CUDA counters) gives "not testable here", never a verdict.

Our models (0.5B master, 135M slave) and GPU (whatever was lent) are not the posts' (9B pairs, a 4090/A100): the
`setup` field says which, and absolute budgets (800 ms, 3.2 GB) are read as the posts state them.
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Callable

from ..paths import bench_results_dir
from .claim import Claim

NB = "gpu_claims"
SIDE_STREAM_GAIN = 0.95
"""A side stream 'runs the slave in the background' if a decode step takes < 95 % of the one-stream step."""
FP16_MARGIN = 0.05
"""fp16 'beats' bf16 only by more than 5 % decode throughput (one run, no CI: within 5 % is inconclusive)."""
NO_CREEP_GB = 0.2
"""C47's own tolerance: memory over repeated calls held within ± 0.2 GB."""


def results_path() -> Path:
    return bench_results_dir() / "gpu_claims.json"


def load(path: Path | None = None) -> dict[str, Any] | None:
    """The GPU run's results, or None when no session has run it yet."""
    p = path or results_path()
    return json.loads(p.read_text()) if p.is_file() else None


def _dtypes(r: dict[str, Any]) -> list[str]:
    return sorted(k.removeprefix("fused_") for k in r if k.startswith("fused_"))


def first_token_verdict(seconds: float | None, budget: float = 0.8) -> str:
    if seconds is None:
        return "not testable here"
    return "supported" if seconds < budget else "not supported"


def fp16_verdict(fp16_tok_s: float | None, bf16_tok_s: float | None) -> str:
    if not fp16_tok_s or not bf16_tok_s:
        return "not testable here"
    ratio = fp16_tok_s / bf16_tok_s
    return "supported" if ratio > 1 + FP16_MARGIN else "not supported" if ratio < 1 - FP16_MARGIN else "inconclusive"


def allocation_cut_verdict(dynamic: float | None, static: float | None, claimed: float = 0.76) -> str:
    """C28: pre-allocating cuts allocator events by 76 %: supported at >= half that cut, partly at any cut."""
    if dynamic is None or static is None or dynamic <= 0:
        return "not testable here"
    cut = 1 - static / dynamic
    return "supported" if cut >= claimed / 2 else "partly supported" if cut > 0 else "not supported"


def peak_memory_verdict(dynamic_gb: float | None, static_gb: float | None, claimed_gb: float = 3.2) -> str:
    if dynamic_gb is None or static_gb is None:
        return "not testable here"
    saved = dynamic_gb - static_gb
    return "supported" if saved >= claimed_gb else "partly supported" if saved > 0 else "not supported"


def fragmentation_verdict(ratios: list[float | None]) -> str:
    """C50's yardstick on a healthy run: reserved/allocated within [1, 2] everywhere is consistent with it."""
    seen = [x for x in ratios if x is not None]
    if not seen:
        return "not testable here"
    return "supported" if all(1.0 <= x <= 2.0 for x in seen) else "inconclusive"


def stream_verdict(one_stream_s: float | None, side_stream_s: float | None) -> str:
    if not one_stream_s or side_stream_s is None:
        return "not testable here"
    return "supported" if side_stream_s < SIDE_STREAM_GAIN * one_stream_s else "not supported"


def training_verdict(training: dict[str, Any] | None) -> str:
    """C36: training through the stitched model raises an illegal memory access."""
    if not training:
        return "not testable here"
    err = str(training.get("error", ""))
    if "illegal memory access" in err.lower():
        return "supported"
    return "not supported" if not err and int(training.get("steps", 0)) >= 1 else "inconclusive"


def memory_creep_verdict(allocated_gb: list[float] | None) -> str:
    """C47: a leak makes memory creep over repeated calls; FusionLab's generations holding within ± 0.2 GB do not."""
    if not allocated_gb or len(allocated_gb) < 2:
        return "not testable here"
    return "not supported" if max(allocated_gb) - min(allocated_gb) <= 2 * NO_CREEP_GB else "partly supported"


def _get(r: dict[str, Any], *keys: str) -> Any:
    for k in keys:
        r = r.get(k) if isinstance(r, dict) else None
    return r


def claims(r: dict[str, Any]) -> list[Claim]:
    """One ledger row per GPU claim from a GPU run's results."""
    d = _dtypes(r)
    half = "float16" if "float16" in d else d[0]
    setup = f"{r['master']} + {r['slave']} on {r['device']}, torch {r['torch']}, {r['tokens']} new tokens"
    fmt: Callable[[Any, str], str] = lambda x, spec: "n/a" if x is None else format(x, spec)  # noqa: E731
    ft = _get(r, f"fused_{half}", "first_token_s")
    tok = {t: _get(r, f"fused_{t}", "decode_tok_s") for t in d}
    cache = {t: r.get(f"cache_{t}", {}) for t in d}
    dyn, sta = cache[half].get("dynamic", {}), cache[half].get("static", {})
    streams = r.get(f"streams_{half}", {})
    alloc = _get(r, f"memory_calls_{half}", "allocated_gb")
    row = dict(n="one run", setup=setup, notebook=NB)
    return [
        Claim(claim="4090, batch 1, 1024 new tokens: first token < 800 ms", seed_section="A§3.1",
              seed_value="< 800 ms", measured=f"fused ({half}) first token {fmt(ft, '.3f')} s",
              verdict=first_token_verdict(ft), claim_id="C14", **row),
        Claim(claim="on a 4090, FP16 beats BF16", seed_section="A§3.1", seed_value="qualitative",
              measured="fused decode " + ", ".join(f"{t} {fmt(v, '.1f')} tok/s" for t, v in tok.items()),
              verdict=fp16_verdict(tok.get("float16"), tok.get("bfloat16")), claim_id="C15", **row),
        Claim(claim="separate CUDA streams run the slave in the background", seed_section="A§3.4",
              seed_value="qualitative", measured=f"decode step, master + slave: one stream "
              f"{fmt(streams.get('one_stream_s'), '.4f')} s, slave on a side stream {fmt(streams.get('side_stream_s'), '.4f')} s",
              verdict=stream_verdict(streams.get("one_stream_s"), streams.get("side_stream_s")), claim_id="C27", **row),
        Claim(claim="pre-allocating the cache cuts GC frequency by 76 %", seed_section="A§3.4", seed_value="−76 %",
              measured=f"allocator events, grown {dyn.get('allocations')} vs pre-allocated {sta.get('allocations')}",
              verdict=allocation_cut_verdict(dyn.get("allocations"), sta.get("allocations")), claim_id="C28", **row),
        Claim(claim="pre-allocation lowers peak memory by 3.2 GB", seed_section="A§3.4", seed_value="-3.2 GB",
              measured=f"peak allocated, grown {fmt(dyn.get('peak_allocated_gb'), '.3f')} GB vs pre-allocated "
              f"{fmt(sta.get('peak_allocated_gb'), '.3f')} GB",
              verdict=peak_memory_verdict(dyn.get("peak_allocated_gb"), sta.get("peak_allocated_gb")),
              claim_id="C29", **row),
        Claim(claim="`trainer.train()` on the stitched model → illegal memory access", seed_section="A§4.3",
              seed_value="qualitative", measured=f"FusionLab fuser training: {_get(r, 'training', 'steps')} steps, "
              f"error: {_get(r, 'training', 'error') or 'none'}", verdict=training_verdict(r.get("training")),
              claim_id="C36", **row),
        Claim(claim="concurrent OOM is a CUDA context leak; a CUDA graph fix holds 19.7 ± 0.2 GB",
              seed_section="A§5.3", seed_value="± 0.2 GB",
              measured="allocated after each of 10 generations: " + ("n/a" if not alloc else
                                                                     f"{min(alloc):.3f}-{max(alloc):.3f} GB"),
              verdict=memory_creep_verdict(alloc), claim_id="C47", **row),
        Claim(claim="`memory_reserved ≈ 1.3 × allocated` is healthy; > 2× means fragmentation", seed_section="A§5.4",
              seed_value="1.3×, 2×", measured="reserved/allocated after decoding: " + ", ".join(
                  f"{t} {k} {fmt(cache[t].get(k, {}).get('reserved_over_allocated'), '.2f')}"
                  for t in d for k in ("dynamic", "static")),
              verdict=fragmentation_verdict([cache[t].get(k, {}).get("reserved_over_allocated")
                                             for t in d for k in ("dynamic", "static")]), claim_id="C50", **row),
    ]
