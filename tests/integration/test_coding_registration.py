"""`aml dataset add DIR --format coding` with the real bubblewrap sandbox (SPEC R-2.5): the
materialised synthetic-coding bundle is registered after every task ran (no patch unresolved,
gold patch resolved, stand-in's wrong patch unresolved); a bundle whose gold patch does not
resolve a task, one with a task resolved without a patch, and one with a trajectory dated after
its task are refused, naming the task, with nothing written; without bwrap the command refuses
with the sandbox's one line. Skips, with that line, where bwrap cannot run."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from aml_devtools.cli import main
from aml_devtools.coding_registration import check_in_sandbox
from aml_evaluation.chunker import plan_adds
from aml_evaluation.coding.bundle import TASKS_FILE, load_coding_bundle
from aml_evaluation.coding.synthetic import SYNTHETIC_CODING_ID, materialise_synthetic_coding
from aml_evaluation.registry import load_dataset, read_manifest, registered
from aml_pipeline.coding_track import verify_limits
from aml_pipeline.sandbox import SandboxUnavailable, require_sandbox
from aml_pipeline.sandbox.sandbox import MISSING_BWRAP

pytestmark = pytest.mark.integration

BUNDLE = "coding/synthetic"


@pytest.fixture(scope="module", autouse=True)
def _bwrap_available() -> None:
    try:
        require_sandbox()
    except SandboxUnavailable as unavailable:
        pytest.skip(str(unavailable))


@pytest.fixture
def root(tmp_path: Path) -> Path:
    """A datasets root holding the materialised synthetic-coding bundle at coding/synthetic."""
    datasets = tmp_path / "datasets"
    materialise_synthetic_coding(datasets / BUNDLE)
    return datasets


def add(root: Path, dataset_id: str) -> int:
    directory = str(root / BUNDLE)
    return main(
        ["dataset", "add", directory, "--format", "coding", "--id", dataset_id,
         "--datasets-root", str(root)]
    )  # fmt: skip


def rewrite_tasks(root: Path, change: dict[str, dict[str, Any]]) -> None:
    """Change fields of some tasks in the bundle's tasks.jsonl (task id -> fields)."""
    path = root / BUNDLE / TASKS_FILE
    lines = []
    for line in path.read_text(encoding="utf-8").splitlines():
        task = json.loads(line)
        task.update(change.get(task["task_id"], {}))
        lines.append(json.dumps({k: v for k, v in task.items() if v is not None}) + "\n")
    path.write_text("".join(lines), encoding="utf-8")


def test_the_synthetic_bundle_is_registered_after_its_tasks_ran(
    root: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert add(root, "syn") == 0, capsys.readouterr().err
    out = capsys.readouterr().out
    assert out.startswith("added syn (coding, coding, 8 tasks, 16 attempts)")
    manifest = read_manifest(root / "manifests" / "syn.json")
    shipped = registered(SYNTHETIC_CODING_ID, None).manifest
    # The same bytes as the shipped bundle, pinned the same way.
    assert [e.sha256 for e in manifest.files] == [e.sha256 for e in shipped.files]
    declared = (manifest.track, manifest.scorer, manifest.search_top_k)
    assert declared == ("coding", "swe_resolved", 100)
    assert manifest.question_counts == shipped.question_counts == {1: 8, 2: 8}
    dataset = load_dataset("syn", root)
    expected = load_dataset(SYNTHETIC_CODING_ID, root).model_copy(update={"dataset_id": "syn"})
    assert plan_adds(dataset, "run") == plan_adds(expected, "run")
    # Every run was made and came out as the checks require.
    checks = check_in_sandbox(load_coding_bundle(root / BUNDLE), root / BUNDLE)
    assert {(c.unpatched_resolved, c.gold_resolved, c.wrong_resolved) for c in checks} == {
        (False, True, False)
    }


def test_a_bundle_whose_gold_patch_does_not_resolve_a_task_is_refused(
    root: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    bundle = load_coding_bundle(root / BUNDLE)
    task = bundle.task("tally-rate-rounding")
    assert task.stand_in is not None
    # Its plausible wrong patch as the gold one: it applies, and misses the hidden tests.
    rewrite_tasks(root, {task.task_id: {"gold_patch": task.stand_in.wrong_patch, "stand_in": None}})
    assert add(root, "syn") == 2
    err = capsys.readouterr().err
    assert "task 'tally-rate-rounding' is not resolved by its gold patch" in err
    assert "almanac" not in err  # the other tasks passed
    assert not (root / "manifests").exists()


def test_a_gold_run_stopped_at_its_time_limit_resolves_nothing(root: Path) -> None:
    """Graded as verify grades an attempt: the run reports every listed test passing (and one
    outside the lists failing, so that its non-zero exit alone does not refuse the log), then
    outlives its limit; its partial log does not count."""
    task = load_coding_bundle(root / BUNDLE).task("tally-rate-rounding")
    unlisted_failure = "echo 'test_unlisted (tests.test_other.Other) ... FAIL'"
    command = f"{task.test_command}; {unlisted_failure}; sleep 60"
    rewrite_tasks(root, {task.task_id: {"test_command": command}})
    bundle = load_coding_bundle(root / BUNDLE)
    (check,) = [
        c
        for c in check_in_sandbox(bundle, root / BUNDLE, verify_limits(3.0))
        if c.task_id == task.task_id
    ]
    assert check.gold_resolved is False
    assert any("not resolved by its gold patch" in problem for problem in check.problems)


def test_a_task_resolved_without_a_patch_is_refused(
    root: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    task = load_coding_bundle(root / BUNDLE).task("knobs-set-option")
    # A test that already passes, as the one that should fail.
    lists = {"fail_to_pass": task.pass_to_pass[:1], "pass_to_pass": task.pass_to_pass[1:]}
    rewrite_tasks(root, {task.task_id: lists})
    assert add(root, "syn") == 2
    err = capsys.readouterr().err
    assert "task 'knobs-set-option' is resolved with no patch" in err
    assert not (root / "manifests").exists()


def test_a_trajectory_dated_after_its_task_is_refused(
    root: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # The task predates its relevant session (tally-s1008, October 2024).
    rewrite_tasks(root, {"tally-rate-rounding": {"created_at": "2024-10-01T00:00:00Z"}})
    assert add(root, "syn") == 2
    err = capsys.readouterr().err
    where = "task 'tally-rate-rounding' condition 'relevant'"
    assert f"{where}: trajectory 'tally-s1008' is dated" in err
    assert "after the task's created_at 2024-10-01T00:00:00+00:00" in err
    assert not (root / "manifests").exists()


def test_without_bwrap_the_command_refuses_with_the_sandboxs_line(
    root: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PATH", str(root))  # no bwrap there
    assert add(root, "syn") == 2
    assert capsys.readouterr().err == f"aml dataset add: {MISSING_BWRAP}\n"
    assert not (root / "manifests").exists()
