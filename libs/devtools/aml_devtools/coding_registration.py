"""`aml dataset add DIR --format coding`: a coding bundle's tasks run for real before it is
registered (SPEC R-2.5), in the coding track's bubblewrap sandbox and graded with SWE-bench's
rules (`aml_evaluation.coding.grading.grade`).

Each task runs three times on a fresh sandbox of its snapshot (`Sandbox.from_archive`): with no
patch it must be unresolved, with its gold patch resolved, and with its stand-in's wrong patch
(when it has one) unresolved. A run applies its patches in order with `Sandbox.apply` (the verify
step's `git apply`), the hidden test patch last, then runs the task's test command in the
repository root; the grader reads the command's output and exit status. What
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
from aml_evaluation.coding.grading import MAX_LOG_CHARS, grade
from aml_evaluation.coding.validation import PatchDoesNotApply, TaskCheck, check_bundle
from aml_evaluation.registration import Registration, register_coding_dataset
from aml_pipeline.sandbox import CommandResult, Sandbox, SandboxLimits, require_sandbox

# A task's whole test command runs as one sandbox command. The agent's per-step minute is far
# too short for a real repository's suite, so registration allows a quarter of an hour; and the
# whole log the grader reads, as the verify step keeps it.
VALIDATION_LIMITS: Final = SandboxLimits(
    wall_seconds=900.0, cpu_seconds=900, output_bytes=MAX_LOG_CHARS
)


class SandboxTestRun:
    """`aml_evaluation.coding.validation.RunTests` in the real sandbox: the test command's
    result (output and exit status), or `PatchDoesNotApply` naming the first patch `git apply`
    refused."""

    def __init__(self, limits: SandboxLimits = VALIDATION_LIMITS) -> None:
        self.limits = limits

    def __call__(self, snapshot: Path, patches: Sequence[str], test_command: str) -> CommandResult:
        with Sandbox.from_archive(snapshot, self.limits) as sandbox:
            for index, patch in enumerate(patches):
                applied = sandbox.apply(patch)
                if not applied.ok:
                    raise PatchDoesNotApply(index, applied.output.strip())
            return sandbox.run(test_command)


def resolves(task: CodingTask, run: CommandResult) -> bool:
    """Whether the run's output resolves the task, as the verify step grades an attempt."""
    verdict = grade(
        run.output, task.log_format, task.fail_to_pass, task.pass_to_pass, exit_code=run.exit_code
    )
    return verdict.resolved


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
