"""Every `module.name` a notebook's code reads exists in that module: a renamed or moved function fails here in a
second, not an hour into a lab run (notebook 06 once called `offload.plan` after it had been dropped)."""
from __future__ import annotations

import ast
import importlib
import json

import pytest

from fusionlab.lab.runner import notebook_paths


def module_aliases(tree: ast.AST) -> dict[str, str]:
    """alias -> module path for `import fusionlab as fl` and `from fusionlab.x import y as z` (when y is a module)."""
    out = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for a in node.names:
                if a.name.startswith("fusionlab"):
                    out[a.asname or a.name] = a.name
        elif isinstance(node, ast.ImportFrom) and (node.module or "").startswith("fusionlab"):
            for a in node.names:
                full = f"{node.module}.{a.name}"
                try:
                    importlib.import_module(full)
                except ModuleNotFoundError:
                    continue  # a name, not a module: checked by the import itself
                out[a.asname or a.name] = full
    return out


def attribute_reads(tree: ast.AST, aliases: dict[str, str]) -> set[tuple[str, str]]:
    return {(node.value.id, node.attr) for node in ast.walk(tree)
            if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id in aliases}


@pytest.mark.parametrize("path", notebook_paths(), ids=lambda p: p.name)
def test_notebook_reads_only_names_that_exist(path):
    cells = json.loads(path.read_text(encoding="utf-8"))["cells"]
    code = "\n".join("".join(c["source"]) for c in cells if c["cell_type"] == "code")
    tree = ast.parse("\n".join(line for line in code.splitlines() if not line.lstrip().startswith(("%", "!"))))
    aliases = module_aliases(tree)
    missing = [f"{a}.{name}" for a, name in sorted(attribute_reads(tree, aliases))
               if not hasattr(importlib.import_module(aliases[a]), name)]
    assert not missing, f"{path.name} reads names its modules do not define: {missing}"
