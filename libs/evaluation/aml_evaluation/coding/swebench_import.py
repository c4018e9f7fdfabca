"""Importing SWE-bench-format tasks and SWEContextBench's Past Experience trajectories into a
coding bundle (:mod:`aml_evaluation.coding.bundle`), for operators who supply the repository
snapshots (SWE-bench's Docker images are not used: the platform's sandbox runs a snapshot).

**Tasks** (:func:`parse_swebench_instance`): one SWE-bench instance, a JSON object as in
SWE-bench and SWEContextBench (``cases/*/<instance_id>.json``). Read: ``instance_id``, ``repo``,
``problem_statement`` (the Search query, verbatim), ``patch`` (gold), ``test_patch`` (hidden),
``FAIL_TO_PASS`` and ``PASS_TO_PASS`` (lists of test ids, or, as in SWE-bench's own release,
strings holding such a list as JSON), ``created_at`` (ISO 8601; without an offset it is taken as
UTC, as SWE-bench writes GitHub's UTC times), and ``base_commit`` when present. Other fields
(``hints_text``, ``version``, ...) are ignored. SWE-bench derives a task's test command from its
repository and version; the operator gives one per repository instead (:class:`RepoTestSpec`),
where ``{test_files}`` stands for the files the test patch creates or changes, shell-quoted, in
the patch's order. SWE-bench has no task types: the operator names the type of the tasks
imported.

**Trajectories** (:func:`trajectory_from_events`): SWEContextBench's Past Experience files are
Claude Code session logs, one JSON event per line. Kept: ``user`` and ``assistant`` events of the
main thread (sidechain and ``isMeta`` events left out), their ``message.content`` read as

- a user prompt (a string, or ``text`` parts) -> a ``user`` turn;
- a ``tool_result`` part -> a ``tool`` turn holding its text (text parts joined by newlines, an
  image part as ``[image]``);
- an assistant ``text`` part -> an ``assistant`` turn; a ``tool_use`` part -> an ``assistant``
  turn ``[<tool name>] <input as JSON, keys sorted>``; ``thinking`` parts only when asked for
  (``include_thinking``: they are the model's private reasoning, and their signatures are
  never kept).

Other events (``summary``, ``file-history-snapshot``, ``system``, ``queue-operation``, unknown
types) are skipped; a turn without text is dropped; a turn over the bundle's
:data:`~aml_evaluation.coding.bundle.MAX_TURN_CHARS` is cut there with a marker saying so.
Plain chat lines, ``{"role", "content", "timestamp"?}`` (e.g. a mini-swe-agent message list
written as JSON Lines), are read the same way (roles ``user``, ``assistant``, ``tool``;
``system`` lines skipped). Each turn keeps its event's ``timestamp``.

**Steps.** A step starts at each user prompt and at each assistant turn that follows a tool
result, so an action stays with what it saw; a step reaching
:data:`~aml_evaluation.coding.bundle.MAX_STEP_TURNS` turns (many parallel tool calls) continues
in the next one.

**Dates.** SWEContextBench's trajectories were recorded in 2025 by running an agent on *base*
tasks that are years older than the related tasks they serve: taken at face value every one is
dated after its task, which the bundle refuses. Their experience belongs to the base task's
time, so :func:`import_swecontextbench` dates a trajectory whose prompt names a base task
(``instance_id: ...``) given in ``base_instances`` at that task's ``created_at``, keeping every
turn's offset from the session's start.

**Tolerance.** A line that is not a JSON object is an error naming the file and line (the real
files hold one torn line), unless ``skip_broken_lines``, which skips and reports it. Missing
fields, wrong types and unknown ids are always errors (:class:`SwebenchImportError`).
"""

from __future__ import annotations

import json
import re
import shlex
import shutil
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Final

from pydantic import BaseModel, ConfigDict, TypeAdapter, ValidationError

from aml_evaluation.coding.bundle import (
    MAX_STEP_TURNS,
    MAX_TURN_CHARS,
    SNAPSHOT_SUFFIX,
    SNAPSHOTS_DIR,
    CodingBundle,
    CodingTask,
    Conditions,
    Id,
    Role,
    Step,
    TaskType,
    Trajectory,
    Turn,
    archive_problems,
    build_snapshot_archive,
    diff_file_pairs,
    file_sha256,
    load_coding_bundle,
    patch_files,
    write_coding_bundle,
)
from aml_evaluation.coding.grading import LogFormat

MAX_INSTANCE_BYTES: Final = 64 * 1024 * 1024
MAX_TRAJECTORY_FILE_BYTES: Final = 512 * 1024 * 1024
MAX_TRAJECTORY_LINE_BYTES: Final = 32 * 1024 * 1024
MAX_TRAJECTORY_LINES: Final = 500_000
TEST_FILES: Final = "{test_files}"
_CUT_MARKER: Final = "\n[... {count} more characters cut by the import]"
_PROMPT_FIELD: Final = re.compile(r"^\s*(instance_id|repo):\s*(\S+)\s*$", re.MULTILINE)
_ROLES: Final[frozenset[str]] = frozenset({"user", "assistant", "tool"})
_ID: Final = TypeAdapter(Id)


class SwebenchImportError(ValueError):
    """Source data that cannot be imported; the message names the file and what is wrong."""


class RepoTestSpec(BaseModel):
    """How a repository's tasks run their tests: the command (``{test_files}`` is replaced by
    the test patch's files) and the log format the grader reads."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    test_command: str
    log_format: LogFormat


# --- tasks ------------------------------------------------------------------------------------


def _field(raw: Mapping[str, Any], name: str, where: str) -> Any:
    if name not in raw:
        raise SwebenchImportError(f"{where}: field {name!r} is missing")
    return raw[name]


def _text(raw: Mapping[str, Any], name: str, where: str) -> str:
    value = _field(raw, name, where)
    if not isinstance(value, str) or not value.strip():
        raise SwebenchImportError(f"{where}: field {name!r} must be a non-empty string")
    return value


def swebench_test_ids(value: object, name: str, where: str) -> list[str]:
    """A SWE-bench test list: a JSON list of strings, or a string holding one (SWE-bench's own
    release encodes FAIL_TO_PASS and PASS_TO_PASS so)."""
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except json.JSONDecodeError:
            raise SwebenchImportError(
                f"{where}: {name} is a string but not a JSON list of test ids"
            ) from None
    if not isinstance(value, list) or not all(isinstance(item, str) for item in value):
        raise SwebenchImportError(f"{where}: {name} must be a list of test ids (strings)")
    return list(value)


def parse_created_at(value: object, where: str) -> datetime:
    """An ISO 8601 time; one without an offset is UTC."""
    if not isinstance(value, str):
        raise SwebenchImportError(f"{where}: created_at must be an ISO 8601 string")
    try:
        moment = datetime.fromisoformat(value.strip().replace("Z", "+00:00"))
    except ValueError:
        raise SwebenchImportError(f"{where}: created_at {value!r} is not ISO 8601") from None
    return moment if moment.tzinfo is not None else moment.replace(tzinfo=UTC)


def command_for(spec: RepoTestSpec, test_patch: str) -> str:
    """The spec's command with ``{test_files}`` replaced by the files the test patch leaves in
    place (created or changed, not deleted), in the patch's order."""
    patch_files(test_patch)  # a diff changing no file, or an unsafe one, is refused here
    kept = [new for _, new in diff_file_pairs(test_patch) if new is not None]
    files = " ".join(shlex.quote(name) for name in dict.fromkeys(kept))
    return spec.test_command.replace(TEST_FILES, files)


def parse_swebench_instance(
    raw: Mapping[str, Any],
    *,
    snapshot: str,
    snapshot_sha256: str,
    spec: RepoTestSpec,
    task_type: TaskType,
    where: str = "instance",
) -> CodingTask:
    """A SWE-bench instance as a CodingTask (see the module docstring)."""
    task_id = _text(raw, "instance_id", where)
    where = f"{where} {task_id!r}"
    test_patch = _text(raw, "test_patch", where)
    try:
        command = command_for(spec, test_patch)
    except ValueError as error:
        raise SwebenchImportError(f"{where}: test_patch {error}") from None
    base_commit = raw.get("base_commit")
    fail_to_pass = swebench_test_ids(_field(raw, "FAIL_TO_PASS", where), "FAIL_TO_PASS", where)
    pass_to_pass = swebench_test_ids(_field(raw, "PASS_TO_PASS", where), "PASS_TO_PASS", where)
    try:
        return CodingTask(
            task_id=task_id,
            repo=_text(raw, "repo", where),
            snapshot=snapshot,
            snapshot_sha256=snapshot_sha256,
            base_commit=base_commit if isinstance(base_commit, str) and base_commit else None,
            problem_statement=_text(raw, "problem_statement", where),
            test_patch=test_patch,
            gold_patch=_text(raw, "patch", where),
            test_command=command,
            log_format=spec.log_format,
            fail_to_pass=fail_to_pass,
            pass_to_pass=pass_to_pass,
            task_type=task_type,
            created_at=parse_created_at(_field(raw, "created_at", where), where),
        )
    except ValidationError as error:
        raise SwebenchImportError(f"{where}: {_first_error(error)}") from None


def _first_error(error: ValidationError) -> str:
    item = error.errors()[0]
    location = ".".join(str(part) for part in item["loc"]) or "(root)"
    return f"{location}: {item['msg']}"


def read_instance(path: Path) -> dict[str, Any]:
    """One instance file (a JSON object), read with a bound."""
    try:
        size = path.stat().st_size
    except OSError as error:
        raise SwebenchImportError(f"{path}: cannot be read ({error.strerror})") from None
    if size > MAX_INSTANCE_BYTES:
        raise SwebenchImportError(f"{path}: {size} bytes, more than {MAX_INSTANCE_BYTES}")
    try:
        raw = json.loads(path.read_bytes())
    except (json.JSONDecodeError, UnicodeDecodeError, RecursionError) as error:
        raise SwebenchImportError(f"{path}: not JSON ({type(error).__name__})") from None
    if not isinstance(raw, dict):
        raise SwebenchImportError(f"{path}: not a JSON object")
    return raw


# --- trajectories -----------------------------------------------------------------------------


@dataclass(frozen=True)
class Event:
    """One line of a trajectory file: its number and the JSON object it holds."""

    line: int
    data: Mapping[str, Any]


@dataclass
class PastExperience:
    """A trajectory read from a Past Experience file, with what the reading found."""

    trajectory: Trajectory
    instance_id: str | None  # the task the session worked on, as its prompt names it
    skipped_lines: list[int] = field(default_factory=list)
    cut_turns: int = 0


@dataclass
class _Turns:
    """Turns gathered in order, grouped into steps (see the module docstring)."""

    include_thinking: bool
    steps: list[list[Turn]] = field(default_factory=list)
    cut: int = 0

    def add(self, role: Role, text: str, timestamp: datetime | None) -> None:
        if not text.strip():
            return
        if len(text) > MAX_TURN_CHARS:
            marker = _CUT_MARKER.format(count=len(text) - MAX_TURN_CHARS)
            text = text[: MAX_TURN_CHARS - len(marker)] + marker
            self.cut += 1
        last = self.steps[-1] if self.steps else None
        starts = (
            last is None
            or role == "user"
            or (role == "assistant" and last[-1].role == "tool")
            or len(last) >= MAX_STEP_TURNS
        )
        turn = Turn(role=role, content=text, timestamp=timestamp)
        if starts:
            self.steps.append([turn])
        else:
            self.steps[-1].append(turn)


def _timestamp(event: Event, where: str) -> datetime | None:
    value = event.data.get("timestamp")
    if value is None:
        return None
    return parse_created_at(value, f"{where}:{event.line}")


def _part_text(part: Mapping[str, Any]) -> str:
    kind = part.get("type")
    if kind == "text":
        return str(part.get("text", ""))
    if kind == "image":
        return "[image]"
    return ""


def _tool_result_text(content: object) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "\n".join(_part_text(part) for part in content if isinstance(part, dict))
    return ""


def _tool_use_text(part: Mapping[str, Any]) -> str:
    arguments = json.dumps(part.get("input", {}), ensure_ascii=False, sort_keys=True)
    return f"[{part.get('name', 'tool')}] {arguments}"


def _claude_code_event(turns: _Turns, event: Event, where: str) -> None:
    data = event.data
    kind = data.get("type")
    if kind not in ("user", "assistant") or data.get("isSidechain") or data.get("isMeta"):
        return
    message = data.get("message")
    if not isinstance(message, dict) or "content" not in message:
        raise SwebenchImportError(f"{where}:{event.line}: a {kind} event without a message")
    moment = _timestamp(event, where)
    content = message["content"]
    if isinstance(content, str):
        turns.add("user" if kind == "user" else "assistant", content, moment)
        return
    if not isinstance(content, list):
        raise SwebenchImportError(f"{where}:{event.line}: message content is not text or parts")
    for part in content:
        if not isinstance(part, dict):
            raise SwebenchImportError(f"{where}:{event.line}: a content part is not an object")
        part_kind = part.get("type")
        if part_kind == "tool_result":
            turns.add("tool", _tool_result_text(part.get("content")), moment)
        elif part_kind == "tool_use":
            turns.add("assistant", _tool_use_text(part), moment)
        elif part_kind == "thinking":
            if turns.include_thinking:
                turns.add("assistant", str(part.get("thinking", "")), moment)
        elif part_kind in ("text", "image"):
            turns.add("user" if kind == "user" else "assistant", _part_text(part), moment)


def _chat_line(turns: _Turns, event: Event, where: str) -> None:
    role, content = event.data.get("role"), event.data.get("content")
    if role == "system":
        return
    if role not in _ROLES:
        raise SwebenchImportError(f"{where}:{event.line}: unknown role {role!r}")
    text = _tool_result_text(content)
    turns.add(role, text, _timestamp(event, where))


def _prompt_fields(trajectory_steps: Sequence[Sequence[Turn]]) -> dict[str, str]:
    """``instance_id`` and ``repo`` as the session's first user prompt names them."""
    for step in trajectory_steps:
        for turn in step:
            if turn.role == "user":
                return {name: value for name, value in _PROMPT_FIELD.findall(turn.content)}
    return {}


def trajectory_from_events(
    events: Iterable[Event],
    *,
    trajectory_id: str,
    repo: str | None = None,
    dated_at: datetime | None = None,
    include_thinking: bool = False,
    where: str = "trajectory",
) -> tuple[Trajectory, str | None, int]:
    """(the trajectory, the instance id its prompt names, turns cut) of a session's events.
    ``repo`` defaults to the prompt's ``repo:``; ``dated_at`` re-dates the session to start
    then, each turn keeping its offset from the start."""
    turns = _Turns(include_thinking=include_thinking)
    for event in events:
        if "type" in event.data:
            _claude_code_event(turns, event, where)
        elif "role" in event.data:
            _chat_line(turns, event, where)
    if not turns.steps:
        raise SwebenchImportError(f"{where}: no user, assistant or tool turn")
    prompt = _prompt_fields(turns.steps)
    repo = repo or prompt.get("repo")
    if repo is None:
        raise SwebenchImportError(f"{where}: no repository given and the prompt names none")
    dated = [turn.timestamp for step in turns.steps for turn in step if turn.timestamp]
    if dated:
        started = min(dated)
    elif dated_at is not None:
        started = dated_at
    else:
        raise SwebenchImportError(f"{where}: no turn is dated; give the trajectory a date")
    try:
        trajectory = Trajectory(
            trajectory_id=trajectory_id,
            repo=repo,
            created_at=started,
            steps=[Step(turns=step) for step in turns.steps],
        )
    except ValidationError as error:
        raise SwebenchImportError(f"{where}: {_first_error(error)}") from None
    if dated_at is not None:
        trajectory = redated(trajectory, dated_at)
    return trajectory, prompt.get("instance_id"), turns.cut


def redated(trajectory: Trajectory, start: datetime) -> Trajectory:
    """The trajectory moved in time to start at `start`, every turn keeping its offset."""
    shift = start - trajectory.created_at
    steps = [
        Step(
            turns=[
                turn
                if turn.timestamp is None
                else turn.model_copy(update={"timestamp": turn.timestamp + shift})
                for turn in step.turns
            ]
        )
        for step in trajectory.steps
    ]
    return trajectory.model_copy(update={"created_at": start, "steps": steps})


def read_events(path: Path, *, skip_broken_lines: bool = False) -> tuple[list[Event], list[int]]:
    """(the events, the numbers of the lines skipped) of a JSON Lines trajectory file, read a
    line at a time with the file, each line and the line count bounded."""
    try:
        size = path.stat().st_size
    except OSError as error:
        raise SwebenchImportError(f"{path}: cannot be read ({error.strerror})") from None
    if size > MAX_TRAJECTORY_FILE_BYTES:
        raise SwebenchImportError(f"{path}: {size} bytes, more than {MAX_TRAJECTORY_FILE_BYTES}")
    events: list[Event] = []
    skipped: list[int] = []
    with path.open("rb") as handle:
        number = 0
        while line := handle.readline(MAX_TRAJECTORY_LINE_BYTES + 1):
            number += 1
            if number > MAX_TRAJECTORY_LINES:
                raise SwebenchImportError(f"{path}: more than {MAX_TRAJECTORY_LINES} lines")
            if len(line) > MAX_TRAJECTORY_LINE_BYTES:
                raise SwebenchImportError(
                    f"{path}:{number}: line longer than {MAX_TRAJECTORY_LINE_BYTES} bytes"
                )
            if not line.strip():
                continue
            try:
                data = json.loads(line)
            except (json.JSONDecodeError, UnicodeDecodeError, RecursionError):
                data = None
            if not isinstance(data, dict):
                if not skip_broken_lines:
                    raise SwebenchImportError(
                        f"{path}:{number}: not a JSON object (skip_broken_lines skips such lines)"
                    )
                skipped.append(number)
                continue
            events.append(Event(number, data))
    return events, skipped


def read_past_experience(
    path: Path,
    *,
    trajectory_id: str | None = None,
    repo: str | None = None,
    dated_at: datetime | None = None,
    include_thinking: bool = False,
    skip_broken_lines: bool = False,
) -> PastExperience:
    """A Past Experience file as a trajectory; its id defaults to the file's name without
    ``.jsonl`` (SWEContextBench names them by the start of the session id)."""
    name = trajectory_id or path.name.removesuffix(".jsonl")
    try:
        _ID.validate_python(name)
    except ValidationError:
        raise SwebenchImportError(
            f"{path}: {name!r} is not a usable trajectory id; give one"
        ) from None
    events, skipped = read_events(path, skip_broken_lines=skip_broken_lines)
    trajectory, instance_id, cut = trajectory_from_events(
        events,
        trajectory_id=name,
        repo=repo,
        dated_at=dated_at,
        include_thinking=include_thinking,
        where=str(path),
    )
    return PastExperience(trajectory, instance_id, skipped, cut)


# --- a whole bundle ---------------------------------------------------------------------------


@dataclass
class SwebenchImport:
    """An imported bundle and what the import did to get there."""

    bundle: CodingBundle
    skipped_lines: dict[str, list[int]]
    cut_turns: dict[str, int]
    dated_by_base_task: list[str]


def _snapshot(snapshots: Path, task_id: str, destination: Path) -> tuple[str, str]:
    """(path in the bundle, sha256) of a task's snapshot: the operator's
    ``<instance_id>.tar.gz`` (checked, copied) or ``<instance_id>/`` tree (archived)."""
    relative = f"{SNAPSHOTS_DIR}/{task_id}{SNAPSHOT_SUFFIX}"
    target = destination / relative
    archive, tree = snapshots / f"{task_id}{SNAPSHOT_SUFFIX}", snapshots / task_id
    if archive.is_file():
        problems = archive_problems(archive)
        if problems:
            raise SwebenchImportError(f"{archive}: {'; '.join(problems[:5])}")
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(archive, target)
        return relative, file_sha256(target)
    if tree.is_dir():
        try:
            return relative, build_snapshot_archive(tree, target)
        except ValueError as error:
            raise SwebenchImportError(f"{tree}: {error}") from None
    raise SwebenchImportError(
        f"task {task_id!r}: no snapshot; place {archive.name} or a directory {tree.name}/ "
        f"(the repository at its base commit, without .git) in {snapshots}"
    )


def import_swecontextbench(
    instances: Sequence[Path],
    trajectories: Sequence[Path],
    conditions: Conditions,
    snapshots: Path,
    destination: Path,
    *,
    repo_specs: Mapping[str, RepoTestSpec],
    task_type: TaskType = "debug",
    base_instances: Sequence[Path] = (),
    include_thinking: bool = False,
    skip_broken_lines: bool = False,
) -> SwebenchImport:
    """Write a coding bundle under `destination` from SWE-bench instance files, Past Experience
    trajectory files, the operator's conditions (SWEContextBench's per-task files do not link a
    task to its trajectories) and snapshots; return it as loaded and statically validated."""
    tasks: list[CodingTask] = []
    for path in instances:
        raw = read_instance(path)
        repo = raw.get("repo")
        if not isinstance(repo, str) or repo not in repo_specs:
            raise SwebenchImportError(
                f"{path}: no test command given for repository {repo!r} (repo_specs)"
            )
        task_id = _text(raw, "instance_id", str(path))
        snapshot, digest = _snapshot(snapshots, task_id, destination)
        tasks.append(
            parse_swebench_instance(
                raw,
                snapshot=snapshot,
                snapshot_sha256=digest,
                spec=repo_specs[repo],
                task_type=task_type,
                where=str(path),
            )
        )
    base_dates = {}
    for path in base_instances:
        raw = read_instance(path)
        where = str(path)
        base_dates[_text(raw, "instance_id", where)] = parse_created_at(
            _field(raw, "created_at", where), where
        )
    read: list[Trajectory] = []
    skipped: dict[str, list[int]] = {}
    cut: dict[str, int] = {}
    dated: list[str] = []
    for path in trajectories:
        experience = read_past_experience(
            path, include_thinking=include_thinking, skip_broken_lines=skip_broken_lines
        )
        trajectory = experience.trajectory
        base = base_dates.get(experience.instance_id or "")
        if base is not None:
            trajectory = redated(trajectory, base)
            dated.append(trajectory.trajectory_id)
        read.append(trajectory)
        if experience.skipped_lines:
            skipped[trajectory.trajectory_id] = experience.skipped_lines
        if experience.cut_turns:
            cut[trajectory.trajectory_id] = experience.cut_turns
    bundle = CodingBundle(tasks=tasks, trajectories=read, conditions=conditions)
    write_coding_bundle(bundle, destination)
    return SwebenchImport(load_coding_bundle(destination), skipped, cut, dated)
