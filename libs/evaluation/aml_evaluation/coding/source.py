"""Where the solve and verify stages find a coding task (SPEC R-2.5): its definition (problem
statement, hidden tests, lists, test command) and its repository snapshot, from the registered
bundle, each checked against what the manifest pins before it is used.

:func:`coding_task_files` reads the dataset's registered manifest (shipped or operator), reads
its ``tasks.jsonl`` and checks its sha256 against the manifest, finds the task, then checks that
the task's snapshot is present and has the sha256 the task pins. :class:`CodingTasks` does the
same with a small per-process cache: a task is looked up again only when the manifest changed
(its bundle hash is part of the key), and its snapshot hashed again only when the file's size,
mtime or inode changed (a snapshot can be gigabytes).

Every refusal is :class:`CodingTaskUnavailable`, naming the dataset, the task and what is wrong.
A file missing or changed under a registered dataset is the platform's failure, never the
participant's and never "unresolved": the caller records it as such.
"""

from __future__ import annotations

import io
import os
import threading
from collections import OrderedDict
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Final

from aml_evaluation.coding.bundle import (
    BundleLimits,
    CodingBundleError,
    CodingTask,
    file_sha256,
    jsonl_records,
)
from aml_evaluation.coding.dataset import tasks_entry_path
from aml_evaluation.registry import (
    DatasetFileError,
    DatasetManifest,
    bundle_hash,
    bundle_root,
    read_verified,
    registered,
)

# Tasks kept per process: a worker's attempts go through a suite's tasks in planning order.
DEFAULT_CACHED_TASKS: Final = 256


class CodingTaskUnavailable(Exception):
    """A coding task's files cannot be used: the dataset, the task or its snapshot is unknown,
    missing or not as registered. A platform failure for the stage that needed them."""


@dataclass(frozen=True)
class CodingTaskFiles:
    """A task of a registered coding dataset and its snapshot archive, both verified against
    what the manifest pins (for ``Sandbox.from_archive``)."""

    dataset_id: str
    task: CodingTask
    snapshot: Path


# What tells a file changed without reading it: (size, mtime in ns, inode).
_FileStamp = tuple[int, int, int]


def _stamp(path: Path) -> _FileStamp | None:
    try:
        status = os.stat(path)
    except OSError:
        return None
    return status.st_size, status.st_mtime_ns, status.st_ino


def _coding_manifest(dataset_id: str, datasets_root: Path) -> DatasetManifest:
    try:
        manifest = registered(dataset_id, datasets_root).manifest
    except KeyError as error:
        raise CodingTaskUnavailable(str(error.args[0])) from None
    except (OSError, ValueError) as error:
        raise CodingTaskUnavailable(
            f"dataset {dataset_id!r}: unreadable manifest: {error}"
        ) from None
    if manifest.format != "coding":
        raise CodingTaskUnavailable(
            f"dataset {dataset_id!r} is a {manifest.format} dataset, not a coding one"
        )
    return manifest


def _find_task(manifest: DatasetManifest, root: Path, task_id: str) -> tuple[CodingTask, Path]:
    """The task as the verified tasks file defines it, and the bundle's directory."""
    where = f"dataset {manifest.dataset_id!r} task {task_id!r}"
    try:
        tasks_path = tasks_entry_path([entry.path for entry in manifest.files])
    except ValueError as error:
        raise CodingTaskUnavailable(f"{where}: {error}") from None
    entry = next(entry for entry in manifest.files if entry.path == tasks_path)
    try:
        content = read_verified(root, entry)
    except DatasetFileError as error:
        raise CodingTaskUnavailable(f"{where}: {error}") from None
    limits = BundleLimits()
    records = jsonl_records(
        io.BytesIO(content),
        PurePosixPath(tasks_path).name,
        CodingTask,
        max_records=limits.max_tasks,
        max_line_bytes=limits.max_line_bytes,
    )
    try:
        task = next((task for task in records if task.task_id == task_id), None)
    except CodingBundleError as error:
        raise CodingTaskUnavailable(f"{where}: {error}") from None
    if task is None:
        raise CodingTaskUnavailable(f"{where}: no such task in {tasks_path}")
    return task, root / PurePosixPath(tasks_path).parent


def _checked_snapshot(dataset_id: str, task: CodingTask, bundle_dir: Path) -> Path:
    path = bundle_dir / task.snapshot
    where = f"dataset {dataset_id!r} task {task.task_id!r}: snapshot {task.snapshot!r}"
    if not path.is_file():
        raise CodingTaskUnavailable(f"{where} is missing at {path}")
    try:
        digest = file_sha256(path)
    except OSError as error:
        raise CodingTaskUnavailable(f"{where} cannot be read at {path}: {error}") from None
    if digest != task.snapshot_sha256:
        raise CodingTaskUnavailable(
            f"{where} at {path} has sha256 {digest}, the task pins {task.snapshot_sha256}"
        )
    return path


def coding_task_files(dataset_id: str, task_id: str, datasets_root: Path) -> CodingTaskFiles:
    """A coding task of a registered dataset and its snapshot, verified (see the module
    docstring); CodingTaskUnavailable otherwise. Reads and hashes every time: a stage that
    opens many tasks keeps a :class:`CodingTasks`."""
    manifest = _coding_manifest(dataset_id, datasets_root)
    task, bundle_dir = _find_task(manifest, bundle_root(manifest, datasets_root), task_id)
    return CodingTaskFiles(dataset_id, task, _checked_snapshot(dataset_id, task, bundle_dir))


class CodingTasks:
    """:func:`coding_task_files` with a bounded per-process cache, keyed by dataset, task and
    bundle hash; a cached snapshot is hashed again when its file's stamp changed. Safe to share
    between threads: the lock guards the cache alone, so reading a tasks file and hashing a
    snapshot on one thread's miss never hold up another thread's hit."""

    def __init__(self, datasets_root: Path, max_tasks: int = DEFAULT_CACHED_TASKS) -> None:
        self.datasets_root = datasets_root
        self.max_tasks = max_tasks
        self._known: OrderedDict[tuple[str, str, str], tuple[CodingTaskFiles, _FileStamp]] = (
            OrderedDict()
        )
        self._lock = threading.Lock()

    def _cached(self, key: tuple[str, str, str]) -> CodingTaskFiles | None:
        with self._lock:
            known = self._known.get(key)
        if known is None or _stamp(known[0].snapshot) != known[1]:
            return None
        with self._lock:
            if key in self._known:
                self._known.move_to_end(key)
        return known[0]

    def files(self, dataset_id: str, task_id: str) -> CodingTaskFiles:
        manifest = _coding_manifest(dataset_id, self.datasets_root)
        key = (dataset_id, task_id, bundle_hash(manifest))
        cached = self._cached(key)
        if cached is not None:
            return cached
        root = bundle_root(manifest, self.datasets_root)
        task, bundle_dir = _find_task(manifest, root, task_id)
        stamp = _stamp(bundle_dir / task.snapshot)
        found = CodingTaskFiles(dataset_id, task, _checked_snapshot(dataset_id, task, bundle_dir))
        if stamp is None or stamp != _stamp(found.snapshot):
            # Only a snapshot that did not change while it was hashed is remembered.
            return found
        with self._lock:
            # Another thread may have missed the same task meanwhile: the first entry stays, so
            # every thread holds the same files.
            known = self._known.get(key)
            if known is not None and known[1] == stamp:
                found = known[0]
            else:
                self._known[key] = (found, stamp)
            self._known.move_to_end(key)
            while len(self._known) > self.max_tasks:
                self._known.popitem(last=False)
        return found
