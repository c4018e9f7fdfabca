"""Dataset bundles and the registry of datasets, shipped and operator-registered: the read side.

**Bundles.** A dataset bundle is a JSON manifest (:class:`DatasetManifest`) listing data files with
their sha256. :func:`load_bundle` refuses to load a file whose bytes differ from the manifest, then
hands the verified bytes to the parser of the manifest's ``format`` (:func:`parser_of`), and
:func:`bundle_hash` fingerprints the manifest itself (and so, through the listed hashes, the data).

**Parsers.** Every format has one function ``parse(contents, manifest) -> Dataset`` where
``contents`` is ``(relative path, verified bytes)`` per manifest file, in manifest order: "locomo"
is :func:`aml_evaluation.datasets.parse_locomo_bundle`, "longmemeval" and "personamem" are
``aml_evaluation.longmemeval.parse`` and ``aml_evaluation.personamem.parse``, "coding" is
``aml_evaluation.coding.dataset.parse`` (its repository snapshots are pinned by the tasks file,
not listed: see that module), "mem-gallery" and "atm-bench" are
``aml_evaluation.memgallery.parse`` and ``aml_evaluation.atmbench.dataset.parse`` (their images,
and ATM-Bench's videos, are bundle files like any other: the parser gets their verified bytes),
each imported only when a bundle of that format is read. A parser
raises ``ValueError`` naming what is wrong. When ``aml dataset add``
(:mod:`aml_evaluation.registration`) checks new files (one, or every file of a bundle that spans
several, parsed together), the parser gets a draft manifest whose ``categories`` is empty: it
returns the categories its format defines, and those become the manifest's.

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
manifests (``track``, ``question_counts``, ``image_dir``, ``search_top_k``) while it holds its
default, so the bundle hash of a
manifest written before those fields existed, which jobs record, does not change.

**The write side.** Registering an operator dataset (``aml dataset add``) is
:mod:`aml_evaluation.registration`, which builds on this module; this module never imports it, so
the services, which only read datasets, never load it.
"""

from __future__ import annotations

import hashlib
import importlib
import json
import re
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import IO, Any, Final, Literal, TypeVar, get_args

import ijson  # type: ignore[import-untyped]
from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from aml_contract.api.vocabulary import Track
from aml_evaluation.chunker import check_media_limits
from aml_evaluation.datasets import DEFAULT_F1_VARIANT, Dataset, ItemFormat
from aml_evaluation.media import MissingImagesError

PACKAGE_DATA_DIR: Final = Path(__file__).resolve().parent / "data"
MANIFESTS_DIR: Final = PACKAGE_DATA_DIR / "manifests"
# Operator manifests: <datasets root>/OPERATOR_MANIFESTS/<id>.json (see the module docstring).
OPERATOR_MANIFESTS: Final = "manifests"

Format = Literal["locomo", "longmemeval", "personamem", "mem-gallery", "coding", "atm-bench"]
FORMATS: Final[tuple[str, ...]] = get_args(Format)
Source = Literal["shipped", "operator"]

# Format -> (module, function) of its parser, imported when first needed.
_PARSERS: Final[dict[str, tuple[str, str]]] = {
    "locomo": ("aml_evaluation.datasets", "parse_locomo_bundle"),
    "longmemeval": ("aml_evaluation.longmemeval", "parse"),
    "personamem": ("aml_evaluation.personamem", "parse"),
    "mem-gallery": ("aml_evaluation.memgallery", "parse"),
    "coding": ("aml_evaluation.coding.dataset", "parse"),
    "atm-bench": ("aml_evaluation.atmbench.dataset", "parse"),
}
# Formats whose files are JSON lists of items, each one conversation with its questions, read an
# item at a time by open_dataset_stream: format -> (module, its ItemFormat). The others (PersonaMem:
# questions over shared contexts; Mem-Gallery: one dialog per file, with its images; ATM-Bench:
# one person's whole memory, with its images and videos) are parsed whole.
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
    "search_top_k": None,
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
    # The Search top_k of the dataset's questions, in place of the job's (the coding track
    # searches with 100, R-2.5); None: the job's.
    search_top_k: int | None = Field(default=None, ge=1)

    @field_validator("image_dir")
    @classmethod
    def _image_dir_inside_the_root(cls, value: str | None) -> str | None:
        if value is not None:
            ManifestFile._inside_the_root(value)
        return value

    @model_validator(mode="after")
    def _coding_runs_on_its_track(self) -> DatasetManifest:
        # Its attempts are solved and verified, not answered and judged: only the coding track
        # runs them.
        if self.format == "coding" and self.track != "coding":
            raise ValueError(f"a coding dataset is on the coding track, not {self.track!r}")
        return self


BundleParser = Callable[[Sequence[tuple[str, bytes]], DatasetManifest], Dataset]
_Parsed = TypeVar("_Parsed")


class DatasetFileError(ValueError):
    """A bundle file is missing, its bytes differ from the manifest, or it cannot be parsed."""


class MissingImagesFileError(DatasetFileError):
    """Images the bundle's data references are not in the bundle; ``missing`` names them."""

    def __init__(self, message: str, missing: Sequence[str]) -> None:
        super().__init__(message)
        self.missing = list(missing)


class FormatUnavailableError(DatasetFileError):
    """No parser of the manifest's format is installed."""


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
    return parsed_for(manifest, lambda: _as_the_manifest_says(parse(contents, manifest), manifest))


def parsed_for(manifest: DatasetManifest, parse: Callable[[], _Parsed]) -> _Parsed:
    """What `parse` makes of a manifest's verified contents; its refusal (a ValueError) becomes
    a DatasetFileError naming the dataset and the format."""
    try:
        return parse()
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


def _as_the_manifest_says(dataset: Dataset, manifest: DatasetManifest) -> Dataset:
    """The track and the Search top_k are the manifest's; a multimodal dataset is checked
    against the media limits here, so an image too many is refused when the dataset is loaded,
    never dropped."""
    if (dataset.track, dataset.search_top_k) != (manifest.track, manifest.search_top_k):
        update = {"track": manifest.track, "search_top_k": manifest.search_top_k}
        dataset = dataset.model_copy(update=update)
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


def check_dataset_id(dataset_id: str) -> None:
    """KeyError unless ``dataset_id`` is a valid id: lower-case letters, digits, '_', '.', '-',
    starting with a letter or digit."""
    # The id becomes a file name: refuse anything that could step out of the manifests dir.
    if _DATASET_ID.fullmatch(dataset_id) is None:
        raise KeyError(f"invalid dataset id {dataset_id!r}")


def manifest_path(dataset_id: str, datasets_root: Path | None) -> Path:
    """The manifest of a dataset id: shipped first, then the operator's under `datasets_root`
    (None: shipped datasets only). KeyError names the known ids."""
    check_dataset_id(dataset_id)
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
