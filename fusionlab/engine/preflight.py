"""Preflight: can these two models "shake hands"? Each difference gets a severity and the fix.

Severities: 'ok' | 'adapter needed: <which>' | 'incompatible'. KV injection tolerates many differences
(FusionLab re-rotates keys, aligns tokens, projects geometry); the report says which adapter each needs.
"""
from __future__ import annotations

import html
from dataclasses import asdict, dataclass, field

import pandas as pd
import torch

from .arch import ADAPTERS, decoder_layers
from ..errors import FusionLabError
from .lm import LM

OK, INCOMPATIBLE = "ok", "incompatible"
PROBES = {"english": "The quick brown fox jumps over the lazy dog.", "chinese": "请对比这两种方案的优缺点。",
          "code": "def add(a, b):\n    return a + b"}


def adapter(which: str) -> str:
    return f"adapter needed: {which}"


@dataclass
class Finding:
    area: str
    item: str
    master: str
    slave: str
    severity: str
    note: str = ""


@dataclass
class AlignmentReport:
    master: str
    slave: str
    findings: list[Finding] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        """True unless some finding is incompatible (adapters are fine: FusionLab provides them)."""
        return all(f.severity != INCOMPATIBLE for f in self.findings)

    @property
    def adapters(self) -> list[str]:
        return sorted({f.severity.removeprefix("adapter needed: ") for f in self.findings
                       if f.severity.startswith("adapter")})

    def to_frame(self) -> pd.DataFrame:
        return pd.DataFrame([asdict(f) for f in self.findings])

    def raise_if_incompatible(self) -> None:
        bad = [f for f in self.findings if f.severity == INCOMPATIBLE]
        if bad:
            lines = "; ".join(f"{f.area}/{f.item}: {f.note}" for f in bad)
            raise FusionLabError(f"{self.slave} cannot be fused into {self.master} (strict=True): {lines}")

    def __str__(self) -> str:
        head = f"alignment {self.slave} -> {self.master}: " + ("OK" if self.ok else "INCOMPATIBLE")
        if self.adapters:
            head += " (adapters: " + ", ".join(self.adapters) + ")"
        rows = [f"  [{f.severity}] {f.area}/{f.item}: master={f.master} slave={f.slave}" + (f"  -- {f.note}" if f.note else "")
                for f in self.findings]
        return "\n".join([head, *rows])

    def _repr_html_(self) -> str:
        colour = {OK: "#1a7f37", INCOMPATIBLE: "#cf222e"}
        rows = "".join(
            f"<tr><td>{f.area}</td><td>{f.item}</td><td>{html.escape(f.master)}</td><td>{html.escape(f.slave)}</td>"
            f"<td style='color:{colour.get(f.severity, '#9a6700')}'>{html.escape(f.severity)}</td>"
            f"<td>{html.escape(f.note)}</td></tr>" for f in self.findings)
        verdict = "OK" if self.ok else "INCOMPATIBLE"
        return (f"<b>{html.escape(self.slave)} → {html.escape(self.master)}: {verdict}</b><table><tr><th>area</th>"
                f"<th>item</th><th>master</th><th>slave</th><th>severity</th><th>note</th></tr>{rows}</table>")


def _same(a: object, b: object, fix: str) -> str:
    return OK if a == b else fix


def _tokenizer(m: LM, s: LM) -> list[Finding]:
    mt, st = m.tokenizer, s.tokenizer
    align = adapter("token alignment (Slave(align='mean'))")
    out = [Finding("tokenizer", "vocab size", str(len(mt)), str(len(st)), _same(len(mt), len(st), align)),
           Finding("tokenizer", "vocab hash", m.vocab_hash[:12], s.vocab_hash[:12],
                   _same(m.vocab_hash, s.vocab_hash, align), "identical tokenizers share ids; else align by characters")]
    for name in ("bos", "eos", "pad", "unk"):
        a, b = getattr(mt, f"{name}_token_id"), getattr(st, f"{name}_token_id")
        out.append(Finding("tokenizer", f"{name} id", str(a), str(b), _same(a, b, align)))
    added_m = {t.content for t in getattr(mt, "added_tokens_decoder", {}).values()}
    added_s = {t.content for t in getattr(st, "added_tokens_decoder", {}).values()}
    diff = sorted(added_m ^ added_s)
    out.append(Finding("tokenizer", "added tokens", str(len(added_m)), str(len(added_s)),
                       OK if not diff else align, f"{len(diff)} differ, e.g. {diff[:3]}" if diff else ""))
    for name, text in PROBES.items():
        a, b = mt(text)["input_ids"], st(text)["input_ids"]
        out.append(Finding("tokenizer", f"probe {name}", f"{len(a)} ids", f"{len(b)} ids", _same(a, b, align),
                           "same ids" if a == b else "different ids for the same text"))
    if m.vocab_hash != s.vocab_hash and not (getattr(mt, "is_fast", False) and getattr(st, "is_fast", False)):
        out.append(Finding("tokenizer", "offsets", str(mt.is_fast), str(st.is_fast), INCOMPATIBLE,
                           "different tokenizers and no character offsets: load fast tokenizers (tokenizer.json)"))
    return out


def _rope(m: LM, s: LM) -> list[Finding]:
    out, fix = [], adapter("RoPE re-rotation (rope='master', the default)")
    for t in sorted(set(m.spec.rope) | set(s.spec.rope)):
        a, b = m.spec.rope.get(t), s.spec.rope.get(t)
        out.append(Finding("rope", f"theta ({t})", f"{a.theta:g}" if a else "-", f"{b.theta:g}" if b else "-",
                           OK if a and b and a.theta == b.theta else fix,
                           "naive post-RoPE injection would place keys at wrong angles" if not (a and b and a.theta == b.theta) else ""))
        sa = (a.rope_type, a.factor) if a else None
        sb = (b.rope_type, b.factor) if b else None
        out.append(Finding("rope", f"scaling ({t})", str(sa), str(sb), OK if sa == sb else fix))
    a, b = m.spec.max_positions, s.spec.max_positions
    out.append(Finding("rope", "max positions", str(a), str(b), OK, "" if a == b else f"fused context <= {min(a, b)}"))
    return out


def _norm_weights(model: object) -> list[torch.Tensor]:
    return [layer.input_layernorm.weight.detach().float() for layer in decoder_layers(model)]


def _norms(m: LM, s: LM) -> list[Finding]:
    cls_m = type(decoder_layers(m.model)[0].input_layernorm).__name__
    cls_s = type(decoder_layers(s.model)[0].input_layernorm).__name__
    out = [Finding("norm", "type", cls_m, cls_s, OK, "" if cls_m == cls_s else "KV injection shares no norm weights"),
           Finding("norm", "epsilon", f"{m.spec.norm_eps:g}", f"{s.spec.norm_eps:g}", OK)]
    km = any(hasattr(layer.self_attn, "k_norm") for layer in decoder_layers(m.model))
    ks = any(hasattr(layer.self_attn, "k_norm") for layer in decoder_layers(s.model))
    out.append(Finding("norm", "k_norm before RoPE", str(km), str(ks),
                       OK if km == ks else adapter("lstsq projector (key scales differ)")))
    if m.spec.hidden_size == s.spec.hidden_size:
        wm, ws = _norm_weights(m.model), _norm_weights(s.model)
        n = min(len(wm), len(ws))
        dist = sum(float((wm[i] - ws[i]).abs().mean()) for i in range(n)) / n
        out.append(Finding("norm", "weight distance", "-", f"{dist:.4f}", OK, "mean |Δw| of input norms, aligned layers"))
    return out


def _geometry(m: LM, s: LM) -> list[Finding]:
    a, b = m.spec, s.spec
    if (a.kv_heads, a.head_dim) == (b.kv_heads, b.head_dim):
        geo = OK
    elif a.head_dim == b.head_dim and (a.kv_heads % b.kv_heads == 0 or b.kv_heads % a.kv_heads == 0):
        geo = adapter("heads projector")
    else:
        geo = adapter("lstsq projector (fl.fit_lstsq)")
    layer_fix = adapter("layer map (proportional / last_aligned / stride)")
    out = [Finding("layers", "count", str(a.layers), str(b.layers), _same(a.layers, b.layers, layer_fix),
                   "" if a.layers == b.layers else "identity covers only the first min(L) layers"),
           Finding("attention", "kv_heads x head_dim", f"{a.kv_heads}x{a.head_dim}", f"{b.kv_heads}x{b.head_dim}", geo),
           Finding("attention", "query heads", str(a.heads), str(b.heads), OK, "only K/V are injected"),
           Finding("attention", "sliding window", str(a.sliding_window), str(b.sliding_window), OK,
                   "" if a.sliding_window == b.sliding_window else "slots obey the master's window (window_slots=True)"),
           Finding("embedding", "hidden size", str(a.hidden_size), str(b.hidden_size), OK,
                   "" if a.hidden_size == b.hidden_size else "no effect on KV injection; blocks naive weight merging"),
           Finding("dtype", "parameters", str(m.dtype).removeprefix("torch."), str(s.dtype).removeprefix("torch."),
                   OK, "" if m.dtype == s.dtype else "slave K/V are cast to the master's dtype")]
    for lm in (m, s):
        if lm.spec.model_type not in ADAPTERS:
            out.append(Finding("architecture", "adapter", m.spec.model_type, s.spec.model_type, INCOMPATIBLE,
                               f"no FusionLab adapter for {lm.spec.model_type}; add one in fusionlab/engine/arch.py"))
    return out


def check_alignment(master: LM, slave: LM) -> AlignmentReport:
    """Compare tokenizer, RoPE, norms, layers, attention geometry, embedding size and dtype."""
    for role, x in (("master", master), ("slave", slave)):
        if not isinstance(x, LM):
            raise FusionLabError(f"check_alignment expects two fl.LM objects (from fl.load); the {role} is a "
                                 f"{type(x).__name__}.")
    rep = AlignmentReport(master.name, slave.name)
    for part in (_tokenizer, _rope, _norms, _geometry):
        rep.findings += part(master, slave)
    return rep
