"""Notebook 08, part 3: the posts' claims about what a KV cache holds and what shrinking it costs.

    C30 patch flash-attn to truncate K to q's length     C61 linear attention is O(n) and keeps no full KV
    C63 a sliding window keeps only the last W tokens     C64 a sliding window sacrifices long-range dependencies
    C65 INT8/INT4 KV quantization is the main fix         C68 a hybrid 27B reaches 1M context on a consumer card

Each `measure_*` returns plain numbers (real models, `analysis.attention_edits` for the K/V edits); each `*_verdict`
reads only those and is tested on hand-made numbers.
"""
from __future__ import annotations

from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from transformers import DynamicCache

from ..analysis import kv
from ..analysis.attention_edits import causal_band, edit_attention, fake_quantize
from ..analysis.stats import bootstrap_ci, interval, mcnemar, wilson
from ..engine.lm import LM
from .claim import Claim
from .nb02_niah import build_context, prompt_for, score
from .nb05_kv_budget import QWEN3_NEXT_80B, weights_gb
from .nb08_arithmetic_claims import state_over_length

NB = "08_remaining_claims"


# --- C63: what a sliding-window layer's cache holds ----------------------------------------------------------
@torch.inference_mode()
def measure_sliding_cache(lm: LM, ids: torch.Tensor) -> dict[str, Any]:
    """After one forward over ids (1, T): per layer, the entries its cache keeps, and whether they are exactly the
    last ones of the keys attention saw in that forward."""
    seen: dict[int, torch.Tensor] = {}

    def record(i, q, k, v, m):  # noqa: ANN001
        seen[i] = k.clone()
        return k, v, m

    cache = DynamicCache(config=lm.model.config)
    with edit_attention(lm, record):
        lm.model(input_ids=ids, cache=cache, use_cache=True)
    types = lm.model.config.layer_types
    rows = []
    for i, layer in enumerate(cache.layers):
        kept = layer.keys.shape[2]
        rows.append({"layer": i, "type": types[i], "kept": kept,
                     "is_the_tail": bool(torch.equal(layer.keys, seen[i][:, :, -kept:]))})
    return {"tokens": int(ids.shape[1]), "window": int(lm.model.config.sliding_window), "layers": rows}


def sliding_cache_verdict(m: dict[str, Any]) -> str:
    """Sliding layers keep min(T, W - 1) entries (the current token's own key makes W) and they are the last ones;
    full layers keep all T."""
    t, w = m["tokens"], m["window"]
    ok = all(r["is_the_tail"] and r["kept"] == (min(t, w - 1) if r["type"] == "sliding_attention" else t)
             for r in m["layers"])
    return "supported" if ok and t > w else ("inconclusive" if ok else "not supported")


# --- C30: truncating K to q's length --------------------------------------------------------------------------
@torch.inference_mode()
def measure_truncation(lm: LM, prefix: str, question: str) -> dict[str, Any]:
    """The master reads `prefix` into its cache (standing in for injected slots: keys before the question's), then
    the question. Next-token logits of the question with the full K (the skyline), with K truncated to q's length as
    the post's flash-attn patch does (keep the last Q keys), and of the question alone at the same positions (floor)."""
    p, q = lm.encode(prefix), lm.encode(question, special_tokens=False)
    pos = torch.arange(p.shape[1], p.shape[1] + q.shape[1])[None]

    def with_prefix(edit=None):  # noqa: ANN001
        cache = DynamicCache(config=lm.model.config)
        lm.model(input_ids=p, cache=cache, use_cache=True)
        if edit is None:
            return lm.model(input_ids=q, cache=cache, position_ids=pos, use_cache=True).logits
        with edit_attention(lm, edit):
            return lm.model(input_ids=q, cache=cache, position_ids=pos, use_cache=True).logits

    last = lambda i, qq, k, v, m: (k[:, :, -qq.shape[2]:], v[:, :, -qq.shape[2]:],  # noqa: E731
                                   None if m is None else m[..., -qq.shape[2]:])
    sky, cut = with_prefix(), with_prefix(last)
    floor = lm.model(input_ids=q, position_ids=pos).logits
    tok = lambda x: lm.tokenizer.decode(int(x[0, -1].argmax()))  # noqa: E731
    return {"prefix_tokens": int(p.shape[1]), "question_tokens": int(q.shape[1]),
            "truncated_vs_floor": float((cut - floor).abs().max()), "skyline_vs_floor": float((sky - floor).abs().max()),
            "next_token": {"skyline": tok(sky), "truncated": tok(cut), "floor": tok(floor)}}


def truncation_verdict(m: dict[str, Any], tol: float = 1e-3) -> str:
    """The patch 'works' only in that the assertion goes away: if the truncated output is the floor's (within fp32
    reassociation) while the prefix did change the output, the injected keys are simply dropped."""
    if m["truncated_vs_floor"] <= tol and m["skyline_vs_floor"] > 100 * tol:
        return "not supported"
    return "inconclusive" if m["skyline_vs_floor"] <= 100 * tol else "supported"


# --- C65: quantized K/V ---------------------------------------------------------------------------------------
SCHEMES = {"per token": (-1, -1), "KIVI (keys per channel)": (-2, -1)}
"""Quantization axes (keys, values): groups of channels within a token, or of tokens within a channel (keys)."""


@torch.inference_mode()
def measure_kv_quantization(lm: LM, texts: list[str], bits: tuple[int, ...] = (8, 4), group: int = kv.QUANT_GROUP,
                            seed: int = 0) -> dict[str, Any]:
    """Held-out NLL per text with every layer's K and V fake-quantized to `bits` (groups of `group`, fp16 scale and
    zero point) under each scheme of SCHEMES, vs full precision; cache bytes from `kv.budget` at 4K tokens."""
    def nll(ids: torch.Tensor) -> float:
        return float(F.cross_entropy(lm.model(ids).logits[0, :-1].float(), ids[0, 1:]))

    ids = [lm.encode(t) for t in texts]
    base = np.array([nll(x) for x in ids])
    out: dict[str, Any] = {"n": len(texts), "nll": float(base.mean()), "bits": {}}
    ref_bytes = kv.budget(lm.model, 4096, dtype="bfloat16").total_bytes
    for b in bits:
        rows = {}
        for scheme, (ka, va) in SCHEMES.items():
            q = lambda i, qq, k, v, m, b=b, ka=ka, va=va: (fake_quantize(k, b, group, ka),  # noqa: E731
                                                           fake_quantize(v, b, group, va), m)
            with edit_attention(lm, q):
                got = np.array([nll(x) for x in ids])
            d = got - base
            rows[scheme] = {"nll": float(got.mean()), "delta": float(d.mean()), "ci": bootstrap_ci(d, seed=seed)}
        best = min(rows, key=lambda k: rows[k]["delta"])
        out["bits"][b] = {**rows[best], "scheme": best, "schemes": rows,
                          "bytes_vs_bf16": kv.budget(lm.model, 4096, dtype="bfloat16", kv_dtype=f"int{b}").total_bytes
                          / ref_bytes}
    return out


def quantization_verdict(m: dict[str, Any], tolerable: float = 0.02) -> str:
    """On the better scheme per bit width: 'practical' = the NLL rise's 95% CI upper bound within `tolerable` (2%) of
    the full-precision NLL. Both int8 and int4 practical: supported; int8 only: partly; neither: not supported; fewer
    than 5 texts: inconclusive."""
    if m["n"] < 5:
        return "inconclusive"
    ok = {b: r["ci"][1] <= tolerable * m["nll"] for b, r in m["bits"].items()}
    if all(ok.values()):
        return "supported"
    return "partly supported" if ok.get(8) else "not supported"


# --- C64: global layers limited to the window -----------------------------------------------------------------
def windowed_globals(lm: LM):  # noqa: ANN201
    """edit_attention's function that limits the full-attention layers to the sliding window (RoPE untouched)."""
    types, w = lm.model.config.layer_types, int(lm.model.config.sliding_window)

    def edit(i, q, k, v, m):  # noqa: ANN001
        return (k, v, m) if types[i] != "full_attention" else (k, v, causal_band(q, k, m, window=w))
    return edit


@torch.inference_mode()
def measure_window_niah(lm: LM, needles: list[Any], haystack: str, lengths: list[int], depths: list[int],
                        max_new_tokens: int = 12) -> list[dict[str, Any]]:
    """NIAH on a model with sliding layers: each cell answered with its global layers intact and limited to the
    window; `beyond` says whether the needle lies farther than the window from the prompt's end."""
    w = int(lm.model.config.sliding_window)
    rows = []
    for needle in needles:
        for length in lengths:
            for depth in depths:
                ctx, at = build_context(lm.tokenizer, haystack, needle, length, depth)
                prompt = prompt_for(lm, ctx, needle) + ("" if lm.spec.has_chat_template else "\nAnswer:")
                ids = lm.encode(prompt)
                dist = ids.shape[1] - lm.encode(prompt[:prompt.find(needle.needle)]).shape[1]
                for setting, edit in (("global layers intact", None), ("global layers windowed", windowed_globals(lm))):
                    def gen() -> str:
                        out = lm.model.generate(ids, max_new_tokens=max_new_tokens, do_sample=False,
                                                pad_token_id=lm.tokenizer.eos_token_id)
                        return lm.tokenizer.decode(out[0, ids.shape[1]:], skip_special_tokens=True)
                    if edit is None:
                        answer = gen()
                    else:
                        with edit_attention(lm, edit):
                            answer = gen()
                    rows.append({"needle": needle.id, "length": length, "depth": depth, "setting": setting,
                                 "tokens_to_needle": int(dist), "beyond": bool(dist > w), "answer": answer,
                                 "correct": score(answer, needle)["label"] == "correct"})
    return rows


def window_niah_verdict(rows: list[dict[str, Any]]) -> tuple[str, dict[str, Any]]:
    """On needles beyond the window: windowing the global layers must lose needles the intact model finds. Supported:
    intact accuracy >= 50% and McNemar p < 0.05 in that direction; not supported: the intact model finds them and
    windowing changes nothing (p >= 0.05, no loss); inconclusive: the intact model cannot do the task (< 50%) or
    fewer than 8 cells."""
    far = [r for r in rows if r["beyond"]]
    by = {s: {(r["needle"], r["length"], r["depth"]): r["correct"] for r in far if r["setting"] == s}
          for s in ("global layers intact", "global layers windowed")}
    keys = sorted(by["global layers intact"])
    a = [by["global layers intact"][k] for k in keys]
    b = [by["global layers windowed"][k] for k in keys]
    stats = {"n": len(keys), "intact": sum(a), "windowed": sum(b), **mcnemar(a, b)}
    if len(keys) < 8 or sum(a) < 0.5 * len(keys):
        return "inconclusive", stats
    if stats["p_value"] < 0.05 and sum(b) < sum(a):
        return "supported", stats
    return ("not supported" if sum(b) >= sum(a) else "inconclusive"), stats


# --- C61 and C68: arithmetic ----------------------------------------------------------------------------------
def linear_state_claim(lengths: tuple[int, ...] = (4_096, 131_072, 1_048_576)) -> Claim:
    """C61: per layer type, cache bytes of Qwen3-Next-80B's published geometry (3 linear : 1 full) over length."""
    lin, full, fixed = state_over_length(QWEN3_NEXT_80B, "linear_attention", lengths)
    verdict = "supported" if fixed else "not supported"
    return Claim(claim="linear attention is O(n) and keeps no full KV", seed_section="B§1.3", seed_value="qualitative",
                 measured=f"36 linear-attention layers hold {lin[0] / 2**20:.1f} MiB at every length {list(lengths)} (a fixed "
                          f"state: per token O(1) work, O(n) over a sequence); the 12 full layers grow {full[0] / 2**20:,.0f} → "
                          f"{full[-1] / 2**20:,.0f} MiB",
                 n="- (exact arithmetic)", setup="kv.budget on Qwen3-Next-80B's published config (bf16)",
                 verdict=verdict, notebook=NB, claim_id="C61")


def hybrid_context_claim(params: float = 27e9, card_gb: float = 24.0, layers: int = 40, kv_heads: int = 32,
                         head_dim: int = 128, attention_share: float = 0.25) -> Claim:
    """C68: the longest context a 24 GB card holds for a 27B hybrid (the post's assumed 40 x 32 x 128 geometry, a
    quarter of the layers attention) with 4-bit weights, at bf16 / int8 / int4 KV; linear states are a few MiB."""
    free = card_gb - weights_gb(params, 4.25)  # AWQ/GPTQ: 4 bits + group scales
    attn_layers = round(layers * attention_share)
    per_token = {name: 2 * attn_layers * kv_heads * head_dim * b for name, b in (("bf16", 2), ("int8", 1),
                                                                                   ("int4", 0.5))}
    tokens = {k: free * 1e9 / v for k, v in per_token.items()}
    need_1m = {k: v * 1_048_576 / 1e9 for k, v in per_token.items()}
    if tokens["bf16"] >= 1_048_576:
        verdict = "supported"
    else:
        verdict = "partly supported" if tokens["bf16"] >= 32_768 else "not supported"
    return Claim(claim="this enables 1M context; 32K–128K is realistic on consumer cards", seed_section="B§2.2, §3.4",
                 seed_value="1M, 32–128K",
                 measured=f"{free:.1f} GB left after 4-bit weights; {attn_layers} attention layers take "
                          f"{per_token['bf16'] / 1024:.0f} KiB/token in bf16: {tokens['bf16'] / 1e3:.0f}K tokens fit "
                          f"(int8 {tokens['int8'] / 1e3:.0f}K, int4 {tokens['int4'] / 1e3:.0f}K); 1M tokens need "
                          f"{need_1m['bf16']:.0f} GB of KV in bf16 ({need_1m['int4']:.0f} GB in int4)",
                 n="- (exact arithmetic)",
                 setup=f"the post's assumed {layers} x {kv_heads} x {head_dim} geometry, {attention_share:.0%} attention "
                       f"layers, {card_gb:g} GB card",
                 verdict=verdict, notebook=NB, claim_id="C68")


def wilson_text(k: int, n: int) -> str:
    lo, hi = wilson(k, n)
    return f"{k}/{n} {interval(lo, hi, '.0%')}"


def claims(m: dict[str, Any], setup: str) -> list[Claim]:
    """The measured claims of this part from `m` = {'sliding', 'truncation', 'quant', 'window_niah'}."""
    s, t, q = m["sliding"], m["truncation"], m["quant"]
    kinds = {}
    for r in s["layers"]:
        kinds.setdefault(r["type"], set()).add(r["kept"])
    tails = all(r["is_the_tail"] for r in s["layers"])
    bits = "; ".join(f"int{b}: " + ", ".join(f"{name} NLL {x['nll']:.3f} (Δ {x['delta']:+.4f} "
                                           f"{interval(*x['ci'], '+.4f')})" for name, x in r["schemes"].items())
                     + f"; {r['bytes_vs_bf16']:.3f}x the bf16 bytes" for b, r in q["bits"].items())
    wv, ws = window_niah_verdict(m["window_niah"])
    nt = t["next_token"]
    return [
        Claim(claim="a sliding window keeps only the last W tokens", seed_section="B§1.3", seed_value="W",
              measured=f"after {s['tokens']} tokens with W={s['window']}: sliding layers keep {sorted(kinds.get('sliding_attention', []))}"
                       f" entries, full layers {sorted(kinds.get('full_attention', []))}; the kept keys are exactly the last "
                       f"ones attention saw: {tails} (the current token's own key makes W)",
              n="-", setup="gemma3-270m, fp32 CPU, transformers' DynamicCache", verdict=sliding_cache_verdict(s),
              notebook=NB, claim_id="C63"),
        Claim(claim="patch flash-attn to truncate K to q's length (\"line 217\")", seed_section="A§3.4",
              seed_value="line 217",
              measured=f"with {t['prefix_tokens']} prefix keys before a {t['question_tokens']}-token question, K truncated to "
                       f"q's length gives the output without the prefix (max |Δlogit| vs the question alone "
                       f"{t['truncated_vs_floor']:.1e}; the full K moves it by {t['skyline_vs_floor']:.1f}); next token: "
                       f"full {nt['skyline']!r}, truncated {nt['truncated']!r}, without prefix {nt['floor']!r} (the patch removes "
                       "the assertion by dropping the injected keys)",
              n="-", setup=setup + "; sdpa (no flash-attn here)", verdict=truncation_verdict(t), notebook=NB,
              claim_id="C30"),
        Claim(claim="INT8/INT4 KV quantization is the main practical fix", seed_section="B§1.3", seed_value="×½, ×¼",
              measured=f"full-precision NLL {q['nll']:.3f}; {bits}", n=f"n={q['n']} held-out texts, paired bootstrap",
              setup=setup + f"; K and V rounded in groups of {kv.QUANT_GROUP} (fp16 scale and zero point), per token, or "
                    "keys per channel (KIVI), every position including the current one; verdict on the better scheme",
              verdict=quantization_verdict(q), notebook=NB, claim_id="C65"),
        Claim(claim="a sliding window sacrifices long-range dependencies", seed_section="B§1.3",
              seed_value="qualitative",
              measured=f"needles farther than the 512-token window: found by the intact model {wilson_text(ws['intact'], ws['n'])}, "
                       f"with its global layers limited to the window {wilson_text(ws['windowed'], ws['n'])}; McNemar "
                       f"p={ws['p_value']:.2g}",
              n=f"n={ws['n']} far cells (needles x lengths x depths)",
              setup="gemma3-270m (base), fp32 CPU, greedy; global layers windowed by mask (RoPE untouched)", verdict=wv,
              notebook=NB, claim_id="C64"),
    ]
