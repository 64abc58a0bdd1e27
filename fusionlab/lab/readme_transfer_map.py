"""The README's notebook-10 blocks: the transfer map (NLL, one row per rung), offload accuracy on synthetic facts and
the learned-fuser positive control, rendered from the saved tables only, the verdicts from the rules on the same
rows (never typed)."""
from __future__ import annotations

import math
from pathlib import Path

import pandas as pd

from ..analysis.stats import interval
from ..experiments.nb10_claims import (accuracy_relay_verdict, beyond_skyline_sentence, nll_rung_verdict, relay_verdict,
                                        rung_verdict)
from ..experiments.nb10_fuser_claims import control_verdict
from ..experiments.nb10_kvcomm_sink import table_name as sink_table, verdict as sink_verdict
from ..experiments.nb10_crossing import accuracy_crossing, crossing_order, order_sentence, sentence
from ..experiments.nb10_offload import offload_plan
from ..experiments.nb10_nll_stage import table_name as nll_stage_table
from ..experiments.nb10_offload_stage import DIVERGENCE as STAGE_DIVERGENCE
from ..experiments.nb10_offload_stage import stage_rungs, table_name
from ..experiments.nb10_transfer_map import plan as ladder_plan
from .results import best_table, load_table

HEAD = ("| slave | KL (nats/token) | distance | transfer [95% CI] | vs other document (nats) | slave's own gain | "
        "through lstsq | KVComm layers | text relay | K/V − relay (nats) | verdict | K/V vs relay |")


def _missing(v: object) -> bool:
    return v is None or (isinstance(v, float) and math.isnan(v))


def _cell(r: dict, point: str, lo: str | None = None, hi: str | None = None, spec: str = ".2f") -> str:
    """`point [lo, hi]`, the point alone where no interval was saved, '-' where the run did not measure it."""
    v = r.get(point)
    if _missing(v):
        return "-"
    if lo is None or _missing(r.get(lo)) or _missing(r.get(hi)):
        return f"{v:{spec}}"
    return f"{v:{spec}} {interval(r[lo], r[hi], spec)}"


NOT_YET = "_Not measured yet: run notebook 10._"


def _table(name: str, head: str, folder: Path | None) -> tuple[pd.DataFrame, str, list[str]] | None:
    """The largest saved run of table `name` with its size, and the markdown header lines of a block over it."""
    got = best_table(name, folder)
    if got is None:
        return None
    df, size = got
    return df, size, [head, "|" + "---|" * (head.count("|") - 1)]


def transfer_map_markdown(folder: Path | None = None) -> str:
    """Notebook 10's ladder, nearest rung first: divergence, NLL transfer with its controls, the slave's own gain
    (its ceiling, as a share of the master's gap), the sibling through `lstsq`, the slave on KVComm's layers, the
    text relay and the verdicts."""
    got = _table("10_transfer_map", HEAD, folder)
    if got is None:
        return NOT_YET
    df, size, lines = got
    n = int(df["n"].min())
    return "\n".join(lines + _map_rows(df)) + (
        f"\n\nfrom `data/results/10_transfer_map.{size}.csv`: {n} documents (one part A / part B pair each), paired "
        "bootstrap over documents. transfer = share of the master's floor-to-skyline NLL gap (mean "
        f"{df['gap'].iloc[0]:.2f} nats/token) the offload closes; vs other document = the control's NLL minus the "
        "offload's; slave's own gain = its own gap from reading A as a share of the master's; distance = 1 − "
        "layer-mean K/V R² after lstsq; through lstsq / KVComm layers / text relay: the same transfer through the "
        "other channels." + _crossing(folder) + _by_domain(df, folder)) + nll_stage_markdown(folder) + \
        kvcomm_sink_markdown(folder)


def _map_rows(df: pd.DataFrame) -> list[str]:
    return [f"| {r['slave']} | {_cell(r, 'kl', spec='.3f')} | {_cell(r, 'distance', spec='.3f')} | "
            f"{_cell(r, 'transfer', 'lo', 'hi')} | "
            f"{_cell(r, 'vs_control', 'vs_control_low', 'vs_control_high', '+.2f')} | "
            f"{_cell(r, 'ceiling_share')} | {_cell(r, 'lstsq_transfer', 'lstsq_lo', 'lstsq_hi')} | "
            f"{_cell(r, 'kvcomm_transfer', 'kvcomm_lo', 'kvcomm_hi')} | "
            f"{_cell(r, 'relay_transfer', 'relay_lo', 'relay_hi')} | "
            f"{_cell(r, 'vs_relay', 'vs_relay_low', 'vs_relay_high', '+.2f')} | {nll_rung_verdict(r)} | "
            f"{relay_verdict(r)} |" for r in df.to_dict("records")]


def nll_stage_markdown(folder: Path | None = None) -> str:
    """The full NLL plan's rungs saved so far (`fusionlab nll-stage`), nearest first; '' if none."""
    df = load_table(nll_stage_table("map"), folder)
    if df is None:
        return ""
    every = len(stage_rungs(ladder_plan("full")))
    return (f"\n\nThe full plan ({len(df)} of {every} rungs so far, `fusionlab nll-stage`; from "
            f"`data/results/{nll_stage_table('map')}.csv`, {int(df['n'].min())} documents, the same columns):\n\n" +
            "\n".join([HEAD, "|" + "---|" * (HEAD.count("|") - 1), *_map_rows(df)]) +
            _halves(load_table(nll_stage_table("crossing"), folder), "\n\nThe full plan's weight-noise rungs"))


SINK_HEAD = ("| slave | KVComm layers | + sink | sink only | sink's gain (nats) | + sink vs other document (nats) | "
             "verdict |")


def kvcomm_sink_markdown(folder: Path | None = None) -> str:
    """KVComm's layers with and without an attention sink (`fusionlab kvcomm-sink`), each verdict from
    `nb10_kvcomm_sink.verdict` on the saved row; '' if not run."""
    df = load_table(sink_table("table"), folder)
    if df is None:
        return ""
    rows = [" | ".join(["", r["slave"], _cell(r, "kvcomm_transfer", "kvcomm_lo", "kvcomm_hi"),
                        _cell(r, "sink_transfer", "sink_lo", "sink_hi"),
                        _cell(r, "sink_only_transfer", "sink_only_lo", "sink_only_hi"),
                        _cell(r, "sink_gain", "sink_gain_low", "sink_gain_high", "+.2f"),
                        _cell(r, "vs_control", "vs_control_low", "vs_control_high", "+.2f"), sink_verdict(r),
                        ""]).strip()
            for r in df.to_dict("records")]
    return (f"\n\nWhy KVComm's layers score below the floor, even on the exact copy (`fusionlab kvcomm-sink`; from "
            f"`data/results/{sink_table('table')}.csv`, {int(df['n'].min())} documents of the full plan, NLL transfer "
            "with paired bootstrap CIs). The suspect: a layer left out of the selection sees only the master's own "
            "tokens, and their first has read the slave's slots at the fed layers, so it is not the attention sink a "
            "first token is. \"+ sink\" keeps the slave's first slot on every layer left out; \"sink only\" gives every layer that "
            "one slot and nothing more (what the sink itself is worth); the gains are per-document NLL differences "
            "against KVComm's layers as published and against the sink version reading another document.\n\n" +
            "\n".join([SINK_HEAD, "|" + "---|" * (SINK_HEAD.count("|") - 1), *rows]))


def _crossing(folder: Path | None) -> str:
    """Where the weight-noise curve halves (`nb10_crossing`), when notebook 10's run saved it."""
    got = best_table("10_crossing", folder)
    return _halves(None if got is None else got[0], " Weight-noise rungs")


def _halves(saved: pd.DataFrame | None, lead: str) -> str:
    """A saved crossing row (notebook 10's or the NLL stage's) as the README's sentence; '' when none was saved."""
    return "" if saved is None else f"{lead} as one curve of KL: {sentence(saved.iloc[0].to_dict())}."


def _by_domain(table: pd.DataFrame, folder: Path | None) -> str:
    """Where a transfer above 1 comes from, domain by domain (`nb10_claims.beyond_skyline_sentence`), when saved."""
    got = best_table("10_transfer_by_domain", folder)
    text = "" if got is None or "setting" not in table else beyond_skyline_sentence(table, got[0])
    return f" {text}" if text else ""


OFFLOAD_HEAD = ("| slave | floor | skyline | slave alone (ceiling) | offload | other document | transfer [95% CI] | "
                "McNemar p vs control | McNemar p vs ceiling | verdict |")


def _acc(r: dict, col: str) -> str:
    return f"{r[col]:.0%} {interval(r[col + '_lo'], r[col + '_hi'], '.0%')}"


def _p(r: dict, col: str) -> str:
    return "-" if _missing(r.get(col)) else f"{r[col]:.2g}"  # tables saved before the column existed: '-'


def _offload_rows(df: pd.DataFrame) -> list[str]:
    return [f"| {r['slave']} | {_acc(r, 'floor')} | {_acc(r, 'skyline')} | {_acc(r, 'ceiling')} | "
            f"{_acc(r, 'offload')} | {_acc(r, 'control')} | {_cell(r, 'transfer', 'lo', 'hi')} | "
            f"{_p(r, 'p_value')} | {_p(r, 'p_vs_ceiling')} | {rung_verdict(r)} |" for r in df.to_dict("records")]


def offload_ladder_markdown(folder: Path | None = None) -> str:
    """Notebook 10's offload accuracy on synthetic facts, one row per rung (`nb10_offload.accuracy_table`), each
    verdict from `nb10_claims.rung_verdict` on the same row; then the full plan's stages, one table per length."""
    got = _table("10_offload_ladder", OFFLOAD_HEAD, folder)
    if got is None:
        return NOT_YET
    df, size, lines = got
    return "\n".join(lines + _offload_rows(df)) + (
        f"\n\nfrom `data/results/10_offload_ladder.{size}.csv`: {int(df['n'].min())} items per setting (synthetic "
        "facts, English and Chinese, one document each), Wilson 95 % CIs; transfer = (offload − floor) / (skyline − "
        "floor), paired bootstrap over items; McNemar: offload against the slave reading another document, and "
        "against the slave answering alone (its ceiling: does the master read more out of its memory than it "
        "answers?)."
    ) + offload_stages_markdown(folder)


def offload_stages_markdown(folder: Path | None = None) -> str:
    """The full plan's offload stages saved so far (`fusionlab offload-stage`), one table per length; '' if none."""
    plan = offload_plan("full")
    every = len(stage_rungs(plan))
    saved = {n: load_table(table_name("ladder", n), folder) for n in plan.lengths}
    blocks = []
    for length, df in saved.items():
        if df is None:
            continue
        blocks.append(
            f"\n\nThe full plan at {length} tokens ({len(df)} of {every} rungs so far, "
            f"`fusionlab offload-stage --length {length}`; from `data/results/{table_name('ladder', length)}.csv`, "
            f"{int(df['n'].min())} items per setting):\n\n" +
            "\n".join([OFFLOAD_HEAD, "|" + "---|" * (OFFLOAD_HEAD.count("|") - 1), *_offload_rows(df)]) +
            _relay_block(df, plan.max_new_tokens) + _stage_crossings(length, folder))
    missing = [n for n, df in saved.items() if df is None]
    if blocks and missing:
        blocks.append(f"\n\nNot run yet at {', '.join(map(str, missing))} tokens.")
    return "".join(blocks)


RELAY_HEAD = ("| slave | K/V offload | text relay | relay reading another document's note | McNemar p K/V vs relay | "
              "note (master tokens) | seconds per item: relay / K/V | verdict |")


def _relay_block(df: pd.DataFrame, tokens: int) -> str:
    """The rungs whose text relay ran (`nb10_offload_relay`), K/V beside talking on the same items; '' if none."""
    rows = df[df["relay"].notna()].to_dict("records") if "relay" in df else []
    if not rows:
        return ""
    lines = [f"| {r['slave']} | {_acc(r, 'offload')} | {_acc(r, 'relay')} | {r['relay_control']:.0%} | "
             f"{_p(r, 'p_vs_relay')} | {r['note_tokens']:.0f} | "
             f"{r['relay_seconds']:.1f} / {r['offload_seconds']:.1f} | {accuracy_relay_verdict(r)} |"
             for r in rows]
    return ("\n\nThe text relay on the same items (the note is the slave's own answer as its ceiling gives it, greedy, "
            f"at most {tokens} tokens; the master reads only the note and the question):\n\n" +
            "\n".join([RELAY_HEAD, "|" + "---|" * (RELAY_HEAD.count("|") - 1), *lines]))


def _stage_divergence(folder: Path | None) -> tuple[pd.DataFrame, str] | None:
    """The KL axis of a stage's crossing and its file: the stages' own divergence (`nb10_offload_stage.DIVERGENCE`,
    the full plan's texts) where saved, else the notebook's largest run's."""
    own = load_table(STAGE_DIVERGENCE, folder)
    if own is not None:
        return own, STAGE_DIVERGENCE
    got = best_table("10_divergence", folder)
    return None if got is None else (got[0], f"10_divergence.{got[1]}")


def _stage_crossings(length: int, folder: Path | None) -> str:
    """Where a stage's weight-noise rungs halve, as curves of KL (`nb10_crossing.accuracy_crossing`): the channel
    (offload) beside the slave alone (its ceiling), and which halves first (`crossing_order`); '' without the
    divergence table or two noise rungs."""
    cells, div = load_table(table_name("cells", length), folder), _stage_divergence(folder)
    if div is None or cells is None:
        return ""
    curves = [accuracy_crossing(cells, div[0], of) for of in ("offload", "ceiling")]
    if len(curves[0]["rungs"]) < 2:
        return ""
    order = order_sentence(crossing_order(cells, div[0]))
    return (f"\n\nWeight-noise rungs ({', '.join(curves[0]['rungs'])}) as curves of their KL from "
            f"`data/results/{div[1]}.csv`: {sentence(curves[0])}; {sentence(curves[1])}. "
            f"Paired on the same items: {order}.")


CONTROL_HEAD = ("| slave | gate parametrisation | gate start → end | held-out transfer [95% CI] | training-free start | "
                "fuser reading another document: transfer; NLL vs it (nats) | shuffled-pairing fuser: transfer; NLL "
                "vs it (nats) | NLL vs start (nats) [95% CI] | "
                "steps (best) | verdict |")


def fuser_control_markdown(folder: Path | None = None) -> str:
    """The learned-fuser positive control (`nb10_fuser_control`), one row per trained fuser, verdicts from its
    `control_verdict` on the same row."""
    got = _table("10_fuser_control", CONTROL_HEAD, folder)
    if got is None:
        return NOT_YET
    df, size, lines = got
    for r in df.to_dict("records"):
        best = "-" if _missing(r.get("best_step")) else int(r["best_step"])
        start = f"{r['start_transfer']:.2f}" + (f" ({r['start']})" if not _missing(r.get("start")) else "")
        lines.append(f"| {r['rung']} | {r['opening']} | {r['gate_start']:.3f} → {r['gate_end']:.3f} | "
                     f"{_cell(r, 'transfer', 'lo', 'hi')} | {start} | {r['control_transfer']:.2f}; "
                     f"{_cell(r, 'vs_control', 'vs_control_lo', 'vs_control_hi', '+.3f')} | "
                     f"{_cell(r, 'shuffled_transfer')}; "
                     f"{_cell(r, 'vs_shuffled', 'vs_shuffled_lo', 'vs_shuffled_hi', '+.3f')} | "
                     f"{_cell(r, 'vs_start', 'vs_start_lo', 'vs_start_hi', '+.3f')} | "
                     f"{int(r['steps'])} ({best}) | {control_verdict(r)} |")
    return "\n".join(lines) + (
        f"\n\nfrom `data/results/10_fuser_control.{size}.csv`: {int(df['n'].min())} held-out windows from "
        f"{int(df['docs'].min())} documents (bootstrap over documents); the fuser kept is the best of its validation "
        "passes (other documents), the untrained start included.")
