"""The coding dataset bundle (SPEC R-2.3, R-2.5; `aml dataset add --format coding`): its models,
its bounded reading, its static validation, and deterministic repository snapshots.

**Layout.** A bundle is a directory::

    tasks.jsonl          one CodingTask per line (JSON object), in the dataset's order
    trajectories.jsonl   one Trajectory per line: every historical trajectory of the bundle
    conditions.json      {task_id: {"relevant": [trajectory ids], "noisy": [trajectory ids]}}
    snapshots/*.tar.gz   the repository snapshots the tasks name (gzip'd tar, see below)

Blank lines in the ``.jsonl`` files are ignored. Every model forbids unknown fields: a typo in a
field name is an error, never a silently missing value.

**What a participant sees.** Only trajectory turns are ever sent (:mod:`.chunking`). The
conditions file is the relevance label and stays on the platform; so do a task's hidden
``test_patch``, its ``gold_patch`` and the optional :class:`StandInHints`, which exist for the
local scripted coding agent of the tests (the convention its relevant trajectory states, and a
plausible patch that misses it) and are never put in any prompt of the real coding agent.

**Snapshots.** A task's ``snapshot`` is the path, relative to the bundle, of a ``.tar.gz`` whose
members are the repository's files at the task's base, relative to the repository root, pinned
by ``snapshot_sha256``. A snapshot holds no ``.git`` (a repository's history can hold the fix)
and only regular files, directories and symlinks that stay inside the tree: no absolute or
``..`` paths, no hard links, devices or fifos, no setuid/setgid/sticky bits, no name twice,
no path through a symlink (:func:`member_refusal`, which the sandbox applies too).
:func:`build_snapshot_archive` and :func:`archive_files` write one deterministically (members
sorted, mtime 0, uid/gid 0, no owner names, normalised modes, gzip header without name or
time): the same tree gives the same sha256 on any machine with the same zlib deflate output
(stock zlib; a zlib-ng build may compress differently, which changes the hash, not the files).

**Caps** (:class:`BundleLimits`, the defaults documented there): every file is read with a
bound, so a hostile bundle (a 1 GB line, a million tasks, a gzip bomb) fails with an error
naming the file and line, without exhausting memory.

**Static validation** (:func:`bundle_problems`, :func:`snapshot_problems`, run by
:func:`load_coding_bundle`): ids distinct, conditions naming known tasks and trajectories, both
conditions of every task non-empty, no trajectory dated after a task whose scope holds it, test
lists non-overlapping, patches that parse and change disjoint files, snapshots present, pinned
and safe. Whether the tests really fail without a patch and pass with the gold patch needs the
sandbox: :mod:`.validation`.
"""

from __future__ import annotations

import gzip
import hashlib
import io
import posixpath
import re
import stat
import tarfile
from collections import Counter
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from itertools import pairwise
from pathlib import Path, PurePosixPath
from typing import IO, Annotated, Final, Literal, TypeVar, get_args

from pydantic import (
    AwareDatetime,
    BaseModel,
    ConfigDict,
    Field,
    RootModel,
    StringConstraints,
    ValidationError,
    field_validator,
    model_validator,
)

from aml_evaluation.coding.grading import LogFormat

TASKS_FILE: Final = "tasks.jsonl"
TRAJECTORIES_FILE: Final = "trajectories.jsonl"
CONDITIONS_FILE: Final = "conditions.json"
SNAPSHOTS_DIR: Final = "snapshots"
SNAPSHOT_SUFFIX: Final = ".tar.gz"
# The files a bundle's manifest lists (the snapshots are pinned by the tasks, not listed).
BUNDLE_FILES: Final = (TASKS_FILE, TRAJECTORIES_FILE, CONDITIONS_FILE)

TaskType = Literal["debug", "development"]
Role = Literal["user", "assistant", "tool"]
Condition = Literal["relevant", "noisy"]
CONDITIONS: Final[tuple[Condition, ...]] = get_args(Condition)

# A step is never split across Adds (.chunking), so it must fit an Add's message limit
# (SPEC; aml_evaluation.chunker.MAX_MESSAGES).
MAX_STEP_TURNS: Final = 20
MAX_STEPS: Final = 10_000
MAX_TURN_CHARS: Final = 1_000_000
MAX_PATCH_CHARS: Final = 8_000_000
MAX_TEXT_CHARS: Final = 1_000_000
MAX_TESTS: Final = 100_000
MAX_TEST_ID_CHARS: Final = 1_000
MAX_MEMBER_PATH_CHARS: Final = 4_096
# Words sent to a participant as ids (trajectory ids become session ids) must not say which
# condition a trajectory serves.
_LABEL_WORDS: Final = ("relevant", "noisy", "distractor", "gold")
_MIB: Final = 1024 * 1024

# Ids become parts of memory ids (`eval:<run>:<dataset>:<task>:<condition>`): no ':' or spaces.
Id = Annotated[str, StringConstraints(pattern=r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,199}$")]
RepoName = Annotated[
    str, StringConstraints(pattern=r"^[A-Za-z0-9][A-Za-z0-9_.-]*(/[A-Za-z0-9][A-Za-z0-9_.-]*)?$")
]
Sha256 = Annotated[str, StringConstraints(pattern=r"^[0-9a-f]{64}$")]
Text = Annotated[str, StringConstraints(min_length=1, max_length=MAX_TEXT_CHARS)]
Patch = Annotated[str, StringConstraints(min_length=1, max_length=MAX_PATCH_CHARS)]
TestId = Annotated[
    str, StringConstraints(min_length=1, max_length=MAX_TEST_ID_CHARS, pattern=r"^[^\r\n]+$")
]
# A `python3 -m unittest -v` line under Python 3.11 names a test `method (module.Class.method)`.
_UNITTEST_ID: Final = re.compile(r"(?P<method>[^\s()]+) \((?P<path>[A-Za-z_][\w.]*)\)")
_DIFF_GIT: Final = re.compile(r"diff --git a/(\S+) b/(\S+)")
_READ_BLOCK: Final = 1 << 20


class CodingBundleError(ValueError):
    """A coding bundle is refused; ``problems`` lists every reason found (at least one)."""

    def __init__(self, problems: Sequence[str]) -> None:
        shown = "; ".join(problems[:10])
        more = f" (and {len(problems) - 10} more)" if len(problems) > 10 else ""
        super().__init__(f"coding bundle refused: {shown}{more}")
        self.problems = list(problems)


@dataclass(frozen=True)
class BundleLimits:
    """What a bundle may hold at most; past a cap reading stops with a CodingBundleError.

    Sized for CAMBench Coding (150 tasks) and SWE-bench-scale repositories with room to spare:
    a trajectory is one line, and the largest SWEContextBench trajectories are a few MB."""

    max_line_bytes: int = 32 * _MIB
    max_tasks: int = 10_000
    max_tasks_file_bytes: int = 256 * _MIB
    max_trajectories: int = 100_000
    max_trajectories_file_bytes: int = 1024 * _MIB
    max_conditions_file_bytes: int = 64 * _MIB
    max_scope_trajectories: int = 1_000
    max_snapshot_bytes: int = 2048 * _MIB
    max_snapshot_members: int = 500_000
    max_snapshot_unpacked_bytes: int = 8192 * _MIB


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, strict=True)


class StandInHints(_Strict):
    """What the local scripted coding agent (tests only) needs of a task: the convention its
    relevant trajectory states verbatim, and a plausible patch that ignores it (passes what the
    problem statement shows, fails the hidden tests). Never sent, never in a real prompt."""

    convention: Text
    wrong_patch: Patch


class CodingTask(_Strict):
    task_id: Id
    repo: RepoName
    snapshot: str = Field(description="the snapshot archive, relative to the bundle")
    snapshot_sha256: Sha256
    base_commit: str | None = Field(default=None, description="provenance only")
    problem_statement: Text = Field(description="the Search query, verbatim")
    test_patch: Patch = Field(description="the hidden test changes (unified diff)")
    gold_patch: Patch
    test_command: Text = Field(description="run in the repository root")
    log_format: LogFormat
    fail_to_pass: Annotated[list[TestId], Field(min_length=1, max_length=MAX_TESTS)]
    pass_to_pass: Annotated[list[TestId], Field(max_length=MAX_TESTS)]
    task_type: TaskType
    created_at: AwareDatetime
    stand_in: StandInHints | None = None

    @field_validator("snapshot")
    @classmethod
    def _snapshot_in_the_bundle(cls, value: str) -> str:
        problem = unsafe_path(value)
        if problem is not None:
            raise ValueError(f"snapshot {value!r}: {problem}")
        if not value.endswith(SNAPSHOT_SUFFIX):
            raise ValueError(f"snapshot {value!r} is not a {SNAPSHOT_SUFFIX} archive")
        return value

    @model_validator(mode="after")
    def _tests_as_the_grader_keys_them(self) -> CodingTask:
        for test_id in [*self.fail_to_pass, *self.pass_to_pass]:
            problem = malformed_test_id(test_id, self.log_format)
            if problem is not None:
                raise ValueError(problem)
        return self


class Turn(_Strict):
    role: Role
    content: Annotated[
        str, StringConstraints(min_length=1, max_length=MAX_TURN_CHARS, pattern=r"\S")
    ]
    timestamp: AwareDatetime | None = None


class Step(_Strict):
    """One action of the trajectory with what it saw (e.g. the agent's command and its output):
    kept in one Add."""

    turns: Annotated[list[Turn], Field(min_length=1, max_length=MAX_STEP_TURNS)]


class Trajectory(_Strict):
    trajectory_id: Id
    repo: RepoName
    created_at: AwareDatetime
    steps: Annotated[list[Step], Field(min_length=1, max_length=MAX_STEPS)]

    @field_validator("trajectory_id")
    @classmethod
    def _says_nothing_of_its_condition(cls, value: str) -> str:
        words = [word for word in _LABEL_WORDS if word in value.lower()]
        if words:
            raise ValueError(
                f"trajectory id {value!r} contains {words[0]!r}: ids are sent to participants "
                "(session ids) and must not tell a trajectory's condition"
            )
        return value

    @model_validator(mode="after")
    def _turns_not_before_the_start(self) -> Trajectory:
        for turn in self.all_turns():
            if turn.timestamp is not None and turn.timestamp < self.created_at:
                raise ValueError(
                    f"a turn is dated {turn.timestamp.isoformat()}, before the trajectory's "
                    f"created_at {self.created_at.isoformat()}"
                )
        return self

    def all_turns(self) -> Iterator[Turn]:
        for step in self.steps:
            yield from step.turns

    @property
    def latest(self) -> datetime:
        """The latest date the trajectory carries (its start or a turn's)."""
        dated = [turn.timestamp for turn in self.all_turns() if turn.timestamp is not None]
        return max([self.created_at, *dated])


class TaskConditions(_Strict):
    relevant: list[Id]
    noisy: list[Id]

    def of(self, condition: Condition) -> list[str]:
        return self.relevant if condition == "relevant" else self.noisy


class Conditions(RootModel[dict[Id, TaskConditions]]):
    model_config = ConfigDict(frozen=True, strict=True)


class CodingBundle(_Strict):
    tasks: list[CodingTask]
    trajectories: list[Trajectory]
    conditions: Conditions

    def task(self, task_id: str) -> CodingTask:
        for task in self.tasks:
            if task.task_id == task_id:
                return task
        raise KeyError(f"unknown task {task_id!r}")

    def scope(self, task_id: str, condition: Condition) -> list[Trajectory]:
        """The trajectories a task's scope holds under a condition, oldest first (ties by id):
        the order never follows the conditions file, so it says nothing about relevance."""
        wanted = set(self.conditions.root[task_id].of(condition))
        held = [t for t in self.trajectories if t.trajectory_id in wanted]
        return sorted(held, key=lambda t: (t.created_at, t.trajectory_id))


# --- rules ------------------------------------------------------------------------------------


def unsafe_path(path: str) -> str | None:
    """Why a relative POSIX path could leave the directory it is resolved in (None: it can't)."""
    if not path or path.startswith("/") or "\\" in path or "\x00" in path:
        return "must be a relative POSIX path"
    if ".." in PurePosixPath(path).parts:
        return "must not contain '..'"
    return None


def malformed_test_id(test_id: str, log_format: LogFormat) -> str | None:
    """Why a test id is not keyed the way the grader reads a log of that format (None: it is)."""
    if log_format == "unittest":
        match = _UNITTEST_ID.fullmatch(test_id)
        if match is None or not match["path"].endswith(f".{match['method']}"):
            return (
                f"test id {test_id!r} is not a Python 3.11 `unittest -v` id, "
                "'method (module.Class.method)'"
            )
    elif "::" not in test_id:
        return f"test id {test_id!r} is not a pytest node id ('path::name')"
    return None


def _diff_path(header: str, prefix: str) -> str | None:
    """The path of a ``---``/``+++`` header's rest (None: /dev/null), its a/ or b/ removed."""
    name = header.split("\t", 1)[0].strip()
    if name == "/dev/null":
        return None
    return name.removeprefix(prefix)


def diff_file_pairs(diff: str) -> list[tuple[str | None, str | None]]:
    """(old path, new path) of each file a unified diff's ``---``/``+++`` headers name, in
    order; None for /dev/null (a file created or deleted). A header is a ``---`` line followed
    by a ``+++`` line, so hunk lines that start with those marks are not taken for one."""
    return [
        (_diff_path(first[4:], "a/"), _diff_path(second[4:], "b/"))
        for first, second in pairwise(diff.splitlines())
        if first.startswith("--- ") and second.startswith("+++ ")
    ]


def _diff_git_paths(line: str) -> set[str]:
    """The paths a ``diff --git a/OLD b/NEW`` line names: OLD and NEW when neither holds a space
    (a rename names two), else the one path both halves name (git writes a name with spaces
    unquoted, so only a line naming the same path twice can be split)."""
    line = line.rstrip("\r\n")
    named = _DIFF_GIT.fullmatch(line)
    if named is not None:
        return set(named.groups())
    rest = line.removeprefix("diff --git ")
    if rest != line and len(rest) % 2 == 1:
        old, new = rest[: len(rest) // 2], rest[len(rest) // 2 + 1 :]
        if old.startswith("a/") and new.startswith("b/") and old[2:] == new[2:]:
            return {old[2:]}
    return set()


@dataclass(frozen=True)
class DiffSection:
    """One file's part of a diff, from its ``diff --git`` line to the next one (the text before
    the first is a section of its own), and the paths it names: its ``---``/``+++`` headers'
    and its ``diff --git`` line's (a binary or mode-only change has only the latter)."""

    text: str
    paths: frozenset[str]


def diff_sections(diff: str) -> list[DiffSection]:
    """A diff split at each file's ``diff --git`` line, in order; joined, the sections' texts
    are the diff."""
    texts: list[str] = []
    current: list[str] = []
    for line in diff.splitlines(keepends=True):
        if line.startswith("diff --git ") and current:
            texts.append("".join(current))
            current = []
        current.append(line)
    if current:
        texts.append("".join(current))
    return [
        DiffSection(
            text,
            frozenset(
                {name for pair in diff_file_pairs(text) for name in pair if name is not None}
                | _diff_git_paths(text.split("\n", 1)[0])
            ),
        )
        for text in texts
    ]


def diff_paths(diff: str) -> set[str]:
    """Every repository path a diff's file headers name (old and new names)."""
    return {path for section in diff_sections(diff) for path in section.paths}


def patch_files(diff: str) -> list[str]:
    """The repository paths a unified diff changes (old and new names), sorted; ValueError when
    it changes none or names an unsafe path."""
    found = diff_paths(diff)
    if not found:
        raise ValueError("is not a unified diff (no file headers)")
    for name in sorted(found):
        problem = unsafe_path(name)
        if problem is not None:
            raise ValueError(f"changes {name!r}, which {problem}")
    return sorted(found)


def _patch_problems(task: CodingTask) -> list[str]:
    problems: list[str] = []
    patches = {"test_patch": task.test_patch, "gold_patch": task.gold_patch}
    if task.stand_in is not None:
        patches["stand_in.wrong_patch"] = task.stand_in.wrong_patch
    files: dict[str, list[str]] = {}
    for name, diff in patches.items():
        try:
            files[name] = patch_files(diff)
        except ValueError as error:
            problems.append(f"task {task.task_id!r}: {name} {error}")
    tests = set(files.get("test_patch", []))
    for name in ("gold_patch", "stand_in.wrong_patch"):
        shared = sorted(tests & set(files.get(name, [])))
        if shared:
            problems.append(
                f"task {task.task_id!r}: {name} and test_patch both change {shared[0]!r}"
            )
    if task.stand_in is not None and task.stand_in.wrong_patch == task.gold_patch:
        problems.append(f"task {task.task_id!r}: stand_in.wrong_patch is the gold patch")
    return problems


def _test_list_problems(task: CodingTask) -> list[str]:
    problems: list[str] = []
    for name, tests in (("fail_to_pass", task.fail_to_pass), ("pass_to_pass", task.pass_to_pass)):
        twice = sorted(test for test, count in Counter(tests).items() if count > 1)
        if twice:
            problems.append(f"task {task.task_id!r}: {name} lists {twice[0]!r} twice")
    overlap = sorted(set(task.fail_to_pass) & set(task.pass_to_pass))
    if overlap:
        problems.append(
            f"task {task.task_id!r}: {overlap[0]!r} is in both fail_to_pass and pass_to_pass"
        )
    return problems


def _duplicates(ids: Iterable[str]) -> list[str]:
    return sorted(item for item, count in Counter(ids).items() if count > 1)


def _condition_problems(
    task: CodingTask,
    lists: TaskConditions,
    trajectories: Mapping[str, Trajectory],
    limits: BundleLimits,
) -> list[str]:
    problems: list[str] = []
    for condition in CONDITIONS:
        ids = lists.of(condition)
        where = f"task {task.task_id!r} condition {condition!r}"
        if not ids:
            problems.append(f"{where} holds no trajectory")
        if len(ids) > limits.max_scope_trajectories:
            problems.append(
                f"{where} holds {len(ids)} trajectories, more than {limits.max_scope_trajectories}"
            )
        problems += [f"{where} lists {item!r} twice" for item in _duplicates(ids)]
        for trajectory_id in dict.fromkeys(ids):
            trajectory = trajectories.get(trajectory_id)
            if trajectory is None:
                problems.append(f"{where}: unknown trajectory {trajectory_id!r}")
            elif trajectory.latest > task.created_at:
                problems.append(
                    f"{where}: trajectory {trajectory_id!r} is dated "
                    f"{trajectory.latest.isoformat()}, after the task's created_at "
                    f"{task.created_at.isoformat()}"
                )
    return problems


def bundle_problems(bundle: CodingBundle, limits: BundleLimits | None = None) -> list[str]:
    """Everything wrong with a bundle's contents (no file is read), in a stable order."""
    limits = limits or BundleLimits()
    problems = [
        f"task {item!r} is given twice" for item in _duplicates(t.task_id for t in bundle.tasks)
    ]
    problems += [
        f"trajectory {item!r} is given twice"
        for item in _duplicates(t.trajectory_id for t in bundle.trajectories)
    ]
    trajectories = {t.trajectory_id: t for t in bundle.trajectories}
    conditions = bundle.conditions.root
    for task in bundle.tasks:
        problems += _test_list_problems(task)
        problems += _patch_problems(task)
        lists = conditions.get(task.task_id)
        if lists is None:
            problems.append(f"task {task.task_id!r} has no conditions")
        else:
            problems += _condition_problems(task, lists, trajectories, limits)
    known = {task.task_id for task in bundle.tasks}
    problems += [
        f"conditions name unknown task {item!r}" for item in conditions if item not in known
    ]
    return problems


# --- snapshots --------------------------------------------------------------------------------


def file_sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        while block := handle.read(_READ_BLOCK):
            digest.update(block)
    return digest.hexdigest()


def member_parts(name: str) -> tuple[str, ...]:
    """A member name as path components, without empty and ``.`` components (``./src//a.py`` is
    ``("src", "a.py")``)."""
    return tuple(part for part in name.split("/") if part not in ("", "."))


def member_refusal(
    member: tarfile.TarInfo, earlier: Mapping[tuple[str, ...], tarfile.TarInfo]
) -> str | None:
    """Why a snapshot member must not be unpacked, given the members before it (keyed by
    :func:`member_parts`), worded to follow "member NAME is"; None when it may be.

    Registration checks a bundle's archives with it and the sandbox checks each archive again
    before unpacking it, with this one rule: a snapshot the sandbox would refuse is never
    registered."""
    name = member.name
    parts = member_parts(name)
    if len(name) > MAX_MEMBER_PATH_CHARS:
        return f"a path longer than {MAX_MEMBER_PATH_CHARS} characters"
    if not name:
        return "an empty name"
    if name.startswith("/"):
        return "an absolute path, not a relative POSIX path"
    if "\\" in name or "\x00" in name:
        return "not a relative POSIX path (it holds a backslash or NUL)"
    if ".." in parts:
        return "a '..' component"
    if ".git" in parts:
        return "repository history (.git): git metadata, which snapshots never carry"
    # Even one to an earlier file: hard links only alias what the tree already holds, and the
    # archives the platform writes never have one.
    if member.islnk():
        return "a hard link, not a regular file, directory or symlink"
    if not (member.isreg() or member.isdir() or member.issym()):
        return "a device, FIFO or other special file, not a regular file, directory or symlink"
    if member.mode & (stat.S_ISUID | stat.S_ISGID | stat.S_ISVTX):
        return "a file with a setuid, setgid or sticky bit"
    if not parts:
        return None if member.isdir() else "an empty name"
    if parts in earlier:
        return "given twice (a duplicate name)"
    for depth in range(1, len(parts)):
        parent = earlier.get(parts[:depth])
        if parent is not None and (parent.issym() or parent.islnk()):
            return "a path through a link"
    if member.issym():
        target = member.linkname
        if not target:
            return "a symlink with no target"
        if target.startswith("/"):
            return f"a symlink to an absolute path, which points outside the snapshot ({target!r})"
        resolved = posixpath.normpath(posixpath.join(*parts[:-1], target))
        if resolved == ".." or resolved.startswith("../"):
            return f"a symlink that points outside the snapshot ({target!r})"
        if ".git" in member_parts(resolved):
            return "a symlink into git metadata"
    return None


def archive_problems(path: Path, limits: BundleLimits | None = None) -> list[str]:
    """Why a snapshot archive is unsafe or unreadable (empty: it is fine). Read as a stream:
    memory stays bounded whatever the archive unpacks to."""
    limits = limits or BundleLimits()
    try:
        size = path.stat().st_size
    except OSError as error:
        return [f"cannot be read: {error.strerror}"]
    if size > limits.max_snapshot_bytes:
        return [f"is {size} bytes, more than {limits.max_snapshot_bytes}"]
    problems: list[str] = []
    seen: dict[tuple[str, ...], tarfile.TarInfo] = {}
    unpacked = 0
    try:
        with tarfile.open(path, mode="r|gz") as archive:
            for count, member in enumerate(archive, start=1):
                if count > limits.max_snapshot_members:
                    return [*problems, f"has more than {limits.max_snapshot_members} members"]
                problem = member_refusal(member, seen)
                if problem is not None:
                    name = member.name
                    shown = name if len(name) <= MAX_MEMBER_PATH_CHARS else f"{name[:80]}..."
                    problems.append(f"member {shown!r} is {problem}")
                seen[member_parts(member.name)] = member
                unpacked += member.size
                if unpacked > limits.max_snapshot_unpacked_bytes:
                    return [
                        *problems,
                        f"unpacks to more than {limits.max_snapshot_unpacked_bytes} bytes",
                    ]
    except (tarfile.TarError, OSError, EOFError, gzip.BadGzipFile) as error:
        return [*problems, f"is not a readable .tar.gz ({type(error).__name__}: {error})"]
    if not seen:
        problems.append("is empty")
    return problems


def snapshot_problems(
    root: Path, tasks: Sequence[CodingTask], limits: BundleLimits | None = None
) -> list[str]:
    """Every task's snapshot is in the bundle, has its pinned sha256 and is safe (each distinct
    archive checked once)."""
    problems: list[str] = []
    checked: dict[str, tuple[str | None, list[str]]] = {}
    for task in tasks:
        if task.snapshot not in checked:
            path = root / task.snapshot
            if not path.is_file():
                checked[task.snapshot] = (None, ["is missing"])
            else:
                checked[task.snapshot] = (file_sha256(path), archive_problems(path, limits))
        digest, found = checked[task.snapshot]
        where = f"task {task.task_id!r}: snapshot {task.snapshot!r}"
        problems += [f"{where} {problem}" for problem in found]
        if digest is not None and digest != task.snapshot_sha256:
            problems.append(f"{where} has sha256 {digest}, the task pins {task.snapshot_sha256}")
    return problems


def extract_snapshot(archive: Path, destination: Path, limits: BundleLimits | None = None) -> None:
    """Unpack a snapshot into an empty or new directory, after checking it (CodingBundleError)."""
    problems = archive_problems(archive, limits)
    if problems:
        raise CodingBundleError([f"snapshot {archive}: {problem}" for problem in problems])
    destination.mkdir(parents=True, exist_ok=True)
    with tarfile.open(archive, mode="r:gz") as opened:
        opened.extractall(destination, filter="data")


@dataclass(frozen=True)
class _Member:
    path: str
    kind: Literal["file", "dir", "symlink"]
    data: bytes = b""
    target: str = ""
    executable: bool = False


# Never archived from a source tree: history (it can hold the fix) and bytecode caches (they
# differ per machine and interpreter).
_NOT_ARCHIVED: Final = frozenset({".git", "__pycache__"})


def _tree_members(source: Path) -> list[_Member]:
    members: list[_Member] = []
    for path in sorted(source.rglob("*")):
        relative = path.relative_to(source)
        if _NOT_ARCHIVED & set(relative.parts):
            continue
        name = relative.as_posix()
        if path.is_symlink():
            target = path.readlink().as_posix()
            resolved = posixpath.normpath(posixpath.join(posixpath.dirname(name), target))
            if target.startswith("/") or resolved == ".." or resolved.startswith("../"):
                raise ValueError(f"{path} is a symlink out of the tree ({target})")
            members.append(_Member(name, "symlink", target=target))
        elif path.is_dir():
            members.append(_Member(name, "dir"))
        elif path.is_file():
            executable = bool(path.stat().st_mode & stat.S_IXUSR)
            members.append(_Member(name, "file", path.read_bytes(), executable=executable))
        else:
            raise ValueError(f"{path} is not a regular file, directory or symlink")
    return members


def _parent_dirs(paths: Iterable[str]) -> set[str]:
    return {str(parent) for path in paths for parent in PurePosixPath(path).parents} - {"."}


def _write_archive(members: Iterable[_Member], destination: Path) -> str:
    """Write the members as a deterministic .tar.gz (see the module docstring); its sha256."""
    ordered = sorted(members, key=lambda member: PurePosixPath(member.path).parts)
    buffer = io.BytesIO()
    with (
        gzip.GzipFile(filename="", mode="wb", fileobj=buffer, compresslevel=9, mtime=0) as zipped,
        tarfile.open(fileobj=zipped, mode="w", format=tarfile.PAX_FORMAT) as archive,
    ):
        for member in ordered:
            info = tarfile.TarInfo(member.path)
            info.mtime = 0
            info.uid = info.gid = 0
            info.uname = info.gname = ""
            content: io.BytesIO | None = None
            if member.kind == "dir":
                info.type, info.mode = tarfile.DIRTYPE, 0o755
            elif member.kind == "symlink":
                info.type, info.mode, info.linkname = tarfile.SYMTYPE, 0o777, member.target
            else:
                info.mode = 0o755 if member.executable else 0o644
                info.size = len(member.data)
                content = io.BytesIO(member.data)
            archive.addfile(info, content)
    data = buffer.getvalue()
    destination.parent.mkdir(parents=True, exist_ok=True)
    destination.write_bytes(data)
    return hashlib.sha256(data).hexdigest()


def build_snapshot_archive(source: Path, destination: Path) -> str:
    """Archive a source tree (without .git and __pycache__) deterministically; its sha256.
    ValueError for a symlink out of the tree or a special file."""
    if not source.is_dir():
        raise ValueError(f"{source} is not a directory")
    return _write_archive(_tree_members(source), destination)


def archive_files(
    files: Mapping[str, bytes], destination: Path, executables: Iterable[str] = ()
) -> str:
    """Archive {relative path: bytes} deterministically, with their parent directories; its
    sha256."""
    for name in files:
        problem = unsafe_path(name)
        if problem is not None or _NOT_ARCHIVED & set(PurePosixPath(name).parts):
            raise ValueError(f"cannot archive {name!r}: {problem or 'history or a cache'}")
    runnable = set(executables)
    members = [
        _Member(name, "file", data, executable=name in runnable) for name, data in files.items()
    ]
    members += [_Member(name, "dir") for name in _parent_dirs(files)]
    return _write_archive(members, destination)


# --- reading ----------------------------------------------------------------------------------

_Model = TypeVar("_Model", bound=BaseModel)


def _validation_text(error: ValidationError) -> str:
    shown = [
        f"{'.'.join(str(part) for part in item['loc']) or '(root)'}: {item['msg']}"
        for item in error.errors()[:5]
    ]
    more = f" (and {error.error_count() - 5} more)" if error.error_count() > 5 else ""
    return "; ".join(shown) + more


def _bounded_size(path: Path, max_bytes: int) -> None:
    try:
        size = path.stat().st_size
    except OSError as error:
        raise CodingBundleError([f"{path.name} cannot be read: {error.strerror}"]) from None
    if size > max_bytes:
        raise CodingBundleError([f"{path.name} is {size} bytes, more than {max_bytes}"])


def read_jsonl(
    path: Path, model: type[_Model], *, max_records: int, max_file_bytes: int, max_line_bytes: int
) -> Iterator[_Model]:
    """The records of a JSON Lines file, one model per non-blank line, read a line at a time with
    every line, the record count and the file bounded; CodingBundleError names file and line."""
    _bounded_size(path, max_file_bytes)
    with path.open("rb") as handle:
        yield from jsonl_records(
            handle, path.name, model, max_records=max_records, max_line_bytes=max_line_bytes
        )


def jsonl_records(
    handle: IO[bytes], name: str, model: type[_Model], *, max_records: int, max_line_bytes: int
) -> Iterator[_Model]:
    """:func:`read_jsonl` over an open binary stream (``name`` names it in errors)."""
    records = 0
    number = 0
    while line := handle.readline(max_line_bytes + 1):
        number += 1
        where = f"{name}:{number}"
        if len(line) > max_line_bytes:
            raise CodingBundleError([f"{where}: line longer than {max_line_bytes} bytes"])
        if not line.strip():
            continue
        records += 1
        if records > max_records:
            raise CodingBundleError([f"{where}: more than {max_records} records"])
        try:
            yield model.model_validate_json(line)
        except ValidationError as error:
            raise CodingBundleError([f"{where}: {_validation_text(error)}"]) from None


def read_tasks(path: Path, limits: BundleLimits | None = None) -> list[CodingTask]:
    limits = limits or BundleLimits()
    return list(
        read_jsonl(
            path,
            CodingTask,
            max_records=limits.max_tasks,
            max_file_bytes=limits.max_tasks_file_bytes,
            max_line_bytes=limits.max_line_bytes,
        )
    )


def read_trajectories(path: Path, limits: BundleLimits | None = None) -> Iterator[Trajectory]:
    """A bundle's trajectories a line at a time (a large bundle need not be held whole)."""
    limits = limits or BundleLimits()
    return read_jsonl(
        path,
        Trajectory,
        max_records=limits.max_trajectories,
        max_file_bytes=limits.max_trajectories_file_bytes,
        max_line_bytes=limits.max_line_bytes,
    )


def read_conditions(path: Path, limits: BundleLimits | None = None) -> Conditions:
    limits = limits or BundleLimits()
    _bounded_size(path, limits.max_conditions_file_bytes)
    try:
        conditions = Conditions.model_validate_json(path.read_bytes())
    except ValidationError as error:
        raise CodingBundleError([f"{path.name}: {_validation_text(error)}"]) from None
    if len(conditions.root) > limits.max_tasks:
        raise CodingBundleError([f"{path.name}: more than {limits.max_tasks} tasks"])
    return conditions


def _bounded_bytes(name: str, data: bytes, max_bytes: int) -> bytes:
    if len(data) > max_bytes:
        raise CodingBundleError([f"{name} is {len(data)} bytes, more than {max_bytes}"])
    return data


def parse_coding_files(
    files: Mapping[str, bytes], limits: BundleLimits | None = None
) -> CodingBundle:
    """A bundle from the bytes of its three files, by name (:data:`BUNDLE_FILES`), read with the
    same bounds as :func:`load_coding_bundle` and not validated yet (:func:`bundle_problems`):
    the dataset registry hands its parser bytes it has checked against the manifest."""
    limits = limits or BundleLimits()
    missing = [name for name in BUNDLE_FILES if name not in files]
    if missing:
        raise CodingBundleError([f"the bundle has no {name}" for name in missing])
    tasks = _bounded_bytes(TASKS_FILE, files[TASKS_FILE], limits.max_tasks_file_bytes)
    trajectories = _bounded_bytes(
        TRAJECTORIES_FILE, files[TRAJECTORIES_FILE], limits.max_trajectories_file_bytes
    )
    conditions = _bounded_bytes(
        CONDITIONS_FILE, files[CONDITIONS_FILE], limits.max_conditions_file_bytes
    )
    try:
        parsed = Conditions.model_validate_json(conditions)
    except ValidationError as error:
        raise CodingBundleError([f"{CONDITIONS_FILE}: {_validation_text(error)}"]) from None
    if len(parsed.root) > limits.max_tasks:
        raise CodingBundleError([f"{CONDITIONS_FILE}: more than {limits.max_tasks} tasks"])
    return CodingBundle(
        tasks=list(
            jsonl_records(
                io.BytesIO(tasks),
                TASKS_FILE,
                CodingTask,
                max_records=limits.max_tasks,
                max_line_bytes=limits.max_line_bytes,
            )
        ),
        trajectories=list(
            jsonl_records(
                io.BytesIO(trajectories),
                TRAJECTORIES_FILE,
                Trajectory,
                max_records=limits.max_trajectories,
                max_line_bytes=limits.max_line_bytes,
            )
        ),
        conditions=parsed,
    )


def load_coding_bundle(root: Path, limits: BundleLimits | None = None) -> CodingBundle:
    """Read a bundle directory and validate it statically (CodingBundleError lists every
    problem found; a file that cannot be read stops at its first problem)."""
    limits = limits or BundleLimits()
    bundle = CodingBundle(
        tasks=read_tasks(root / TASKS_FILE, limits),
        trajectories=list(read_trajectories(root / TRAJECTORIES_FILE, limits)),
        conditions=read_conditions(root / CONDITIONS_FILE, limits),
    )
    problems = bundle_problems(bundle, limits) + snapshot_problems(root, bundle.tasks, limits)
    if problems:
        raise CodingBundleError(problems)
    return bundle


def write_coding_bundle(bundle: CodingBundle, root: Path) -> None:
    """Write a bundle's tasks, trajectories and conditions under `root` (snapshots are placed
    by the caller): one compact JSON object per line, keys in model order."""
    root.mkdir(parents=True, exist_ok=True)
    (root / TASKS_FILE).write_text(
        "".join(task.model_dump_json(exclude_none=True) + "\n" for task in bundle.tasks),
        encoding="utf-8",
    )
    (root / TRAJECTORIES_FILE).write_text(
        "".join(t.model_dump_json(exclude_none=True) + "\n" for t in bundle.trajectories),
        encoding="utf-8",
    )
    (root / CONDITIONS_FILE).write_text(
        bundle.conditions.model_dump_json(indent=2) + "\n", encoding="utf-8"
    )
