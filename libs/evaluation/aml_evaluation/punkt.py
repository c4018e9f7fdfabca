"""nltk's punkt_tab sentence model for English, which `nltk.word_tokenize` (and so BLEU-1) needs.

nltk ships its models as data to download, not inside its wheel, and nothing may be downloaded
while a job runs. So a pinned copy is installed once at set-up time by
`python -m aml_runtime.install_punkt` (dev.py runs it, so does the Dockerfile) into
`<sys.prefix>/nltk_data`, a directory on nltk's default search path. The copy is taken from a
wheel on PyPI that carries nltk's punkt_tab data verbatim, so it comes through the package
registry like every other dependency: `llama-index-core` vendors it under `_static/nltk_cache`.
The wheel and every extracted file are pinned by sha256 here.

At run time `require_punkt_tab` checks that the model nltk would load is this exact one, and
fails with the fix in its message otherwise: a missing or different model is never silently
replaced by another tokenizer.
"""

from __future__ import annotations

import functools
import hashlib
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, Final

import nltk  # type: ignore[import-untyped]

SOURCE_REQUIREMENT: Final = "llama-index-core==0.14.25"
SOURCE_WHEEL: Final = "llama_index_core-0.14.25-py3-none-any.whl"
SOURCE_WHEEL_SHA256: Final = "caa7d9c5ac9b13dc33400cf8d5e92e689b6d1e4497eb9bfa50d6f52ca2eb22a1"
# Where the wheel keeps nltk's punkt_tab directory.
SOURCE_PREFIX: Final = "llama_index/core/_static/nltk_cache/tokenizers/punkt_tab/"

# The nltk resource word_tokenize(language="english") loads, and what is installed of it:
# path relative to the punkt_tab directory -> sha256. README says where the model comes from.
RESOURCE: Final = "tokenizers/punkt_tab/english/"
MODEL_FILES: Final[Mapping[str, str]] = {
    "english/abbrev_types.txt": "92a3e070f43d9b4c5534758ca40ad7343b04e7e29bfe0c2eb658a39445a4f779",
    "english/collocations.tab": "8e2da1225e4dd2cc9dba261ee231ccb134859e21b46006e7f472c5ee269af0cf",
    "english/ortho_context.tab": "4bbcca25ed3d3f06c02402abf8419b9f033b8adc06e7b482eca4e45f81a5dc4c",
    "english/sent_starters.txt": "f3f8535483e1dba487241b764945168123bca3209a9645e59acd1225dc76edac",
}
INSTALLED_FILES: Final[Mapping[str, str]] = {
    **MODEL_FILES,
    "README": "d3251cae66a9359bd68c039e3a46172a05ca9df0b27dcdfa23ae594d68d27ec4",
}
INSTALL_COMMAND: Final = "python -m aml_runtime.install_punkt"


class PunktDataError(RuntimeError):
    """The punkt_tab model is not installed, or is not the pinned one."""


def sha256_hex(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _model_id() -> str:
    lines = "".join(f"{name} {digest}\n" for name, digest in sorted(MODEL_FILES.items()))
    return "punkt_tab/english@" + sha256_hex(lines.encode())[:16]


# One name for the exact model, recorded with BLEU-1's version: the sha256 over the sorted
# "<file> <sha256>" lines of the model files.
MODEL_ID: Final = _model_id()


def _read(pointer: Any, name: str) -> bytes:
    """A file of the model directory nltk found: read directly when it is a directory (nltk's
    own opener only admits directories on nltk.data.path, and a check may look elsewhere),
    through nltk's pointer when it is inside a zip."""
    if isinstance(pointer, nltk.data.FileSystemPathPointer):
        return (Path(pointer.path) / name).read_bytes()
    with pointer.join(name).open() as stream:
        return bytes(stream.read())


def locate_punkt_tab(paths: Sequence[str] | None = None) -> str:
    """Where nltk finds the English punkt_tab model (searching `paths`, default nltk's own
    search path, in nltk's order), after checking each model file against its pinned sha256.
    Raises PunktDataError naming the fix when it is missing or differs."""
    try:
        pointer = nltk.data.find(RESOURCE, None if paths is None else list(paths))
    except LookupError:
        searched = nltk.data.path if paths is None else list(paths)
        raise PunktDataError(
            "BLEU-1 tokenises with nltk.word_tokenize, which needs nltk's punkt_tab English "
            f"model; it is not installed (searched: {', '.join(map(str, searched))}). Install "
            f"the pinned copy with `{INSTALL_COMMAND}` (dev.py does this at set-up); nothing is "
            "downloaded at run time."
        ) from None
    for name, expected in MODEL_FILES.items():
        basename = name.split("/", 1)[1]
        try:
            actual = sha256_hex(_read(pointer, basename))
        except OSError as exc:
            raise PunktDataError(
                f"punkt_tab model at {pointer}: {basename} cannot be read ({exc}); reinstall "
                f"the pinned copy with `{INSTALL_COMMAND}`"
            ) from None
        if actual != expected:
            raise PunktDataError(
                f"punkt_tab model at {pointer}: {basename} has sha256 {actual}, the pinned "
                f"model has {expected}. This copy is the first on nltk's search path; remove "
                f"it, or reinstall the pinned one with `{INSTALL_COMMAND}`."
            )
    return str(pointer)


@functools.cache
def require_punkt_tab() -> str:
    """locate_punkt_tab on nltk's own search path, checked once per process (a failure is
    not cached, so installing the model mid-process is picked up)."""
    return locate_punkt_tab()
