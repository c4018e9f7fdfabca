"""The benchmarks (scripts, and the load benchmark's package beside its script), loaded as
modules by the tests that check their pure parts. Importable from tests/unit and
tests/integration alike (`tests/` is on the path through its conftest)."""

from __future__ import annotations

import importlib
import importlib.util
import pkgutil
import sys
from pathlib import Path
from types import ModuleType

BENCHMARKS = Path(__file__).resolve().parents[1] / "benchmarks"
# The load benchmark's parts: the package its entry point, benchmarks/pipeline_load.py, runs.
LOAD_BENCHMARK = BENCHMARKS / "loadbench"


def load_script(name: str, path: Path) -> ModuleType:
    """The script at `path` as a module named `name` (registered, so that the dataclasses it
    defines find their module while they are made); a package's `__init__.py` loads the
    package, its modules then found beside it."""
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


def load_benchmark(name: str) -> ModuleType:
    """The load benchmark (benchmarks/loadbench/) as package `name` holding, besides its
    modules, every name they define, as the single script it was: a test reaches a part as
    `<benchmark>.<part>` whichever module defines it."""
    package = load_script(name, LOAD_BENCHMARK / "__init__.py")
    for found in pkgutil.iter_modules(package.__path__):
        module = importlib.import_module(f"{name}.{found.name}")
        for key, value in vars(module).items():
            if not key.startswith("__"):
                held = vars(package).setdefault(key, value)
                assert held is value, f"{key} is a different thing in two modules of {name}"
    return package
