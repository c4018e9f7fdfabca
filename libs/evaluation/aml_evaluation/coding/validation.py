"""Registration-time dynamic validation of coding tasks (SPEC R-2.5): a task is usable only if
its hidden tests tell a fix from no fix.

For each task, on its snapshot with its hidden ``test_patch`` applied first, as the verify step
applies it (a fix and the hidden tests change disjoint files, a static rule of
:func:`aml_evaluation.coding.bundle.bundle_problems`):

- with no patch the task is **unresolved** (otherwise the tests do not test the problem);
- with its ``gold_patch`` it is **resolved** (otherwise no agent could resolve it);
- with its stand-in's ``wrong_patch`` (when the task has :class:`StandInHints`) it is
  **unresolved** (otherwise the scripted agent of the tests cannot tell memory from no memory).

Running the tests needs the sandbox and reading their log needs the grader, both of which
live elsewhere: they are parameters here. ``run_tests(snapshot, patches, test_command)``
unpacks the snapshot into a fresh directory, applies the patches in order (raising
:class:`PatchDoesNotApply` naming the first that fails), runs the command in the repository root
and returns its log (or whatever the grader reads: the log with the command's exit status, for
:func:`aml_evaluation.coding.grading.grade`); ``grade(task, log)`` says whether that run resolves
the task. Any other exception of ``run_tests`` is an infrastructure fault and is raised as is: it
never counts as "unresolved" (R-2.5).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Protocol, TypeVar

from pydantic import BaseModel, ConfigDict

from aml_evaluation.coding.bundle import CodingBundle, CodingTask


class PatchDoesNotApply(Exception):
    """The patch at ``index`` of the patches given to ``run_tests`` does not apply."""

    def __init__(self, index: int, detail: str = "") -> None:
        super().__init__(f"patch {index} does not apply" + (f": {detail}" if detail else ""))
        self.index = index
        self.detail = detail


# What a test run gives the grader: its log, or the log with more (its exit status).
_Run = TypeVar("_Run")
_Run_co = TypeVar("_Run_co", covariant=True)


class RunTests(Protocol[_Run_co]):
    def __call__(self, snapshot: Path, patches: Sequence[str], test_command: str) -> _Run_co: ...


Grade = Callable[[CodingTask, _Run], bool]


class TaskCheck(BaseModel):
    """What running a task's tests found; ``None``: that run could not be made."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    task_id: str
    unpatched_resolved: bool | None
    gold_resolved: bool | None
    wrong_resolved: bool | None
    problems: list[str]

    @property
    def usable(self) -> bool:
        return not self.problems


def _run(
    task: CodingTask,
    snapshot: Path,
    fix: tuple[str, str] | None,
    run_tests: RunTests[_Run],
    grade: Grade[_Run],
) -> tuple[bool | None, str | None]:
    """(resolved, problem) of one run: the hidden tests, then the fix (name, patch) if any."""
    patches = [task.test_patch] if fix is None else [task.test_patch, fix[1]]
    try:
        log = run_tests(snapshot, patches, task.test_command)
    except PatchDoesNotApply as error:
        names = ["test_patch"] if fix is None else ["test_patch", fix[0]]
        name = names[error.index] if 0 <= error.index < len(names) else f"patch {error.index}"
        return None, f"task {task.task_id!r}: {name} does not apply to the snapshot"
    return grade(task, log), None


def check_task(
    task: CodingTask, snapshot: Path, run_tests: RunTests[_Run], grade: Grade[_Run]
) -> TaskCheck:
    """Run a task's tests with no patch, the gold patch and (if any) the stand-in's wrong patch;
    the problems name what makes the task unusable."""
    problems: list[str] = []
    unpatched, problem = _run(task, snapshot, None, run_tests, grade)
    if problem is not None:
        # Without the hidden tests in place no other run means anything.
        problems.append(problem)
        return TaskCheck(
            task_id=task.task_id,
            unpatched_resolved=None,
            gold_resolved=None,
            wrong_resolved=None,
            problems=problems,
        )
    if unpatched:
        problems.append(f"task {task.task_id!r} is resolved with no patch")
    gold, problem = _run(task, snapshot, ("gold_patch", task.gold_patch), run_tests, grade)
    if problem is not None:
        problems.append(problem)
    elif not gold:
        problems.append(f"task {task.task_id!r} is not resolved by its gold patch")
    wrong: bool | None = None
    if task.stand_in is not None:
        fix = ("stand_in.wrong_patch", task.stand_in.wrong_patch)
        wrong, problem = _run(task, snapshot, fix, run_tests, grade)
        if problem is not None:
            problems.append(problem)
        elif wrong:
            problems.append(f"task {task.task_id!r} is resolved by its stand-in's wrong patch")
    return TaskCheck(
        task_id=task.task_id,
        unpatched_resolved=unpatched,
        gold_resolved=gold,
        wrong_resolved=wrong,
        problems=problems,
    )


def check_bundle(
    bundle: CodingBundle, root: Path, run_tests: RunTests[_Run], grade: Grade[_Run]
) -> list[TaskCheck]:
    """:func:`check_task` for every task of a bundle whose directory is `root`, in order."""
    return [check_task(task, root / task.snapshot, run_tests, grade) for task in bundle.tasks]
