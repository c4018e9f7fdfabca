"""Dataset bundles and the registry of datasets: shipped and operator-registered.

**Bundles.** A dataset bundle is a JSON manifest (:class:`DatasetManifest`) listing data files with
their sha256. :func:`load_bundle` refuses to load a file whose bytes differ from the manifest, then
hands the verified bytes to the parser of the manifest's ``format`` (:func:`parser_of`), and
:func:`bundle_hash` fingerprints the manifest itself (and so, through the listed hashes, the data).

**Parsers.** Every format has one function ``parse(contents, manifest) -> Dataset`` where
``contents`` is ``(relative path, verified bytes)`` per manifest file, in manifest order: "locomo"
is :func:`aml_evaluation.datasets.parse_locomo_bundle`, "longmemeval" and "personamem" are
``aml_evaluation.longmemeval.parse`` and ``aml_evaluation.personamem.parse``, imported only when a
bundle of that format is read. A parser raises ``ValueError`` naming what is wrong. When
``aml dataset add`` checks a new file, the parser gets a draft manifest whose ``categories`` is
empty: it returns the categories its format defines, and those become the manifest's.

**Where manifests live.** Shipped manifests are package data (``data/manifests/<id>.json``).
Operator manifests are written by ``aml dataset add`` to ``<datasets root>/manifests/<id>.json``:
the datasets root (``AML_DATASETS_ROOT``) is the one directory every service that reads datasets
already mounts, the data files sit beside it, and the package directory is read-only in an
image. A dataset id is looked up in the package first, so an operator manifest can never shadow a
shipped dataset (``add`` refuses a shipped id). Benchmark files that may not be redistributed are
never shipped: their manifest pins them by sha256, and the operator places the files.

**The canonical hash.** :func:`canonical_manifest_json` leaves out a field added after the first
manifests (``track``, ``question_counts``) while it holds its default, so the bundle hash of a
manifest written before those fields existed, which jobs record, does not change.
"""

from __future__ import annotations

import hashlib
import importlib
import json
import os
import re
import tempfile
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Any, Final, Literal, get_args

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from aml_contract.api.vocabulary import Track
from aml_evaluation.datasets import (
    DEFAULT_F1_VARIANT,
    DEFAULT_SCORER,
    LOCOMO_ADVERSARIAL_CATEGORY,
    Dataset,
)

PACKAGE_DATA_DIR: Final = Path(__file__).resolve().parent / "data"
MANIFESTS_DIR: Final = PACKAGE_DATA_DIR / "manifests"
# Operator manifests: <datasets root>/OPERATOR_MANIFESTS/<id>.json (see the module docstring).
OPERATOR_MANIFESTS: Final = "manifests"

Format = Literal["locomo", "longmemeval", "personamem", "mem-gallery"]
FORMATS: Final[tuple[str, ...]] = get_args(Format)
Source = Literal["shipped", "operator"]

# The scorer a dataset of the format declares unless the operator names another.
DEFAULT_SCORER_OF_FORMAT: Final[dict[str, str]] = {
    "locomo": DEFAULT_SCORER,
    "longmemeval": DEFAULT_SCORER,
    "personamem": "multiple_choice",
    # Mem-Gallery scores with token F1 alone (the scorer does not yet tell it apart: see
    # docs/architecture.md "Not yet").
    "mem-gallery": "token_f1",
}
# Categories reported apart, not counted in Overall, unless the operator names others.
DEFAULT_EXCLUDED_OF_FORMAT: Final[dict[str, list[int]]] = {
    "locomo": [LOCOMO_ADVERSARIAL_CATEGORY],
    "longmemeval": [],
    "personamem": [],
    "mem-gallery": [],
}
# Format -> (module, function) of its parser, imported when first needed.
_PARSERS: Final[dict[str, tuple[str, str]]] = {
    "locomo": ("aml_evaluation.datasets", "parse_locomo_bundle"),
    "longmemeval": ("aml_evaluation.longmemeval", "parse"),
    "personamem": ("aml_evaluation.personamem", "parse"),
    "mem-gallery": ("aml_evaluation.memgallery", "parse"),
}
# Fields added after the first manifests, with the default a manifest without them means; left
# out of the canonical JSON while they hold it (bundle hashes of old manifests stay the same).
_ADDED_FIELD_DEFAULTS: Final[dict[str, object]] = {"track": "textual", "question_counts": None}
_DATASET_ID = re.compile(r"[a-z0-9][a-z0-9_.-]*")


class _Frozen(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class ManifestFile(_Frozen):
    path: str = Field(description="relative to the bundle root, POSIX separators")
    sha256: str = Field(pattern=r"^[0-9a-f]{64}$")

    @field_validator("path")
    @classmethod
    def _inside_the_root(cls, value: str) -> str:
        parts = PurePosixPath(value).parts
        if not parts or value.startswith("/") or "\\" in value or ".." in parts:
            raise ValueError(f"a bundle file path is relative, without '..': {value!r}")
        return value


class DatasetManifest(_Frozen):
    dataset_id: str
    version: str
    format: Format
    track: Track = "textual"
    scorer: str
    # Which token-F1 the dataset is scored with (aml_evaluation.scoring.F1_VARIANTS); results
    # name it, since harnesses in the field differ here.
    f1_variant: str = DEFAULT_F1_VARIANT
    categories: dict[int, str]
    excluded_from_overall: list[int] = Field(default_factory=list)
    # Questions per category, as `aml dataset add` counted them (absent in older manifests:
    # counting then needs the files).
    question_counts: dict[int, int] | None = None
    # Where `files` are resolved by load_dataset: inside this package, or under the operator's
    # datasets root (licensed data that the repository must not carry).
    location: Literal["package", "datasets_root"] = "datasets_root"
    files: list[ManifestFile] = Field(min_length=1)


BundleParser = Callable[[Sequence[tuple[str, bytes]], DatasetManifest], Dataset]


class DatasetFileError(ValueError):
    """A bundle file is missing, its bytes differ from the manifest, or it cannot be parsed."""


class FormatUnavailableError(DatasetFileError):
    """No parser of the manifest's format is installed."""


class RegistrationError(ValueError):
    """`aml dataset add` refused a dataset; nothing was written."""


@dataclass(frozen=True)
class RegisteredManifest:
    """A manifest of the registry and where it came from."""

    manifest: DatasetManifest
    path: Path
    source: Source

    @property
    def dataset_id(self) -> str:
        return self.manifest.dataset_id


# --- bundles --------------------------------------------------------------------------------


def read_manifest(path: Path) -> DatasetManifest:
    return DatasetManifest.model_validate_json(path.read_bytes())


def canonical_manifest_json(manifest: DatasetManifest) -> bytes:
    payload = manifest.model_dump(mode="json")
    for name, default in _ADDED_FIELD_DEFAULTS.items():
        if payload[name] == default:
            del payload[name]
    return json.dumps(payload, sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode(
        "utf-8"
    )


def bundle_hash(manifest: DatasetManifest) -> str:
    """sha256 of the canonical manifest; the data files enter through their listed hashes."""
    return hashlib.sha256(canonical_manifest_json(manifest)).hexdigest()


def read_verified(root: Path, entry: ManifestFile) -> bytes:
    """The file's bytes, hashed and parsed from the same read so nothing can swap in between."""
    path = root / entry.path
    try:
        content = path.read_bytes()
    except OSError as error:
        raise DatasetFileError(
            f"dataset file {entry.path!r} cannot be read at {path}: {error.strerror}"
        ) from None
    actual = hashlib.sha256(content).hexdigest()
    if actual != entry.sha256:
        raise DatasetFileError(
            f"dataset file {entry.path!r} at {path} has sha256 {actual}, "
            f"manifest expects {entry.sha256}"
        )
    return content


def parser_of(format_name: str) -> BundleParser:
    """The parser of a bundle format, imported now; FormatUnavailableError if it is missing."""
    if format_name not in _PARSERS:
        raise FormatUnavailableError(
            f"format {format_name!r} is not available; known: {', '.join(FORMATS)}"
        )
    module_name, function_name = _PARSERS[format_name]
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as error:
        if error.name != module_name:
            raise
        raise FormatUnavailableError(
            f"format {format_name!r} is not available (no module {module_name})"
        ) from None
    parser = getattr(module, function_name, None)
    if not callable(parser):
        raise FormatUnavailableError(
            f"format {format_name!r} is not available (no {module_name}.{function_name})"
        )
    parse: BundleParser = parser
    return parse


def parse_contents(contents: Sequence[tuple[str, bytes]], manifest: DatasetManifest) -> Dataset:
    """Parse verified contents with the manifest format's parser; a parser's refusal becomes a
    DatasetFileError naming the dataset and the format."""
    parse = parser_of(manifest.format)
    try:
        return parse(contents, manifest)
    except DatasetFileError:
        raise
    except ValueError as error:
        raise DatasetFileError(
            f"dataset {manifest.dataset_id!r} ({manifest.format}): {error}"
        ) from None


def bundle_root(manifest: DatasetManifest, datasets_root: Path) -> Path:
    """Where the manifest's files are: the package's data dir or the datasets root."""
    return PACKAGE_DATA_DIR if manifest.location == "package" else datasets_root


def load_manifest_bundle(manifest: DatasetManifest, root: Path) -> Dataset:
    """Verify every file the manifest lists under `root`, then parse them by its format."""
    contents = [(entry.path, read_verified(root, entry)) for entry in manifest.files]
    return parse_contents(contents, manifest)


def load_bundle(manifest_path: Path, root: Path | None = None) -> Dataset:
    """Verify every listed file, then load the bundle; ``root`` defaults to the manifest's dir."""
    manifest = read_manifest(manifest_path)
    base = manifest_path.resolve().parent if root is None else root
    return load_manifest_bundle(manifest, base)


def count_questions(dataset: Dataset) -> dict[int, int]:
    """Questions per category of the dataset, every category listed (0 for none)."""
    found = Counter(question.category for question in dataset.questions)
    return {number: found.get(number, 0) for number in sorted({*dataset.categories, *found})}


# --- the registry ---------------------------------------------------------------------------


def operator_manifests_dir(datasets_root: Path) -> Path:
    return datasets_root / OPERATOR_MANIFESTS


def _check_id(dataset_id: str) -> None:
    # The id becomes a file name: refuse anything that could step out of the manifests dir.
    if _DATASET_ID.fullmatch(dataset_id) is None:
        raise KeyError(f"invalid dataset id {dataset_id!r}")


def manifest_path(dataset_id: str, datasets_root: Path | None) -> Path:
    """The manifest of a dataset id: shipped first, then the operator's under `datasets_root`
    (None: shipped datasets only). KeyError names the known ids."""
    _check_id(dataset_id)
    candidates = [MANIFESTS_DIR / f"{dataset_id}.json"]
    if datasets_root is not None:
        candidates.append(operator_manifests_dir(datasets_root) / f"{dataset_id}.json")
    for path in candidates:
        if path.is_file():
            return path
    known = known_ids(datasets_root)
    raise KeyError(f"unknown dataset {dataset_id!r}; known: {', '.join(known)}")


def _manifest_files(directory: Path) -> list[Path]:
    if not directory.is_dir():
        return []
    return sorted(
        path
        for path in directory.glob("*.json")
        if path.is_file() and _DATASET_ID.fullmatch(path.stem) is not None
    )


def known_ids(datasets_root: Path | None) -> list[str]:
    """Every dataset id a manifest file names, shipped and operator (sorted, by file name)."""
    ids = {path.stem for path in _manifest_files(MANIFESTS_DIR)}
    if datasets_root is not None:
        ids |= {path.stem for path in _manifest_files(operator_manifests_dir(datasets_root))}
    return sorted(ids)


def _read_registered(path: Path, source: Source) -> RegisteredManifest:
    manifest = read_manifest(path)
    if manifest.dataset_id != path.stem:
        raise ValueError(f"{path}: names dataset {manifest.dataset_id!r}, not {path.stem!r}")
    if source == "operator" and manifest.location != "datasets_root":
        raise ValueError(f"{path}: an operator manifest lists files under the datasets root")
    return RegisteredManifest(manifest=manifest, path=path, source=source)


def registered(dataset_id: str, datasets_root: Path | None) -> RegisteredManifest:
    """The manifest of a dataset id and where it came from (see manifest_path)."""
    path = manifest_path(dataset_id, datasets_root)
    source: Source = "shipped" if path.parent == MANIFESTS_DIR else "operator"
    return _read_registered(path, source)


def list_manifests(datasets_root: Path | None) -> list[RegisteredManifest]:
    """Every readable manifest, shipped then operator-registered, each sorted by id. An operator
    file with a shipped id is shadowed and left out; unreadable ones are left out here and named
    by unreadable_manifests."""
    found = [_read_registered(path, "shipped") for path in _manifest_files(MANIFESTS_DIR)]
    if datasets_root is not None:
        shipped = {item.dataset_id for item in found}
        for path in _manifest_files(operator_manifests_dir(datasets_root)):
            if path.stem in shipped:
                continue
            try:
                found.append(_read_registered(path, "operator"))
            except (OSError, ValueError):
                continue
    return found


def unreadable_manifests(datasets_root: Path) -> dict[Path, str]:
    """Operator manifest files list_manifests leaves out, with the reason."""
    problems: dict[Path, str] = {}
    for path in _manifest_files(operator_manifests_dir(datasets_root)):
        try:
            _read_registered(path, "operator")
        except (OSError, ValueError) as error:
            problems[path] = str(error).splitlines()[0] if str(error) else type(error).__name__
    return problems


def open_dataset(dataset_id: str, datasets_root: Path) -> tuple[DatasetManifest, Dataset]:
    """A dataset and the manifest it was loaded from (one read, so the bundle hash a job records
    is the manifest's that was loaded); package-located files ignore ``datasets_root``."""
    manifest = registered(dataset_id, datasets_root).manifest
    return manifest, load_manifest_bundle(manifest, bundle_root(manifest, datasets_root))


def load_dataset(dataset_id: str, datasets_root: Path) -> Dataset:
    """Load a registered bundle (shipped or operator); package-located files ignore
    ``datasets_root``."""
    return open_dataset(dataset_id, datasets_root)[1]


# --- registering an operator dataset (`aml dataset add`) --------------------------------------


@dataclass(frozen=True)
class Registration:
    manifest: DatasetManifest
    path: Path
    # "added", "replaced", or "unchanged" (the same manifest was already registered).
    outcome: Literal["added", "replaced", "unchanged"]


def _inside(path: Path, datasets_root: Path) -> str:
    """`path` relative to the datasets root (POSIX), after resolving symlinks and '..'."""
    root = datasets_root.resolve()
    if not root.is_dir():
        raise RegistrationError(f"the datasets root {datasets_root} is not a directory")
    target = path.resolve()
    if not target.is_relative_to(root) or target == root:
        raise RegistrationError(
            f"{path} is not inside the datasets root {root} (resolved: {target}); place the "
            "file under the datasets root first"
        )
    relative = target.relative_to(root)
    if relative.parts[0] == OPERATOR_MANIFESTS:
        raise RegistrationError(f"{path} is in the manifests directory, not a data file")
    if not target.is_file():
        raise RegistrationError(f"{path} is not a regular file")
    return relative.as_posix()


def draft_manifest(
    dataset_id: str,
    relative_path: str,
    sha256: str,
    format_name: str,
    *,
    track: str = "textual",
    scorer: str | None = None,
    version: str | None = None,
    f1_variant: str = DEFAULT_F1_VARIANT,
    excluded_from_overall: Sequence[int] | None = None,
) -> DatasetManifest:
    """The manifest `add` checks a file against: categories and counts still empty."""
    if format_name not in FORMATS:
        raise RegistrationError(f"unknown format {format_name!r}; known: {', '.join(FORMATS)}")
    payload: dict[str, Any] = {
        "dataset_id": dataset_id,
        "version": version or f"{PurePosixPath(relative_path).name}@sha256:{sha256[:12]}",
        "format": format_name,
        "track": track,
        "scorer": scorer or DEFAULT_SCORER_OF_FORMAT[format_name],
        "f1_variant": f1_variant,
        "categories": {},
        "excluded_from_overall": list(
            DEFAULT_EXCLUDED_OF_FORMAT[format_name]
            if excluded_from_overall is None
            else excluded_from_overall
        ),
        "location": "datasets_root",
        "files": [{"path": relative_path, "sha256": sha256}],
    }
    try:
        return DatasetManifest.model_validate(payload)
    except ValidationError as error:
        raise RegistrationError(f"invalid manifest: {error}") from None


def manifest_json(manifest: DatasetManifest) -> str:
    """A manifest file's text, as the shipped ones are written (absent defaults left out)."""
    payload = manifest.model_dump(mode="json")
    if payload["question_counts"] is None:
        del payload["question_counts"]
    return json.dumps(payload, indent=2, ensure_ascii=False) + "\n"


def _write_atomically(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    handle, temporary = tempfile.mkstemp(dir=path.parent, prefix=f".{path.stem}.", suffix=".tmp")
    try:
        with os.fdopen(handle, "w", encoding="utf-8") as file:
            file.write(text)
            file.flush()
            os.fsync(file.fileno())
        os.replace(temporary, path)
    except BaseException:
        Path(temporary).unlink(missing_ok=True)
        raise


def register_dataset(
    path: Path,
    format_name: str,
    dataset_id: str,
    datasets_root: Path,
    *,
    track: str = "textual",
    scorer: str | None = None,
    version: str | None = None,
    f1_variant: str = DEFAULT_F1_VARIANT,
    excluded_from_overall: Sequence[int] | None = None,
    replace: bool = False,
) -> Registration:
    """Verify a data file under the datasets root and write its operator manifest
    (`<datasets root>/manifests/<id>.json`, atomically). The file is parsed by its format's
    parser first, so a file that does not parse is refused with the parser's error and nothing
    is written. Re-registering the same manifest is a no-op; a different one needs `replace`."""
    try:
        _check_id(dataset_id)
    except KeyError as error:
        raise RegistrationError(
            f"{error.args[0]}: lower-case letters, digits, '_', '.', '-', starting with a "
            "letter or digit"
        ) from None
    if (MANIFESTS_DIR / f"{dataset_id}.json").is_file():
        raise RegistrationError(f"{dataset_id!r} is a shipped dataset; choose another id")
    if format_name not in FORMATS:
        raise RegistrationError(f"unknown format {format_name!r}; known: {', '.join(FORMATS)}")
    relative = _inside(path, datasets_root)
    try:
        content = (datasets_root / relative).read_bytes()
    except OSError as error:
        raise RegistrationError(f"{path} cannot be read: {error.strerror}") from None
    sha256 = hashlib.sha256(content).hexdigest()
    draft = draft_manifest(
        dataset_id,
        relative,
        sha256,
        format_name,
        track=track,
        scorer=scorer,
        version=version,
        f1_variant=f1_variant,
        excluded_from_overall=excluded_from_overall,
    )
    try:
        dataset = parse_contents([(relative, content)], draft)
    except DatasetFileError as error:
        raise RegistrationError(f"{path} is refused: {error}") from None
    if not dataset.questions:
        raise RegistrationError(f"{path} is refused: it holds no questions")
    categories = dict(sorted(dataset.categories.items()))
    unknown = sorted(set(draft.excluded_from_overall) - set(categories))
    if unknown:
        raise RegistrationError(
            f"excluded categories {unknown} are not categories of the dataset "
            f"({', '.join(str(number) for number in categories)})"
        )
    manifest = draft.model_copy(
        update={"categories": categories, "question_counts": count_questions(dataset)}
    )
    # Validated whole once more, so what is written reads back as the same manifest.
    manifest = DatasetManifest.model_validate(manifest.model_dump())
    target = operator_manifests_dir(datasets_root) / f"{dataset_id}.json"
    outcome: Literal["added", "replaced", "unchanged"] = "added"
    if target.exists():
        try:
            existing: DatasetManifest | None = read_manifest(target)
        except (OSError, ValueError):
            existing = None
        if existing == manifest:
            return Registration(manifest=manifest, path=target, outcome="unchanged")
        if not replace:
            was = "unreadable" if existing is None else f"bundle {bundle_hash(existing)}"
            raise RegistrationError(
                f"dataset {dataset_id!r} is already registered ({target}, {was}) with other "
                f"content; --replace overwrites it (bundle {bundle_hash(manifest)})"
            )
        outcome = "replaced"
    _write_atomically(target, manifest_json(manifest))
    return Registration(manifest=manifest, path=target, outcome=outcome)
