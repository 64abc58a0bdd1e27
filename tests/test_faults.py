"""kill -9 a grid process at random points, again and again: the resumed run ends with every cell exactly once and the
same results as an uninterrupted run (NIAH and HumanEval grids, tiny models, each in its own process)."""
from __future__ import annotations

import json
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

WORKER = r'''
import sys, torch
import fusionlab as fl
from fusionlab.experiments import nb04_humaneval as he, nb02_niah as niah, nb02_niah_grid as ng
kind, cache, hay = sys.argv[1], sys.argv[2], sys.argv[3]
torch.set_num_threads(1)
m = fl.load("tiny-qwen2")
if kind == "niah":
    s = fl.load("tiny-qwen2")
    settings = [ng.Setting("single", lambda: fl.fuse(m, []), "single"),
                ng.Setting("self", lambda: fl.fuse(m, [fl.Slave(s)]), "self")]
    needles = [n for n in niah.load_needles() if n.lang == "en"][:2]
    ng.run_grid(m, settings, needles, [200, 230, 260], [20, 80], {"en": hay}, cache=cache, max_new_tokens=6,
                batch_size=2)
else:
    tasks = [t for t in he.problems() if len(t["prompt"]) < 260][:8]
    he.generate_all("s", "k", lambda: fl.fuse(m, []), tasks, max_new_tokens=10, cache=cache, batch_size=3)
'''
CELLS = {"niah": 24, "humaneval": 8}
BATCH = {"niah": 2, "humaneval": 3}  # the workers' batch sizes: cells land in the cache a batch at a time


def run(kind: str, cache: Path, hay: Path, worker: Path, kill: tuple[int, float] | None) -> int:
    """Run the grid; `kill` = (cells, delay): SIGKILL it `delay` s after the cache first holds that many finished
    cells (a random point of the run that lands whatever the machine's speed), unless it has finished by then."""
    p = subprocess.Popen([sys.executable, str(worker), kind, str(cache), str(hay)], stdout=subprocess.DEVNULL,
                         stderr=subprocess.PIPE)
    if kill is not None:
        cells, delay = kill
        while p.poll() is None and (len(records(cache)) if cache.exists() else 0) < cells:
            time.sleep(0.005)
        time.sleep(delay)
        if p.poll() is None:
            p.send_signal(signal.SIGKILL)
    p.wait()
    if p.returncode not in (0, -signal.SIGKILL):
        raise AssertionError(p.stderr.read().decode()[-2000:])
    return p.returncode


def records(cache: Path) -> list[dict]:
    out = []
    for raw in cache.read_bytes().splitlines(keepends=True):
        try:
            if raw.endswith(b"\n"):
                out.append(json.loads(raw))
        except ValueError:
            pass
    return out


@pytest.mark.parametrize("kind", ["niah", "humaneval"])
def test_kill_minus_nine_at_random_points_loses_and_duplicates_nothing(tmp_path, kind):
    worker, hay = tmp_path / "worker.py", tmp_path / "hay.txt"
    worker.write_text(WORKER)
    hay.write_text(" ".join(f"Sentence number {i} talks about rivers and old maps." for i in range(600)))
    ref = tmp_path / "ref.jsonl"
    assert run(kind, ref, hay, worker, None) == 0 and len(records(ref)) == CELLS[kind]
    cache, kills, rng = tmp_path / "killed.jsonl", 0, random.Random(0)
    for attempt in range(9):  # kill at random points of the run; the last attempts are left to finish
        done = len(records(cache)) if cache.exists() else 0
        last = CELLS[kind] - BATCH[kind]  # a kill point with at least one batch still to compute
        target = rng.randint(done, max(done, last))
        # target == done: during start-up or the first batch (a random delay); else right after that many cells
        point = (target, rng.uniform(0.3, 2.5) if target == done else rng.uniform(0.0, 0.05)) if attempt < 6 else None
        code = run(kind, cache, hay, worker, point)
        kills += code == -signal.SIGKILL
        if code == 0:
            break
    assert code == 0 and kills >= 3, f"only {kills} kills landed"
    got, want = records(cache), records(ref)
    keys = [r["key"] for r in got]
    assert len(keys) == len(set(keys)) == CELLS[kind]  # every cell exactly once (a torn line is not a record)
    field = "answer" if kind == "niah" else "completion"
    assert {r["key"]: r[field] for r in got} == {r["key"]: r[field] for r in want}
