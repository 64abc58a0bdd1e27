"""The README's continuous-batching measurements, rendered from the benchmarks' JSON (never copied by hand):
`bench_continuous.py` (ours against transformers' `generate_batch`, continuous against static batches),
`bench_streaming.py` (a grid streamed through one scheduler run against groups), `bench_seats.py` (how many
seats a grid should use) and `seat_replay.py` (which admission order would keep the seats busy)."""
from __future__ import annotations

import json
from pathlib import Path

from ..paths import bench_results_dir


def _seconds(runs: list[float]) -> str:
    return " / ".join(f"{s:.0f}" for s in runs)


def _continuous(r: dict) -> list[str]:
    w, tps, seats = r["wall_s"], r["tok_per_s"], r["seats"]
    return [
        f"Measured (`benchmarks/bench_continuous.py`, {r['date']}; Qwen alone, {r['prompts']} HumanEval prompts, "
        f"{seats} seats for both schedulers, {r['max_new_tokens']} new tokens, {r['threads']} threads, {r['reps']} runs "
        "each, in turns; `benchmarks/results/continuous.json`):",
        "- Against transformers' own continuous batching (`generate_batch`, paged cache; EOS only, since it takes no "
        f"stop strings, so every row ran its {r['max_new_tokens']} tokens), ours takes "
        f"**{r['ours_continuous_over_transformers_wall']:.2f}×** its wall time ({_seconds(w['ours continuous'])} s "
        f"against {_seconds(w['transformers'])} s; {tps['ours continuous']:.0f} vs {tps['transformers']:.0f} tok/s), "
        f"with {r['completions_agreeing_with_transformers']} completions identical.",
        "- With HumanEval's stop strings, where rows end at different steps, the scheduler takes "
        f"{r['continuous_over_static_wall_with_stop_strings']:.2f}× the wall time of static batches of {seats} "
        f"({_seconds(w['ours continuous, stop strings'])} s against {_seconds(w['ours static, stop strings'])} s) for "
        f"the same completions; {r['occupancy_with_stop_strings']:.0%} of seat-steps were busy (the last rows decode "
        f"alone). Without stop strings every row runs to {r['max_new_tokens']} tokens and continuous takes "
        f"{r['continuous_over_static_wall']:.2f}× static (each prompt prefilled alone; nothing to refill).",
    ]


def _streaming(r: dict) -> str:
    occ = {run["how"]: run["occupancy"] for run in r["runs"]}
    ratios = " and ".join(f"{x:.2f}×" for x in r["streamed_over_grouped_wall"])
    same = "same completions" if r["same_completions"] else "**completions differ**"
    return (f"- A grid's prompts in one streamed scheduler run against groups of {r['group_seats'] * r['seats']} "
            f"(`benchmarks/bench_streaming.py`, {r['date']}; {r['prompts']} HumanEval prompts, {r['seats']} seats, "
            f"{r['max_new_tokens']} new tokens, stop strings, {r['reps']} runs in turns; "
            f"`benchmarks/results/streaming.json`): {ratios} the wall time, {occ['streamed']:.0%} of seat-steps busy "
            f"against {occ['grouped']:.0%}, {same}.")


SETTING_NAMES = {"alone": "the master alone", "bus": "the bus"}


def _seats(r: dict) -> str:
    first = str(r["seats"][0])
    per = []
    for setting, by_seats in r["settings"].items():
        cmp = ", ".join(f"{s} seats {v['wall_over_first']:.2f}×" for s, v in by_seats.items() if s != first)
        occ = " / ".join(f"{v['occupancy']:.0%}" for v in by_seats.values())
        diff = " / ".join(str(v["differing_from_first"]) for s, v in by_seats.items() if s != first)
        per.append(f"{SETTING_NAMES.get(setting, setting)} ({by_seats[first]['tokens']} tokens): {cmp} the wall time "
                   f"of {first} seats, {occ} of seat-steps busy, completions differing from {first} seats: {diff}")
    return (f"- Seats per grid (`benchmarks/bench_seats.py`, {r['date']}; {r['prompts']} HumanEval prompts streamed "
            f"through one scheduler run, {r['max_new_tokens']} new tokens, stop strings, {r['reps']} runs in turns; "
            f"`benchmarks/results/seats.json`): " + "; ".join(per) + ".")


def _span(settings: dict, order: str, field: str = "occupancy") -> str:
    """The lowest and highest share of busy seat-steps over the settings, for one admission order."""
    shares = [v[order][field] for v in settings.values()]
    return f"{min(shares):.0%}-{max(shares):.0%}"


def _seat_replay(r: dict) -> str:
    """The replay of the committed HumanEval run: which admission order would have kept the seats busy."""
    s, both = r["settings"], r["four_settings_sharing_seats"]
    return (f"- Why the seats stay under 85 % busy (`benchmarks/seat_replay.py`, {r['date']}; the committed full "
            f"HumanEval run's {len(s)} settings replayed from their completions' token counts, no model, "
            f"{r['seats']} seats; `benchmarks/results/seat_replay.json`): in the grid's order (shortest prompt first) "
            f"the replay gives {_span(s, 'grid_order')} of seat-steps busy where the run measured "
            f"{_span(s, 'measured')}; random orders {_span(s, 'random_orders', 'occupancy_mean')} on average; "
            f"longest completion first {_span(s, 'longest_first')}, but that needs the lengths before decoding. "
            f"Each setting's run ends with its last rows decoding alone; the four settings sharing one run's seats "
            f"would keep {both['occupancy']:.0%} busy in {both['steps_ratio']:.2f}× the decode steps.")


def continuous_markdown(folder: Path | None = None) -> str:
    """The measured bullets of the README's continuous-batching paragraph, from whichever benchmark JSON exists."""
    folder = Path(folder or bench_results_dir())
    lines: list[str] = []
    for name, render in (("continuous.json", _continuous), ("streaming.json", lambda r: [_streaming(r)]),
                         ("seats.json", lambda r: [_seats(r)]), ("seat_replay.json", lambda r: [_seat_replay(r)])):
        f = folder / name
        if f.exists():
            lines += render(json.loads(f.read_text()))
    return "\n".join(lines) or "_Not measured yet: run `python benchmarks/bench_continuous.py`._"
