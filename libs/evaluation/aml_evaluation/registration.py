"""Registering an operator dataset (`aml dataset add`): the write side of the dataset registry.

:func:`register_dataset` takes data files an operator placed under the datasets root, checks them
the way every read will (each file's sha256 pinned, the files parsed together by the format's
parser, see :mod:`aml_evaluation.registry`), and writes the operator manifest,
``<datasets root>/manifests/<id>.json``, atomically. The parser first gets a draft manifest
(:func:`draft_manifest`) whose ``categories`` is empty: the categories the parse returns, and the
questions counted per category, become the manifest's. A format with images
(:data:`IMAGE_FORMATS`) has every image its files reference pinned too. A shipped id is refused;
the same manifest again is a no-op; different content under a registered id needs ``replace``.

A format whose bundle is a directory (:data:`DIRECTORY_FORMATS`: ATM-Bench, its QA files,
metadata, images and videos) may be named by that directory: every regular file under it
(hidden names left out) is a data file, each checked against the format's size limit before it
is read.

A coding bundle (:func:`register_coding_dataset`) is registered from its directory: its three
files are pinned like any format's, and before anything is written its snapshots are checked
(present, pinned by their tasks, safe) and every task is run (``check_tasks``, the sandbox's
work, given by the caller): no patch must leave it unresolved and its gold patch resolve it.

Only the dataset CLI (:mod:`aml_devtools.dataset_cli`) and tests write manifests; services only
read them, through :mod:`aml_evaluation.registry`, which never imports this module.
"""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Any, Final, Literal

from pydantic import ValidationError

from aml_evaluation.atmbench.dataset import max_file_bytes
from aml_evaluation.atmbench.scoring import ATM_SCORER
from aml_evaluation.chunker import fitted_images
from aml_evaluation.coding.bundle import BUNDLE_FILES, CodingBundle, snapshot_problems
from aml_evaluation.coding.dataset import (
    CODING_TOP_K,
    CODING_TRACK,
    coding_bundle_of,
    coding_dataset,
)
from aml_evaluation.coding.validation import TaskCheck
from aml_evaluation.datasets import (
    DEFAULT_F1_VARIANT,
    DEFAULT_SCORER,
    LOCOMO_ADVERSARIAL_CATEGORY,
    Dataset,
)
from aml_evaluation.media import MAX_SOURCE_IMAGE_BYTES, ImageError, read_image, resolve_image
from aml_evaluation.registry import (
    FORMATS,
    MANIFESTS_DIR,
    OPERATOR_MANIFESTS,
    DatasetFileError,
    DatasetManifest,
    ManifestFile,
    MissingImagesFileError,
    bundle_hash,
    check_dataset_id,
    count_questions,
    operator_manifests_dir,
    parse_contents,
    parsed_for,
    read_manifest,
)
from aml_evaluation.scoring import CODING_SCORER

# The scorer a dataset of the format declares unless the operator names another.
DEFAULT_SCORER_OF_FORMAT: Final[dict[str, str]] = {
    "locomo": DEFAULT_SCORER,
    "longmemeval": DEFAULT_SCORER,
    "personamem": "multiple_choice",
    # Mem-Gallery scores with token F1 alone (the scorer does not yet tell it apart: see
    # docs/architecture.md "Not yet").
    "mem-gallery": "token_f1",
    # An attempt is resolved or not by the task's hidden tests.
    "coding": CODING_SCORER,
    # ATM-Bench's question-type score: exact match, Jaccard or its judge by answer type.
    "atm-bench": ATM_SCORER,
}
# The token F1 a dataset of the format reports unless the operator names another: Mem-Gallery's
# own (aml_evaluation.scoring.token_f1_memgallery).
DEFAULT_F1_VARIANT_OF_FORMAT: Final[dict[str, str]] = {"mem-gallery": "f1-memgallery-v1"}
# The track a dataset of the format is registered on unless the operator names another.
DEFAULT_TRACK_OF_FORMAT: Final[dict[str, str]] = {
    "mem-gallery": "multimodal",
    "coding": CODING_TRACK,
    "atm-bench": "multimodal",
}
# The Search top_k a dataset of the format declares in place of the job's (R-2.5: coding, 100).
DEFAULT_SEARCH_TOP_K_OF_FORMAT: Final[dict[str, int]] = {"coding": CODING_TOP_K}
# Formats whose datasets reference image files (`aml dataset add --images DIR` pins them).
IMAGE_FORMATS: Final = frozenset({"mem-gallery"})
# Formats whose bundle may be named by its directory (every file under it), with the largest
# each of its files may be, by path (ValueError: a file the format does not take).
DIRECTORY_FORMATS: Final[dict[str, Callable[[str], int]]] = {"atm-bench": max_file_bytes}
# Files a bundle directory may hold: more is refused before any is read.
MAX_DIRECTORY_FILES: Final = 250_000
# Categories reported apart, not counted in Overall, unless the operator names others.
DEFAULT_EXCLUDED_OF_FORMAT: Final[dict[str, list[int]]] = {
    "locomo": [LOCOMO_ADVERSARIAL_CATEGORY],
    "longmemeval": [],
    "personamem": [],
    "mem-gallery": [],
    "coding": [],
    "atm-bench": [],
}


class RegistrationError(ValueError):
    """`aml dataset add` refused a dataset; nothing was written."""


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
        "search_top_k": DEFAULT_SEARCH_TOP_K_OF_FORMAT.get(format_name),
    }
    try:
        return DatasetManifest.model_validate(payload)
    except ValidationError as error:
        raise RegistrationError(f"invalid manifest: {error}") from None


def manifest_json(manifest: DatasetManifest) -> str:
    """A manifest file's text, as the shipped ones are written (absent defaults left out)."""
    payload = manifest.model_dump(mode="json")
    for name in ("question_counts", "image_dir", "search_top_k"):
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


def _directory_files(
    directory: Path, datasets_root: Path, max_bytes: Callable[[str], int]
) -> list[Path]:
    """Every regular file under a bundle directory, hidden names (a leading '.') left out, in
    path order; RegistrationError for a file the format does not take or over its size limit,
    found before any file is read."""
    relative = _inside(directory, datasets_root, directory=True)
    found: list[Path] = []
    for parent, directories, names in os.walk(datasets_root / relative):
        directories[:] = sorted(name for name in directories if not name.startswith("."))
        for name in sorted(names):
            if name.startswith("."):
                continue
            path = Path(parent) / name
            if not path.is_file():
                continue
            found.append(path)
            if len(found) > MAX_DIRECTORY_FILES:
                raise RegistrationError(f"{directory} holds more than {MAX_DIRECTORY_FILES} files")
            inside = _inside(path, datasets_root)
            try:
                limit = max_bytes(inside)
            except ValueError as error:
                raise RegistrationError(f"{directory} is refused: {error}") from None
            size = path.stat().st_size
            if size > limit:
                raise RegistrationError(
                    f"{directory} is refused: {inside} is {size} bytes, over the limit of "
                    f"{limit} bytes for such a file"
                )
    if not found:
        raise RegistrationError(f"{directory} holds no file")
    return found


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
    .jsonl; Mem-Gallery: one dialog file per conversation; a format of
    :data:`DIRECTORY_FORMATS` also takes directories, each standing for every file under it);
    the manifest lists each with its sha256, in path order. The files are parsed together by
    the format's parser first, so files that do not parse are refused with the parser's error
    and nothing is written.
    Re-registering the same manifest is a no-op; a different one needs `replace`.

    A format with images (:data:`IMAGE_FORMATS`) takes the directory holding them, `images`
    (under the datasets root): every image the files reference is pinned in the manifest
    (path and sha256) after its type and size are checked; a reference that is not there
    refuses the dataset, naming how many are missing and the first of them."""
    _check_new_id(dataset_id)
    if format_name not in FORMATS:
        raise RegistrationError(f"unknown format {format_name!r}; known: {', '.join(FORMATS)}")
    if format_name == "coding":
        raise RegistrationError(
            "a coding bundle is registered from its directory (register_coding_dataset; "
            "`aml dataset add DIR --format coding`), with its tasks run in the sandbox"
        )
    if images is not None and format_name not in IMAGE_FORMATS:
        raise RegistrationError(
            f"--images applies to formats with images ({', '.join(sorted(IMAGE_FORMATS))}), "
            f"not {format_name!r}"
        )
    given = [paths] if isinstance(paths, Path) else list(paths)
    if not given:
        raise RegistrationError("no data file given")
    refused = f"{given[0]} is" if len(given) == 1 else f"{', '.join(map(str, given))} are"
    files = given
    if format_name in DIRECTORY_FORMATS:
        max_bytes = DIRECTORY_FORMATS[format_name]
        files = [
            file
            for path in given
            for file in (
                _directory_files(path, datasets_root, max_bytes) if path.is_dir() else [path]
            )
        ]
    data_files = _read_data_files(files, datasets_root)
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
    manifest = _completed(refused, draft, dataset)
    draft_files = tuple(entry for entry, _ in data_files)
    fitted = tuple(fitted_images(dataset))
    target = operator_manifests_dir(datasets_root) / f"{dataset_id}.json"
    outcome = _outcome(manifest, target, replace)
    if outcome != "unchanged":
        _write_atomically(target, manifest_json(manifest))
    return Registration(
        manifest=manifest, path=target, outcome=outcome, data_files=draft_files, fitted=fitted
    )


def _check_new_id(dataset_id: str) -> None:
    try:
        check_dataset_id(dataset_id)
    except KeyError as error:
        raise RegistrationError(
            f"{error.args[0]}: lower-case letters, digits, '_', '.', '-', starting with a "
            "letter or digit"
        ) from None
    if (MANIFESTS_DIR / f"{dataset_id}.json").is_file():
        raise RegistrationError(f"{dataset_id!r} is a shipped dataset; choose another id")


def _completed(refused: str, draft: DatasetManifest, dataset: Dataset) -> DatasetManifest:
    """The draft with the parsed dataset's categories and question counts, validated whole once
    more, so what is written reads back as the same manifest."""
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
    return DatasetManifest.model_validate(manifest.model_dump())


def _outcome(
    manifest: DatasetManifest, target: Path, replace: bool
) -> Literal["added", "replaced", "unchanged"]:
    """What writing `manifest` to `target` would be; RegistrationError when another manifest
    is registered there and `replace` is not given."""
    if not target.exists():
        return "added"
    try:
        existing: DatasetManifest | None = read_manifest(target)
    except (OSError, ValueError):
        existing = None
    if existing == manifest:
        return "unchanged"
    if not replace:
        was = "unreadable" if existing is None else f"bundle {bundle_hash(existing)}"
        raise RegistrationError(
            f"dataset {manifest.dataset_id!r} is already registered ({target}, {was}) with "
            f"other content; --replace overwrites it (bundle {bundle_hash(manifest)})"
        )
    return "replaced"


# Runs every task of a statically valid bundle whose directory is the Path (no patch, the gold
# patch, ...), as `aml_evaluation.coding.validation.check_bundle` does with a real sandbox.
CheckTasks = Callable[[CodingBundle, Path], Sequence[TaskCheck]]


def register_coding_dataset(
    directory: Path,
    dataset_id: str,
    datasets_root: Path,
    *,
    check_tasks: CheckTasks,
    version: str | None = None,
    replace: bool = False,
) -> Registration:
    """Verify a coding bundle under the datasets root and write its operator manifest: its
    tasks, trajectories and conditions files pinned by sha256 (the snapshots are pinned by the
    tasks file), format and track ``coding``, scorer ``swe_resolved``, Search top_k 100.

    Refused, with nothing written, when the files do not parse or break a static rule
    (:func:`aml_evaluation.coding.bundle.bundle_problems`: e.g. a trajectory dated after its
    task), when a snapshot is missing, not as its task pins it or unsafe, or when a task fails
    ``check_tasks`` (resolved with no patch, not resolved by its gold patch): the reason names
    each task and what is wrong. An infrastructure fault raised by ``check_tasks`` propagates:
    it says nothing of the bundle."""
    _check_new_id(dataset_id)
    relative = _inside(directory, datasets_root, directory=True)
    refused = f"{directory} is"
    bundle_dir = datasets_root / relative
    missing = [name for name in BUNDLE_FILES if not (bundle_dir / name).is_file()]
    if missing:
        raise RegistrationError(
            f"{refused} refused: it has no {', '.join(missing)} (a coding bundle is a directory "
            f"holding {', '.join(BUNDLE_FILES)} and the snapshots its tasks name)"
        )
    data_files = _read_data_files([bundle_dir / name for name in BUNDLE_FILES], datasets_root)
    draft = draft_manifest(
        dataset_id, [entry for entry, _ in data_files], "coding", version=version
    )
    contents = [(entry.path, content) for entry, content in data_files]
    try:
        bundle = parsed_for(draft, lambda: coding_bundle_of(contents))
        dataset = parsed_for(draft, lambda: coding_dataset(bundle, draft))
    except DatasetFileError as error:
        raise RegistrationError(f"{refused} refused: {error}") from None
    manifest = _completed(refused, draft, dataset)
    target = operator_manifests_dir(datasets_root) / f"{dataset_id}.json"
    outcome = _outcome(manifest, target, replace)
    problems = snapshot_problems(bundle_dir, bundle.tasks)
    if not problems:
        # Tasks are run only on snapshots known to be theirs and safe to unpack.
        checks = check_tasks(bundle, bundle_dir)
        problems = [problem for check in checks for problem in check.problems]
    if problems:
        raise RegistrationError(f"{refused} refused: {'; '.join(problems)}")
    if outcome != "unchanged":
        _write_atomically(target, manifest_json(manifest))
    return Registration(
        manifest=manifest,
        path=target,
        outcome=outcome,
        data_files=tuple(entry for entry, _ in data_files),
    )
