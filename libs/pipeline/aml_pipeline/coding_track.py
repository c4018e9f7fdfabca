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
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final, Protocol

import structlog
from pydantic import BaseModel, ConfigDict

from aml_evaluation.coding.bundle import CodingTask, diff_paths, diff_sections, patch_files
from aml_evaluation.coding.grading import (
    GRADING_VERSION,
    MAX_LOG_CHARS,
    Grade,
    ResolvedStatus,
    grade,
)
from aml_evaluation.coding.source import CodingTasks
from aml_evaluation.context import TokenCount
from aml_pipeline.coding_agent import (
    AgentConfig,
    Attempt,
    Complete,
    EndReason,
    MemoryContext,
    StoppableRunner,
    attempt,
    memory_context,
)
from aml_pipeline.sandbox import (
    CommandResult,
    PodOptions,
    Sandbox,
    SandboxFault,
    SandboxLimits,
    SandboxUnavailable,
    WorkingCopyRejected,
    require_sandbox,
    sandbox_backend,
)
from aml_runtime.broker import FinalFailure
from aml_runtime.db import Document
from aml_runtime.documents import FailureKind
from aml_runtime.settings import CodingWorkerSettings

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
    return CodingTasks(datasets_root).files


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


def coding_sandbox(
    settings: CodingWorkerSettings, lifetime_seconds: float
) -> tuple[OpenWorkspace, SandboxCheck]:
    """The backend the settings name (`AML_SANDBOX_BACKEND`): how a step opens its workspaces and
    the probe its first coding item runs. `lifetime_seconds`: how long the step uses one sandbox
    (a sandbox pod's deadline is built from it)."""
    options = None
    if settings.sandbox_backend == "kubernetes":
        options = PodOptions(
            image=settings.sandbox_image,
            namespace=settings.sandbox_namespace,
            lifetime_seconds=lifetime_seconds,
        )
    opener, probe = sandbox_backend(settings.sandbox_backend, pod_options=options)
    return opener, SandboxCheck(probe=probe)


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


# How long an attempt's end waits for the command it killed to return before it removes the
# sandbox: the kill takes milliseconds, the sandbox's own bounded kill path ten seconds at most.
# Past it, the command's thread removes the sandbox when the command returns.
COMMAND_STOP_SECONDS: Final = 30.0


def _close_after_commands(commands: StoppableRunner, workspace: Workspace, task_id: str) -> None:
    if not commands.close(lambda: _close(workspace, task_id), COMMAND_STOP_SECONDS):
        log.warning("coding.sandbox_removal_deferred", task_id=task_id)


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
    commands = StoppableRunner(workspace)
    try:
        result = await attempt(task.problem_statement, memory.text, config, complete, commands)
        patch, rejected = "", None
        if result.end_reason is EndReason.SUBMITTED:
            patch, rejected = await asyncio.to_thread(_submitted_patch, workspace)
    finally:
        # The agent's thread may still be in a command (a wall limit, a cancelled item): its
        # working copy is removed only once that command is killed and has returned.
        await asyncio.to_thread(_close_after_commands, commands, workspace, task.task_id)
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


def _changed_files(patch: str) -> list[str]:
    return sorted(diff_paths(patch))


def without_files(patch: str, files: Sequence[str]) -> tuple[str, list[str]]:
    """`patch` without the sections that change any of `files`, and the paths left out."""
    hidden = set(files)
    kept: list[str] = []
    ignored: set[str] = set()
    for section in diff_sections(patch):
        touched = section.paths & hidden
        if touched:
            ignored |= touched
        else:
            kept.append(section.text)
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


@dataclass(frozen=True)
class PatchRejected:
    """`git apply` refused the patch at `index` of those given; `reason` is git's."""

    index: int
    reason: str


def apply_and_run(
    workspace: Workspace, patches: Sequence[str], command: str, timeout: float
) -> CommandResult | PatchRejected:
    """`patches` applied to the workspace in order, then `command` run within `timeout`
    seconds: its result, or the first patch refused (then nothing runs). Registration's runs of
    a task (`aml_devtools.coding_registration`) go through it as the verify step's do, so a task
    is registered only as verify will run it."""
    for index, patch in enumerate(patches):
        applied = workspace.apply(patch)
        if not applied.ok:
            return PatchRejected(index, applied.output.strip())
    return workspace.run(command, timeout)


def graded(task: CodingTask, ran: CommandResult) -> Grade:
    """The task's hidden tests graded on a run's log and exit status."""
    return grade(
        ran.output, task.log_format, task.fail_to_pass, task.pass_to_pass, exit_code=ran.exit_code
    )


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
        ran = apply_and_run(
            workspace, [task.test_patch, kept], task.test_command, limits.wall_seconds
        )
    finally:
        _close(workspace, task.task_id)
    if isinstance(ran, PatchRejected):
        reason = _cut(ran.reason, _REASON_CHARS)
        if ran.index == 0:
            raise HiddenTestsRejected(
                f"the hidden test changes of task {task.task_id} do not apply to its snapshot: "
                f"{reason}"
            )
        return _unresolved(
            f"the patch does not apply: {reason}", patch_applied=False, ignored_files=ignored
        )
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
    verdict = graded(task, ran)
    return Verification(
        resolved=verdict.resolved,
        resolution=verdict.resolution,
        reason=verdict.reason,
        report=verdict.report(),
        **ran_fields,
    )


def score_fields(verification: Verification) -> Document:
    """The score document's fields of a verified attempt; the test log is the run's body,
    emptied by retention (R-7.5)."""
    return verification.model_dump(mode="json", exclude_none=True)
