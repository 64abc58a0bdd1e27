"""README blocks: rendered from saved results only, and the committed README equals what they render."""
from __future__ import annotations

import json

import pandas as pd

from conftest import SELF_FUSION_TOL

from fusionlab import stats
from fusionlab.lab import readme
from fusionlab.paths import readme_path


def test_write_ledger_replaces_block(tmp_path, monkeypatch):
    path = tmp_path / "README.md"
    path.write_text("top\n<!-- ledger:begin -->\nOLD-BLOCK\n<!-- ledger:end -->\nbottom\n")
    monkeypatch.setattr(readme, "blocks", lambda: {"ledger": "NEW", "bench": "unused"})
    readme.write_ledger(path)
    assert path.read_text() == "top\n<!-- ledger:begin -->\nNEW\n<!-- ledger:end -->\nbottom\n"


def test_ledger_markdown_from_a_frame():
    df = pd.DataFrame([{"claim_id": "C35", "claim": "x beats y", "seed_value": "2.3x", "measured": "1.2x | a", "n": "n=4",
                        "verdict": "not supported", "notebook": "nb", "run": "full"},
                       {"claim_id": "C02", "claim": "first", "seed_value": "-", "measured": "-", "n": "-",
                        "verdict": "supported", "notebook": "nb", "run": "full"}])
    lines = readme.ledger_markdown(df).splitlines()
    assert lines[0] == "The posts' 2 claims: supported 1, not supported 1 (a claim with several rows counts once, by its first row)."
    lines = lines[2:]
    assert lines[2].startswith("| C02 | first") and lines[3] == \
        "| C35 | x beats y | 2.3x | 1.2x / a | n=4 | not supported | nb | full |"
    assert readme.ledger_markdown(pd.DataFrame()).startswith("_No results saved yet")


def test_humaneval_table_from_saved_results(tmp_path):
    rows = [("master alone", t, p, "passed" if p else "wrong or crashed") for t, p in zip("abcd", [1, 1, 1, 0])]
    rows += [("+s", t, p, "passed" if p else "syntax error") for t, p in zip("abcd", [0, 0, 1, 0])]
    df = pd.DataFrame(rows, columns=["setting", "task_id", "passed", "kind"]).assign(
        passed=lambda d: d["passed"].astype(bool), seconds=2.0, new_tokens=10, extra_kv_bytes=[0] * 4 + [2**20] * 4)
    df.to_csv(tmp_path / "04_humaneval.default.csv", index=False)
    md = readme.humaneval_markdown(tmp_path).splitlines()
    lo, hi = stats.wilson(3, 4)
    assert md[2] == f"| master alone | 3/4 = 75.0% [{lo:.1%}, {hi:.1%}] | - | 0 of 4 | 2.0 | 5.0 | 0.00 |"
    lo, hi = stats.wilson(1, 4)  # McNemar: 2 discordant pairs, both for the master -> p = 2 * 1/4 = 0.5
    assert md[3] == f"| +s | 1/4 = 25.0% [{lo:.1%}, {hi:.1%}] | 0.5 | 3 of 4 | 2.0 | 5.0 | 1.00 |"
    assert "04_humaneval.default.csv" in md[-1]
    assert readme.humaneval_markdown(tmp_path / "none").startswith("_Not measured yet")
    assert "Rerun (" not in readme.humaneval_markdown(tmp_path)
    pd.DataFrame([{"setting": "master alone", "n": 4, "passed_before": 3, "passed_after": 3, "completions_changed": 0,
                   "outcomes_changed": 0, "changed_tasks": None},
                  {"setting": "+s", "n": 4, "passed_before": 1, "passed_after": 2, "completions_changed": 2,
                   "outcomes_changed": 1, "changed_tasks": "b c"}]).to_csv(tmp_path / "04_batch_rerun.full.csv",
                                                                          index=False)
    md = readme.humaneval_markdown(tmp_path)
    assert "master alone 3 -> 3 (0 of 4 completions changed, 0 pass/fail flips)" in md
    assert "+s 1 -> 2 (2 of 4 completions changed (b c), 1 pass/fail flips)" in md and "04_batch_rerun.full.csv" in md
    assert "not rerun yet" not in md and "wall time of these settings" not in md
    assert "Rerun (batched) against the earlier run (batch 1)" in md  # a comparison saved before runs were labelled
    pd.read_csv(tmp_path / "04_batch_rerun.full.csv").assign(seconds_before=[3000.0, 2880.0], seconds_after=[600.0, 720.0]
                                                             ).to_csv(tmp_path / "04_batch_rerun.full.csv", index=False)
    assert ("Generation wall time of these settings: 98 min (batch 1), 22 min (batched) (target: <= 25 min"
            in readme.humaneval_markdown(tmp_path))
    pd.read_csv(tmp_path / "04_batch_rerun.full.csv").assign(before_run="static batches of up to 8",
                                                             after_run="continuous batching, 8 seats"
                                                             ).to_csv(tmp_path / "04_batch_rerun.full.csv", index=False)
    md = readme.humaneval_markdown(tmp_path)
    assert "Rerun (continuous batching, 8 seats) against the earlier run (static batches of up to 8)" in md
    assert "98 min (static batches of up to 8), 22 min (continuous batching, 8 seats)" in md
    # an all-digit hash with a leading zero stays text
    pd.read_csv(tmp_path / "04_batch_rerun.full.csv").assign(before_commit="0274500"
                                                             ).to_csv(tmp_path / "04_batch_rerun.full.csv", index=False)
    assert "against the earlier run (static batches of up to 8; commit 0274500)" in readme.humaneval_markdown(tmp_path)
    pd.read_csv(tmp_path / "04_batch_rerun.full.csv").iloc[:1].to_csv(tmp_path / "04_batch_rerun.full.csv", index=False)
    assert "; not rerun yet: +s (" in readme.humaneval_markdown(tmp_path)
    df.to_csv(tmp_path / "07_humaneval.full.csv", index=False)
    pd.DataFrame([{"slave": "smollm2", "fuser": "+smollm2 fuser", "against": "master alone", "n": 96,
                   "delta_nll": -0.0123, "lo": -0.02, "hi": -0.004, "beats": True},
                  {"slave": "smollm2", "fuser": "+smollm2 fuser", "against": "shuffled", "n": 96,
                   "delta_nll": 0.001, "lo": -0.003, "hi": 0.005, "beats": False}]).to_csv(
        tmp_path / "07_controls.full.csv", index=False)
    f = readme.fusers_markdown(tmp_path)
    assert "| smollm2 | master alone | -0.012 [-0.020, -0.004] | 96 | yes |" in f
    assert "| smollm2 | shuffled | +0.001 [-0.003, +0.005] | 96 | no |" in f and "07_humaneval.full.csv" in f
    assert readme.fusers_markdown(tmp_path / "none").startswith("_Not measured yet")


def test_a_humaneval_run_whose_settings_shared_the_seats_reports_the_run_not_each_setting(tmp_path):
    """Rows of a shared run carry shares of one run's time: the block gives the run's wall time and occupancy (sums
    over every row) and no per-setting speed, which such a run does not measure."""
    rows = [(s, t, True) for s in ("master alone", "+s") for t in "ab"]
    df = pd.DataFrame(rows, columns=["setting", "task_id", "passed"]).assign(
        kind="passed", seconds=[60.0, 30.0, 90.0, 60.0], new_tokens=10, extra_kv_bytes=0, batch=4,
        scheduler="continuous", seat_steps=[40, 0, 40, 20], busy_seat_steps=[40, 0, 30, 10], shared_by=2)
    df.to_csv(tmp_path / "04_humaneval.full.csv", index=False)
    md = readme.humaneval_markdown(tmp_path)
    assert "| master alone | 2/2 = 100.0% " in md and "| 0 of 2 | - | - | 0.00 |" in md
    assert ("Generation took 4 min of wall time for all settings, continuous batching with 4 seats shared by 2 "
            "settings") in md
    assert "80% of seat-steps decoded a row." in md and "per setting" not in md  # (40 + 30 + 10) / 100
    assert "A setting's own speed is not measured in a shared run" in md
    df.drop(columns="shared_by").to_csv(tmp_path / "04_humaneval.full.csv", index=False)
    md = readme.humaneval_markdown(tmp_path)  # saved before runs were shared: per setting, as before
    assert "(per setting 67%-100%)" in md and "| 0 of 2 | 45.0 |" in md


def test_readme_tables_are_generated_from_the_saved_results():
    """Every generated README block equals what `fusionlab ledger` writes from the committed results
    (regenerate with `fusionlab ledger` after a lab run)."""
    text = readme_path().read_text()
    for name, body in readme.blocks().items():
        begin, end = f"<!-- {name}:begin -->", f"<!-- {name}:end -->"
        assert text[text.index(begin) + len(begin):text.index(end)].strip() == body.strip(), name


def test_bench_table_says_what_bounds_batch_scaling(tmp_path):
    """The batch rows come from fusion.json; whether the CPU or the fusion bounds batch-8 scaling is a rule on the
    master's own scaling, not a sentence typed once."""
    ratio = {"ratio": 1.0, "ci_low": 0.98, "ci_high": 1.02, "a_median_s": 1.0, "b_median_s": 1.0}
    batch = lambda fused, master: {**ratio, "fused_tok_s": fused, "master_tok_s": master}  # noqa: E731
    r = {"threads": 2, "torch": "2.13.0", "steps": 16, "prompt_tokens": 2048, "noop_forward": ratio, "prefill_2k": ratio,
         "decode_2k": {**ratio, "fused_s": 1.0, "master_s": 1.0}, "ttft": {"cold_s": 3.0, "warm_median_s": 1.0},
         "ttft_warm_over_cold": 0.33, "batch_decode": {"1": batch(6.0, 6.0), "16": batch(40.0, 41.0),
                                                        "8": batch(21.0, 22.0)}, "batch8_over_batch1": 3.5}
    (tmp_path / "fusion.json").write_text(json.dumps(r))
    md = readme.bench_markdown(tmp_path)
    assert "| fused / master decode throughput, batch 16 (master: transformers' own padded batch) | 1.000 [0.980, " \
           "1.020] (40.0 vs 41.0 tok/s) | >= 0.95 |" in md
    assert "| 3.50 (the master alone, transformers' own batch, scales 3.67 too: the bound is this 2-core CPU" in md
    r["batch_decode"]["16"] |= {"fused_s": 1.2, "master_s": 1.0, "fused_attention_ms": 20.0, "master_attention_ms": 9.0}
    (tmp_path / "fusion.json").write_text(json.dumps(r))
    assert "(40.0 vs 41.0 tok/s; a step +12.5 ms, of which the attention kernel +11.0 ms) |" in readme.bench_markdown(tmp_path)
    assert "Measured:" not in readme.bench_markdown(tmp_path)
    (tmp_path / "fusion.json").write_text(json.dumps(r | {"measured": {"batch": "2026-12-03"}}))
    assert "Measured: batch rows on 2026-12-03; the other fusion rows in an earlier run." in readme.bench_markdown(tmp_path)
    (tmp_path / "fusion.json").write_text(json.dumps(r | {"measured": dict.fromkeys(readme.BENCH_PARTS, "2026-12-04")}))
    assert "earlier run" not in readme.bench_markdown(tmp_path)
    r["batch_decode"]["8"] = batch(21.0, 30.0)
    (tmp_path / "fusion.json").write_text(json.dumps(r))
    assert "scales 5.00: the fusion loses scaling" in readme.bench_markdown(tmp_path)
    second = {"16": {**batch(40.0, 41.0), "ratio": 0.96, "ci_low": 0.951, "ci_high": 0.97}}
    (tmp_path / "fusion.json").write_text(json.dumps(r | {"batch_decode_runs": [r["batch_decode"], second]}))
    md = readme.bench_markdown(tmp_path)
    assert "(40.0 vs 41.0 tok/s; a step +12.5 ms, of which the attention kernel +11.0 ms; run 2: 0.960 [0.951, " \
           "0.970]) |" in md  # every run reported, the first in full
    assert "run 2" not in md.split("batch 8 (")[1].split("\n")[0]  # a batch size the second run lacks


def test_reliability_block_with_and_without_the_rerun_attribution(tmp_path):
    r = {"bad_inputs": {"tried": 3, "clear": 2, "other": ["x: ValueError"]},
         "kills": {"niah": {"kills": 5, "cells": 4, "unique": 4, "identical_to_uninterrupted": True}},
         "reproducibility": ["lstsq fit: equal"]}
    (tmp_path / "reliability.json").write_text(json.dumps(r))
    md = readme.reliability_markdown(tmp_path)
    assert "2 of 3 give one FusionLabError naming the argument or file; not clear: x: ValueError |" in md
    assert "5 kills; 4 of 4 cells, each exactly once; results identical to an uninterrupted run |" in md
    assert "rerun" not in md
    (tmp_path / "rerun_attribution.json").write_text(json.dumps(
        {"before": "abc1234", "changed": 3, "master_alone_changed": 0,
         "by_cause": {"batching": 1, "projector refit": 2}, "rows": []}))
    md = readme.reliability_markdown(tmp_path)
    assert ("| notebook 04's batched HumanEval rerun vs its batch-1 run (commit abc1234) | master alone: 0 of 164 "
            "completions changed; the 3 fused completions that changed, regenerated alone with today's projectors: "
            "2 projector refit, 1 batching |") in md and "rerun_attribution.py" in md


def test_readme_quotes_the_self_fusion_tolerance_the_tests_assert():
    """The anchors sentence must state the tolerance tests/conftest.py holds the tests to, not a tighter one."""
    text = readme_path().read_text(encoding="utf-8")
    sentence = text[text.index("self-fusion\n(concat, live) = master"):][:200]
    for where, tol in SELF_FUSION_TOL.items():
        assert f"<= {tol:g} on {where}" in sentence, (where, tol, sentence)


def test_the_test_line_is_generated_from_the_recorded_run(tmp_path, monkeypatch):
    """bootstrap.py records a whole-suite run from pytest's JUnit report; the README's test line renders that record."""
    from fusionlab import bootstrap

    report = tmp_path / "test_run.xml"
    report.write_text('<?xml version="1.0"?><testsuites><testsuite name="pytest" tests="610" failures="1" errors="1" '
                      'skipped="3" time="800.0"></testsuite></testsuites>')
    monkeypatch.setattr(bootstrap, "TEST_RUN", tmp_path / "test_run.json")
    bootstrap.write_test_run(report, 801.4, 890.6, fresh=True)
    line = readme.tests_markdown(tmp_path)
    assert "last recorded from a fresh clone of " in line
    assert "605 passed, 2 failed, 3 skipped in 801 s (891 s with set-up)" in line
    assert readme.tests_markdown(tmp_path / "none").startswith("_No test run recorded yet")


def test_transfer_map_block_from_a_saved_ladder(tmp_path):
    from fusionlab.lab.readme_transfer_map import transfer_map_markdown

    assert transfer_map_markdown(tmp_path).startswith("_Not measured yet")
    nan = float("nan")
    base = {"n": 30, "gap": 1.0, "gap_low": 0.8, "ceiling_gap_low": 0.5, "ceiling_share": 1.0, "vs_control": 0.9,
            "vs_control_low": 0.7, "vs_control_high": 1.1}
    pd.DataFrame([
        {**base, "slave": "noise:0", "kl": 0.0, "distance": 0.1, "transfer": 1.0, "lo": 1.0, "hi": 1.0,
         "lstsq_transfer": 0.7, "lstsq_lo": 0.6, "lstsq_hi": 0.8, "kvcomm_transfer": 0.5, "kvcomm_lo": 0.4,
         "kvcomm_hi": 0.6, "relay_transfer": 0.2, "relay_lo": 0.1,
         "relay_hi": 0.3, "vs_relay": 0.8, "vs_relay_low": 0.6, "vs_relay_high": 1.0},
        {**base, "slave": "smollm2", "kl": nan, "distance": 1.9, "transfer": -0.5, "lo": -0.8, "hi": -0.2,
         "lstsq_transfer": nan, "lstsq_lo": nan, "lstsq_hi": nan, "relay_transfer": 0.2, "relay_lo": 0.1,
         "relay_hi": 0.3, "vs_relay": -0.7, "vs_relay_low": -0.9, "vs_relay_high": -0.5},
    ]).to_csv(tmp_path / "10_transfer_map.default.csv", index=False)
    rows = transfer_map_markdown(tmp_path).splitlines()
    assert rows[2] == ("| noise:0 | 0.000 | 0.100 | 1.00 [1.00, 1.00] | +0.90 [+0.70, +1.10] | 1.00 | 0.70 [0.60, 0.80] | "
                       "0.50 [0.40, 0.60] | 0.20 [0.10, 0.30] | +0.80 [+0.60, +1.00] | transfers | K/V beats the relay |")
    assert rows[3].startswith("| smollm2 | - | 1.900 | -0.50 [-0.80, -0.20] |")  # no KL across tokenizers
    assert rows[3].endswith("| - | - | 0.20 [0.10, 0.30] | -0.70 [-0.90, -0.50] | does not transfer | the relay beats K/V |")
    assert "30 documents" in rows[-1] and "10_transfer_map.default.csv" in rows[-1]
    stage = pd.read_csv(tmp_path / "10_transfer_map.default.csv").iloc[:1].assign(n=106)
    stage.to_csv(tmp_path / "10_nll_stage_map.full.csv", index=False)  # a stage of the full plan follows the table
    text = transfer_map_markdown(tmp_path)
    assert "The full plan (1 of 20 rungs so far, `fusionlab nll-stage`" in text and "106 documents" in text
    assert text.count("| noise:0 | 0.000 |") == 2 and text.endswith("| transfers | K/V beats the relay |")
    pd.DataFrame([{"family": "noise:0,noise:0.1,noise:0.2", "kl_max": 5.1, "level": 0.5, "n": 106, "crossing": 1.2,
                   "lo": 1.1, "hi": 1.3, "share_defined": 1.0, "bracketed": True, "unit": "documents",
                   "of": "transfer"}]).to_csv(tmp_path / "10_nll_stage_crossing.full.csv", index=False)
    assert transfer_map_markdown(tmp_path).endswith(  # the stage's own crossing, under its table
        "\n\nThe full plan's weight-noise rungs as one curve of KL: transfer falls to 50% of the gap at KL 1.2 "
        "nats/token [1.1, 1.3] (bootstrap over 106 documents; 100% of resamples cross within the ladder).")


def test_kvcomm_sink_block_from_a_saved_table_with_its_verdict_recomputed(tmp_path):
    from fusionlab.lab.readme_transfer_map import kvcomm_sink_markdown

    assert kvcomm_sink_markdown(tmp_path) == ""  # not run: nothing under the map
    row = {"slave": "noise:0", "n": 106, "gap": 0.67, "kvcomm_transfer": -1.1, "kvcomm_lo": -1.2, "kvcomm_hi": -1.0,
           "sink_transfer": 0.5, "sink_lo": 0.4, "sink_hi": 0.6, "sink_only_transfer": 0.07, "sink_only_lo": 0.05,
           "sink_only_hi": 0.09, "sink_gain": 1.07, "sink_gain_low": 0.9, "sink_gain_high": 1.2, "vs_sink_only": 0.3,
           "vs_sink_only_low": 0.2, "vs_sink_only_high": 0.4, "vs_control": 0.3, "vs_control_low": 0.2,
           "vs_control_high": 0.4, "verdict": "typed, never read"}
    pd.DataFrame([row, {**row, "slave": "smollm2", "vs_control_low": -0.1}]).to_csv(
        tmp_path / "10_kvcomm_sink.full.csv", index=False)
    lines = kvcomm_sink_markdown(tmp_path).splitlines()
    assert "106 documents" in lines[2] and "`fusionlab kvcomm-sink`" in lines[2]
    assert lines[6] == ("| noise:0 | -1.10 [-1.20, -1.00] | 0.50 [0.40, 0.60] | 0.07 [0.05, 0.09] | "
                        "+1.07 [+0.90, +1.20] | +0.30 [+0.20, +0.40] | the sink mends it |")
    assert lines[7].endswith("| +0.30 [-0.10, +0.40] | a sink only |")  # the rule's verdict, not the saved one


def test_transfer_map_block_adds_the_crossing_when_saved(tmp_path):
    from fusionlab.experiments import nb10_crossing as cr
    from fusionlab.lab.readme_transfer_map import transfer_map_markdown

    row = {"slave": "noise:0", "kl": 0.0, "distance": 0.1, "n": 30, "gap": 1.0, "gap_low": 0.8, "transfer": 1.0,
           "lo": 1.0, "hi": 1.0}
    pd.DataFrame([row]).to_csv(tmp_path / "10_transfer_map.default.csv", index=False)
    assert "Weight-noise rungs" not in transfer_map_markdown(tmp_path)
    c = {"rungs": ["noise:0", "noise:0.3"], "kl": [0.0, 4.0], "level": 0.5, "n": 30, "crossing": 2.0, "lo": 1.5,
         "hi": 2.5, "share_defined": 0.99, "bracketed": True}
    pd.DataFrame([cr.as_row(c)]).to_csv(tmp_path / "10_crossing.default.csv", index=False)
    assert transfer_map_markdown(tmp_path).endswith(
        "Weight-noise rungs as one curve of KL: transfer falls to 50% of the gap at KL 2 nats/token [1.5, 2.5] "
        "(bootstrap over 30 documents; 99% of resamples cross within the ladder).")
    pd.DataFrame([{**row, "setting": "+noise:0", "lo": 1.02, "hi": 1.1, "transfer": 1.05}]).to_csv(
        tmp_path / "10_transfer_map.default.csv", index=False)
    pd.DataFrame([{"setting": "+noise:0", "slaves": "noise:0", "domain": "chinese", "n": 12, "transfer": 1.2,
                   "lo": 1.1, "hi": 1.3}]).to_csv(tmp_path / "10_transfer_by_domain.default.csv", index=False)
    assert transfer_map_markdown(tmp_path).endswith(  # a transfer above 1, traced to its domain
        "resamples cross within the ladder). Transfer above 1 (the slots help more than the master reading part A "
        "itself), by domain: noise:0 1.05 [1.02, 1.10]: chinese 1.20 [1.10, 1.30] (n=12, beyond the skyline).")


def test_offload_ladder_and_fuser_control_blocks_from_saved_tables(tmp_path):
    from fusionlab.lab.readme_transfer_map import fuser_control_markdown, offload_ladder_markdown

    assert offload_ladder_markdown(tmp_path).startswith("_Not measured yet")
    assert fuser_control_markdown(tmp_path).startswith("_Not measured yet")
    acc = {f"{c}{s}": v for c, v0 in (("floor", 0.0), ("skyline", 0.8), ("ceiling", 0.8), ("offload", 0.75),
                                       ("control", 0.05)) for s, v in (("", v0), ("_lo", max(v0 - 0.1, 0)),
                                                                        ("_hi", min(v0 + 0.1, 1)))}
    pd.DataFrame([{"slave": "noise:0", "n": 40, **acc, "transfer": 0.94, "lo": 0.8, "hi": 1.0, "p_value": 1e-6,
                   "p_vs_ceiling": 0.004, "acc_setting": 0.75, "acc_control": 0.05}]).to_csv(
        tmp_path / "10_offload_ladder.default.csv", index=False)
    rows = offload_ladder_markdown(tmp_path).splitlines()
    assert rows[2] == ("| noise:0 | 0% [0%, 10%] | 80% [70%, 90%] | 80% [70%, 90%] | 75% [65%, 85%] | 5% [0%, 15%] | "
                       "0.94 [0.80, 1.00] | 1e-06 | 0.004 | transfers |")
    assert "40 items per setting" in rows[-1]
    pd.DataFrame([{"slave": "noise:0", "n": 120, **acc, "transfer": 0.94, "lo": 0.8, "hi": 1.0, "p_value": 1e-6,
                   "acc_setting": 0.75, "acc_control": 0.05}]).to_csv(tmp_path / "10_offload_ladder_256.full.csv",
                                                                      index=False)
    text = offload_ladder_markdown(tmp_path)  # a stage of the full plan follows the notebook's own table
    assert "The full plan at 256 tokens (1 of 19 rungs so far" in text and "120 items per setting" in text
    assert text.count("| noise:0 |") == 2 and text.endswith("Not run yet at 1024, 2048 tokens.")
    assert "| 1e-06 | - | transfers |" in text  # a table saved before p_vs_ceiling existed: no number made up
    pd.DataFrame([{"rung": "noise:0", "opening": "log", "gate_start": 0.135, "gate_end": 0.5, "transfer": 0.9,
                   "lo": 0.8, "hi": 1.0, "start_transfer": 0.8, "start": "identity", "control_transfer": 0.0,
                   "control_hi": 0.1, "shuffled_transfer": 0.05, "shuffled_hi": 0.2,
                   "vs_start": -0.1, "vs_start_lo": -0.2, "vs_start_hi": -0.05, "steps": 40, "best_step": 36,
                   "vs_control": -0.5, "vs_control_lo": -0.6, "vs_control_hi": -0.4, "vs_shuffled": -0.3,
                   "vs_shuffled_lo": -0.35, "vs_shuffled_hi": -0.25,
                   "n": 24, "docs": 13}]).to_csv(tmp_path / "10_fuser_control.default.csv", index=False)
    rows = fuser_control_markdown(tmp_path).splitlines()
    assert rows[2] == ("| noise:0 | log | 0.135 → 0.500 | 0.90 [0.80, 1.00] | 0.80 (identity) | "
                       "0.00; -0.500 [-0.600, -0.400] | 0.05; -0.300 [-0.350, -0.250] | "
                       "-0.100 [-0.200, -0.050] | 40 (36) | opens and beats its start |")
    assert "24 held-out windows from 13 documents" in rows[-1]


def test_learning_curve_block_from_saved_tables(tmp_path):
    import numpy as np
    import pandas as pd

    from fusionlab.experiments import nb07_curve_stats as cs
    from fusionlab.lab.readme_learning_curve import learning_curve_markdown

    assert learning_curve_markdown(tmp_path).startswith("_Not measured yet")
    rng, rows = np.random.default_rng(0), []
    for d in range(6):
        for dom in ("code", "english"):
            base, doc = 2 + rng.standard_normal(), f"{dom}/{d}"
            rows.append({"variant": cs.MASTER, "budget": 0, "domain": dom, "doc": doc, "nll": base})
            for b in (10_000, 20_000, 40_000):
                gap = 0.2 - 0.05 * np.log2(b / 10_000)  # closing: crosses 0 near 160K
                for v, x in (("constant", base - 0.15), ("shuffled r32", base - 0.15),
                             ("fuser r32", base - 0.15 + gap + 0.01 * rng.standard_normal())):
                    rows.append({"variant": v, "budget": b, "domain": dom, "doc": doc, "nll": x})
    nll = pd.DataFrame(rows)
    nll["chunk"] = nll.groupby(["variant", "budget"]).cumcount()  # chunk k: the same text in every run
    table = cs.curve_table(nll)
    table.to_csv(tmp_path / "07_learning_curve.default.csv", index=False)
    cs.verdicts(nll, table).to_csv(tmp_path / "07_learning_curve_trend.default.csv", index=False)
    text = learning_curve_markdown(tmp_path)
    assert "| fuser r32 | 40K | " in text and "| constant | 10K | " in text
    assert "**trends toward the constant control**" in text and "07_learning_curve.default.csv" in text
    assert "per training seed" not in text  # one seed: no seed table
    again = nll[nll["variant"] != cs.MASTER].assign(seed=1, nll=lambda f: f["nll"] + 0.5 * (f["variant"] == "fuser r32"))
    cs.seed_table(pd.concat([nll.assign(seed=0), again])).to_csv(tmp_path / "07_learning_curve_seeds.default.csv",
                                                                 index=False)
    lines = learning_curve_markdown(tmp_path).splitlines()
    assert "| run | tokens | against | seed 0 | seed 1 |" in lines
    row = next(x for x in lines if x.startswith("| fuser r32 | 10K | constant |"))
    assert row.split(" | ")[3].startswith("+0.2") and row.split(" | ")[4].startswith("+0.7")  # each seed its own


def test_continuous_batching_bullets_come_from_the_benchmarks_json(tmp_path):
    from fusionlab.lab.readme_continuous import continuous_markdown

    assert continuous_markdown(tmp_path).startswith("_Not measured yet")
    wall = {"transformers": [200.0, 180.0], "ours continuous": [150.4, 140.6], "ours static": [1.0, 1.0],
            "ours continuous, stop strings": [60.0, 70.0], "ours static, stop strings": [100.0, 110.0]}
    (tmp_path / "continuous.json").write_text(json.dumps({
        "date": "2026-01-02", "prompts": 24, "seats": 8, "max_new_tokens": 128, "threads": 2, "reps": 2,
        "wall_s": wall, "tok_per_s": {"transformers": 17.4, "ours continuous": 20.6},
        "ours_continuous_over_transformers_wall": 291 / 380, "completions_agreeing_with_transformers": "23 of 24",
        "continuous_over_static_wall_with_stop_strings": 130 / 210, "occupancy_with_stop_strings": 0.751,
        "continuous_over_static_wall": 1.06}))
    text = continuous_markdown(tmp_path)
    assert "ours takes **0.77×** its wall time (150 / 141 s against 200 / 180 s; 21 vs 17 tok/s)" in text
    assert "23 of 24 completions identical" in text and "0.62× the wall time of static batches of 8" in text
    assert "75% of seat-steps were busy" in text and "streamed" not in text
    (tmp_path / "streaming.json").write_text(json.dumps({
        "date": "2026-01-03", "prompts": 48, "seats": 8, "group_seats": 4, "max_new_tokens": 256, "reps": 2,
        "runs": [{"how": "grouped", "occupancy": 0.76}, {"how": "streamed", "occupancy": 0.81}],
        "streamed_over_grouped_wall": [0.923, 0.966], "same_completions": False}))
    last = continuous_markdown(tmp_path).splitlines()[-1]
    assert "groups of 32" in last and "0.92× and 0.97× the wall time, 81% of seat-steps busy against 76%" in last
    assert last.endswith("**completions differ**.")


def test_the_seats_benchmark_renders_each_setting_against_its_first_seat_count(tmp_path):
    from fusionlab.lab.readme_continuous import continuous_markdown

    one = lambda ratio, occ, diff: {"wall_s": [1.0, 1.0], "tokens": 4000, "occupancy": occ,  # noqa: E731
                                    "differing_from_first": diff, "wall_over_first": ratio}
    (tmp_path / "seats.json").write_text(json.dumps({
        "date": "2026-01-04", "prompts": 32, "seats": [8, 16], "max_new_tokens": 256, "reps": 2,
        "settings": {"alone": {"8": one(1.0, 0.8, 0), "16": one(0.61, 0.7, 0)},
                     "bus": {"8": one(1.0, 0.8, 0), "16": one(0.74, 0.66, 2)}}}))
    text = continuous_markdown(tmp_path)
    assert text.startswith("- Seats per grid (`benchmarks/bench_seats.py`, 2026-01-04; 32 HumanEval prompts")
    assert ("the master alone (4000 tokens): 16 seats 0.61× the wall time of 8 seats, 80% / 70% of seat-steps busy, "
            "completions differing from 8 seats: 0; the bus (4000 tokens): 16 seats 0.74×") in text
    assert text.endswith("completions differing from 8 seats: 2.")


def test_the_seat_replay_renders_each_order_over_the_settings(tmp_path):
    from fusionlab.lab.readme_continuous import continuous_markdown

    def setting(grid, measured, mean, first):
        return {"measured": {"occupancy": measured}, "grid_order": {"occupancy": grid},
                "random_orders": {"occupancy_mean": mean}, "longest_first": {"occupancy": first}}

    (tmp_path / "seat_replay.json").write_text(json.dumps({
        "date": "2026-01-05", "seats": 16,
        "settings": {"a": setting(0.78, 0.79, 0.83, 0.98), "b": setting(0.83, 0.834, 0.85, 0.99)},
        "four_settings_sharing_seats": {"occupancy": 0.9365, "steps_ratio": 0.8747}}))
    text = continuous_markdown(tmp_path)
    assert text.startswith("- Why the seats stay under 85 % busy (`benchmarks/seat_replay.py`, 2026-01-05; the "
                           "committed full HumanEval run's 2 settings")
    assert ("the replay gives 78%-83% of seat-steps busy where the run measured 79%-83%; random orders 83%-85% on "
            "average; longest completion first 98%-99%") in text
    assert text.endswith("would keep 94% busy in 0.87× the decode steps.")


def test_an_offload_stage_puts_its_text_relays_beside_the_kv_channel(tmp_path):
    from fusionlab.experiments.nb10_offload_stage import table_name
    from fusionlab.lab.readme_transfer_map import offload_stages_markdown

    acc = {f"{c}{s}": 0.5 for c in ("floor", "skyline", "ceiling", "offload", "control") for s in ("", "_lo", "_hi")}
    row = {"slave": "noise:0", "n": 120, "transfer": 1.0, "lo": 1.0, "hi": 1.0, "p_value": 1e-6, **acc}
    pd.DataFrame([row]).to_csv(tmp_path / f"{table_name('ladder', 256)}.csv", index=False)
    assert "text relay" not in offload_stages_markdown(tmp_path)  # a table saved before the relay: no block
    relay = {"relay": 0.25, "relay_lo": 0.2, "relay_hi": 0.3, "relay_control": 0.0, "p_vs_relay": 3e-9,
             "note_tokens": 21.4, "relay_seconds": 2.04, "offload_seconds": 1.51, "floor": 0.0, "skyline": 1.0,
             "acc_setting": 0.5, "acc_control": 0.5}
    pd.DataFrame([row | relay, {**row, "slave": "int4"}]).to_csv(tmp_path / f"{table_name('ladder', 256)}.csv",
                                                                 index=False)
    text = offload_stages_markdown(tmp_path)
    assert "the slave's own answer as its ceiling gives it, greedy, at most 24 tokens" in text
    assert "| noise:0 | 50% [50%, 50%] | 25% [20%, 30%] | 0% | 3e-09 | 21 | 2.0 / 1.5 | K/V beats the relay |" in text
    assert "| int4 | 50% [50%, 50%] | 25%" not in text  # a rung whose relay did not run has no relay row


def test_an_offload_stage_says_where_its_noise_rungs_halve_once_the_divergence_is_saved(tmp_path):
    from fusionlab.experiments.nb10_offload_stage import table_name
    from fusionlab.lab.readme_transfer_map import offload_stages_markdown

    share = {"floor (no document)": 0.0, "skyline (master reads it)": 1.0, "+noise:0": 1.0, "+noise:0.1": 0.0,
             "noise:0 alone (reads it)": 1.0, "noise:0.1 alone (reads it)": 0.0}
    pd.DataFrame([{"setting": s, "item": f"f{i}", "label": "correct" if i < t * 40 else "wrong"}
                  for s, t in share.items() for i in range(40)]).to_csv(
        tmp_path / f"{table_name('cells', 256)}.csv", index=False)
    pd.DataFrame([{"slave": "noise:0", "n": 40, "transfer": 1.0, "lo": 1.0, "hi": 1.0, "p_value": 1e-6,
                   **{f"{c}{s}": 0.5 for c in ("floor", "skyline", "ceiling", "offload", "control")
                      for s in ("", "_lo", "_hi")}}]).to_csv(tmp_path / f"{table_name('ladder', 256)}.csv", index=False)
    assert "Weight-noise rungs" not in offload_stages_markdown(tmp_path)  # no KL saved: no curve
    pd.DataFrame({"recipe": ["noise:0", "noise:0.1"], "kl": [0.0, 1.0]}).to_csv(
        tmp_path / "10_divergence.default.csv", index=False)
    text = offload_stages_markdown(tmp_path)
    assert ("Weight-noise rungs (noise:0, noise:0.1) as curves of their KL from `data/results/10_divergence.default"
            ".csv`: transfer falls to 50% of the gap at KL 0.5 nats/token") in text  # linear from the exact copy
    assert "; the slave's own accuracy falls to 50% of the gap at KL 0.5 nats/token" in text
    assert ("Paired on the same items: the channel and the slave halve at indistinguishable KL (channel / slave "
            "crossing +0.00 decades of KL [+0.00, +0.00], paired bootstrap over 40 items).") in text
    pd.DataFrame({"recipe": ["noise:0", "noise:0.1"], "kl": [0.0, 0.2]}).to_csv(
        tmp_path / "10_offload_divergence.full.csv", index=False)  # the stages' own: the full plan's texts
    text = offload_stages_markdown(tmp_path)
    assert ("as curves of their KL from `data/results/10_offload_divergence.full.csv`: transfer falls to 50% of the "
            "gap at KL 0.1 nats/token") in text
