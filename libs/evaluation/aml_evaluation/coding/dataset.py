"""A coding bundle as a registry dataset (format ``coding``, SPEC R-2.5): the parser the registry
hands a coding bundle's verified files to, so that planning, progress, isolation and results
treat the coding track's attempts like any other dataset's questions.

**Files.** A coding manifest lists the bundle's ``tasks.jsonl``, ``trajectories.jsonl`` and
``conditions.json``, all in one directory (the bundle's), each pinned by sha256. The repository
snapshots are not listed: each task pins its own by ``snapshot_sha256`` (a path relative to the
bundle's directory), and since they can be gigabytes they are never read here. They are checked
(present, pinned, safe) when the bundle is registered and whenever a stage opens one
(:mod:`aml_evaluation.coding.source`).

**Mapping** (what :func:`parse` returns, validated statically first: :func:`bundle_problems`):

- one :class:`Conversation` per scope, task by task in the tasks file's order, relevant then
  noisy: ``conversation_id`` is the scope, ``<task>:<condition>`` (so its memory user is
  ``eval:<run>:<dataset>:<task>:<condition>``), speakers are the roles;
- one :class:`Session` per trajectory the scope holds, in the order they are written (oldest
  first, ties by id; never the conditions file's order): ``session_key`` is the trajectory's id,
  dated by its ``created_at``;
- one :class:`Turn` per trajectory turn, its role as ``speaker``, its content unchanged, its own
  time when the source dates it and its step's index (``coding-v1`` never splits a step);
- one :class:`Question` per scope, ``question_id`` the scope: the task's problem statement
  verbatim, category 1 ``relevant`` or 2 ``noisy``; its ``answer`` is the task's id, since the
  gold of an attempt is the task's hidden tests (read by the verify stage from the bundle,
  never sent), never an abstention; ``coding_task`` and ``task_type`` name the task.

The dataset's chunk rule is ``coding-v1`` (:attr:`Dataset.chunk_rule`), so the registry's
chunker writes its Adds as :mod:`aml_evaluation.coding.chunking` states that rule. Nothing
of the conditions file but which trajectories a scope holds reaches the dataset: relevance
labels are never sent.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import PurePosixPath
from typing import Final

from aml_evaluation.chunker import CODING_CHUNKER_VERSION
from aml_evaluation.coding.bundle import (
    BUNDLE_FILES,
    CONDITIONS,
    TASKS_FILE,
    CodingBundle,
    CodingBundleError,
    CodingTask,
    Condition,
    Trajectory,
    bundle_problems,
    parse_coding_files,
)
from aml_evaluation.coding.chunking import scope_key, unix_ms
from aml_evaluation.datasets import BundleManifest, Conversation, Dataset, Question, Session, Turn
from aml_evaluation.scoring import CODING_SCORER

# The categories are the memory conditions (the score's categories, R-2.5).
CODING_CATEGORIES: Final[Mapping[int, str]] = {
    number: condition for number, condition in enumerate(CONDITIONS, start=1)
}
# The Search top_k of every coding question; registration writes it into the manifest.
CODING_TOP_K: Final = 100
CODING_TRACK: Final = "coding"
ROLES: Final = ("user", "assistant")


def bundle_directory(paths: Sequence[str]) -> str:
    """The one directory the manifest's files are in (POSIX, relative to the bundle root; "."
    for the root itself); ValueError unless they are exactly the bundle's three files there."""
    names = [PurePosixPath(path).name for path in paths]
    if sorted(names) != sorted(BUNDLE_FILES):
        raise ValueError(
            f"a coding bundle lists exactly {', '.join(BUNDLE_FILES)}, not {', '.join(names)}"
        )
    directories = {str(PurePosixPath(path).parent) for path in paths}
    if len(directories) != 1:
        raise ValueError(f"a coding bundle's files are in one directory, not {sorted(directories)}")
    return directories.pop()


def coding_bundle_of(contents: Sequence[tuple[str, bytes]]) -> CodingBundle:
    """The bundle of a manifest's verified contents, statically valid (CodingBundleError lists
    every problem; its snapshots are not read)."""
    bundle_directory([path for path, _ in contents])
    bundle = parse_coding_files({PurePosixPath(path).name: data for path, data in contents})
    problems = bundle_problems(bundle)
    if problems:
        raise CodingBundleError(problems)
    return bundle


def tasks_entry_path(paths: Sequence[str]) -> str:
    """Of a coding manifest's file paths, the tasks file's."""
    bundle_directory(paths)
    return next(path for path in paths if PurePosixPath(path).name == TASKS_FILE)


def _turns(trajectory: Trajectory) -> list[Turn]:
    return [
        Turn(
            turn_id=f"{trajectory.trajectory_id}:s{step_index}:t{turn_index}",
            speaker=turn.role,
            text=turn.content,
            step=step_index,
            timestamp_ms=None if turn.timestamp is None else unix_ms(turn.timestamp),
        )
        for step_index, step in enumerate(trajectory.steps)
        for turn_index, turn in enumerate(step.turns)
    ]


def _session(index: int, trajectory: Trajectory) -> Session:
    return Session(
        session_key=trajectory.trajectory_id,
        index=index,
        date_text=trajectory.created_at.isoformat(),
        timestamp_ms=unix_ms(trajectory.created_at),
        turns=_turns(trajectory),
    )


def _scope(bundle: CodingBundle, task: CodingTask, condition: Condition) -> Conversation:
    return Conversation(
        conversation_id=scope_key(task.task_id, condition),
        speakers=ROLES,
        speakers_are_roles=True,
        sessions=[
            _session(index, trajectory)
            for index, trajectory in enumerate(bundle.scope(task.task_id, condition), start=1)
        ],
    )


def _question(task: CodingTask, number: int, condition: Condition) -> Question:
    scope = scope_key(task.task_id, condition)
    return Question(
        question_id=scope,
        conversation_id=scope,
        question=task.problem_statement,
        answer=task.task_id,
        category=number,
        category_name=condition,
        evidence=[],
        adversarial=False,
        coding_task=task.task_id,
        task_type=task.task_type,
    )


def coding_dataset(bundle: CodingBundle, manifest: BundleManifest) -> Dataset:
    """The dataset of a statically valid bundle (see the module docstring)."""
    if manifest.scorer != CODING_SCORER:
        raise ValueError(f"a coding dataset is scored by {CODING_SCORER}, not {manifest.scorer!r}")
    if manifest.categories and dict(manifest.categories) != CODING_CATEGORIES:
        raise ValueError(
            f"a coding dataset's categories are the conditions, {dict(CODING_CATEGORIES)}"
        )
    numbered = list(enumerate(CONDITIONS, start=1))
    return Dataset(
        dataset_id=manifest.dataset_id,
        version=manifest.version,
        categories=dict(CODING_CATEGORIES),
        scorer=CODING_SCORER,
        f1_variant=manifest.f1_variant,
        track=CODING_TRACK,
        chunk_rule=CODING_CHUNKER_VERSION,
        conversations=[
            _scope(bundle, task, condition) for task in bundle.tasks for _, condition in numbered
        ],
        questions=[
            _question(task, number, condition)
            for task in bundle.tasks
            for number, condition in numbered
        ],
    )


def parse(contents: Sequence[tuple[str, bytes]], manifest: BundleManifest) -> Dataset:
    """The registry's parser of format ``coding``: the manifest's three files, verified."""
    return coding_dataset(coding_bundle_of(contents), manifest)
