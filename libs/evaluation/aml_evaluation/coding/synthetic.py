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

**Shipped.** The materialised bundle is package data too, ``data/synthetic_coding/bundle/``
(its three files and its snapshots, some 75 KB), and ``data/manifests/synthetic-coding.json``
pins it (``location: package``), so every process reads the same verified bytes and nothing is
written at run time: the datasets root is read-only where the services run, and a snapshot's
sha256 depends on the zlib that compressed it. Both are written from the sources here by
``python -m aml_evaluation.coding.synthetic``; ``--check`` (run by the unit tests) exits 1 when
they are not what the sources give.
"""

from __future__ import annotations

import argparse
import hashlib
import shutil
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Annotated, Final

from pydantic import AwareDatetime, BaseModel, ConfigDict, Field, TypeAdapter

from aml_evaluation.coding.bundle import (
    BUNDLE_FILES,
    SNAPSHOT_SUFFIX,
    SNAPSHOTS_DIR,
    CodingBundle,
    CodingTask,
    Conditions,
    Id,
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
from aml_evaluation.coding.dataset import CODING_CATEGORIES, CODING_TOP_K, CODING_TRACK
from aml_evaluation.coding.grading import LogFormat
from aml_evaluation.registration import manifest_json
from aml_evaluation.registry import (
    MANIFESTS_DIR,
    DatasetManifest,
    ManifestFile,
    count_questions,
    parse_contents,
)
from aml_evaluation.scoring import CODING_SCORER

SYNTHETIC_CODING_ID: Final = "synthetic-coding"
SYNTHETIC_CODING_DIR: Final = Path(__file__).resolve().parents[1] / "data" / "synthetic_coding"
SOURCE_SUFFIX: Final = ".txt"
SYNTHETIC_CODING_VERSION: Final = "v1"
# The shipped bundle, relative to the package data dir (its manifest's paths) and on disk.
SHIPPED_BUNDLE: Final = "synthetic_coding/bundle"
SHIPPED_BUNDLE_DIR: Final = SYNTHETIC_CODING_DIR / "bundle"
SHIPPED_MANIFEST: Final = MANIFESTS_DIR / f"{SYNTHETIC_CODING_ID}.json"


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


def synthetic_coding_manifest(bundle_dir: Path = SHIPPED_BUNDLE_DIR) -> DatasetManifest:
    """The shipped manifest of a materialised bundle: its three files pinned as package data
    under :data:`SHIPPED_BUNDLE`, its questions counted."""
    contents = [
        (f"{SHIPPED_BUNDLE}/{name}", (bundle_dir / name).read_bytes())
        for name in sorted(BUNDLE_FILES)
    ]
    manifest = DatasetManifest(
        dataset_id=SYNTHETIC_CODING_ID,
        version=SYNTHETIC_CODING_VERSION,
        format="coding",
        track=CODING_TRACK,
        scorer=CODING_SCORER,
        categories=dict(CODING_CATEGORIES),
        search_top_k=CODING_TOP_K,
        location="package",
        files=[
            ManifestFile(path=path, sha256=hashlib.sha256(data).hexdigest())
            for path, data in contents
        ],
    )
    counts = count_questions(parse_contents(contents, manifest))
    return manifest.model_copy(update={"question_counts": counts})


def _tree(root: Path) -> dict[str, bytes]:
    return {
        path.relative_to(root).as_posix(): path.read_bytes()
        for path in sorted(root.rglob("*"))
        if path.is_file()
    }


def shipped_differences(source: Path = SYNTHETIC_CODING_DIR) -> list[str]:
    """How the shipped bundle and manifest differ from what the sources give (empty: not at
    all): files missing, extra or with other bytes."""
    with tempfile.TemporaryDirectory(prefix="aml-synthetic-coding-") as work:
        fresh = Path(work) / "bundle"
        materialise_synthetic_coding(fresh, source)
        expected = _tree(fresh)
        expected_manifest = manifest_json(synthetic_coding_manifest(fresh)).encode("utf-8")
    found = _tree(SHIPPED_BUNDLE_DIR) if SHIPPED_BUNDLE_DIR.is_dir() else {}
    problems = [
        f"{SHIPPED_BUNDLE}/{name}: "
        + ("missing" if name not in found else "extra" if name not in expected else "differs")
        for name in sorted({*expected, *found})
        if expected.get(name) != found.get(name)
    ]
    shipped = SHIPPED_MANIFEST.read_bytes() if SHIPPED_MANIFEST.is_file() else None
    if shipped != expected_manifest:
        problems.append(f"{SHIPPED_MANIFEST.name}: {'differs' if shipped else 'missing'}")
    return problems


def write_shipped(source: Path = SYNTHETIC_CODING_DIR) -> None:
    """Write the shipped bundle and its manifest from the sources (see the module docstring)."""
    shutil.rmtree(SHIPPED_BUNDLE_DIR, ignore_errors=True)
    materialise_synthetic_coding(SHIPPED_BUNDLE_DIR, source)
    SHIPPED_MANIFEST.write_text(manifest_json(synthetic_coding_manifest()), encoding="utf-8")


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m aml_evaluation.coding.synthetic",
        description="write the shipped synthetic-coding bundle and manifest from the sources",
    )
    parser.add_argument("--check", action="store_true", help="exit 1 if they are out of date")
    args = parser.parse_args(argv)
    if not args.check:
        write_shipped()
        print(f"wrote {SHIPPED_BUNDLE_DIR} and {SHIPPED_MANIFEST}")
        return 0
    problems = shipped_differences()
    for problem in problems:
        print(f"out of date: {problem}", file=sys.stderr)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
