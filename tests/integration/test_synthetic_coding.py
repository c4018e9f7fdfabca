"""Every shipped synthetic-coding task really tells a fix from no fix (R-2.5): on its snapshot
with its hidden tests, no patch leaves its fail-to-pass tests failing, the gold patch resolves
it, the stand-in's wrong patch does not, and its pass-to-pass tests pass every time.

The tests run for real, in a temporary copy of the snapshot, with the standard library's
unittest under /usr/bin/python3 and patches applied by `patch -p1`. The runner and the status
check below are THE TESTS' STAND-INS for the platform's sandbox and grader (written elsewhere):
a plain subprocess with no isolation, and "every listed test reports `ok`" read from
`unittest -v` lines, which is all these tasks need."""

from __future__ import annotations

import json
import re
import shlex
import shutil
import subprocess
import tempfile
from collections.abc import Sequence
from pathlib import Path

import pytest

from aml_evaluation.coding.bundle import CodingBundle, CodingTask, extract_snapshot
from aml_evaluation.coding.synthetic import SYNTHETIC_CODING_DIR, materialise_synthetic_coding
from aml_evaluation.coding.validation import PatchDoesNotApply, check_bundle, check_task

pytestmark = pytest.mark.integration

PYTHON = Path("/usr/bin/python3")
TASK_IDS = [
    task["task_id"] for task in json.loads((SYNTHETIC_CODING_DIR / "tasks.json").read_text())
]
# A `python3 -m unittest -v` result line (Python 3.11): `name (module.Class.name) ... status`.
_RESULT = re.compile(r"^(?P<test>\S+ \([\w.]+\)) \.\.\. (?P<status>.+)$", re.MULTILINE)


def run_tests_locally(snapshot: Path, patches: Sequence[str], test_command: str) -> str:
    """Stand-in for the sandbox: unpack, patch in order, run the command, return its output."""
    with tempfile.TemporaryDirectory(prefix="aml-coding-") as work:
        repository = Path(work) / "repository"
        extract_snapshot(snapshot, repository)
        for index, patch in enumerate(patches):
            applied = subprocess.run(
                ["patch", "-p1", "--batch", "--forward", "--fuzz=0", "--no-backup-if-mismatch"],
                input=patch,
                text=True,
                cwd=repository,
                capture_output=True,
                timeout=60,
                check=False,
            )
            if applied.returncode != 0:
                raise PatchDoesNotApply(index, applied.stdout + applied.stderr)
        ran = subprocess.run(
            shlex.split(test_command),
            cwd=repository,
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
            # `python3` is /usr/bin/python3; no bytecode is left in the copy.
            env={"PATH": "/usr/bin:/bin", "PYTHONDONTWRITEBYTECODE": "1", "LC_ALL": "C.UTF-8"},
        )
        return ran.stdout + ran.stderr


def unittest_statuses(log: str) -> dict[str, str]:
    """Stand-in for the grader's log reading: test id -> status word of its `-v` line."""
    return {match["test"]: match["status"].strip() for match in _RESULT.finditer(log)}


def resolved_by_stand_in(task: CodingTask, log: str) -> bool:
    """Stand-in for the grader: every fail-to-pass and pass-to-pass test reports `ok`."""
    statuses = unittest_statuses(log)
    return all(statuses.get(test) == "ok" for test in [*task.fail_to_pass, *task.pass_to_pass])


@pytest.fixture(scope="module")
def synthetic(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, CodingBundle]:
    if not PYTHON.is_file() or shutil.which("patch") is None:
        pytest.skip("needs /usr/bin/python3 and patch")
    root = tmp_path_factory.mktemp("synthetic-coding")
    return root, materialise_synthetic_coding(root)


@pytest.mark.parametrize("task_id", TASK_IDS)
def test_a_shipped_task_tells_fixes_apart(
    synthetic: tuple[Path, CodingBundle], task_id: str
) -> None:
    root, bundle = synthetic
    task = bundle.task(task_id)
    assert task.stand_in is not None
    snapshot = root / task.snapshot

    def statuses(fix: str | None) -> dict[str, str]:
        patches = [task.test_patch] if fix is None else [fix, task.test_patch]
        return unittest_statuses(run_tests_locally(snapshot, patches, task.test_command))

    unpatched, gold, wrong = (
        statuses(None),
        statuses(task.gold_patch),
        statuses(task.stand_in.wrong_patch),
    )
    assert all(unpatched.get(test) in ("FAIL", "ERROR") for test in task.fail_to_pass), unpatched
    assert all(gold.get(test) == "ok" for test in task.fail_to_pass), gold
    assert any(wrong.get(test) != "ok" for test in task.fail_to_pass), wrong
    for found in (unpatched, gold, wrong):
        assert all(found.get(test) == "ok" for test in task.pass_to_pass), found


def test_dynamic_validation_accepts_every_shipped_task(
    synthetic: tuple[Path, CodingBundle],
) -> None:
    root, bundle = synthetic
    checks = check_bundle(bundle, root, run_tests_locally, resolved_by_stand_in)
    assert [check.task_id for check in checks] == TASK_IDS
    assert all(check.usable for check in checks), [check.problems for check in checks]
    assert {(c.unpatched_resolved, c.gold_resolved, c.wrong_resolved) for c in checks} == {
        (False, True, False)
    }


def test_dynamic_validation_names_what_is_wrong(synthetic: tuple[Path, CodingBundle]) -> None:
    root, bundle = synthetic
    task = bundle.task("tally-rate-rounding")
    assert task.stand_in is not None
    snapshot = root / task.snapshot

    def check(**changes: object) -> list[str]:
        changed = task.model_copy(update=changes)
        return check_task(changed, snapshot, run_tests_locally, resolved_by_stand_in).problems

    assert check(gold_patch=task.stand_in.wrong_patch) == [
        "task 'tally-rate-rounding' is not resolved by its gold patch"
    ]
    assert check(fail_to_pass=task.pass_to_pass[:1], pass_to_pass=[]) == [
        "task 'tally-rate-rounding' is resolved with no patch",
        "task 'tally-rate-rounding' is resolved by its stand-in's wrong patch",
    ]
    other = bundle.task("almanac-duration-hours")
    assert check(gold_patch=other.gold_patch, stand_in=None) == [
        "task 'tally-rate-rounding': gold_patch does not apply to the snapshot"
    ]
    assert check(test_patch=other.gold_patch) == [
        "task 'tally-rate-rounding': test_patch does not apply to the snapshot"
    ]


def test_an_infrastructure_fault_is_never_unresolved(synthetic: tuple[Path, CodingBundle]) -> None:
    root, bundle = synthetic

    def broken(snapshot: Path, patches: Sequence[str], test_command: str) -> str:
        raise OSError("sandbox unavailable")

    with pytest.raises(OSError, match="sandbox unavailable"):
        check_bundle(bundle, root, broken, resolved_by_stand_in)
