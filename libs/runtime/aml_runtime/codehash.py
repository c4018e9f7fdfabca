"""The pipeline code hash (SPEC R-6.4): one sha256 over the source files of every package that
takes part in evaluating a job, so a published number names the exact code behind it."""

from __future__ import annotations

import hashlib
import os
from importlib.util import find_spec
from pathlib import Path

# The gateway and the tools are left out: they do not touch what is evaluated or how.
PIPELINE_PACKAGES = (
    "aml_contract",
    "aml_evaluation",
    "aml_runtime",
    "aml_pipeline",
    "aml_scheduler",
    "aml_adder",
    "aml_searcher",
    "aml_answerer",
    "aml_scorer",
)
CODE_HASH_OVERRIDE = "AML_CODE_HASH_OVERRIDE"
_SOURCE_SUFFIXES = frozenset({".py", ".txt", ".json"})


def package_files(name: str) -> list[tuple[str, Path]]:
    """(name-relative posix path, file) of a package's source files, sorted by path."""
    spec = find_spec(name)
    if spec is None or not spec.submodule_search_locations:
        raise LookupError(f"package {name} is not installed")
    root = Path(next(iter(spec.submodule_search_locations)))
    found = [
        (f"{name}/{path.relative_to(root).as_posix()}", path)
        for path in root.rglob("*")
        if path.is_file() and path.suffix in _SOURCE_SUFFIXES and "__pycache__" not in path.parts
    ]
    return sorted(found)


def code_hash(packages: tuple[str, ...] = PIPELINE_PACKAGES) -> str:
    """sha256 over (relative path, sha256 of bytes) of every source file, in path order: the
    same files give the same hash wherever the packages are installed.

    `AML_CODE_HASH_OVERRIDE`, when set, is the pipeline's hash instead: a test and operator
    hook that makes one process present itself as another build (a rolling upgrade replayed on
    one machine, tests/integration/test_rolling_upgrade.py). A deployment never sets it: a
    published number would then name code it did not run."""
    override = os.environ.get(CODE_HASH_OVERRIDE, "").strip()
    if override and packages == PIPELINE_PACKAGES:
        return override
    digest = hashlib.sha256()
    for name in packages:
        for relative, path in package_files(name):
            digest.update(relative.encode("utf-8") + b"\0")
            digest.update(hashlib.sha256(path.read_bytes()).digest())
    return digest.hexdigest()
