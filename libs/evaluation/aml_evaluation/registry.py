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
``aml dataset add`` checks new files (one, or every file of a bundle that spans several, parsed
together), the parser gets a draft manifest whose ``categories`` is empty: it returns the
categories its format defines, and those become the manifest's.

**Reading a piece at a time.** :func:`open_dataset_stream` (what the scheduler plans from) checks
every file's sha256 reading it in blocks, then gives the dataset a few conversations at a time
(:class:`DatasetStream`): the files of a format listed in ``_ITEM_FORMATS`` (LoCoMo, LongMemEval:
JSON lists of items, each one conversation with its questions) are read an item at a time with
ijson and each item parsed by the format's own rules (its
:class:`~aml_evaluation.datasets.ItemFormat`); other formats, and files ijson might read otherwise
than ``json.loads``, are parsed whole. Either way the conversations and questions are the whole
parse's, and a file it refuses is refused with the whole parse's error.

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
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import IO, Any, Final, Literal, get_args

import ijson  # type: ignore[import-untyped]
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from aml_contract.api.vocabulary import Track
from aml_evaluation.chunker import check_media_limits, fitted_images
from aml_evaluation.datasets import (
    DEFAULT_F1_VARIANT,
    DEFAULT_SCORER,
    LOCOMO_ADVERSARIAL_CATEGORY,
    Dataset,
    ItemFormat,
)
from aml_evaluation.media import (
    MAX_SOURCE_IMAGE_BYTES,
    ImageError,
    MissingImagesError,
    read_image,
    resolve_image,
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
# The token F1 a dataset of the format reports unless the operator names another: Mem-Gallery's
# own (aml_evaluation.scoring.token_f1_memgallery).
DEFAULT_F1_VARIANT_OF_FORMAT: Final[dict[str, str]] = {"mem-gallery": "f1-memgallery-v1"}
# The track a dataset of the format is registered on unless the operator names another.
DEFAULT_TRACK_OF_FORMAT: Final[dict[str, str]] = {"mem-gallery": "multimodal"}
# Formats whose datasets reference image files (`aml dataset add --images DIR` pins them).
IMAGE_FORMATS: Final = frozenset({"mem-gallery"})
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
# Formats whose files are JSON lists of items, each one conversation with its questions, read an
# item at a time by open_dataset_stream: format -> (module, its ItemFormat). The others (PersonaMem:
# questions over shared contexts; Mem-Gallery: one dialog per file, with its images) are parsed
# whole.
_ITEM_FORMATS: Final[dict[str, tuple[str, str]]] = {
    "locomo": ("aml_evaluation.datasets", "LOCOMO_ITEMS"),
    "longmemeval": ("aml_evaluation.longmemeval", "ITEMS"),
}
# Bytes read at a time while a file's sha256 is checked or its items are read.
_READ_BLOCK: Final = 1 << 20
# A \u escape of a high surrogate not followed by one of a low surrogate: json.loads keeps it (a
# lone surrogate), ijson's yajl reads it otherwise ('?', or one character of the two).
_UNPAIRED_HIGH_SURROGATE: Final = re.compile(
    rb"\\u[dD][89abAB][0-9a-fA-F]{2}(?!\\u[dD][c-fC-F][0-9a-fA-F]{2})"
)
# Bytes one such match spans, with its look-ahead (kept from one block for the next).
_SURROGATE_SPAN: Final = 12
# Fields added after the first manifests, with the default a manifest without them means; left
# out of the canonical JSON while they hold it (bundle hashes of old manifests stay the same).
_ADDED_FIELD_DEFAULTS: Final[dict[str, object]] = {
    "track": "textual",
    "question_counts": None,
    "image_dir": None,
}
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
    # Multimodal bundles: the bundle directory the listed images are under, each at
    # `<image_dir>/<reference>` (`aml dataset add --images`); None: the format's own layout.
    image_dir: str | None = None

    @field_validator("image_dir")
    @classmethod
    def _image_dir_inside_the_root(cls, value: str | None) -> str | None:
        if value is not None:
            ManifestFile._inside_the_root(value)
        return value


BundleParser = Callable[[Sequence[tuple[str, bytes]], DatasetManifest], Dataset]


class DatasetFileError(ValueError):
    """A bundle file is missing, its bytes differ from the manifest, or it cannot be parsed."""


class MissingImagesFileError(DatasetFileError):
    """Images the bundle's data references are not in the bundle; ``missing`` names them."""

    def __init__(self, message: str, missing: Sequence[str]) -> None:
        super().__init__(message)
        self.missing = list(missing)


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
        raise _unreadable(entry, path, error) from None
    _check_sha256(entry, path, hashlib.sha256(content).hexdigest())
    return content


def _unreadable(entry: ManifestFile, path: Path, error: OSError) -> DatasetFileError:
    return DatasetFileError(
        f"dataset file {entry.path!r} cannot be read at {path}: {error.strerror}"
    )


def _check_sha256(entry: ManifestFile, path: Path, actual: str) -> None:
    if actual != entry.sha256:
        raise DatasetFileError(
            f"dataset file {entry.path!r} at {path} has sha256 {actual}, "
            f"manifest expects {entry.sha256}"
        )


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
        dataset = _as_the_manifest_says(parse(contents, manifest), manifest)
    except DatasetFileError:
        raise
    except MissingImagesError as error:
        raise MissingImagesFileError(
            f"dataset {manifest.dataset_id!r} ({manifest.format}): {error}", error.missing
        ) from None
    except ValueError as error:
        raise DatasetFileError(
            f"dataset {manifest.dataset_id!r} ({manifest.format}): {error}"
        ) from None
    return dataset


def _as_the_manifest_says(dataset: Dataset, manifest: DatasetManifest) -> Dataset:
    """The track is the manifest's; a multimodal dataset is checked against the media limits
    here, so an image too many is refused when the dataset is loaded, never dropped."""
    if dataset.track != manifest.track:
        dataset = dataset.model_copy(update={"track": manifest.track})
    if dataset.track == "multimodal":
        check_media_limits(dataset)
    return dataset


def bundle_root(manifest: DatasetManifest, datasets_root: Path) -> Path:
    """Where the manifest's files are: the package's data dir or the datasets root."""
    return PACKAGE_DATA_DIR if manifest.location == "package" else datasets_root


def load_manifest_bundle(manifest: DatasetManifest, root: Path) -> Dataset:
    """Verify every file the manifest lists under `root`, then parse them by its format."""
    contents = [(entry.path, read_verified(root, entry)) for entry in manifest.files]
    return parse_contents(contents, manifest)


class _ChangedWhileRead(DatasetFileError):
    """A file's bytes read for its items are not those whose sha256 was checked."""


class _HashingReader:
    """A binary file that hashes what is read from it."""

    def __init__(self, handle: IO[bytes]) -> None:
        self.handle = handle
        self.sha256 = hashlib.sha256()

    def read(self, size: int = -1) -> bytes:
        data = self.handle.read(size)
        self.sha256.update(data)
        return data


class DatasetStream:
    """A verified bundle read a piece at a time (:func:`stream_manifest_bundle`).

    ``dataset`` holds the dataset-level fields (no conversations, no questions): the same as the
    whole parse's. :meth:`pieces` gives the dataset's conversations in order, each with all its
    questions, in pieces (small :class:`Dataset` s with the same dataset-level fields): together
    they are the whole parse's conversations and questions. ``streamed`` tells how: an item at a
    time (a format of :data:`_ITEM_FORMATS`, its files read incrementally with ijson and hashed
    again as they are read), or, for the other formats and for files ijson might read otherwise
    than ``json.loads`` (not starting with a list, a form feed or vertical tab, an unpaired
    surrogate escape), parsed whole at once and given as one piece."""

    def __init__(
        self,
        manifest: DatasetManifest,
        root: Path,
        dataset: Dataset,
        items: ItemFormat | None = None,
        whole: Dataset | None = None,
    ) -> None:
        self.manifest = manifest
        self.dataset = dataset
        self.streamed = whole is None
        # Why the item-at-a-time read gave up and the bundle was parsed whole (None: it did not).
        self.parsed_whole: str | None = None
        self._root = root
        self._items = items
        self._whole = whole

    def pieces(self) -> Iterator[Dataset]:
        """The dataset's conversations, each with its questions, a few at a time.

        Anything the item-at-a-time read stumbles on (a JSON or format error, ids given twice,
        a bound passed) has the bundle parsed whole instead: its error is raised (the one
        :func:`load_manifest_bundle` raises, though pieces before it were given already), or, if
        it parses, the conversations not given yet follow as one piece. A file whose bytes
        changed since its sha256 was checked raises DatasetFileError at its end."""
        if self._whole is not None:
            yield self._whole
            return
        assert self._items is not None
        given: set[str] = set()
        read = turns = 0
        try:
            for name, item in self._read_items():
                read += 1
                bound = self._items.max_items
                if not isinstance(item, dict) or (bound is not None and read > bound):
                    raise ValueError(f"{name}: item {read} is refused when parsed whole")
                piece = self._items.parse([(name, item)], self.manifest)
                piece = _as_the_manifest_says(piece, self.manifest)
                ids = [conversation.conversation_id for conversation in piece.conversations]
                turns += sum(conversation.turn_count for conversation in piece.conversations)
                if len(set(ids)) != len(ids) or not given.isdisjoint(ids):
                    raise ValueError(f"{name}: item {read} repeats a conversation id")
                if self._items.max_turns is not None and turns > self._items.max_turns:
                    raise ValueError(f"{name}: more than {self._items.max_turns} turns")
                yield piece
                given.update(ids)
        except _ChangedWhileRead:
            raise
        except Exception as error:
            # Parsed whole: the format's own error, or the rest of a file ijson refused.
            self.parsed_whole = f"{type(error).__name__}: {error}"
            whole = load_manifest_bundle(self.manifest, self._root)
            rest = [c for c in whole.conversations if c.conversation_id not in given]
            questions = [q for q in whole.questions if q.conversation_id not in given]
            if rest or questions:
                yield whole.model_copy(update={"conversations": rest, "questions": questions})

    def _read_items(self) -> Iterator[tuple[str, Any]]:
        """Each file's top-level items in order, as (its path, the item), the file hashed as it
        is read."""
        for entry in self.manifest.files:
            path = self._root / entry.path
            with path.open("rb") as handle:
                reader = _HashingReader(handle)
                for item in ijson.items(reader, "item", use_float=True, buf_size=_READ_BLOCK):
                    yield entry.path, item
                while reader.read(_READ_BLOCK):
                    pass  # to the end, for the hash (ijson reads past the list already)
            try:
                _check_sha256(entry, path, reader.sha256.hexdigest())
            except DatasetFileError as error:
                raise _ChangedWhileRead(str(error)) from None


def _item_format(format_name: str) -> ItemFormat | None:
    """The format's item rules, when it is read an item at a time (None: parsed whole)."""
    if format_name not in _ITEM_FORMATS:
        return None
    module_name, attribute = _ITEM_FORMATS[format_name]
    try:
        items = getattr(importlib.import_module(module_name), attribute, None)
    except ModuleNotFoundError:
        return None
    return items if isinstance(items, ItemFormat) else None


def _verify_in_blocks(root: Path, entry: ManifestFile) -> bool:
    """Check a file's sha256 reading it in blocks (DatasetFileError as :func:`read_verified`);
    True when ijson reads its items as ``json.loads`` would: it starts with a list (after JSON
    whitespace; no byte-order mark) and holds no form feed or vertical tab (whitespace to yajl,
    not to JSON) and no unpaired high-surrogate escape."""
    path = root / entry.path
    sha256 = hashlib.sha256()
    first: bytes | None = None
    plain = True
    tail = b""
    try:
        with path.open("rb") as handle:
            while block := handle.read(_READ_BLOCK):
                sha256.update(block)
                if first is None and (start := block.lstrip(b" \t\r\n")):
                    first = start[:1]
                if plain:
                    scanned = tail + block
                    last = len(scanned) - _SURROGATE_SPAN
                    plain = (
                        b"\x0b" not in block
                        and b"\x0c" not in block
                        and not any(
                            match.start() < last
                            for match in _UNPAIRED_HIGH_SURROGATE.finditer(scanned)
                        )
                    )
                    tail = scanned[-_SURROGATE_SPAN:]
    except OSError as error:
        raise _unreadable(entry, path, error) from None
    _check_sha256(entry, path, sha256.hexdigest())
    return plain and first == b"[" and _UNPAIRED_HIGH_SURROGATE.search(tail) is None


def stream_manifest_bundle(manifest: DatasetManifest, root: Path) -> DatasetStream:
    """Verify every file the manifest lists under `root` (its sha256, read in blocks) and read
    the dataset a piece at a time (:class:`DatasetStream`): the same dataset as
    :func:`load_manifest_bundle`, without holding a large one whole where its format allows."""
    items = _item_format(manifest.format)
    if items is not None and all([_verify_in_blocks(root, entry) for entry in manifest.files]):
        try:
            dataset = _as_the_manifest_says(items.parse([], manifest), manifest)
        except Exception:
            pass  # parsed whole below: the format's own error
        else:
            return DatasetStream(manifest, root, dataset, items=items)
    whole = load_manifest_bundle(manifest, root)
    dataset = whole.model_copy(update={"conversations": [], "questions": []})
    return DatasetStream(manifest, root, dataset, whole=whole)


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


def dataset_id_of(spelling: str, datasets_root: Path | None) -> str:
    """The registered id a user's spelling names: the spelling itself when it is an id, else
    the id it names with '-' written for '_' (``synthetic-multimodal`` is
    ``synthetic_multimodal``); the spelling unchanged when neither is registered."""
    known = set(known_ids(datasets_root))
    underscored = spelling.replace("-", "_")
    if spelling not in known and underscored in known:
        return underscored
    return spelling


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


def open_dataset_stream(
    dataset_id: str, datasets_root: Path
) -> tuple[DatasetManifest, DatasetStream]:
    """:func:`open_dataset` a piece at a time (:func:`stream_manifest_bundle`): what the
    scheduler plans a job from, so that a large dataset is never held whole."""
    manifest = registered(dataset_id, datasets_root).manifest
    return manifest, stream_manifest_bundle(manifest, bundle_root(manifest, datasets_root))


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
    # The manifest's data files, the ones given to `add`; the rest of `manifest.files` are the
    # images pinned for them.
    data_files: tuple[ManifestFile, ...]
    # Images sent fitted (fit-v1) because their source is over an Add's or a Search's limit.
    fitted: tuple[str, ...] = ()

    @property
    def images(self) -> tuple[ManifestFile, ...]:
        return tuple(self.manifest.files[len(self.data_files) :])


def _inside(path: Path, datasets_root: Path, *, directory: bool = False) -> str:
    """`path` relative to the datasets root (POSIX), after resolving symlinks and '..'; a
    regular file, or with `directory` a directory."""
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
    if directory and not target.is_dir():
        raise RegistrationError(f"{path} is not a directory")
    if not directory and not target.is_file():
        raise RegistrationError(f"{path} is not a regular file")
    return relative.as_posix()


def default_version(files: Sequence[ManifestFile]) -> str:
    """A dataset's version when the operator names none: the file's name and the start of its
    sha256; for several files, their names and the start of the sha256 of their hashes."""
    names = "+".join(PurePosixPath(entry.path).name for entry in files)
    if len(files) == 1:
        return f"{names}@sha256:{files[0].sha256[:12]}"
    combined = hashlib.sha256("".join(entry.sha256 for entry in files).encode("ascii"))
    return f"{names}@sha256:{combined.hexdigest()[:12]}"


def draft_manifest(
    dataset_id: str,
    files: Sequence[ManifestFile],
    format_name: str,
    *,
    track: str | None = None,
    scorer: str | None = None,
    version: str | None = None,
    f1_variant: str | None = None,
    excluded_from_overall: Sequence[int] | None = None,
    image_dir: str | None = None,
) -> DatasetManifest:
    """The manifest `add` checks the data files against: categories and counts still empty."""
    if format_name not in FORMATS:
        raise RegistrationError(f"unknown format {format_name!r}; known: {', '.join(FORMATS)}")
    payload: dict[str, Any] = {
        "dataset_id": dataset_id,
        "version": version or default_version(files),
        "format": format_name,
        "track": track or DEFAULT_TRACK_OF_FORMAT.get(format_name, "textual"),
        "scorer": scorer or DEFAULT_SCORER_OF_FORMAT[format_name],
        "f1_variant": (
            f1_variant or DEFAULT_F1_VARIANT_OF_FORMAT.get(format_name, DEFAULT_F1_VARIANT)
        ),
        "categories": {},
        "excluded_from_overall": list(
            DEFAULT_EXCLUDED_OF_FORMAT[format_name]
            if excluded_from_overall is None
            else excluded_from_overall
        ),
        "location": "datasets_root",
        "files": [entry.model_dump() for entry in files],
        "image_dir": image_dir,
    }
    try:
        return DatasetManifest.model_validate(payload)
    except ValidationError as error:
        raise RegistrationError(f"invalid manifest: {error}") from None


def manifest_json(manifest: DatasetManifest) -> str:
    """A manifest file's text, as the shipped ones are written (absent defaults left out)."""
    payload = manifest.model_dump(mode="json")
    for name in ("question_counts", "image_dir"):
        if payload[name] is None:
            del payload[name]
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


def _pin_images(
    refused: str, references: Sequence[str], datasets_root: Path, image_dir: str | None
) -> list[tuple[ManifestFile, bytes]]:
    """The manifest entries (and bytes) of the images a dataset file references, read from the
    image directory under the datasets root; RegistrationError naming the missing ones."""
    if image_dir is None:
        raise RegistrationError(
            f"{refused} refused: it references {len(references)} images and no image directory "
            f"was given ({_first(references)}); pass --images DIR, the directory under the "
            "datasets root that holds them (Mem-Gallery: the source's benchmark/data/image)"
        )
    directory = datasets_root / image_dir
    missing: list[str] = []
    for reference in references:
        try:
            resolve_image(directory, reference)
        except ImageError:
            missing.append(reference)
    if missing:
        raise RegistrationError(
            f"{refused} refused: {len(missing)} of {len(references)} referenced images are "
            f"missing under {directory} ({_first(missing)}); pass --images DIR naming the "
            "directory that holds them"
        )
    pinned: list[tuple[ManifestFile, bytes]] = []
    for reference in references:
        try:
            data = read_image(directory, reference, MAX_SOURCE_IMAGE_BYTES)
        except ImageError as error:
            raise RegistrationError(f"{refused} refused: {error}") from None
        entry = ManifestFile(
            path=f"{image_dir}/{reference}", sha256=hashlib.sha256(data).hexdigest()
        )
        pinned.append((entry, data))
    return pinned


def _first(references: Sequence[str], shown: int = 5) -> str:
    more = len(references) - shown
    return ", ".join(references[:shown]) + (f" and {more} more" if more > 0 else "")


def _read_data_files(
    paths: Sequence[Path], datasets_root: Path
) -> list[tuple[ManifestFile, bytes]]:
    """The manifest entries (and bytes) of the data files given to `add`, in path order, so
    the manifest does not depend on the order they were named in."""
    read: dict[str, tuple[ManifestFile, bytes]] = {}
    for path in paths:
        relative = _inside(path, datasets_root)
        if relative in read:
            raise RegistrationError(f"{path} is given twice (as {relative!r} in the root)")
        try:
            content = (datasets_root / relative).read_bytes()
        except OSError as error:
            raise RegistrationError(f"{path} cannot be read: {error.strerror}") from None
        entry = ManifestFile(path=relative, sha256=hashlib.sha256(content).hexdigest())
        read[relative] = (entry, content)
    return [read[relative] for relative in sorted(read)]


def register_dataset(
    paths: Path | Sequence[Path],
    format_name: str,
    dataset_id: str,
    datasets_root: Path,
    *,
    track: str | None = None,
    scorer: str | None = None,
    version: str | None = None,
    f1_variant: str | None = None,
    excluded_from_overall: Sequence[int] | None = None,
    replace: bool = False,
    images: Path | None = None,
) -> Registration:
    """Verify the data files of a dataset under the datasets root and write its operator
    manifest (`<datasets root>/manifests/<id>.json`, atomically). `paths` is one file or every
    file of a bundle that spans several (PersonaMem: its questions .csv and shared contexts
    .jsonl; Mem-Gallery: one dialog file per conversation); the manifest lists each with its
    sha256, in path order. The files are parsed together by the format's parser first, so
    files that do not parse are refused with the parser's error and nothing is written.
    Re-registering the same manifest is a no-op; a different one needs `replace`.

    A format with images (:data:`IMAGE_FORMATS`) takes the directory holding them, `images`
    (under the datasets root): every image the files reference is pinned in the manifest
    (path and sha256) after its type and size are checked; a reference that is not there
    refuses the dataset, naming how many are missing and the first of them."""
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
    if images is not None and format_name not in IMAGE_FORMATS:
        raise RegistrationError(
            f"--images applies to formats with images ({', '.join(sorted(IMAGE_FORMATS))}), "
            f"not {format_name!r}"
        )
    given = [paths] if isinstance(paths, Path) else list(paths)
    if not given:
        raise RegistrationError("no data file given")
    refused = f"{given[0]} is" if len(given) == 1 else f"{', '.join(map(str, given))} are"
    data_files = _read_data_files(given, datasets_root)
    image_dir = None if images is None else _inside(images, datasets_root, directory=True)
    draft = draft_manifest(
        dataset_id,
        [entry for entry, _ in data_files],
        format_name,
        track=track,
        scorer=scorer,
        version=version,
        f1_variant=f1_variant,
        excluded_from_overall=excluded_from_overall,
        image_dir=image_dir,
    )
    contents = [(entry.path, content) for entry, content in data_files]
    try:
        try:
            dataset = parse_contents(contents, draft)
        except MissingImagesFileError as error:
            pinned = _pin_images(refused, error.missing, datasets_root, image_dir)
            draft = draft.model_copy(
                update={"files": [*draft.files, *(entry for entry, _ in pinned)]}
            )
            contents += [(entry.path, data) for entry, data in pinned]
            dataset = parse_contents(contents, DatasetManifest.model_validate(draft.model_dump()))
    except DatasetFileError as error:
        raise RegistrationError(f"{refused} refused: {error}") from None
    if not dataset.questions:
        raise RegistrationError(f"{refused} refused: the dataset holds no questions")
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
    draft_files = tuple(entry for entry, _ in data_files)
    fitted = tuple(fitted_images(dataset))
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
            return Registration(
                manifest=manifest,
                path=target,
                outcome="unchanged",
                data_files=draft_files,
                fitted=fitted,
            )
        if not replace:
            was = "unreadable" if existing is None else f"bundle {bundle_hash(existing)}"
            raise RegistrationError(
                f"dataset {dataset_id!r} is already registered ({target}, {was}) with other "
                f"content; --replace overwrites it (bundle {bundle_hash(manifest)})"
            )
        outcome = "replaced"
    _write_atomically(target, manifest_json(manifest))
    return Registration(
        manifest=manifest, path=target, outcome=outcome, data_files=draft_files, fitted=fitted
    )
