"""``synthetic-coding``: AML's own small coding dataset, shipped as package data
(``data/synthetic_coding/``), materialised as a coding bundle by
:func:`materialise_synthetic_coding`.

**What it holds.** Three tiny pure-Python repositories (``tally``: money amounts and a ledger;
``almanac``: date, period and duration labels; ``knobs``: layered settings and a command line),
each with ``tests/`` run by ``python3 -m unittest -v`` on the standard library alone, and eight
tasks on them, debug and development. Each task's fix depends on a project convention that only
its relevant trajectory states (verbatim: the task's :attr:`StandInHints.convention`); the
problem statement does not state it and the snapshot does not show it. Every trajectory is a
past session on the task's repository, dated before the task. A task's noisy condition holds its
relevant trajectory and three more from the same repository that share its vocabulary but not
its convention (pure distractors, or other tasks' relevant sessions).

**Files.** ``tasks.json`` lists the tasks without their patches and snapshots; each task's
hidden test changes, gold patch and plausible wrong patch are ``patches/<task>/test.diff``,
``gold.diff`` and ``wrong.diff``; ``trajectories.json`` (a JSON list of
:class:`~aml_evaluation.coding.bundle.Trajectory`) and ``conditions.json`` are in bundle form. A
repository's source tree is ``repos/<repo>/``, every file stored with ``.txt`` appended, so
that the platform's linters, type checker and test collector never take the benchmark's code
for the platform's; its snapshot is the tree without the suffix, archived deterministically as
``snapshots/<repo>.tar.gz``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Final

from pydantic import AwareDatetime, BaseModel, ConfigDict, Field, TypeAdapter

from aml_evaluation.coding.bundle import (
    SNAPSHOT_SUFFIX,
    SNAPSHOTS_DIR,
    CodingBundle,
    CodingTask,
    Conditions,
    Id,
    LogFormat,
    RepoName,
    StandInHints,
    TaskType,
    TestId,
    Text,
    Trajectory,
    archive_files,
    load_coding_bundle,
    write_coding_bundle,
)

SYNTHETIC_CODING_ID: Final = "synthetic-coding"
SYNTHETIC_CODING_DIR: Final = Path(__file__).resolve().parents[1] / "data" / "synthetic_coding"
SOURCE_SUFFIX: Final = ".txt"


class SyntheticTaskSpec(BaseModel):
    """A task as ``tasks.json`` writes it: a CodingTask without patches and snapshot."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    task_id: Id
    repo: RepoName
    task_type: TaskType
    created_at: AwareDatetime
    problem_statement: Text
    test_command: Text
    log_format: LogFormat
    fail_to_pass: Annotated[list[TestId], Field(min_length=1)]
    pass_to_pass: list[TestId]
    convention: Text


def repository_files(repo: str, source: Path = SYNTHETIC_CODING_DIR) -> dict[str, bytes]:
    """A shipped repository's files by path relative to its root, the ``.txt`` suffix removed."""
    root = source / "repos" / repo
    if not root.is_dir():
        raise ValueError(f"synthetic-coding has no repository {repo!r}")
    return {
        path.relative_to(root).as_posix().removesuffix(SOURCE_SUFFIX): path.read_bytes()
        for path in sorted(root.rglob(f"*{SOURCE_SUFFIX}"))
        if path.is_file()
    }


def _patch(source: Path, task_id: str, kind: str) -> str:
    return (source / "patches" / task_id / f"{kind}.diff").read_text(encoding="utf-8")


def materialise_synthetic_coding(
    destination: Path, source: Path = SYNTHETIC_CODING_DIR
) -> CodingBundle:
    """Write synthetic-coding as a coding bundle under `destination` (snapshots built
    deterministically) and return it as :func:`load_coding_bundle` reads and validates it."""
    specs = TypeAdapter(list[SyntheticTaskSpec]).validate_json((source / "tasks.json").read_bytes())
    trajectories = TypeAdapter(list[Trajectory]).validate_json(
        (source / "trajectories.json").read_bytes()
    )
    conditions = Conditions.model_validate_json((source / "conditions.json").read_bytes())
    snapshots: dict[str, tuple[str, str]] = {}
    for repo in sorted({spec.repo for spec in specs}):
        relative = f"{SNAPSHOTS_DIR}/{repo}{SNAPSHOT_SUFFIX}"
        digest = archive_files(repository_files(repo, source), destination / relative)
        snapshots[repo] = (relative, digest)
    tasks = [
        CodingTask(
            task_id=spec.task_id,
            repo=spec.repo,
            snapshot=snapshots[spec.repo][0],
            snapshot_sha256=snapshots[spec.repo][1],
            problem_statement=spec.problem_statement,
            test_patch=_patch(source, spec.task_id, "test"),
            gold_patch=_patch(source, spec.task_id, "gold"),
            test_command=spec.test_command,
            log_format=spec.log_format,
            fail_to_pass=spec.fail_to_pass,
            pass_to_pass=spec.pass_to_pass,
            task_type=spec.task_type,
            created_at=spec.created_at,
            stand_in=StandInHints(
                convention=spec.convention, wrong_patch=_patch(source, spec.task_id, "wrong")
            ),
        )
        for spec in specs
    ]
    write_coding_bundle(
        CodingBundle(tasks=tasks, trajectories=trajectories, conditions=conditions), destination
    )
    return load_coding_bundle(destination)
