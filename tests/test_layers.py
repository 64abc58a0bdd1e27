"""The package's layers import in one direction only (README, "Layout"): read from the source, every import.

foundation (errors, paths, files, cells, runsize, _version) < engine < models < experiments < lab, with
analysis beside models (it may import the engine, nothing else above the foundation) and training beside them too
(learned fusers: it may import the engine; the engine knows nothing about it).
"""
from __future__ import annotations

import ast
import sys
from pathlib import Path

import pytest

import fusionlab

PACKAGE = Path(fusionlab.__file__).parent
FOUNDATION = {"errors", "paths", "files", "cells", "runsize", "_version"}
ALLOWED = {
    "foundation": {"foundation"},
    "engine": {"foundation", "engine"},
    "models": {"foundation", "engine", "models"},
    "analysis": {"foundation", "engine", "analysis"},
    "training": {"foundation", "engine", "training"},
    "experiments": {"foundation", "engine", "models", "analysis", "training", "experiments"},
    "lab": {"foundation", "engine", "models", "analysis", "training", "experiments", "lab"},
}
FACADES = {"__init__", "__main__", "bootstrap"}
"""The package facade may import anything; bootstrap.py runs as a plain file and may import nothing of ours."""


def layer_of(parts: list[str]) -> str | None:
    """['engine', 'fuse'] -> 'engine'; ['paths'] -> 'foundation'; the facade (`from fusionlab import x`) -> None."""
    if not parts:
        return None
    return "foundation" if parts[0] in FOUNDATION else parts[0] if parts[0] in ALLOWED else None


def modules() -> list[Path]:
    return sorted(p for p in PACKAGE.rglob("*.py") if "_data" not in p.parts)


def imported(path: Path) -> list[list[str]]:
    """Every fusionlab module `path` imports (at any depth in the file), as parts below `fusionlab`."""
    package = list(path.relative_to(PACKAGE).parts[:-1])  # the folder: [] for foundation, ['engine'], ...
    out = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            out += [n.name.split(".")[1:] for n in node.names if n.name.split(".")[0] == "fusionlab"]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package[: len(package) - (node.level - 1)]
                if node.module is None:  # `from . import x`: each x is a module of that package
                    out += [base + [a.name] for a in node.names]
                else:
                    out.append(base + node.module.split("."))
            elif node.module and node.module.split(".")[0] == "fusionlab":
                out.append(node.module.split(".")[1:])  # `from fusionlab import x` -> [] (the facade)
    return out


def test_every_module_belongs_to_a_layer():
    for path in modules():
        parts = list(path.relative_to(PACKAGE).with_suffix("").parts)
        assert parts[0] in FACADES or layer_of(parts) is not None, f"{path.name}: in no layer; add it to one"


@pytest.mark.parametrize("path", modules(), ids=lambda p: str(p.relative_to(PACKAGE)))
def test_imports_run_one_way(path):
    parts = list(path.relative_to(PACKAGE).with_suffix("").parts)
    if parts[0] in FACADES:
        if parts[0] == "bootstrap":
            assert not imported(path), "bootstrap.py must run with the standard library alone"
        return
    mine = layer_of(parts)
    for target in imported(path):
        theirs = layer_of(target)
        where = ".".join(target) or "fusionlab (the facade)"
        assert theirs in ALLOWED[mine], f"{'.'.join(parts)} ({mine}) imports {where} ({theirs})"


def test_the_checker_catches_a_wrong_way_import(tmp_path, monkeypatch):
    """Mutation check: an engine module importing the lab must be reported."""
    fake = tmp_path / "fusionlab"
    (fake / "engine").mkdir(parents=True)
    bad = fake / "engine" / "bad.py"
    bad.write_text("from ..lab.results import save_table\nfrom ..errors import FusionLabError\n")
    monkeypatch.setattr(sys.modules[__name__], "PACKAGE", fake)
    assert imported(bad) == [["lab", "results"], ["errors"]]
    assert layer_of(["lab", "results"]) not in ALLOWED["engine"]


def module_name(path: Path) -> str:
    """fusionlab/engine/fuse.py -> 'engine.fuse'; a package's __init__ -> the package ('engine'; '' for the facade)."""
    parts = list(path.relative_to(PACKAGE).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def import_graph(paths: list[Path]) -> dict[str, set[str]]:
    """Module -> the fusionlab modules it imports anywhere in the file (inside functions and TYPE_CHECKING blocks
    too: a circle hidden in a function is still a circle). `from .x import name` counts `x.name` when that is a
    module of ours, else `x`."""
    known = {module_name(p) for p in paths}
    graph: dict[str, set[str]] = {}
    for path in paths:
        tree = ast.parse(path.read_text(encoding="utf-8"))
        package = list(path.relative_to(PACKAGE).parts[:-1])
        targets: list[list[str]] = []
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                targets += [n.name.split(".")[1:] for n in node.names if n.name.split(".")[0] == "fusionlab"]
            elif isinstance(node, ast.ImportFrom):
                if node.level:
                    base = package[: len(package) - (node.level - 1)] + (node.module.split(".") if node.module else [])
                elif node.module and node.module.split(".")[0] == "fusionlab":
                    base = node.module.split(".")[1:]
                else:
                    continue
                targets += [base + [a.name] for a in node.names]
        edges = set()
        for t in targets:  # the longest prefix that names one of our modules
            hit = next((".".join(t[:k]) for k in range(len(t), 0, -1) if ".".join(t[:k]) in known), None)
            if hit:
                edges.add(hit)
        me = module_name(path)
        graph[me] = edges - {me, ""}
    return graph


def circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in graph.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                found.append(sorted(comp))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def test_no_import_circles_anywhere():
    """Not even one hidden inside a function: each module can be read after the ones it imports."""
    graph = import_graph([p for p in modules() if module_name(p) != ""])
    assert circles(graph) == [], f"import circles: {circles(graph)}"


def test_the_circle_checker_catches_a_circle_inside_a_function(tmp_path, monkeypatch):
    """Mutation check: a circle closed by an import inside a function body must be reported."""
    fake = tmp_path / "fusionlab"
    (fake / "engine").mkdir(parents=True)
    (fake / "engine" / "a.py").write_text("from .b import thing\n")
    (fake / "engine" / "b.py").write_text("def thing():\n    from . import a\n    return a\n")
    (fake / "engine" / "c.py").write_text("from .a import thing\n")
    monkeypatch.setattr(sys.modules[__name__], "PACKAGE", fake)
    graph = import_graph(sorted(fake.rglob("*.py")))
    assert graph["engine.b"] == {"engine.a"}
    assert circles(graph) == [["engine.a", "engine.b"]]


LAZY_OWN_IMPORTS = {
    "lab/cli.py": "each subcommand loads only what it needs, so `fusionlab --help` starts without torch",
    "experiments/nb00_ttft.py": "only the child process that times a cold start loads the engine",
}
"""Files allowed to import our own modules inside a function, and why. Anywhere else the import goes at the top."""


def outermost_functions(body: list[ast.stmt]) -> list[ast.FunctionDef | ast.AsyncFunctionDef]:
    """Functions at module level and in class bodies (at any depth); a nested function is inside its outer one."""
    found = []
    for node in body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            found.append(node)
        elif isinstance(node, ast.ClassDef):
            found += outermost_functions(node.body)
    return found


def imports_inside_functions(path: Path) -> list[str]:
    """`func: line N` for each import of a fusionlab module inside a function body of `path`, each once."""
    found = []
    for fn in outermost_functions(ast.parse(path.read_text(encoding="utf-8")).body):
        for node in ast.walk(fn):
            own = (isinstance(node, ast.ImportFrom) and (node.level or (node.module or "").split(".")[0] == "fusionlab")
                   or isinstance(node, ast.Import) and any(a.name.split(".")[0] == "fusionlab" for a in node.names))
            if own:
                found.append(f"{fn.name}: line {node.lineno}")
    return found


@pytest.mark.parametrize("path", modules(), ids=lambda p: str(p.relative_to(PACKAGE)))
def test_own_modules_are_imported_at_the_top(path):
    """An import inside a function hides a dependency from a reader (and once hid circles); only stated reasons."""
    where = path.relative_to(PACKAGE)
    if str(where) in LAZY_OWN_IMPORTS or where.with_suffix("").parts[0] in FACADES:
        return
    assert imports_inside_functions(path) == [], f"{where}: move these imports to the top"


def test_the_lazy_import_checker_catches_one(tmp_path):
    (tmp_path / "m.py").write_text("import os\n\ndef f():\n    if os:\n        from .engine import fuse\n\n"
                                   "class C:\n    def g(self):\n        def inner():\n            import fusionlab.lab\n")
    assert imports_inside_functions(tmp_path / "m.py") == ["f: line 5", "g: line 10"]
