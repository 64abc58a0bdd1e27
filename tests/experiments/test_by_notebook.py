"""Experiments are organised by notebook (README, "Layout"): from a notebook's number a reader finds its harness
(`nbNN_<topic>`), its verdict rules (`nbNN_claims`, or `nbNN_<topic>_claims` in notebook 08) and its figures.

Read from the source: module names, where `Claim(...)` is built, where figures are drawn, and which experiment
modules each notebook imports (its own number or an earlier notebook's, never a later one)."""
from __future__ import annotations

import ast
import json
import re
from pathlib import Path

import fusionlab.experiments as experiments
from fusionlab.paths import notebooks_dir

SHARED = {"__init__", "claim", "gpu_claims"}
"""`claim`: the Claim record and the ledger's open rows; `gpu_claims`: the GPU script's verdict rules (no notebook)."""
NAME = re.compile(r"nb(\d\d)_[a-z0-9_]+$")


def is_claims_module(stem: str) -> bool:
    return stem in {"claim", "gpu_claims"} or bool(re.fullmatch(r"nb\d\d_(?:[a-z0-9_]+_)?claims", stem))


def misplaced(folder: Path, notebooks: set[str]) -> list[str]:
    """Every way a module breaks the pattern, as readable lines (empty: the folder follows it)."""
    bad = []
    for path in sorted(folder.glob("*.py")):
        stem, tree = path.stem, ast.parse(path.read_text(encoding="utf-8"))
        m = NAME.fullmatch(stem)
        if stem not in SHARED and (m is None or m.group(1) not in notebooks):
            bad.append(f"{stem}: not nbNN_<topic> for a notebook NN in notebooks/")
        builds = any(isinstance(n, ast.Call) and getattr(n.func, "id", getattr(n.func, "attr", "")) == "Claim"
                     for n in ast.walk(tree))
        if builds and not is_claims_module(stem):
            bad.append(f"{stem}: builds a Claim outside a claims module")
        plots = [n.name for n in tree.body if isinstance(n, ast.FunctionDef) and n.name.startswith("plot_")]
        if plots and is_claims_module(stem):
            bad.append(f"{stem}: a claims module draws figures ({plots})")
    return bad


def notebook_imports(path: Path) -> set[str]:
    """The fusionlab.experiments modules a notebook's code cells import."""
    cells = json.loads(path.read_text(encoding="utf-8"))["cells"]
    src = "\n".join("".join(c["source"]) for c in cells if c["cell_type"] == "code")
    tree = ast.parse("\n".join(line for line in src.splitlines() if not line.lstrip().startswith(("%", "!"))))
    out = set()
    for n in ast.walk(tree):
        if isinstance(n, ast.ImportFrom) and n.module == "fusionlab.experiments":
            out |= {a.name for a in n.names}
        elif isinstance(n, ast.ImportFrom) and (n.module or "").startswith("fusionlab.experiments."):
            out.add(n.module.split(".")[2])
    return out


def numbers() -> set[str]:
    return {p.name[:2] for p in notebooks_dir().glob("[0-9][0-9]_*.ipynb")}


def test_every_experiment_module_follows_the_notebook_pattern():
    assert misplaced(Path(experiments.__file__).parent, numbers()) == []


def test_the_pattern_check_catches_each_break(tmp_path):
    (tmp_path / "fusers.py").write_text("x = 1\n")  # no notebook number
    (tmp_path / "nb42_thing.py").write_text("x = 1\n")  # no notebook 42
    (tmp_path / "nb07_harness.py").write_text("from .claim import Claim\ndef f():\n    return Claim(claim='a')\n")
    (tmp_path / "nb07_claims.py").write_text("def plot_curves():\n    pass\n")
    bad = misplaced(tmp_path, {"07"})
    assert bad == ["fusers: not nbNN_<topic> for a notebook NN in notebooks/",
                   "nb07_claims: a claims module draws figures (['plot_curves'])",
                   "nb07_harness: builds a Claim outside a claims module",
                   "nb42_thing: not nbNN_<topic> for a notebook NN in notebooks/"]


def test_a_notebook_imports_its_own_or_earlier_notebooks_experiments():
    for nb in sorted(notebooks_dir().glob("[0-9][0-9]_*.ipynb")):
        mods = notebook_imports(nb) - SHARED
        later = sorted(m for m in mods if NAME.fullmatch(m) is None or m[2:4] > nb.name[:2])
        assert not later, f"{nb.name} imports {later}"
        assert any(m.startswith(f"nb{nb.name[:2]}_") for m in mods), f"{nb.name} uses no module of its own number"
