"""Execute notebooks headless (nbclient), in order, with visible progress; executed copies go to an ignored folder."""
from __future__ import annotations

import json
import os
import tempfile
import threading
import time
from contextlib import contextmanager, nullcontext
from pathlib import Path
from typing import Any, Iterator

from ..cells import PROGRESS_ENV, RAY_ENV, read_tally
from ..errors import FusionLabError
from ..paths import notebooks_dir, repo_root
from .results import lab_times, record_lab_time


DEFAULT_CELL_TIMEOUT_S = 4 * 3600
"""One notebook cell's limit in a default run (a hang, not a slow grid: notebook 10's NLL ladder computed from an empty
cache takes about 2 h on 2 cores); full runs have none (a full 8K grid cell runs for hours)."""


def notebook_paths(folder: Path | None = None) -> list[Path]:
    return sorted(p for p in Path(folder or notebooks_dir()).glob("[0-9][0-9]_*.ipynb"))


def code_cells(path: Path) -> int:
    return sum(c.get("cell_type") == "code" for c in json.loads(path.read_text(encoding="utf-8"))["cells"])


def kernel_of(nb: Any) -> str:
    """The kernel a notebook names (the bootstrap registers 'fusionlab': this venv); a clear error if it is missing."""
    from jupyter_client.kernelspec import KernelSpecManager, NoSuchKernel

    name = nb.metadata.get("kernelspec", {}).get("name", "python3")
    try:
        KernelSpecManager().get_kernel_spec(name)
    except NoSuchKernel:
        raise FusionLabError(f"the notebook asks for kernel {name!r}, which is not registered: run the README's set-up "
                             f"(python3 fusionlab/bootstrap.py test), or python -m ipykernel install --sys-prefix "
                             f"--name {name}.") from None
    return name


class CellProgress:
    """What the lab prints while a notebook runs: one line per finished code cell (elapsed time against the last
    recorded run of this notebook, `lab_times.<size>.json`, and each grid the cell finished, from the cell tally), and
    while a long cell runs, each grid's count of computed cells with its rate and the time left (from the grid
    progress file that `run_cells` appends to), at most once per `every_s` per grid."""

    def __init__(self, name: str, code_cells: int, estimate_s: float | None, tally: Path | None,
                 grids: Path | None = None, every_s: float = 30.0):
        self.name, self.code_cells, self.estimate_s, self.tally = name, code_cells, estimate_s, tally
        self.grids, self.every_s = grids, every_s
        self.t0, self.done, self.grids_seen, self.progress_seen = time.perf_counter(), 0, 0, 0
        self._first: dict[str, tuple[float, int]] = {}  # grid -> (when first seen, cells done then)
        self._shown: dict[str, float] = {}

    def line(self) -> str:
        elapsed = time.perf_counter() - self.t0
        of = f" of ~{self.estimate_s:.0f} s (last run)" if self.estimate_s else ""
        out = f"    {self.name}: cell {self.done}/{self.code_cells} done, {elapsed:.0f} s{of}"
        grids = self.tally.read_text(encoding="utf-8").splitlines() if self.tally and self.tally.exists() else []
        for raw in grids[self.grids_seen:]:
            g = json.loads(raw)
            out += f"\n      grid {g['desc']!r}: {g['computed']} computed, {g['cached']} from the cache"
        self.grids_seen = len(grids)
        return out

    def grid_lines(self, now: float | None = None) -> list[str]:
        """New progress of the grids running now: one line per grid that moved, unless shown < `every_s` ago."""
        now = time.perf_counter() if now is None else now
        rows = self.grids.read_text(encoding="utf-8").splitlines() if self.grids and self.grids.exists() else []
        latest: dict[str, dict[str, Any]] = {}
        for raw in rows[self.progress_seen:]:
            g = json.loads(raw)
            latest[g["desc"]] = g
            self._first.setdefault(g["desc"], (now, g["done"]))
        self.progress_seen = len(rows)
        out = []
        for desc, g in latest.items():
            if now - self._shown.get(desc, -1e9) < self.every_s and g["done"] < g["total"]:
                continue
            self._shown[desc] = now
            since, done0 = self._first[desc]
            rate = (now - since) / (g["done"] - done0) if g["done"] > done0 else None
            left = f", ~{rate * (g['total'] - g['done']) / 60:.0f} min left" if rate else ""
            out.append(f"      grid {desc!r}: {g['done']}/{g['total']} cells" +
                       (f" ({rate:.1f} s/cell{left})" if rate else ""))
        return out

    @contextmanager
    def watching(self, poll_s: float = 5.0) -> Iterator[None]:
        """Print grid progress from a background thread while the block runs (the notebook executes)."""
        stop = threading.Event()

        def loop() -> None:
            while not stop.wait(poll_s):
                for line in self.grid_lines():
                    print(line, flush=True)
        t = threading.Thread(target=loop, daemon=True)
        t.start()
        try:
            yield
        finally:
            stop.set()
            t.join()

    def __call__(self, cell: Any, **_: Any) -> None:
        if cell.get("cell_type") == "code":
            self.done += 1
            print(self.line(), flush=True)


def execute(path: Path, out_dir: Path | None = None, timeout: int | None = 3600,
            env: dict[str, str] | None = None, html: bool = True, progress: CellProgress | None = None) -> Path:
    """Run one notebook top to bottom in its own folder (raise with the failing cell's error); the executed copy keeps
    its widget state, and an HTML export with the figures inline is written beside it."""
    import nbformat
    from nbclient import NotebookClient

    old = dict(os.environ)
    os.environ.update(env or {})
    try:
        nb = nbformat.read(path, as_version=4)
        client = NotebookClient(nb, timeout=timeout, kernel_name=kernel_of(nb), store_widget_state=True,
                                resources={"metadata": {"path": str(path.parent)}})
        if progress is not None:
            client.on_cell_executed = progress
        with progress.watching() if progress is not None else nullcontext():
            client.execute()
    finally:
        os.environ.clear()
        os.environ.update(old)
    out_dir = Path(out_dir or notebooks_dir() / "executed")
    out_dir.mkdir(parents=True, exist_ok=True)
    out = out_dir / path.name
    nbformat.write(nb, out)
    if html:
        from nbconvert import HTMLExporter

        body, _ = HTMLExporter(embed_images=True).from_notebook_node(nb)
        out.with_suffix(".html").write_text(body, encoding="utf-8")
    return out


def run_all(full: bool = False, quick: bool = False, only: list[str] | None = None,
            ray: str | None = None) -> list[tuple[str, float]]:
    """Every notebook in order (or those whose name starts with one of `only`, e.g. ['04', '07']); each one's wall
    time is recorded for the README (QUICK runs and Ray runs are not: the cost table is one machine, in-process).
    `ray`: 'local' or a cluster address; every grid of every notebook then runs on Ray ($FUSIONLAB_RAY, cells.py)."""
    env = {"FUSIONLAB_FULL": "1" if full else "0", "FUSIONLAB_QUICK": "1" if quick else "0"}
    if ray:
        env[RAY_ENV] = ray
    size = "quick" if quick else ("full" if full else "default")
    times = []
    paths = [p for p in notebook_paths() if not only or any(p.name.startswith(o) for o in only)]
    if only and not paths:
        raise FusionLabError(f"no notebook matches {only}; names start with two digits, e.g. --only 04 07.")
    recorded = (lab_times(size) or {}).get("notebooks", {})
    for n, path in enumerate(paths, 1):
        last = recorded.get(path.name, {}).get("seconds")
        print(f"[{n}/{len(paths)}] {path.name} ..." + (f" (last {size} run: {last:.0f} s)" if last else ""),
              flush=True)
        with tempfile.TemporaryDirectory() as tmp:
            tally = Path(tmp) / "cells.jsonl"  # the kernel's run_cells calls append here (cells.py)
            grids = Path(tmp) / "progress.jsonl"  # ... and each finished batch here
            t0 = time.perf_counter()
            progress = CellProgress(path.name[:2], code_cells(path), recorded.get(path.name, {}).get("seconds"), tally,
                                    grids)
            out = execute(path, env=env | {"FUSIONLAB_CELL_TALLY": str(tally), PROGRESS_ENV: str(grids)},
                          timeout=None if full else DEFAULT_CELL_TIMEOUT_S, progress=progress)
            times.append((path.name, time.perf_counter() - t0))
            if size != "quick" and not ray:
                record_lab_time(path.name, times[-1][1], size, cells=read_tally(tally))
        print(f"[{n}/{len(paths)}] {path.name} done in {times[-1][1]:.0f} s -> {out.relative_to(repo_root().resolve())}", flush=True)
    return times
