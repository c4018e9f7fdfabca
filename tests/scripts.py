"""Scripts that are not packages (the benchmarks), loaded as modules by the tests that check
their pure parts. Importable from tests/unit and tests/integration alike (`tests/` is on the
path through its conftest)."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

BENCHMARKS = Path(__file__).resolve().parents[1] / "benchmarks"


def load_script(name: str, path: Path) -> ModuleType:
    """The script at `path` as a module named `name` (registered, so that the dataclasses it
    defines find their module while they are made)."""
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


def load_benchmark(name: str) -> ModuleType:
    """benchmarks/pipeline_load.py, as module `name`."""
    return load_script(name, BENCHMARKS / "pipeline_load.py")
