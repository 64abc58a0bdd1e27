"""Notebook 08, part 2: the posts' claims about model behaviour that a short run on our models settles.

    C13 gradients make the stitched model non-deterministic      C20 the slave needs use_cache=False to expose K/V
    C24 eval() + no_grad are mandatory against dropout           C44 strict=False postpones a shape error
    C56 cached decoding equals recomputing everything            C05 fused output entropy is higher
    C70 a larger batch raises throughput and latency

Each `measure_*` returns plain numbers; each `*_verdict` reads only those (tested on hand-made numbers).
"""
from __future__ import annotations

import time
from typing import Any, Callable

import numpy as np
import torch
import torch.nn.functional as F
from transformers import DynamicCache

from ..analysis.stats import bootstrap_ci, interval
from ..engine.fit import fit_lstsq
from ..engine.fuse import fuse
from ..engine.kv_capture import capture_kv
from ..engine.lm import LM
from ..engine.slave import Slave
from ..errors import FusionLabError
from ..training.attention import fused_logits
from ..training.chunks import TrainChunk, prepare, slots_of
from .claim import Claim

NB = "08_remaining_claims"


# --- C13: gradients and determinism --------------------------------------------------------------------------
def measure_grad_determinism(lm: LM, ids: torch.Tensor, repeats: int = 3, slave: LM | None = None,
                             text: str | None = None) -> dict[str, Any]:
    """Logits (1, T, V) under no_grad and enable_grad, `repeats` times each, compared bitwise: the master's own
    forward, and with `slave` (+ `text`) the *stitched* model on the path gradients really flow through (the
    training path: the slave's lstsq slots in the master's attention; fused inference runs under inference_mode, so
    enable_grad cannot reach it)."""
    def compare(forward: Callable[[], torch.Tensor], prefix: str) -> dict[str, Any]:
        def run(grad: bool) -> list[torch.Tensor]:
            with torch.set_grad_enabled(grad):
                return [forward().detach() for _ in range(repeats)]
        plain, grad = run(False), run(True)
        return {f"{prefix}no_grad_repeats_identical": all(torch.equal(plain[0], x) for x in plain),
                f"{prefix}grad_repeats_identical": all(torch.equal(grad[0], x) for x in grad),
                f"{prefix}grad_vs_no_grad_max_abs": float((grad[0] - plain[0]).abs().max())}

    out = {"repeats": repeats, **compare(lambda: lm.model(ids).logits, "")}
    if slave is not None:
        if text is None:
            raise FusionLabError("measure_grad_determinism(slave=...) needs the text the stitched model reads.")
        proj = fit_lstsq(lm, slave)
        with fuse(lm, [Slave(slave, layer_map=proj.layer_map, projector=proj, mode="concat", align="mean")]) as f:
            p = prepare(f, [TrainChunk(text)], "same", [0])[0]
            out.update(compare(lambda: fused_logits(f, p.ids, slots_of(f, None, p)), "stitched_"))
    return out


def grad_verdict(m: dict[str, Any]) -> str:
    """Judged on the stitched model where it was measured (else the master alone, the old measurement): supported
    iff no_grad repeats agree and enable_grad repeats do not; not supported iff both agree, on this CPU."""
    k = "stitched_" if "stitched_grad_repeats_identical" in m else ""
    return "supported" if m[f"{k}no_grad_repeats_identical"] and not m[f"{k}grad_repeats_identical"] else \
        "not supported"


# --- C24: dropout --------------------------------------------------------------------------------------------
def measure_dropout(lm: LM, ids: torch.Tensor) -> dict[str, Any]:
    """Logits in train() vs eval() (the model is put back in eval); the config's dropout rates."""
    cfg = lm.model.config.to_dict()
    rates = {k: v for k, v in cfg.items() if "dropout" in k and isinstance(v, (int, float))}
    with torch.no_grad():
        ref = lm.model(ids).logits
        lm.model.train()
        try:
            torch.manual_seed(0)
            trained = lm.model(ids).logits
        finally:
            lm.model.eval()
    return {"dropout_rates": rates, "train_vs_eval_max_abs": float((trained - ref).abs().max())}


def dropout_verdict(m: dict[str, Any]) -> str:
    return "supported" if m["train_vs_eval_max_abs"] > 0 else "not supported"


# --- C20: use_cache and the K/V hooks ------------------------------------------------------------------------
def measure_use_cache(lm: LM, ids: torch.Tensor) -> dict[str, Any]:
    """FusionLab's K/V hooks (on k_proj / v_proj) with use_cache=False and with a live cache (use_cache=True)."""
    off = capture_kv(lm, ids)
    on = capture_kv(lm, ids, cache=DynamicCache(config=lm.model.config))
    same = all(torch.equal(off.keys[i], on.keys[i]) and torch.equal(off.values[i], on.values[i]) for i in off.keys)
    return {"layers_seen_use_cache_false": len(off.keys), "layers_seen_use_cache_true": len(on.keys),
            "identical": same}


def use_cache_verdict(m: dict[str, Any]) -> str:
    exposed = m["layers_seen_use_cache_true"] == m["layers_seen_use_cache_false"] > 0 and m["identical"]
    return "not supported" if exposed else "supported"


# --- C44: strict=False ---------------------------------------------------------------------------------------
def measure_strict_false(target: torch.nn.Module, source: torch.nn.Module) -> dict[str, Any]:
    """Load a differently shaped model's weights with strict=False: does it fail at load, or load and fail later?
    (Into a copy: torch copies the matching tensors before it raises.)"""
    import copy

    target = copy.deepcopy(target)
    try:
        target.load_state_dict(source.state_dict(), strict=False)
        return {"fails_at_load": False, "error": ""}
    except RuntimeError as e:
        first = next((ln.strip() for ln in str(e).splitlines() if "size mismatch" in ln), str(e).splitlines()[0])
        return {"fails_at_load": True, "error": first[:160]}


def strict_false_verdict(m: dict[str, Any]) -> str:
    return "not supported" if m["fails_at_load"] else "supported"


# --- C56: cached decoding vs recomputing ---------------------------------------------------------------------
@torch.inference_mode()
def measure_cached_decoding(lm: LM, ids: torch.Tensor, steps: int) -> dict[str, Any]:
    """Greedy decoding with a KV cache vs recomputing the whole sequence at every step: tokens and logits."""
    cache = DynamicCache(config=lm.model.config)
    logits = lm.model(input_ids=ids, cache=cache, use_cache=True).logits[:, -1]
    seq, diffs, same = ids, [], 0
    for _ in range(steps):
        full = lm.model(input_ids=seq).logits[:, -1]  # no cache: everything recomputed
        diffs.append(float((full - logits).abs().max()))
        same += int(full.argmax(-1) == logits.argmax(-1))
        tok = logits.argmax(-1, keepdim=True)  # (1, 1)
        seq = torch.cat([seq, tok], dim=1)
        logits = lm.model(input_ids=tok, cache=cache, use_cache=True).logits[:, -1]
    return {"steps": steps, "same_argmax": same, "max_abs_logit_diff": max(diffs), "dtype": str(lm.dtype)}


def cached_decoding_verdict(m: dict[str, Any], tol: float = 1e-3) -> str:
    """Equal up to floating-point reassociation (fp32 here), with every greedy token the same."""
    return "supported" if m["same_argmax"] == m["steps"] and m["max_abs_logit_diff"] <= tol else "not supported"


# --- C05: entropy of the fused output ------------------------------------------------------------------------
def token_entropy(logits: torch.Tensor) -> torch.Tensor:
    """Next-token entropy in nats (T,) of logits (1, T, V)."""
    logp = F.log_softmax(logits[0].float(), -1)
    return -(logp.exp() * logp).sum(-1)


@torch.inference_mode()
def measure_entropy(master: LM, fused: Any, texts: list[str], seed: int = 0) -> dict[str, Any]:
    """Per text: mean next-token entropy and NLL, master alone vs fused; paired bootstrap CIs of the differences."""
    rows = []
    for text in texts:
        ids = master.encode(text)
        a, b = master.model(ids).logits, fused(ids)
        nll = [float(F.cross_entropy(x[0, :-1].float(), ids[0, 1:])) for x in (a, b)]
        rows.append((float(token_entropy(a).mean()), float(token_entropy(b).mean()), *nll))
    r = np.array(rows)
    d_ent, d_nll = r[:, 1] - r[:, 0], r[:, 3] - r[:, 2]
    return {"n": len(texts), "entropy_master": float(r[:, 0].mean()), "entropy_fused": float(r[:, 1].mean()),
            "entropy_diff": float(d_ent.mean()), "entropy_diff_ci": bootstrap_ci(d_ent, seed=seed),
            "nll_master": float(r[:, 2].mean()), "nll_fused": float(r[:, 3].mean()),
            "nll_diff_ci": bootstrap_ci(d_nll, seed=seed)}


def entropy_verdict(m: dict[str, Any], smooth: float = 0.003) -> str:
    """Two parts: 'fused output entropy is higher' (the paired CI of fused - master entropy above 0) and 'smoothness
    drops < 0.3 %' (read as the held-out NLL rising by under 0.3 % of the master's). Both: supported; only the entropy
    part: partly; entropy CI below 0: not supported; n < 5 texts or a CI across 0: inconclusive."""
    lo, hi = m["entropy_diff_ci"]
    if m["n"] < 5:
        return "inconclusive"
    if hi < 0:
        return "not supported"
    if lo <= 0:
        return "inconclusive"
    small = m["nll_diff_ci"][1] <= smooth * m["nll_master"]
    return "supported" if small else "partly supported"


# --- C70: batch size, throughput and latency -----------------------------------------------------------------
@torch.inference_mode()
def measure_batching(lm: LM, prompt: str, batches: list[int], steps: int = 16, reps: int = 3) -> list[dict[str, Any]]:
    """Decode `steps` tokens for `batch` copies of a prompt (transformers' own batch): median step latency and
    aggregate tokens/s per batch size."""
    ids = lm.encode(prompt)
    out = []
    for b in batches:
        times = []
        for _ in range(reps):
            cache = DynamicCache(config=lm.model.config)
            x = ids.expand(b, -1).contiguous()
            tok = lm.model(input_ids=x, cache=cache, use_cache=True).logits[:, -1:].argmax(-1)  # (B, 1)
            t0 = time.perf_counter()
            for _ in range(steps):
                tok = lm.model(input_ids=tok, cache=cache, use_cache=True).logits[:, -1:].argmax(-1)
            times.append((time.perf_counter() - t0) / steps)
        step = float(np.median(times))
        out.append({"batch": b, "step_ms": 1000 * step, "tokens_per_s": b / step, "reps": reps})
    return out


def batching_verdict(rows: list[dict[str, Any]]) -> str:
    """Both must rise from the smallest to the largest batch: throughput by > 20 %, step latency by > 5 %."""
    a, z = rows[0], rows[-1]
    return "supported" if z["tokens_per_s"] > 1.2 * a["tokens_per_s"] and z["step_ms"] > 1.05 * a["step_ms"] \
        else "not supported"


# --- the claims ----------------------------------------------------------------------------------------------
def claims(m: dict[str, Any], setup: str) -> list[Claim]:
    g, d, u, s, c, e, b = (m[k] for k in ("grad", "dropout", "use_cache", "strict", "cached", "entropy", "batch"))
    rates = ", ".join(f"{k}={v}" for k, v in d["dropout_rates"].items()) or "none"
    lo, hi = e["entropy_diff_ci"]
    nlo, nhi = e["nll_diff_ci"]
    bs = ", ".join(f"b={r['batch']}: {r['tokens_per_s']:.0f} tok/s, {r['step_ms']:.0f} ms/step" for r in b)
    return [
        Claim(claim="enabling gradients makes the stitched model non-deterministic", seed_section="A§2.3",
              seed_value="qualitative",
              measured=(f"stitched model (Qwen + SmolLM2 lstsq slots, the differentiable path): {g['repeats']} "
                        f"repeats under enable_grad bitwise identical: {g['stitched_grad_repeats_identical']}, "
                        f"enable_grad vs no_grad max |Δlogit| {g['stitched_grad_vs_no_grad_max_abs']:.1e}; "
                        if "stitched_grad_repeats_identical" in g else "") +
                       f"master alone: {g['repeats']} repeats under enable_grad bitwise identical: "
                       f"{g['grad_repeats_identical']}; enable_grad vs no_grad max |Δlogit| "
                       f"{g['grad_vs_no_grad_max_abs']:.1e} (on this CPU; GPU kernels with atomic adds are untested; "
                       "FusionLab's fused inference runs under inference_mode regardless)",
              n=f"n={g['repeats']} x 2", setup=setup, verdict=grad_verdict(g), notebook=NB, claim_id="C13"),
        Claim(claim="the slave needs `use_cache=False` to expose K/V", seed_section="A§3.2", seed_value="qualitative",
              measured=f"the K/V hooks see {u['layers_seen_use_cache_true']} layers with use_cache=True and "
                       f"{u['layers_seen_use_cache_false']} with False; identical tensors: {u['identical']}",
              n="-", setup=setup, verdict=use_cache_verdict(u), notebook=NB, claim_id="C20"),
        Claim(claim="`eval()` + `no_grad` are mandatory against dropout", seed_section="A§3.2",
              seed_value="qualitative",
              measured=f"train() vs eval() max |Δlogit| {d['train_vs_eval_max_abs']:.1e}; dropout rates: {rates}"
                       + ("" if d["train_vs_eval_max_abs"] > 0 else " (no dropout is active in these models, so eval() changes "
                       "nothing here; it would matter for a model trained with dropout)"),
              n="-", setup=setup, verdict=dropout_verdict(d), notebook=NB, claim_id="C24"),
        Claim(claim="`strict=False` only postpones the error to a CUDA error", seed_section="A§5.1",
              seed_value="qualitative",
              measured=f"load_state_dict(strict=False) fails at load: {s['error']}" if s["fails_at_load"]
                       else "strict=False loaded the mismatched weights",
              n="-", setup="two tiny models of different widths", verdict=strict_false_verdict(s), notebook=NB,
              claim_id="C44"),
        Claim(claim="cached decoding equals recomputing everything", seed_section="B§1.1", seed_value="qualitative",
              measured=f"{c['same_argmax']}/{c['steps']} greedy tokens the same, max |Δlogit| {c['max_abs_logit_diff']:.1e} "
                       f"({c['dtype']})",
              n=f"n={c['steps']} steps", setup=setup, verdict=cached_decoding_verdict(c), notebook=NB, claim_id="C56"),
        Claim(claim="the master's output smoothness drops < 0.3 %; fused output entropy is higher",
              seed_section="A§2.2, §5.4", seed_value="< 0.3 %",
              measured=f"entropy {e['entropy_master']:.3f} → {e['entropy_fused']:.3f} nats (Δ {e['entropy_diff']:+.3f}, "
                       f"95% CI {interval(lo, hi, '+.3f')}); NLL {e['nll_master']:.3f} → {e['nll_fused']:.3f} "
                       f"(Δ CI {interval(nlo, nhi, '+.3f')}, {(e['nll_fused'] / e['nll_master'] - 1):+.1%}; the post: < 0.3 %)",
              n=f"n={e['n']} held-out texts, paired bootstrap", setup=setup + ", SmolLM2 slave, lstsq, concat",
              verdict=entropy_verdict(e), notebook=NB, claim_id="C05"),
        Claim(claim="a larger batch raises throughput and latency", seed_section="B§4.2", seed_value="qualitative",
              measured=bs, n=f"median of {b[0]['reps']} reps", setup=setup + ", plain master",
              verdict=batching_verdict(b), notebook=NB, claim_id="C70"),
    ]
