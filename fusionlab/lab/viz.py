"""Figures for papers: one style, one `save_figure()` writing PDF + SVG + PNG and a JSON manifest."""
from __future__ import annotations

import json
import subprocess
import time
from pathlib import Path
from typing import Any

import matplotlib

from .._version import __version__
from ..paths import clone_root, figures_dir
from ..runsize import SIZES, run_size

FORMATS = ("pdf", "svg", "png")


def use_paper_style() -> None:
    """seaborn 'paper' context; fonts embedded as TrueType (pdf.fonttype 42) so journals accept the PDF; PNGs at 300
    dpi."""
    import seaborn as sns

    sns.set_theme(context="paper", style="whitegrid", palette="colorblind")
    matplotlib.rcParams.update({"pdf.fonttype": 42, "ps.fonttype": 42, "svg.fonttype": "none",
                                "figure.dpi": 110, "savefig.dpi": 300, "savefig.bbox": "tight"})


def git_revision() -> str | None:
    root = clone_root()
    if root is None:
        return None
    try:
        out = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=root, capture_output=True, text=True)
        return out.stdout.strip() or None
    except OSError:
        return None


def target_folder(name: str, size: str) -> Path:
    """figures/ unless a larger run's `name` is there (then figures/<size>/); QUICK always figures/quick/."""
    top = figures_dir()
    if size == "quick":
        return top / "quick"
    there = top / f"{name}.json"
    if there.exists():
        existing = json.loads(there.read_text()).get("run_size", "default")
        if existing in SIZES and SIZES.index(existing) < SIZES.index(size):
            return top / size
    return top


def model_record(lm: Any) -> dict[str, Any]:
    return {"name": lm.name, "sha256": lm.fingerprint, "source": lm.source}


def save_figure(fig: Any, name: str, models: list[Any] | None = None, params: dict[str, Any] | None = None,
                folder: Path | None = None) -> dict[str, Path]:
    """Write `name`.pdf/.svg/.png (300 dpi) and `name`.json (models + sha, version, git revision, parameters, date).
    figures/ holds the largest run's figure, like the result tables: QUICK figures go to the ignored figures/quick/,
    and a run smaller than the one already in figures/ writes to figures/<run size>/ instead of replacing it."""
    folder = Path(folder or target_folder(name, run_size()))  # CI runs never overwrite real figures
    folder.mkdir(parents=True, exist_ok=True)
    paths = {fmt: folder / f"{name}.{fmt}" for fmt in FORMATS}
    for fmt, path in paths.items():
        fig.savefig(path, format=fmt, metadata=None if fmt == "png" else {"Creator": "fusionlab"})
    manifest = {"figure": name, "files": [p.name for p in paths.values()],
                "models": [model_record(m) for m in models or []], "fusionlab_version": __version__,
                "git_revision": git_revision(), "run_size": run_size(), "params": params or {},
                "date": time.strftime("%Y-%m-%dT%H:%M:%S")}
    paths["json"] = folder / f"{name}.json"
    paths["json"].write_text(json.dumps(manifest, indent=2, default=str))
    return paths
