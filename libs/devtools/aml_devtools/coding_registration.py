"""`aml dataset add DIR --format coding`: a coding bundle's tasks run for real before it is
registered (SPEC R-2.5), in the coding track's bubblewrap sandbox and graded with SWE-bench's
rules (`aml_evaluation.coding.grading.grade`).

Each task runs three times on a fresh sandbox of its snapshot (`Sandbox.from_archive`): with no
patch it must be unresolved, with its gold patch resolved, and with its stand-in's wrong patch
(when it has one) unresolved. A run applies the hidden test patch, then the fix, then runs the
task's test command in the repository root, with the verify step's own
`aml_pipeline.coding_track.apply_and_run`; the verify step's `graded` reads the command's output
and exit status. What
`aml_evaluation.registration.register_coding_dataset` does with the outcome (refuse, naming
each task and why, or write the manifest) is the registry's.

Without bwrap (or with one that cannot create namespaces) nothing is checked: `require_sandbox`'s
one line is the refusal. A sandbox fault while checking is the platform's failure
(`SandboxFault`), never a task's: it propagates and nothing is written.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Final

from aml_evaluation.coding.bundle import CodingBundle, CodingTask
from aml_evaluation.coding.validation import PatchDoesNotApply, TaskCheck, check_bundle
from aml_evaluation.registration import Registration, register_coding_dataset
from aml_pipeline.coding_track import PatchRejected, apply_and_run, graded, verify_limits
from aml_pipeline.sandbox import CommandResult, Sandbox, SandboxLimits, require_sandbox

# A task's whole test command runs as one sandbox command. The agent's per-step minute is far
# too short for a real repository's suite, so registration allows a quarter of an hour; and the
# whole log the grader reads, as the verify step keeps it.
VALIDATION_LIMITS: Final = verify_limits(900.0)


class SandboxTestRun:
    """`aml_evaluation.coding.validation.RunTests` in the real sandbox: the test command's
    result (output and exit status), or `PatchDoesNotApply` naming the first patch `git apply`
    refused."""

    def __init__(self, limits: SandboxLimits = VALIDATION_LIMITS) -> None:
        self.limits = limits

    def __call__(self, snapshot: Path, patches: Sequence[str], test_command: str) -> CommandResult:
        with Sandbox.from_archive(snapshot, self.limits) as sandbox:
            ran = apply_and_run(sandbox, patches, test_command, self.limits.wall_seconds)
            if isinstance(ran, PatchRejected):
                raise PatchDoesNotApply(ran.index, ran.reason)
            return ran


def resolves(task: CodingTask, run: CommandResult) -> bool:
    """Whether the run's output resolves the task, as the verify step grades an attempt: a run
    stopped at its time limit resolves nothing, whatever its partial log says."""
    return not run.timed_out and graded(task, run).resolved


def check_in_sandbox(
    bundle: CodingBundle, root: Path, limits: SandboxLimits = VALIDATION_LIMITS
) -> list[TaskCheck]:
    """Every task of a bundle (directory `root`) run and graded; see the module docstring."""
    return check_bundle(bundle, root, SandboxTestRun(limits), resolves)


def register_coding_bundle(
    directory: Path,
    dataset_id: str,
    datasets_root: Path,
    *,
    version: str | None = None,
    replace: bool = False,
) -> Registration:
    """Register a coding bundle after its static checks and its tasks' runs in the sandbox
    (`SandboxUnavailable` first when sandboxes cannot run here; `RegistrationError` for a
    refused bundle)."""
    require_sandbox()
    return register_coding_dataset(
        directory,
        dataset_id,
        datasets_root,
        check_tasks=check_in_sandbox,
        version=version,
        replace=replace,
    )
