"""Execute notebooks headless (nbclient), in order, with visible progress; executed copies go to an ignored folder."""
from __future__ import annotations

import os
import tempfile
import time
from pathlib import Path
from typing import Any

from ..cells import read_tally
from ..errors import FusionLabError
from ..paths import notebooks_dir, repo_root
from .results import record_lab_time


def notebook_paths(folder: Path | None = None) -> list[Path]:
    return sorted(p for p in Path(folder or notebooks_dir()).glob("[0-9][0-9]_*.ipynb"))


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


def execute(path: Path, out_dir: Path | None = None, timeout: int | None = 3600,
            env: dict[str, str] | None = None, html: bool = True) -> Path:
    """Run one notebook top to bottom in its own folder (raise with the failing cell's error); the executed copy keeps
    its widget state, and an HTML export with the figures inline is written beside it."""
    import nbformat
    from nbclient import NotebookClient

    old = dict(os.environ)
    os.environ.update(env or {})
    try:
        nb = nbformat.read(path, as_version=4)
        NotebookClient(nb, timeout=timeout, kernel_name=kernel_of(nb), store_widget_state=True,
                       resources={"metadata": {"path": str(path.parent)}}).execute()
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


def run_all(full: bool = False, quick: bool = False, only: list[str] | None = None) -> list[tuple[str, float]]:
    """Every notebook in order (or those whose name starts with one of `only`, e.g. ['04', '07']); each one's wall
    time is recorded for the README (QUICK runs are not)."""
    env = {"FUSIONLAB_FULL": "1" if full else "0", "FUSIONLAB_QUICK": "1" if quick else "0"}
    size = "quick" if quick else ("full" if full else "default")
    times = []
    paths = [p for p in notebook_paths() if not only or any(p.name.startswith(o) for o in only)]
    if only and not paths:
        raise FusionLabError(f"no notebook matches {only}; names start with two digits, e.g. --only 04 07.")
    for n, path in enumerate(paths, 1):
        print(f"[{n}/{len(paths)}] {path.name} ...", flush=True)
        with tempfile.TemporaryDirectory() as tmp:
            tally = Path(tmp) / "cells.jsonl"  # the kernel's run_cells calls append here (cells.py)
            t0 = time.perf_counter()
            out = execute(path, env=env | {"FUSIONLAB_CELL_TALLY": str(tally)},
                          timeout=None if full else 3600)  # a full 8K grid cell runs for hours
            times.append((path.name, time.perf_counter() - t0))
            if size != "quick":
                record_lab_time(path.name, times[-1][1], size, cells=read_tally(tally))
        print(f"[{n}/{len(paths)}] {path.name} done in {times[-1][1]:.0f} s -> {out.relative_to(repo_root().resolve())}", flush=True)
    return times
