"""Where FusionLab's files live: one place, so nothing breaks when a module moves or the package is installed.

Two layouts are supported:

- **a clone** (the lab: notebooks, results, figures, README): the package's parent folder holds
  `pyproject.toml` and `data/`. Text assets are read from `data/`, results are written to `data/results/`,
  figures to `figures/`.
- **an installed wheel** (the library only): the text assets the library itself reads ship inside the wheel as
  package data (`fusionlab/_data/`: calibration text, held-out text, the Chinese haystack, needles, prompt sets,
  the training split, the claim ids); results, caches and figures go under `FUSIONLAB_HOME` (default
  `~/.cache/fusionlab`). Notebooks, benchmarks and the README exist in a clone only.

`FUSIONLAB_HOME` also holds the converted embedded models and the fetched Paul Graham haystack in both layouts.
"""
from __future__ import annotations

import os
from pathlib import Path

from .errors import FusionLabError

PACKAGE = Path(__file__).resolve().parent
SHIPPED_DATA = PACKAGE / "_data"
"""Where a wheel install puts the text assets (setuptools maps the clone's data/ here)."""


def clone_root() -> Path | None:
    """The repository root when running from a clone (editable install or PYTHONPATH), else None."""
    root = PACKAGE.parent
    return root if (root / "pyproject.toml").is_file() and (root / "data").is_dir() else None


def home() -> Path:
    """Per-user cache: converted models, fetched haystacks, and (for installed wheels) results and figures."""
    return Path(os.environ.get("FUSIONLAB_HOME", Path.home() / ".cache" / "fusionlab"))


def data_dir() -> Path:
    """The read-only text assets: the clone's data/ or the wheel's package data."""
    root = clone_root()
    if root is not None:
        return root / "data"
    if SHIPPED_DATA.is_dir():
        return SHIPPED_DATA
    raise FusionLabError(f"FusionLab's data files are missing: neither a clone's data/ next to {PACKAGE} nor the "
                         f"wheel's {SHIPPED_DATA}. Reinstall the package (pip install --force-reinstall fusionlab).")


def asset(*parts: str) -> Path:
    """A file or folder under the data assets, e.g. asset('calibration'); a clear error if it is missing."""
    path = data_dir().joinpath(*parts)
    if not path.exists():
        raise FusionLabError(f"data asset {'/'.join(parts)!r} not found at {path}; restore it from the repository "
                             "(git checkout -- data/) or reinstall the package.")
    return path


def results_dir() -> Path:
    """Saved tables and claims: the clone's data/results, else FUSIONLAB_HOME/results."""
    root = clone_root()
    return root / "data" / "results" if root is not None else home() / "results"


def cache_dir() -> Path:
    """Resumable cell caches and fitted projectors (never committed)."""
    return results_dir() / "cache"


def figures_dir() -> Path:
    root = clone_root()
    return root / "figures" if root is not None else home() / "figures"


def _in_clone(name: str) -> Path:
    root = clone_root()
    if root is None:
        raise FusionLabError(f"{name} exists only in a clone of the FusionLab repository (an installed wheel carries "
                             "the library alone); clone it and run from there.")
    return root / name


def repo_root() -> Path:
    return _in_clone(".")


def notebooks_dir() -> Path:
    return _in_clone("notebooks")


def bench_results_dir() -> Path:
    return _in_clone("benchmarks") / "results"


def readme_path() -> Path:
    return _in_clone("README.md")
