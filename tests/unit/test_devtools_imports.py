"""The modules of `aml_devtools` import each other without a circle, read from the source: a
circle only works by the order modules happen to load in, and is usually dodged with an import
hidden in a function, which this check sees too (every import statement counts, wherever it
stands)."""

from __future__ import annotations

import ast
from graphlib import CycleError, TopologicalSorter
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = "aml_devtools"
FOLDER = ROOT / "libs" / "devtools" / PACKAGE


def module_names(folder: Path, package: str) -> dict[str, Path]:
    """Dotted module name -> file, a package by its `__init__.py`."""
    names: dict[str, Path] = {}
    for path in folder.rglob("*.py"):
        parts = path.relative_to(folder).with_suffix("").parts
        if parts[-1] == "__init__":
            parts = parts[:-1]
        names[".".join((package, *parts))] = path
    return names


def imported_modules(module: str, path: Path, known: dict[str, Path]) -> set[str]:
    """The known modules `module` imports: `from a import b` names the module `a.b` when there
    is one, else `a`; `import a.b.c` the longest known prefix."""
    # The package a relative import starts from: a package's own, or the module's parent.
    here = module if path.name == "__init__.py" else module.rpartition(".")[0]
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text("utf-8"))):
        if isinstance(node, ast.Import):
            for alias in node.names:
                parts = alias.name.split(".")
                prefixes = [".".join(parts[:n]) for n in range(len(parts), 0, -1)]
                found.update([prefix for prefix in prefixes if prefix in known][:1])
        elif isinstance(node, ast.ImportFrom):
            source = node.module or ""
            if node.level:
                base = here.rsplit(".", node.level - 1)[0]
                source = f"{base}.{source}" if source else base
            for alias in node.names:
                submodule = f"{source}.{alias.name}"
                found.add(submodule if submodule in known else source)
    return {name for name in found if name in known and name != module}


def import_graph(folder: Path, package: str) -> dict[str, set[str]]:
    known = module_names(folder, package)
    return {module: imported_modules(module, path, known) for module, path in known.items()}


def test_the_graph_sees_the_imports() -> None:
    """The reading itself: without it a graph of no edges would pass as free of circles."""
    graph = import_graph(FOLDER, PACKAGE)
    assert "aml_devtools.team_cli" in graph["aml_devtools.cli"]
    assert "aml_devtools.conformance" in graph["aml_devtools.cli"]
    assert "aml_devtools.tables" in graph["aml_devtools.team_cli"]


def test_a_circle_is_found(tmp_path: Path) -> None:
    (tmp_path / "__init__.py").write_text("")
    (tmp_path / "a.py").write_text("from pkg import b\n")
    (tmp_path / "b.py").write_text("def f():\n    from .a import x\n")
    with pytest.raises(CycleError):
        TopologicalSorter(import_graph(tmp_path, "pkg")).prepare()


def test_aml_devtools_has_no_import_circle() -> None:
    try:
        TopologicalSorter(import_graph(FOLDER, PACKAGE)).prepare()
    except CycleError as error:
        pytest.fail(f"aml_devtools imports in a circle: {' -> '.join(error.args[1])}")
