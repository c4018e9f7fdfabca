from __future__ import annotations

import os
from pathlib import Path

import pytest


@pytest.fixture(scope="session")
def datasets_root() -> Path:
    """The shared benchmark data (licensed, never committed): $AML_DATASETS_ROOT, else the
    `shared/datasets` folder beside the repository."""
    default = Path(__file__).resolve().parents[1].parent / "shared" / "datasets"
    root = Path(os.environ.get("AML_DATASETS_ROOT", str(default)))
    if not root.is_dir():
        pytest.skip(f"benchmark datasets not found at {root} (set AML_DATASETS_ROOT)")
    return root
