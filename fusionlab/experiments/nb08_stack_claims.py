"""Notebook 08, part 4: the posts' claims about the software around the models, each run on ours.

    C08 a sentencepiece patch version misaligns ids        C17 transformers 4.41.2 needs a patch in a named file
    C18 accelerate / deepspeed break the manual KV flow     C23 interpolated norm weights err by < 0.002
    C25 the post's hook code stitches inside generate()     (speed claims: speed_claims.py)

`measure_*` return plain numbers; the `*_verdict` rules read only those (tested on hand-made numbers).
"""
from __future__ import annotations

import importlib.util
import subprocess
import sys
import zipfile
from pathlib import Path
from typing import Any

import torch

from ..engine.arch import attn_module, decoder_layers
from ..engine.fuse import fuse
from ..engine.lm import LM
from ..engine.slave import Slave
from ..models.zoo import load
from ..paths import cache_dir
from .claim import Claim

NB = "08_remaining_claims"


# --- C08: which tokenizer code runs -------------------------------------------------------------------------
def measure_tokenizer_stack(lms: list[LM]) -> dict[str, Any]:
    """Each tokenizer's class and whether it is a fast (Rust) tokenizer, and whether sentencepiece is installed."""
    return {"sentencepiece_installed": importlib.util.find_spec("sentencepiece") is not None,
            "tokenizers": {lm.name: {"class": type(lm.tokenizer).__name__, "fast": bool(lm.tokenizer.is_fast)}
                           for lm in lms}}


def tokenizer_stack_verdict(m: dict[str, Any]) -> str:
    """No tokenizer here calls sentencepiece: its patch version cannot change our ids (and two versions of it cannot be
    compared on these models). A slow sentencepiece tokenizer present: the check needs two installed versions."""
    slow = [n for n, t in m["tokenizers"].items() if not t["fast"]]
    return "not testable here" if not slow or not m["sentencepiece_installed"] else "inconclusive"


# --- C17: does the named file exist in that release? ----------------------------------------------------------
def measure_release_file(package: str, version: str, path: str, folder: Path | None = None) -> dict[str, Any]:
    """Download `package==version`'s wheel from PyPI once (cached under cache_dir()/wheels) and say whether it holds
    `path`, and which of its files mention flash attention. Offline: available False."""
    folder = Path(folder or cache_dir() / "wheels")
    wheels = list(folder.glob(f"{package}-{version}-*.whl"))
    if not wheels:
        folder.mkdir(parents=True, exist_ok=True)
        subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary", ":all:", "-q",
                        "--disable-pip-version-check", "-d", str(folder), f"{package}=={version}"],
                       capture_output=True, timeout=300)
        wheels = list(folder.glob(f"{package}-{version}-*.whl"))
    if not wheels:
        return {"available": False, "package": package, "version": version, "path": path}
    names = zipfile.ZipFile(wheels[0]).namelist()
    flash = sorted(n for n in names if "flash_attention" in n)
    return {"available": True, "package": package, "version": version, "path": path, "has_file": path in names,
            "files": len(names), "flash_attention_files": flash}


def release_file_verdict(m: dict[str, Any]) -> str:
    if not m["available"]:
        return "inconclusive"
    return "not supported" if not m["has_file"] else "inconclusive"


# --- C18: accelerate's hooks --------------------------------------------------------------------------------
@torch.inference_mode()
def measure_accelerate(name: str, prompt: str) -> dict[str, Any]:
    """Self-fusion of `name` (the slave an exact copy, concat) with plain models, then with the slave and then the
    master under accelerate's cpu_offload (weights kept off the modules and brought in by hooks around every forward,
    as device_map offloading does): max |Δlogit| of each against the plain run."""
    from accelerate import cpu_offload

    master, slave, h_master, h_slave = (load(name) for _ in range(4))
    for lm in (h_master, h_slave):
        cpu_offload(lm.model, execution_device=torch.device("cpu"))

    def run(m: LM, s: LM) -> torch.Tensor:
        with fuse(m, [Slave(s)]) as f:
            return f(prompt)

    ref = run(master, slave)
    return {"model": name, "hooked_modules": sum(hasattr(x, "_hf_hook") for x in h_slave.model.modules()),
            "parameter_device": str(next(h_slave.model.parameters()).device),
            "slave_hooked_max_abs_diff": float((run(master, h_slave) - ref).abs().max()),
            "master_hooked_max_abs_diff": float((run(h_master, slave) - ref).abs().max())}


def accelerate_verdict(m: dict[str, Any], tol: float = 1e-4) -> str:
    if m["hooked_modules"] == 0:
        return "inconclusive"
    worst = max(m["slave_hooked_max_abs_diff"], m["master_hooked_max_abs_diff"])
    return "not supported" if worst <= tol else "supported"


# --- C23: norm weights filled in by interpolation -----------------------------------------------------------
def norm_weights(lm: LM) -> dict[str, torch.Tensor]:
    """Each kind of per-layer RMSNorm weight stacked over layers: {attribute: (L, hidden)} (raw parameters: Gemma's
    are offsets from 1)."""
    layers = decoder_layers(lm.model)
    kinds = [n for n, m in layers[0].named_children() if "norm" in n and hasattr(m, "weight")]
    return {k: torch.stack([getattr(layer, k).weight.detach().float() for layer in layers]) for k in kinds}


def measure_norm_interpolation(lms: list[LM]) -> list[dict[str, Any]]:
    """Leave one interior layer out and fill it with the mean of its neighbours' norm weights (the post's linear
    interpolation): absolute and relative error per model and norm kind (median over layers)."""
    rows = []
    for lm in lms:
        for kind, w in norm_weights(lm).items():  # (L, H)
            fill = (w[:-2] + w[2:]) / 2  # (L-2, H): layer i from i-1 and i+1
            err = (fill - w[1:-1]).abs().mean(-1)  # (L-2,)
            rel = err / w[1:-1].abs().mean(-1).clamp_min(1e-12)
            rows.append({"model": lm.name, "norm": kind, "layers": int(w.shape[0]),
                         "median_abs_error": float(err.median()), "median_rel_error": float(rel.median()),
                         "mean_abs_weight": float(w.abs().mean())})
    return rows


def norm_interpolation_verdict(rows: list[dict[str, Any]], bound: float = 0.002) -> str:
    """The post's 'error < 0.002', read as the mean absolute weight error of an interpolated layer: supported if the
    median over layers is below it for every model and norm, not supported if above it for all, else partly."""
    below = [r["median_abs_error"] < bound for r in rows]
    return "supported" if all(below) else ("not supported" if not any(below) else "partly supported")


# --- C25: the hook mechanism the post describes -------------------------------------------------------------
@torch.inference_mode()
def measure_described_hook(master: LM, prompt: str, max_new_tokens: int = 8) -> dict[str, Any]:
    """FusionLab's reconstruction of the mechanism C25 (data/claims.csv) describes (the post's listing is not in this repository):
    a forward hook on each master attention module reads `output[1]` as the layer's (k, v), injects the slave's K/V only
    when that value looks like a (k, v) pair (the hasattr guard), and returns the outputs. What does output[1] hold, how
    many layers would inject, and does generate() change?"""
    kinds: list[str] = []
    injected = 0

    def hook(module, args, output):  # noqa: ANN001
        nonlocal injected
        second = output[1] if isinstance(output, tuple) and len(output) > 1 else None
        kinds.append(type(second).__name__)
        if isinstance(second, tuple) and len(second) == 2 and hasattr(second[0], "shape"):
            injected += 1  # the post's branch: concatenate the slave's K/V here
        return output

    ids = master.encode(prompt)
    plain = master.model.generate(ids, max_new_tokens=max_new_tokens, do_sample=False)
    handles = [attn_module(master.model, i).register_forward_hook(hook) for i in range(master.spec.layers)]
    try:
        hooked = master.model.generate(ids, max_new_tokens=max_new_tokens, do_sample=False)
    finally:
        for h in handles:
            h.remove()
    return {"calls": len(kinds), "output1_types": sorted(set(kinds)), "injected_calls": injected,
            "same_tokens": bool(torch.equal(plain, hooked))}


def described_hook_verdict(m: dict[str, Any]) -> str:
    """The listing itself is not available to run, so no run of ours can support or refute 'the post's code works';
    a reconstruction that injects nothing and changes no token makes the claim doubtful, never settled."""
    return "inconclusive"

def claims(m: dict[str, Any], setup: str) -> list[Claim]:
    """The claims of this part from `m` = {'tokenizers', 'release', 'accelerate', 'norms', 'hook'}."""
    tk, rel, acc, nr, hk = (m[k] for k in ("tokenizers", "release", "accelerate", "norms", "hook"))
    kinds = ", ".join(f"{n}: {t['class']} ({'fast' if t['fast'] else 'slow'})" for n, t in tk["tokenizers"].items())
    rel_text = (f"{rel['package']} {rel['version']}'s wheel ({rel['files']} files) has no {rel['path']}; files about "
                f"flash attention in it: {rel['flash_attention_files'] or 'none'}" if rel["available"] and
                not rel["has_file"] else (f"{rel['path']} exists in {rel['version']}" if rel["available"] else
                                          "the wheel could not be downloaded (offline)"))
    norms = "; ".join(f"{r['model']} {r['norm']}: {r['median_abs_error']:.3f} ({r['median_rel_error']:.0%} of the "
                      f"weights)" for r in nr)
    return [
        Claim(claim="a sentencepiece patch version change misaligns embedding lookups", seed_section="A§2.3",
              seed_value="0.1.95 vs 0.1.96",
              measured=f"no tokenizer here runs sentencepiece ({kinds}; sentencepiece installed: "
                       f"{tk['sentencepiece_installed']}): its version cannot touch these ids",
              n="-", setup=setup, verdict=tokenizer_stack_verdict(tk), notebook=NB, claim_id="C08"),
        Claim(claim="transformers 4.41.2 needs a stride patch in `modeling_flash_attention_utils.py`",
              seed_section="A§3.1", seed_value="4.41.2", measured=rel_text, n="-",
              setup="the release's wheel from PyPI, read (never installed)", verdict=release_file_verdict(rel),
              notebook=NB, claim_id="C17"),
        Claim(claim="accelerate / deepspeed break the manual KV flow", seed_section="A§3.1", seed_value="qualitative",
              measured=f"under accelerate's cpu_offload ({acc['hooked_modules']} hooked modules; the parameters report device "
                       f"{acc['parameter_device']!r}, so inputs must go to the hooks' execution device, which FusionLab reads) "
                       f"self-fusion logits differ by {acc['slave_hooked_max_abs_diff']:.1e} (slave hooked) and "
                       f"{acc['master_hooked_max_abs_diff']:.1e} (master hooked); deepspeed not tried (not installed)",
              n="-", setup=f"{acc['model']}, fp32 CPU, accelerate", verdict=accelerate_verdict(acc), notebook=NB,
              claim_id="C18"),
        Claim(claim="fill missing layers by linear interpolation of norm weights, error < 0.002", seed_section="A§3.2",
              seed_value="< 0.002",
              measured=f"a layer's norm weights from its neighbours' mean, median error over layers: {norms}", n="-",
              setup="leave-one-out over interior layers, raw parameters", verdict=norm_interpolation_verdict(nr),
              notebook=NB, claim_id="C23"),
        Claim(claim="the post's 137-line hook code stitches transparently inside `generate()`", seed_section="A§3.3",
              seed_value="137 lines",
              measured=f"the post's listing is not in this repository; FusionLab's reconstruction of the mechanism described "
                       f"(a forward hook reading output[1] as (k, v) behind a guard) saw output[1] = {hk['output1_types']} in "
                       f"{hk['calls']} attention calls, injected {hk['injected_calls']} times, generate() unchanged: "
                       f"{hk['same_tokens']}",
              n="-", setup=setup, verdict=described_hook_verdict(hk), notebook=NB, claim_id="C25"),
    ]
