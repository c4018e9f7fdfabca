"""The modules of `aml_evaluation` import each other one way, read from the source: no import
circle, counting imports inside functions and under `if TYPE_CHECKING:` (the ways a circle is
usually hidden rather than removed), and the dataset read path (`registry`) never needs the
write path (`registration`)."""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = "aml_evaluation"
FOLDER = Path(__file__).resolve().parents[2] / "libs" / "evaluation" / PACKAGE


def module_name(path: Path) -> str:
    parts = path.relative_to(FOLDER.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imported_modules(path: Path, modules: set[str]) -> set[str]:
    """The package's modules that `path` imports anywhere in its source."""
    # A module's own package, for resolving `from . import x` and `from .x import y`.
    package = module_name(path) if path.name == "__init__.py" else module_name(path.parent)
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text("utf-8"))):
        if isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.rsplit(".", node.level - 1)[0]
                source = f"{base}.{node.module}" if node.module else base
            else:
                source = node.module or ""
            found.add(source)
            # `from aml_evaluation import registry` imports the module aml_evaluation.registry.
            found |= {f"{source}.{alias.name}" for alias in node.names}
    return found & modules - {module_name(path)}


def import_graph() -> dict[str, set[str]]:
    """Each module of the package -> the package's modules it imports."""
    # data/ holds the scripts that generate the shipped datasets, not modules of the package.
    paths = [path for path in FOLDER.rglob("*.py") if "data" not in path.relative_to(FOLDER).parts]
    modules = {module_name(path) for path in paths}
    return {module_name(path): imported_modules(path, modules) for path in paths}


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One import circle of the graph, as the modules along it (first repeated last), or None."""
    done: set[str] = set()
    path: list[str] = []

    def visit(module: str) -> list[str] | None:
        if module in path:
            return [*path[path.index(module) :], module]
        if module in done:
            return None
        path.append(module)
        for imported in sorted(graph[module]):
            if (cycle := visit(imported)) is not None:
                return cycle
        path.pop()
        done.add(module)
        return None

    for module in sorted(graph):
        if (cycle := visit(module)) is not None:
            return cycle
    return None


def test_the_cycle_finder_finds_a_circle() -> None:
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
    assert find_cycle(graph) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b"}, "b": set(), "c": {"a", "b"}}) is None


def test_the_graph_sees_the_dataset_modules() -> None:
    graph = import_graph()
    assert {"aml_evaluation.datasets", "aml_evaluation.chunker"} <= graph["aml_evaluation.registry"]
    assert "aml_evaluation.datasets" in graph["aml_evaluation.chunker"]


def test_aml_evaluation_has_no_import_circle() -> None:
    cycle = find_cycle(import_graph())
    assert cycle is None, f"aml_evaluation modules import each other in a circle: {cycle}"


def test_the_read_path_never_imports_the_write_path() -> None:
    graph = import_graph()
    assert "aml_evaluation.registry" in graph["aml_evaluation.registration"]
    assert "aml_evaluation.registration" not in graph["aml_evaluation.registry"]
