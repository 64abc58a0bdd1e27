"""Packaging in sync (pyproject, environment.yml), notebooks committed valid and without outputs, CI = README."""
from __future__ import annotations

import json
import re
import tomllib

from fusionlab.paths import repo_root

ROOT = repo_root()


def _names(reqs):
    return {re.split(r"[<>=!\[ ]", r.strip(), 1)[0].lower(): r.replace(" ", "") for r in reqs}


def test_environment_yml_matches_pyproject():
    import yaml

    py = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    want = _names(py["dependencies"] + py["optional-dependencies"]["notebooks"] + py["optional-dependencies"]["dev"])
    env = yaml.safe_load((ROOT / "environment.yml").read_text())
    pip = next(d["pip"] for d in env["dependencies"] if isinstance(d, dict))
    got = _names([p for p in pip if not p.startswith("-e")])
    assert got == want


def test_notebooks_are_valid_and_have_no_outputs():
    import nbformat

    nbs = sorted((ROOT / "notebooks").glob("*.ipynb"))
    assert nbs
    for nb in nbs:
        data = json.loads(nb.read_text())
        assert all("id" in cell for cell in data["cells"]), f"{nb.name}: a cell lacks an id (nbformat 4.5)"
        nbformat.validate(nbformat.from_dict(data))
        for cell in data["cells"]:
            if cell["cell_type"] == "code":
                assert cell.get("outputs") == [] and cell.get("execution_count") is None, nb.name


def test_ci_runs_exactly_the_readme_test_command():
    readme = (ROOT / "README.md").read_text()
    ci = (ROOT / ".ci" / "run").read_text()
    assert "python3 fusionlab/bootstrap.py test" in readme and "python3 fusionlab/bootstrap.py lab" in readme
    assert "exec python3 fusionlab/bootstrap.py test" in ci


def test_readme_layout_map_names_every_module():
    """Each module appears in its folder's row of the README's Layout table (the map matches the tree)."""
    text = (ROOT / "README.md").read_text()
    rows = [line for line in text[text.index("## Layout"):].splitlines() if line.startswith("| `fusionlab/")]
    for path in sorted((ROOT / "fusionlab").rglob("*.py")):
        rel = path.relative_to(ROOT / "fusionlab")
        if path.stem in ("__init__", "__main__") or "_data" in rel.parts:
            continue
        label = f"`fusionlab/{rel.parts[0]}/`" if len(rel.parts) > 1 else "`fusionlab/` (top level)"
        row = next(r for r in rows if r.split("|")[1].strip() == label)
        assert f"`{path.stem}" in row, f"README Layout: the {label} row does not name {rel}"
