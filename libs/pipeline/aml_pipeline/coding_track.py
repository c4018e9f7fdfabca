"""The coding track's Solve and Verify steps (SPEC R-2.5), as the answer and score stages run
them for a question that carries a coding task (`PlannedQuestion.coding_task`).

**Solve** (`solve`): the participant's candidates, in its order, cut to the agent's memory budget
(`memory_context`, rule coding-context-v1), go into the fixed agent's task prompt; the agent
(`aml_pipeline.coding_agent.attempt`) works in a fresh sandbox over the task's repository
snapshot; a submitted attempt's patch is the sandbox's diff of its working copy against the
snapshot. Only a submitted attempt has a patch to verify: an agent that ends at a limit (steps,
wall clock, context, malformed replies) is unresolved whatever its working copy holds, as
mini-swe-agent's SWE-bench runs submit nothing then. A working copy the sandbox will not diff,
or a patch over MAX_PATCH_BYTES, is the agent's doing: unresolved, with the reason.

**Verify** (`verify`, rule VERIFY_RULE): in a fresh sandbox from the same snapshot,
1. the hidden test changes are applied first; they must apply (registration checked that they
   do), so a refusal is a platform or dataset fault (`HiddenTestsRejected`), never the agent's;
2. the patch is applied without its changes to the files the hidden test changes touch. SWE-bench
   resets those files to the base commit before it applies the test patch, so the agent's edits
   to them never count; leaving them out of the patch gives the same tree (their recorded names
   are `ignored_files`). Upstream's workflow also leaves a `patch.txt` and scratch scripts in the
   working copy: they are new files, which apply and change no test;
3. a patch that does not apply is unresolved (git's reason recorded); so is an empty patch,
   without running anything (SWE-bench grades an empty patch unresolved, and registration checked
   that the hidden tests fail without a fix, so running them would only cost time);
4. the task's test command runs within its limits; one cut at its time limit is unresolved;
5. its log is graded with SWE-bench's semantics (`aml_evaluation.coding.grading.grade`):
   resolved iff every FAIL_TO_PASS test passes and every PASS_TO_PASS test still passes.

**Whose failure.** Everything the agent does to itself is an outcome: unresolved. The platform's
faults raise: `SandboxFault` (a sandbox that does not start, a snapshot that will not unpack),
`HiddenTestsRejected`, the agent's `PlatformFailure` (the LLM or the sandbox failed under it), and
whatever the task source raises when a task's files are unavailable. The stages turn them into
platform failures (retried, then `platform_error`), never into an unresolved attempt.

Both steps are blocking work (unpacking, diffing, running tests) done in worker threads; the agent
runs in a thread of its own (`coding_agent.attempt`), so the service's loop keeps serving.
"""

from __future__ import annotations

import asyncio
import hashlib
import math
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final, Protocol

import structlog
from pydantic import BaseModel, ConfigDict

from aml_evaluation.coding.bundle import CodingTask, diff_file_pairs, patch_files
from aml_evaluation.coding.grading import GRADING_VERSION, MAX_LOG_CHARS, ResolvedStatus, grade
from aml_evaluation.coding.source import CodingTasks
from aml_evaluation.context import TokenCount
from aml_pipeline.coding_agent import (
    AgentConfig,
    Attempt,
    Complete,
    EndReason,
    MemoryContext,
    attempt,
    memory_context,
)
from aml_pipeline.sandbox import (
    CommandResult,
    Sandbox,
    SandboxFault,
    SandboxLimits,
    SandboxUnavailable,
    WorkingCopyRejected,
    require_sandbox,
)
from aml_runtime.broker import FinalFailure
from aml_runtime.db import Document
from aml_runtime.documents import FailureKind

log = structlog.get_logger()

VERIFY_RULE: Final = "coding-verify-v1"
# The largest patch verified: well above any real fix (SWE-bench's gold patches are a few KB;
# a bundle's patches are capped at 8 MB of text), and small enough for the answer document,
# which also holds the bounded trajectory, to stay far under a document's 16 MB.
MAX_PATCH_BYTES: Final = 4 * 1024 * 1024
# What a score document keeps of the test log for the audit: its first and last halves (the
# verdict lines are usually at its end); the grade reads all of it.
LOG_KEPT_CHARS: Final = 256 * 1024
_REASON_CHARS: Final = 2_000


class TaskFiles(Protocol):
    """A registered coding task and its repository snapshot on disk
    (`aml_evaluation.coding.source.CodingTaskFiles`)."""

    @property
    def task(self) -> CodingTask: ...

    @property
    def snapshot(self) -> Path: ...


# (dataset id, task id) -> the task's files; raises when they are unavailable (a platform
# failure). Blocking (it reads and checks the bundle): called in a worker thread.
OpenTask = Callable[[str, str], TaskFiles]


class Workspace(Protocol):
    """What the two steps use of a sandbox (`aml_pipeline.sandbox.Sandbox`)."""

    def run(self, command: str, timeout: float) -> CommandResult: ...

    def apply(self, patch: str) -> CommandResult: ...

    def patch(self) -> str: ...

    def close(self) -> None: ...


# A fresh workspace over a snapshot archive, within limits (`Sandbox.from_archive`); blocking.
OpenWorkspace = Callable[[Path, SandboxLimits], Workspace]


class HiddenTestsRejected(RuntimeError):
    """The task's hidden test changes do not apply to its own snapshot: the dataset's or the
    platform's fault (registration checks they apply), never the agent's."""


@dataclass
class SandboxCheck:
    """Whether this process can run sandboxes, probed at its first coding item
    (`require_sandbox`) and remembered once it can. A process that cannot fails each coding item
    at once with the probe's one line (bwrap missing, or unable to create namespaces): the
    platform's failure, which no redelivery to the same process could change."""

    probe: Callable[[], None] = require_sandbox
    _ready: bool = field(default=False, init=False)

    async def __call__(self) -> None:
        if self._ready:
            return
        try:
            await asyncio.to_thread(self.probe)
        except SandboxUnavailable as unavailable:
            raise FinalFailure(FailureKind.PLATFORM_ERROR, str(unavailable)) from None
        self._ready = True


def registered_tasks(datasets_root: Path) -> OpenTask:
    """The registered coding tasks under `datasets_root` (aml_evaluation.coding.source), with
    its per-process cache; safe to call from several worker threads at once."""
    tasks = CodingTasks(datasets_root)
    lock = threading.Lock()

    def open_task(dataset_id: str, task_id: str) -> TaskFiles:
        with lock:
            return tasks.files(dataset_id, task_id)

    return open_task


async def open_task_files(open_task: OpenTask, question: Document) -> TaskFiles:
    """The files of the coding task a planned question attempts (in a worker thread)."""
    task_id = question.get("coding_task")
    if not task_id:
        raise FinalFailure(
            FailureKind.PLATFORM_ERROR,
            f"question {question.get('question_id')} of a coding dataset names no task",
        )
    return await asyncio.to_thread(open_task, str(question["dataset_id"]), str(task_id))


def solve_limits(config: AgentConfig) -> SandboxLimits:
    """Each agent command's sandbox: its wall clock and CPU time are the config's per-command
    timeout (the attempt cuts a command's wall clock further to the time it has left)."""
    seconds = config.command_timeout_seconds
    return SandboxLimits(wall_seconds=seconds, cpu_seconds=math.ceil(seconds))


def verify_limits(test_timeout_seconds: float) -> SandboxLimits:
    """The verify step's sandbox: the test command's wall clock and CPU time, and as much of its
    output as the grader reads (a log cut shorter would lose the results in its middle and grade
    those tests as missing)."""
    return SandboxLimits(
        wall_seconds=test_timeout_seconds,
        cpu_seconds=math.ceil(test_timeout_seconds),
        output_bytes=MAX_LOG_CHARS,
    )


def limits_record(limits: SandboxLimits) -> dict[str, float]:
    """The limits as the evaluation spec records them."""
    return {name: float(value) for name, value in limits.model_dump().items()}


def _cut(text: str, limit: int) -> str:
    """`text` within `limit` characters: its first and last halves around a note of the cut."""
    if len(text) <= limit:
        return text
    half = limit // 2
    return f"{text[:half]}\n[{len(text) - 2 * half} characters cut]\n{text[-half:]}"


# --- solve ----------------------------------------------------------------------------------


class Solution(BaseModel):
    """An attempt and what it submits for verification."""

    model_config = ConfigDict(frozen=True)
    attempt: Attempt
    memory: MemoryContext
    # The submitted diff of the working copy against the snapshot: what verify grades ("" when
    # the attempt did not submit, changed nothing, or its patch was rejected).
    patch: str
    patch_rejected: str | None = None


def _submitted_patch(workspace: Workspace) -> tuple[str, str | None]:
    try:
        patch = workspace.patch()
    except WorkingCopyRejected as rejected:
        return "", f"the working copy could not be diffed: {rejected}"
    size = len(patch.encode("utf-8"))
    if size > MAX_PATCH_BYTES:
        return "", f"the patch is {size:,} bytes, over the {MAX_PATCH_BYTES:,} verified"
    return patch, None


def _close(workspace: Workspace, task_id: str) -> None:
    # The outcome is settled by now: a sandbox left behind is the operator's to clean up, and
    # says nothing about the attempt.
    try:
        workspace.close()
    except SandboxFault as fault:
        log.error("coding.sandbox_not_removed", task_id=task_id, reason=str(fault))


async def solve(
    task: CodingTask,
    snapshot: Path,
    candidates: Sequence[dict[str, Any]],
    config: AgentConfig,
    complete: Complete,
    count_tokens: TokenCount,
    open_workspace: OpenWorkspace = Sandbox.from_archive,
) -> Solution:
    """One attempt of `task` with the candidates in the agent's prompt. `complete` is the
    agent's model call (one LLM call per step, under the item's admission). Raises
    `SandboxFault` or `coding_agent.PlatformFailure` for the platform's failures."""
    memory = await memory_context(candidates, config.memory_tokens, count_tokens)
    workspace = await asyncio.to_thread(open_workspace, snapshot, solve_limits(config))
    try:
        result = await attempt(task.problem_statement, memory.text, config, complete, workspace)
        patch, rejected = "", None
        if result.end_reason is EndReason.SUBMITTED:
            patch, rejected = await asyncio.to_thread(_submitted_patch, workspace)
    finally:
        await asyncio.to_thread(_close, workspace, task.task_id)
    return Solution(attempt=result, memory=memory, patch=patch, patch_rejected=rejected)


def answer_fields(solution: Solution, config: AgentConfig, model: str) -> Document:
    """The answer document of an attempt. `answer` is the patch the score stage verifies (the
    pipeline hands an answer on to the score stage, `question_stage.carried_answer`); the
    trajectory and the answer are the run's bodies, emptied by retention (R-7.5)."""
    attempt_ = solution.attempt
    memory = solution.memory
    patch = solution.patch
    return {
        "answer": patch,
        "model": model,
        "prompt": config.prompts,
        "agent": attempt_.agent,
        "agent_config_sha256": attempt_.config_fingerprint,
        "end_reason": attempt_.end_reason.value,
        "steps": attempt_.steps,
        "tokens_in": attempt_.tokens_in,
        "tokens_out": attempt_.tokens_out,
        "format_errors": attempt_.format_errors,
        "seconds": attempt_.seconds,
        "patch_bytes": len(patch.encode("utf-8")),
        "patch_sha256": hashlib.sha256(patch.encode("utf-8")).hexdigest(),
        "patch_files": _changed_files(patch),
        **({"patch_rejected": solution.patch_rejected} if solution.patch_rejected else {}),
        "candidates_returned": memory.candidates_returned,
        "candidates_used": memory.kept,
        "context_tokens": memory.tokens,
        "memory_first_cut": memory.first_cut,
        "token_counter": config.token_counter,
        "trajectory": [message.model_dump(mode="json") for message in attempt_.trajectory],
        "trajectory_elided": attempt_.trajectory_elided,
    }


# --- the patch's files ------------------------------------------------------------------------


def _sections(patch: str) -> list[str]:
    """The patch split at each file's `diff --git` header (text before the first is its own)."""
    sections: list[str] = []
    current: list[str] = []
    for line in patch.splitlines(keepends=True):
        if line.startswith("diff --git ") and current:
            sections.append("".join(current))
            current = []
        current.append(line)
    if current:
        sections.append("".join(current))
    return sections


def _section_paths(section: str) -> set[str]:
    """The paths one file section names: its `---`/`+++` headers, and its `diff --git a/P b/P`
    line (the sandbox's diffs never detect renames, so both halves are the same path; a binary
    or mode-only change has no `---`/`+++` lines)."""
    paths = {name for pair in diff_file_pairs(section) for name in pair if name is not None}
    first = section.split("\n", 1)[0].rstrip("\r")
    rest = first.removeprefix("diff --git ")
    if rest != first and len(rest) % 2 == 1:
        old, new = rest[: len(rest) // 2], rest[len(rest) // 2 + 1 :]
        if old.startswith("a/") and new.startswith("b/") and old[2:] == new[2:]:
            paths.add(old[2:])
    return paths


def _changed_files(patch: str) -> list[str]:
    return sorted({path for section in _sections(patch) for path in _section_paths(section)})


def without_files(patch: str, files: Sequence[str]) -> tuple[str, list[str]]:
    """`patch` without the sections that change any of `files`, and the paths left out."""
    hidden = set(files)
    kept: list[str] = []
    ignored: set[str] = set()
    for section in _sections(patch):
        touched = _section_paths(section) & hidden
        if touched:
            ignored |= touched
        else:
            kept.append(section)
    return "".join(kept), sorted(ignored)


# --- verify ---------------------------------------------------------------------------------


class Verification(BaseModel):
    """The verify step's verdict on one patch, as the score document records it."""

    model_config = ConfigDict(frozen=True)
    resolved: bool
    resolution: ResolvedStatus
    reason: str
    # FAIL_TO_PASS / PASS_TO_PASS, each {success, failure}: only when the tests ran.
    report: dict[str, dict[str, list[str]]] | None = None
    # None: nothing to apply; False: the patch does not apply.
    patch_applied: bool | None = None
    ignored_files: list[str] = []
    tests_ran: bool = False
    test_exit_code: int | None = None
    test_timed_out: bool = False
    test_seconds: float | None = None
    test_log: str | None = None
    test_log_bytes: int | None = None
    verify_rule: str = VERIFY_RULE
    grading_version: str = GRADING_VERSION


def _unresolved(reason: str, **fields: Any) -> Verification:
    return Verification(resolved=False, resolution=ResolvedStatus.NO, reason=reason, **fields)


def verify(
    task: CodingTask,
    snapshot: Path,
    patch: str,
    limits: SandboxLimits,
    open_workspace: OpenWorkspace = Sandbox.from_archive,
) -> Verification:
    """Verify `patch` against `task`'s hidden tests (see the module docstring). Blocking: run
    it in a worker thread. Raises `SandboxFault` and `HiddenTestsRejected` (the platform's)."""
    if not patch.strip():
        return _unresolved("no patch to verify: the attempt submitted none, or an empty one")
    kept, ignored = without_files(patch, patch_files(task.test_patch))
    if not kept.strip():
        return _unresolved(
            "the patch changes only the files of the hidden tests, which verification replaces",
            patch_applied=True,
            ignored_files=ignored,
        )
    workspace = open_workspace(snapshot, limits)
    try:
        tests = workspace.apply(task.test_patch)
        if not tests.ok:
            raise HiddenTestsRejected(
                f"the hidden test changes of task {task.task_id} do not apply to its snapshot: "
                f"{_cut(tests.output.strip(), _REASON_CHARS)}"
            )
        applied = workspace.apply(kept)
        if not applied.ok:
            return _unresolved(
                f"the patch does not apply: {_cut(applied.output.strip(), _REASON_CHARS)}",
                patch_applied=False,
                ignored_files=ignored,
            )
        ran = workspace.run(task.test_command, limits.wall_seconds)
    finally:
        _close(workspace, task.task_id)
    ran_fields: dict[str, Any] = {
        "patch_applied": True,
        "ignored_files": ignored,
        "tests_ran": True,
        "test_exit_code": ran.exit_code,
        "test_timed_out": ran.timed_out,
        "test_seconds": round(ran.duration_seconds, 3),
        "test_log": _cut(ran.output, LOG_KEPT_CHARS),
        "test_log_bytes": ran.output_bytes,
    }
    if ran.timed_out:
        return _unresolved(f"the tests ran past their {limits.wall_seconds:g} s", **ran_fields)
    graded = grade(
        ran.output, task.log_format, task.fail_to_pass, task.pass_to_pass, exit_code=ran.exit_code
    )
    return Verification(
        resolved=graded.resolved,
        resolution=graded.resolution,
        reason=graded.reason,
        report=graded.report(),
        **ran_fields,
    )


def score_fields(verification: Verification) -> Document:
    """The score document's fields of a verified attempt; the test log is the run's body,
    emptied by retention (R-7.5)."""
    return verification.model_dump(mode="json", exclude_none=True)
