"""The libraries' layering, read from the source: wire formats and evaluation logic at the
bottom, service plumbing (`aml_runtime`) on them, pipeline logic (`aml_pipeline`) on the
plumbing, services on top. A lower layer never imports a higher one, and no service imports
another service."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SERVICES = ("gateway", "scheduler", "adder", "searcher", "answerer", "scorer", "publisher")
# What each package may not import.
FORBIDDEN = {
    "aml_contract": {"aml_evaluation", "aml_runtime", "aml_pipeline", "aml_devtools"},
    "aml_evaluation": {"aml_runtime", "aml_pipeline", "aml_devtools"},
    "aml_runtime": {"aml_pipeline", "aml_devtools"},
    "aml_pipeline": {"aml_devtools"},
}
FOLDERS = {
    "aml_contract": ROOT / "libs" / "contract",
    "aml_evaluation": ROOT / "libs" / "evaluation",
    "aml_runtime": ROOT / "libs" / "runtime",
    "aml_pipeline": ROOT / "libs" / "pipeline",
}
SERVICE_PACKAGES = {f"aml_{name}" for name in SERVICES}


def imported_packages(path: Path) -> set[str]:
    tree = ast.parse(path.read_text("utf-8"))
    found: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found |= {alias.name.split(".")[0] for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.add(node.module.split(".")[0])
    return found


@pytest.mark.parametrize("package", sorted(FORBIDDEN))
def test_a_library_never_imports_a_higher_layer(package: str) -> None:
    above = FORBIDDEN[package] | SERVICE_PACKAGES
    offending = {
        str(path.relative_to(ROOT)): sorted(imported_packages(path) & above)
        for path in FOLDERS[package].rglob("*.py")
        if imported_packages(path) & above
    }
    assert not offending, f"{package} imports a higher layer: {offending}"
    assert list(FOLDERS[package].rglob("*.py")), f"no sources found for {package}"


@pytest.mark.parametrize("service", SERVICES)
def test_no_service_imports_another(service: str) -> None:
    others = SERVICE_PACKAGES - {f"aml_{service}"}
    folder = ROOT / "services" / service
    offending = {
        str(path.relative_to(ROOT)): sorted(imported_packages(path) & others)
        for path in folder.rglob("*.py")
        if imported_packages(path) & others
    }
    assert not offending, f"aml_{service} imports another service: {offending}"
