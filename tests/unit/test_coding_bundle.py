"""The coding dataset bundle (R-2.3, R-2.5): its models, static validation, hostile bundles,
deterministic snapshots, the coding-v1 chunking rule, the SWE-bench / SWEContextBench import and
the shipped synthetic-coding data."""

from __future__ import annotations

import io
import json
import os
import re
import stat
import tarfile
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from coding_doubles import bundle_adds
from pydantic import ValidationError

from aml_contract.participant import Message, encode
from aml_evaluation.chunker import MAX_MESSAGES, AddChunk, message_words
from aml_evaluation.coding.bundle import (
    CONDITIONS_FILE,
    MAX_STEP_TURNS,
    MAX_TURN_CHARS,
    TASKS_FILE,
    TRAJECTORIES_FILE,
    BundleLimits,
    CodingBundle,
    CodingBundleError,
    CodingTask,
    Condition,
    Conditions,
    Step,
    TaskConditions,
    Trajectory,
    Turn,
    archive_files,
    archive_problems,
    build_snapshot_archive,
    extract_snapshot,
    file_sha256,
    load_coding_bundle,
    patch_files,
    write_coding_bundle,
)
from aml_evaluation.coding.chunking import CODING_CHUNKER_VERSION, unix_ms
from aml_evaluation.coding.swebench_import import (
    Event,
    RepoTestSpec,
    SwebenchImportError,
    command_for,
    import_swecontextbench,
    parse_swebench_instance,
    read_past_experience,
    trajectory_from_events,
)
from aml_evaluation.coding.synthetic import materialise_synthetic_coding, repository_files

T0 = datetime(2024, 1, 10, 9, 0, tzinfo=UTC)
TEST_PATCH = (
    "diff --git a/tests/test_calc.py b/tests/test_calc.py\n"
    "new file mode 100644\n"
    "--- /dev/null\n"
    "+++ b/tests/test_calc.py\n"
    "@@ -0,0 +1 @@\n"
    "+import unittest\n"
)
GOLD_PATCH = (
    "diff --git a/calc/core.py b/calc/core.py\n"
    "--- a/calc/core.py\n"
    "+++ b/calc/core.py\n"
    "@@ -1 +1 @@\n"
    "-X = 1\n"
    "+X = 2\n"
)
F2P = "test_adds (tests.test_calc.TestCalc.test_adds)"
P2P = "test_keeps (tests.test_calc.TestCalc.test_keeps)"
SNAPSHOT_FILES = {"calc/__init__.py": b"", "calc/core.py": b"X = 1\n", "tests/__init__.py": b""}
SWE_SAMPLE = "swecontextbench/sympy__sympy-12426.json"


def task_payload(**changes: Any) -> dict[str, Any]:
    payload: dict[str, Any] = {
        "task_id": "calc-1",
        "repo": "calc",
        "snapshot": "snapshots/calc.tar.gz",
        "snapshot_sha256": "0" * 64,
        "problem_statement": "adding is broken",
        "test_patch": TEST_PATCH,
        "gold_patch": GOLD_PATCH,
        "test_command": "python3 -m unittest -v",
        "log_format": "unittest",
        "fail_to_pass": [F2P],
        "pass_to_pass": [P2P],
        "task_type": "debug",
        "created_at": "2024-02-01T00:00:00Z",
    }
    payload.update(changes)
    return payload


def trajectory_payload(trajectory_id: str = "calc-s1", **changes: Any) -> dict[str, Any]:
    payload: dict[str, Any] = {
        "trajectory_id": trajectory_id,
        "repo": "calc",
        "created_at": "2024-01-10T09:00:00Z",
        "steps": [
            {
                "turns": [
                    {"role": "user", "content": "why is X 1?", "timestamp": "2024-01-10T09:00:00Z"},
                    {"role": "assistant", "content": "ran `grep -rn X calc/`"},
                    {"role": "tool", "content": "calc/core.py:1:X = 1"},
                ]
            }
        ],
    }
    payload.update(changes)
    return payload


def trajectory(
    trajectory_id: str, steps: list[list[tuple[str, str]]], start: datetime
) -> Trajectory:
    """A trajectory whose turns are a minute apart from `start`."""
    built: list[Step] = []
    minute = 0
    for step in steps:
        turns = []
        for role, content in step:
            moment = start + timedelta(minutes=minute)
            turns.append(
                Turn.model_validate({"role": role, "content": content, "timestamp": moment})
            )
            minute += 1
        built.append(Step(turns=turns))
    return Trajectory(trajectory_id=trajectory_id, repo="calc", created_at=start, steps=built)


def write_bundle(
    root: Path,
    *,
    tasks: list[dict[str, Any]] | None = None,
    trajectories: list[dict[str, Any]] | None = None,
    conditions: dict[str, Any] | None = None,
    snapshot: dict[str, bytes] | None = None,
) -> Path:
    """A bundle directory; tasks naming the default snapshot get its real sha256."""
    root.mkdir(parents=True, exist_ok=True)
    digest = archive_files(
        SNAPSHOT_FILES if snapshot is None else snapshot, root / "snapshots/calc.tar.gz"
    )
    tasks = [task_payload()] if tasks is None else tasks
    for task in tasks:
        if task.get("snapshot_sha256") == "0" * 64:
            task["snapshot_sha256"] = digest
    trajectories = [trajectory_payload()] if trajectories is None else trajectories
    if conditions is None:
        conditions = {"calc-1": {"relevant": ["calc-s1"], "noisy": ["calc-s1"]}}
    (root / TASKS_FILE).write_text("".join(json.dumps(t) + "\n" for t in tasks))
    (root / TRAJECTORIES_FILE).write_text("".join(json.dumps(t) + "\n" for t in trajectories))
    (root / CONDITIONS_FILE).write_text(json.dumps(conditions))
    return root


def problems_of(root: Path, limits: BundleLimits | None = None) -> list[str]:
    with pytest.raises(CodingBundleError) as caught:
        load_coding_bundle(root, limits)
    return caught.value.problems


# --- models -------------------------------------------------------------------------------------


def test_a_valid_bundle_loads(tmp_path: Path) -> None:
    bundle = load_coding_bundle(write_bundle(tmp_path))
    assert [task.task_id for task in bundle.tasks] == ["calc-1"]
    assert bundle.tasks[0].created_at == datetime(2024, 2, 1, tzinfo=UTC)
    assert [t.trajectory_id for t in bundle.scope("calc-1", "noisy")] == ["calc-s1"]


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"extra": 1}, "Extra inputs are not permitted"),
        ({"created_at": "2024-02-01T00:00:00"}, "timezone"),
        ({"task_type": "refactor"}, "debug"),
        ({"log_format": "tap"}, "unittest"),
        ({"task_id": "calc:1"}, "pattern"),
        ({"snapshot": "../calc.tar.gz"}, "'..'"),
        ({"snapshot": "/srv/calc.tar.gz"}, "relative"),
        ({"snapshot": "snapshots/calc.zip"}, ".tar.gz"),
        ({"fail_to_pass": []}, "at least 1"),
        ({"fail_to_pass": ["test_adds (tests.test_calc.TestCalc)"]}, "Python 3.11"),
        ({"fail_to_pass": ["tests/test_calc.py::test_adds"]}, "Python 3.11"),
        ({"fail_to_pass": [F2P], "log_format": "pytest"}, "pytest node id"),
        ({"fail_to_pass": [F2P + "\nx"]}, "pattern"),
        ({"snapshot_sha256": "xyz"}, "pattern"),
    ],
)
def test_task_fields_are_strict(change: dict[str, Any], message: str) -> None:
    with pytest.raises(ValidationError, match=re.escape(message)):
        CodingTask.model_validate_json(json.dumps(task_payload(**change)))


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"trajectory_id": "relevant-7"}, "must not tell"),
        ({"trajectory_id": "calc-noisy-2"}, "must not tell"),
        ({"created_at": "2024-01-10T09:30:00Z"}, "before the trajectory's created_at"),
        ({"steps": []}, "at least 1"),
        ({"steps": [{"turns": []}]}, "at least 1"),
        ({"steps": [{"turns": [{"role": "user", "content": "   "}]}]}, "pattern"),
        ({"steps": [{"turns": [{"role": "system", "content": "x"}]}]}, "'user'"),
        ({"steps": [{"turns": [{"role": "user", "content": "x", "relevant": True}]}]}, "Extra"),
        (
            {"steps": [{"turns": [{"role": "user", "content": "x"}] * (MAX_STEP_TURNS + 1)}]},
            f"at most {MAX_STEP_TURNS}",
        ),
    ],
)
def test_trajectory_fields_are_strict(change: dict[str, Any], message: str) -> None:
    with pytest.raises(ValidationError, match=re.escape(message)):
        Trajectory.model_validate_json(json.dumps(trajectory_payload(**change)))


def test_patch_files_reads_git_and_plain_diffs() -> None:
    assert patch_files(TEST_PATCH) == ["tests/test_calc.py"]
    assert patch_files(GOLD_PATCH) == ["calc/core.py"]
    with pytest.raises(ValueError, match="not a unified diff"):
        patch_files("just words")
    # A removed line starting with "-- " is hunk content, not a file header.
    sql = "--- a/db.sql\n+++ b/db.sql\n@@ -1,2 +1,1 @@\n--- old note\n select 1;\n"
    assert patch_files(sql) == ["db.sql"]
    deleted = "--- a/tests/test_old.py\n+++ /dev/null\n@@ -1 +0,0 @@\n-x\n"
    spec = RepoTestSpec(test_command="pytest {test_files}", log_format="pytest")
    assert command_for(spec, TEST_PATCH + deleted) == "pytest tests/test_calc.py"
    with pytest.raises(ValueError, match=r"'\.\.'"):
        patch_files("--- a/../etc/passwd\n+++ b/../etc/passwd\n")


# --- static validation --------------------------------------------------------------------------


def test_every_problem_is_named(tmp_path: Path) -> None:
    late = trajectory_payload(
        "calc-s9",
        created_at="2024-03-01T00:00:00Z",
        steps=[{"turns": [{"role": "user", "content": "later"}]}],
    )
    root = write_bundle(
        tmp_path,
        tasks=[
            task_payload(),
            task_payload(),
            task_payload(task_id="calc-2", pass_to_pass=[F2P], fail_to_pass=[F2P, F2P]),
            task_payload(task_id="calc-3", gold_patch=TEST_PATCH),
            task_payload(task_id="calc-4", test_patch="no diff here"),
        ],
        trajectories=[trajectory_payload(), trajectory_payload(), late],
        conditions={
            "calc-1": {"relevant": ["calc-s1"], "noisy": ["calc-s1", "calc-s1", "calc-s7"]},
            "calc-2": {"relevant": [], "noisy": ["calc-s9"]},
            "calc-3": {"relevant": ["calc-s1"], "noisy": ["calc-s1"]},
            "calc-9": {"relevant": ["calc-s1"], "noisy": ["calc-s1"]},
        },
    )
    problems = problems_of(root)
    expected = [
        "task 'calc-1' is given twice",
        "trajectory 'calc-s1' is given twice",
        "task 'calc-1' condition 'noisy' lists 'calc-s1' twice",
        "task 'calc-1' condition 'noisy': unknown trajectory 'calc-s7'",
        "task 'calc-2': fail_to_pass lists",
        "is in both fail_to_pass and pass_to_pass",
        "task 'calc-2' condition 'relevant' holds no trajectory",
        "trajectory 'calc-s9' is dated 2024-03-01T00:00:00+00:00, after the task's created_at",
        "task 'calc-3': gold_patch and test_patch both change 'tests/test_calc.py'",
        "task 'calc-4': test_patch is not a unified diff",
        "task 'calc-4' has no conditions",
        "conditions name unknown task 'calc-9'",
    ]
    for fragment in expected:
        assert any(fragment in problem for problem in problems), (fragment, problems)


def test_a_turn_dated_after_the_task_counts(tmp_path: Path) -> None:
    payload = trajectory_payload()
    payload["steps"][0]["turns"][1]["timestamp"] = "2024-02-01T00:00:01Z"
    problems = problems_of(write_bundle(tmp_path, trajectories=[payload]))
    assert any("2024-02-01T00:00:01+00:00, after the task's created_at" in p for p in problems)


def test_snapshot_is_pinned_and_present(tmp_path: Path) -> None:
    root = write_bundle(tmp_path, tasks=[task_payload(snapshot_sha256="1" * 64)])
    assert any("the task pins" + " " + "1" * 64 in p for p in problems_of(root))
    (root / "snapshots/calc.tar.gz").unlink()
    assert any("snapshot 'snapshots/calc.tar.gz' is missing" in p for p in problems_of(root))


def _tar_gz(path: Path, members: list[tuple[tarfile.TarInfo, bytes]]) -> Path:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w:gz") as archive:
        for info, data in members:
            info.size = len(data) if info.isreg() else 0
            archive.addfile(info, io.BytesIO(data) if info.isreg() else None)
    path.write_bytes(buffer.getvalue())
    return path


def _member(name: str, kind: bytes = tarfile.REGTYPE, **fields: Any) -> tarfile.TarInfo:
    info = tarfile.TarInfo(name)
    info.type = kind
    for key, value in fields.items():
        setattr(info, key, value)
    return info


@pytest.mark.parametrize(
    ("member", "message"),
    [
        (_member(".git/config"), "repository history (.git)"),
        (_member("sub/.git"), "repository history (.git)"),
        (_member("/etc/passwd"), "relative POSIX path"),
        (_member("../escape.py"), "'..'"),
        (_member("link", tarfile.SYMTYPE, linkname="../../etc/passwd"), "points outside"),
        (_member("link", tarfile.SYMTYPE, linkname="/etc/passwd"), "points outside"),
        (_member("hard", tarfile.LNKTYPE, linkname="calc/core.py"), "not a regular file"),
        (_member("fifo", tarfile.FIFOTYPE), "not a regular file"),
        (_member("dev", tarfile.CHRTYPE), "not a regular file"),
        (_member("run.sh", mode=0o4755), "setuid"),
        (_member("calc/core.py"), "given twice"),
    ],
)
def test_unsafe_snapshot_members_are_refused(
    tmp_path: Path, member: tarfile.TarInfo, message: str
) -> None:
    archive = _tar_gz(
        tmp_path / "s.tar.gz", [(_member("calc/core.py"), b"X = 1\n"), (member, b"x")]
    )
    assert any(message in problem for problem in archive_problems(archive)), archive_problems(
        archive
    )
    with pytest.raises(CodingBundleError, match=re.escape(message)):
        extract_snapshot(archive, tmp_path / "out")


def test_a_safe_symlink_is_kept(tmp_path: Path) -> None:
    link = _member("calc/alias.py", tarfile.SYMTYPE, linkname="core.py")
    archive = _tar_gz(tmp_path / "s.tar.gz", [(_member("calc/core.py"), b"X = 1\n"), (link, b"")])
    assert archive_problems(archive) == []
    extract_snapshot(archive, tmp_path / "out")
    assert (tmp_path / "out/calc/alias.py").read_text() == "X = 1\n"


def test_archives_that_are_not_archives_or_too_big(tmp_path: Path) -> None:
    (tmp_path / "junk.tar.gz").write_bytes(b"not gzip at all")
    assert "is not a readable .tar.gz" in archive_problems(tmp_path / "junk.tar.gz")[0]
    empty = _tar_gz(tmp_path / "empty.tar.gz", [])
    assert archive_problems(empty) == ["is empty"]
    many = _tar_gz(tmp_path / "many.tar.gz", [(_member(f"f{n}"), b"") for n in range(5)])
    assert archive_problems(many, BundleLimits(max_snapshot_members=4)) == [
        "has more than 4 members"
    ]
    # A gzip bomb: a few KB that unpack to 64 MiB, refused by the unpacked-size cap as it streams.
    bomb = _tar_gz(tmp_path / "bomb.tar.gz", [(_member("zeros"), bytes(64 * 1024 * 1024))])
    assert bomb.stat().st_size < 200_000
    problems = archive_problems(bomb, BundleLimits(max_snapshot_unpacked_bytes=1024 * 1024))
    assert problems == [f"unpacks to more than {1024 * 1024} bytes"]
    assert archive_problems(bomb, BundleLimits(max_snapshot_bytes=10)) == [
        f"is {bomb.stat().st_size} bytes, more than 10"
    ]


# --- hostile bundles ------------------------------------------------------------------------------


def test_a_huge_line_fails_without_being_read_whole(tmp_path: Path) -> None:
    root = write_bundle(tmp_path)
    # 33 MiB on one line: past the 32 MiB line cap, so reading stops at the cap.
    with (root / TASKS_FILE).open("wb") as handle:
        handle.write(b'{"task_id": "' + b"x" * (33 * 1024 * 1024) + b'"}\n')
    with pytest.raises(CodingBundleError, match=r"tasks\.jsonl:1: line longer than 33554432 bytes"):
        load_coding_bundle(root)


def test_a_huge_file_fails_before_it_is_read(tmp_path: Path) -> None:
    root = write_bundle(tmp_path)
    with (root / TRAJECTORIES_FILE).open("r+b") as handle:
        handle.truncate(1024 * 1024 * 1024 + 1)  # sparse: nothing is written
    with pytest.raises(CodingBundleError, match=r"trajectories\.jsonl is 1073741825 bytes"):
        load_coding_bundle(root)


def test_too_many_tasks_fail_at_the_first_one_over(tmp_path: Path) -> None:
    root = write_bundle(tmp_path)
    line = (root / TASKS_FILE).read_bytes()
    limits = BundleLimits()
    # A file of a million tasks stops at the 10,001st line the same way.
    (root / TASKS_FILE).write_bytes(line * (limits.max_tasks + 1))
    with pytest.raises(CodingBundleError, match=r"tasks\.jsonl:10001: more than 10000 records"):
        load_coding_bundle(root)


@pytest.mark.parametrize(
    ("name", "content", "message"),
    [
        (TASKS_FILE, b"[" * 100_000 + b"\n", r"tasks\.jsonl:1: "),
        (TASKS_FILE, b"\xff\xfe{}\n", r"tasks\.jsonl:1: "),
        (TRAJECTORIES_FILE, b"\n\n{}\n", r"trajectories\.jsonl:3: trajectory_id: Field required"),
        (CONDITIONS_FILE, b"[1, 2]", r"conditions\.json: "),
        (CONDITIONS_FILE, b'{"calc-1": {"relevant": "calc-s1"}}', r"conditions\.json: "),
    ],
)
def test_malformed_files_name_file_and_line(
    tmp_path: Path, name: str, content: bytes, message: str
) -> None:
    root = write_bundle(tmp_path)
    (root / name).write_bytes(content)
    with pytest.raises(CodingBundleError, match=message):
        load_coding_bundle(root)


def test_a_scope_over_its_cap_is_refused(tmp_path: Path) -> None:
    root = write_bundle(tmp_path)
    problems = problems_of(root, BundleLimits(max_scope_trajectories=0))
    assert any("holds 1 trajectories, more than 0" in problem for problem in problems)


def test_a_bundle_round_trips(tmp_path: Path) -> None:
    bundle = load_coding_bundle(write_bundle(tmp_path / "a"))
    write_coding_bundle(bundle, tmp_path / "b")
    (tmp_path / "b/snapshots").mkdir()
    (tmp_path / "b/snapshots/calc.tar.gz").write_bytes(
        (tmp_path / "a/snapshots/calc.tar.gz").read_bytes()
    )
    assert load_coding_bundle(tmp_path / "b") == bundle


# --- deterministic snapshots ----------------------------------------------------------------------


def _tree(root: Path, mode: int, mtime: int) -> Path:
    for name, data in SNAPSHOT_FILES.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)
        path.chmod(mode)
        os.utime(path, (mtime, mtime))
    return root


def test_snapshot_archives_are_deterministic(tmp_path: Path) -> None:
    first = archive_files(SNAPSHOT_FILES, tmp_path / "one.tar.gz")
    second = archive_files(dict(reversed(SNAPSHOT_FILES.items())), tmp_path / "two.tar.gz")
    assert first == second == file_sha256(tmp_path / "one.tar.gz")
    # The same files on another machine: other times, permissions, history and caches.
    tree = _tree(tmp_path / "tree", 0o664, 1_700_000_000)
    (tree / ".git").mkdir()
    (tree / ".git/HEAD").write_text("ref: refs/heads/main\n")
    (tree / "calc/__pycache__").mkdir()
    (tree / "calc/__pycache__/core.cpython-311.pyc").write_bytes(b"\x00")
    other = _tree(tmp_path / "other", 0o600, 1)
    assert build_snapshot_archive(tree, tmp_path / "three.tar.gz") == first
    assert build_snapshot_archive(other, tmp_path / "four.tar.gz") == first
    raw = (tmp_path / "one.tar.gz").read_bytes()
    assert raw[4:8] == b"\x00\x00\x00\x00"  # gzip mtime 0, and no file name (FLG 0)
    assert raw[3] == 0
    with tarfile.open(tmp_path / "one.tar.gz") as archive:
        members = archive.getmembers()
    assert [m.name for m in members] == [
        "calc",
        "calc/__init__.py",
        "calc/core.py",
        "tests",
        "tests/__init__.py",
    ]
    assert {(m.mtime, m.uid, m.gid, m.uname, m.gname) for m in members} == {(0, 0, 0, "", "")}
    assert {m.name: stat.S_IMODE(m.mode) for m in members}["calc/core.py"] == 0o644


def test_executables_keep_their_bit_and_escaping_links_are_refused(tmp_path: Path) -> None:
    tree = _tree(tmp_path / "tree", 0o644, 0)
    (tree / "run.sh").write_text("#!/bin/sh\n")
    (tree / "run.sh").chmod(0o700)
    build_snapshot_archive(tree, tmp_path / "a.tar.gz")
    with tarfile.open(tmp_path / "a.tar.gz") as archive:
        assert stat.S_IMODE(archive.getmember("run.sh").mode) == 0o755
    (tree / "out").symlink_to("/etc/passwd")
    with pytest.raises(ValueError, match="symlink out of the tree"):
        build_snapshot_archive(tree, tmp_path / "b.tar.gz")
    with pytest.raises(ValueError, match="cannot archive"):
        archive_files({".git/HEAD": b""}, tmp_path / "c.tar.gz")


# --- coding-v1 ----------------------------------------------------------------------------------


def scope_adds(
    task_id: str, condition: Condition, trajectories: list[Trajectory], *, run: str, dataset: str
) -> list[AddChunk]:
    """One scope's Adds as a job writes them: a bundle of one task whose `condition` scope holds
    `trajectories`, through the registry's mapping and the chunker."""
    ids = [t.trajectory_id for t in trajectories]
    lists = TaskConditions(
        relevant=ids if condition == "relevant" else [], noisy=ids if condition == "noisy" else []
    )
    bundle = CodingBundle(
        tasks=[CodingTask.model_validate_json(json.dumps(task_payload(task_id=task_id)))],
        trajectories=trajectories,
        conditions=Conditions({task_id: lists}),
    )
    scope = f"{task_id}:{condition}"
    return [add for add in bundle_adds(bundle, run, dataset) if add.conversation_id == scope]


def chunks_of(one: Trajectory) -> list[list[Message]]:
    """The messages of each Add a trajectory is written with."""
    adds = scope_adds("calc-1", "relevant", [one], run="r", dataset="d")
    return [add.request.messages for add in adds]


def _step(number: int, words: int = 3) -> list[tuple[str, str]]:
    text = " ".join(["word"] * words)
    return [
        ("assistant", f"step {number}: {text}"),
        ("tool", f"output {number}"),
        ("assistant", f"noted {number}"),
    ]


def test_one_add_per_trajectory_with_turns_as_messages() -> None:
    one = trajectory("calc-s1", [_step(1), _step(2)], T0)
    adds = scope_adds("calc-1", "relevant", [one], run="run-1", dataset="syn")
    assert len(adds) == 1
    add = adds[0]
    assert add.user_id == "eval:run-1:syn:calc-1:relevant"
    assert add.session_id == "eval:run-1:calc-1:relevant:calc-s1"
    assert add.request_id == "eval:run-1:syn:calc-1:relevant:chunk-1"
    assert add.conversation_id == "calc-1:relevant"
    assert [(m.role, m.content) for m in add.request.messages] == [
        (turn.role, turn.content) for turn in one.all_turns()
    ]
    assert [m.timestamp for m in add.request.messages] == [
        unix_ms(T0 + timedelta(minutes=n)) for n in range(6)
    ]
    assert CODING_CHUNKER_VERSION == "coding-v1"


def test_an_undated_turn_takes_the_trajectory_date() -> None:
    one = Trajectory.model_validate_json(json.dumps(trajectory_payload()))
    messages = chunks_of(one)[0]
    assert messages[1].timestamp == unix_ms(one.created_at) == 1704877200000


def test_a_long_trajectory_splits_between_steps_only() -> None:
    # 8 steps of 3 turns = 24 messages: 6 steps (18) fit, the 7th would make 21.
    long = trajectory("calc-s1", [_step(n) for n in range(8)], T0)
    chunks = chunks_of(long)
    assert [len(chunk) for chunk in chunks] == [18, 6]
    assert all(len(chunk) <= MAX_MESSAGES for chunk in chunks)
    assert chunks[1][0].content.startswith("step 6:")
    # Words: steps of ~900 words, two fit in 2,000 words, a third starts a new Add.
    wordy = trajectory("calc-s2", [_step(n, words=900) for n in range(3)], T0)
    assert [len(chunk) for chunk in chunks_of(wordy)] == [6, 3]
    # One step over 2,000 words is never split: it is an Add of its own.
    huge = trajectory("calc-s3", [_step(0), _step(1, words=2500), _step(2)], T0)
    chunks = chunks_of(huge)
    assert [len(chunk) for chunk in chunks] == [3, 3, 3]
    assert sum(message_words(m) for m in chunks[1]) > 2000


def test_a_scope_is_written_oldest_first_never_in_the_conditions_order() -> None:
    older = trajectory("calc-s2", [_step(n) for n in range(7)], T0)
    newer = trajectory("calc-s1", [_step(1)], T0 + timedelta(days=3))
    adds = scope_adds("calc-1", "noisy", [newer, older], run="r", dataset="d")
    assert [(add.seq, add.session_id.rsplit(":", 1)[1]) for add in adds] == [
        (1, "calc-s2"),
        (2, "calc-s2"),
        (3, "calc-s1"),
    ]
    assert [add.request_id.rsplit(":", 1)[1] for add in adds] == ["chunk-1", "chunk-2", "chunk-3"]
    assert adds == scope_adds("calc-1", "noisy", [older, newer], run="r", dataset="d")


def test_no_relevance_label_is_ever_sent(tmp_path: Path) -> None:
    bundle = materialise_synthetic_coding(tmp_path)
    adds = bundle_adds(bundle, "r", "synthetic-coding")
    sent = {
        t.trajectory_id: [(turn.role, turn.content) for turn in t.all_turns()]
        for t in bundle.trajectories
    }
    written: dict[tuple[str, str], list[tuple[str, str]]] = {}
    for add in adds:
        body = json.loads(encode(add.request))
        assert set(body) == {"request_id", "messages", "user_id", "session_id"}
        assert all(set(message) == {"role", "content", "timestamp"} for message in body["messages"])
        key = (add.user_id, add.session_id.rsplit(":", 1)[1])
        written.setdefault(key, []).extend((m["role"], m["content"]) for m in body["messages"])
    # Each scope's Adds carry exactly its trajectories' turns, nothing added.
    assert all(messages == sent[trajectory_id] for (_, trajectory_id), messages in written.items())
    for task in bundle.tasks:
        for condition in ("relevant", "noisy"):
            user = f"eval:r:synthetic-coding:{task.task_id}:{condition}"
            held = {trajectory_id for (user_id, trajectory_id) in written if user_id == user}
            assert held == set(bundle.conditions.root[task.task_id].of(condition))


# --- SWE-bench / SWEContextBench import ------------------------------------------------------


SYMPY_SPEC = RepoTestSpec(test_command="python -m pytest -rA {test_files}", log_format="pytest")


@pytest.fixture()
def sympy_sample(datasets_root: Path) -> Path:
    path = datasets_root / SWE_SAMPLE
    if not path.is_file():
        pytest.skip(f"{SWE_SAMPLE} is not in {datasets_root} (licence keeps it out of the repo)")
    return path


def test_the_sample_instance_parses(sympy_sample: Path) -> None:
    raw = json.loads(sympy_sample.read_text())
    task = parse_swebench_instance(
        raw,
        snapshot="snapshots/x.tar.gz",
        snapshot_sha256="a" * 64,
        spec=SYMPY_SPEC,
        task_type="debug",
    )
    assert task.task_id == "sympy__sympy-12426"
    assert task.repo == "sympy/sympy"
    assert task.base_commit == "2340de24255dce927b66840f6271431269ba5b93"
    assert task.problem_statement == raw["problem_statement"]
    assert task.gold_patch == raw["patch"] and task.test_patch == raw["test_patch"]
    assert task.fail_to_pass == [
        "sympy/matrices/expressions/tests/test_diagonal.py::test_DiagonalMatrix"
    ]
    assert len(task.pass_to_pass) == 2
    assert task.created_at == datetime(2017, 3, 26, 21, 39, 14, tzinfo=UTC)
    assert (
        task.test_command
        == "python -m pytest -rA sympy/matrices/expressions/tests/test_diagonal.py"
    )
    # SWE-bench's own release writes the test lists as JSON strings.
    encoded = {**raw, "FAIL_TO_PASS": json.dumps(raw["FAIL_TO_PASS"]), "PASS_TO_PASS": "[]"}
    again = parse_swebench_instance(
        encoded,
        snapshot="snapshots/x.tar.gz",
        snapshot_sha256="a" * 64,
        spec=SYMPY_SPEC,
        task_type="debug",
    )
    assert again.fail_to_pass == task.fail_to_pass and again.pass_to_pass == []


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"FAIL_TO_PASS": None}, "FAIL_TO_PASS must be a list of test ids"),
        ({"FAIL_TO_PASS": "[not json"}, "FAIL_TO_PASS is a string but not a JSON list"),
        ({"FAIL_TO_PASS": []}, "fail_to_pass: List should have at least 1 item"),
        ({"PASS_TO_PASS": [1, 2]}, "PASS_TO_PASS must be a list of test ids"),
        ({"created_at": "26 March 2017"}, "is not ISO 8601"),
        ({"patch": ""}, "field 'patch' must be a non-empty string"),
        ({"test_patch": "no diff"}, "test_patch is not a unified diff"),
        ({"FAIL_TO_PASS": ["test_DiagonalMatrix"]}, "is not a pytest node id"),
        ({"instance_id": "sympy:12426"}, "task_id: String should match pattern"),
    ],
)
def test_bad_instances_are_refused_clearly(
    sympy_sample: Path, change: dict[str, Any], message: str
) -> None:
    raw = {**json.loads(sympy_sample.read_text()), **change}
    with pytest.raises(SwebenchImportError, match=re.escape(message)):
        parse_swebench_instance(
            raw,
            snapshot="snapshots/x.tar.gz",
            snapshot_sha256="a" * 64,
            spec=SYMPY_SPEC,
            task_type="debug",
        )
    missing = json.loads(sympy_sample.read_text())
    del missing["problem_statement"]
    with pytest.raises(SwebenchImportError, match="field 'problem_statement' is missing"):
        parse_swebench_instance(
            missing,
            snapshot="snapshots/x.tar.gz",
            snapshot_sha256="a" * 64,
            spec=SYMPY_SPEC,
            task_type="debug",
        )


def claude_code_session(
    instance_id: str, repo: str, start: str = "2025-12-09T20:18:28.889Z"
) -> list[dict[str, Any]]:
    """A Past Experience session in Claude Code's log format, as SWEContextBench ships them."""
    base = {
        "isSidechain": False,
        "userType": "external",
        "sessionId": "8c0be6e5-1",
        "version": "2.0.62",
    }

    def at(seconds: int) -> str:
        moment = datetime.fromisoformat(start.replace("Z", "+00:00")) + timedelta(seconds=seconds)
        return moment.isoformat().replace("+00:00", "Z")

    prompt = (
        f"Fix this bug:\n  instance_id: {instance_id}\n  repo: {repo}\n  problem_statement: ..."
    )
    return [
        {"type": "file-history-snapshot", "messageId": "m0", "snapshot": {}},
        {
            **base,
            "type": "user",
            "timestamp": at(0),
            "message": {"role": "user", "content": prompt},
        },
        {
            **base,
            "type": "assistant",
            "timestamp": at(5),
            "message": {
                "role": "assistant",
                "content": [
                    {
                        "type": "thinking",
                        "thinking": "Let me look at diagonal.py",
                        "signature": "EqgF",
                    }
                ],
            },
        },
        {
            **base,
            "type": "assistant",
            "timestamp": at(6),
            "message": {
                "role": "assistant",
                "content": [{"type": "text", "text": "Reading the matrix code."}],
            },
        },
        {
            **base,
            "type": "assistant",
            "timestamp": at(7),
            "message": {
                "role": "assistant",
                "content": [
                    {
                        "type": "tool_use",
                        "id": "t1",
                        "name": "Bash",
                        "input": {"command": "grep -n _entry diagonal.py"},
                    }
                ],
            },
        },
        {
            **base,
            "type": "user",
            "timestamp": at(8),
            "toolUseResult": "x",
            "message": {
                "role": "user",
                "content": [
                    {
                        "type": "tool_result",
                        "tool_use_id": "t1",
                        "content": "11:    def _entry(self, i, j):",
                    }
                ],
            },
        },
        {**base, "type": "system", "subtype": "api_error", "timestamp": at(9)},
        {
            **base,
            "isSidechain": True,
            "type": "assistant",
            "timestamp": at(9),
            "message": {"role": "assistant", "content": "side"},
        },
        {
            **base,
            "type": "assistant",
            "timestamp": at(10),
            "message": {
                "role": "assistant",
                "content": [
                    {"type": "text", "text": "The entry ignores symbolic indices; fixing it."}
                ],
            },
        },
        {
            **base,
            "type": "user",
            "timestamp": at(11),
            "message": {
                "role": "user",
                "content": [
                    {
                        "type": "tool_result",
                        "tool_use_id": "t2",
                        "content": [
                            {"type": "text", "text": "tests pass"},
                            {"type": "image", "source": {}},
                        ],
                    }
                ],
            },
        },
        {"type": "summary", "summary": "DiagonalMatrix entry fix", "leafUuid": "u9"},
    ]


def write_jsonl(path: Path, lines: list[dict[str, Any]], torn: bool = False) -> Path:
    text = "".join(json.dumps(line) + "\n" for line in lines)
    if torn:
        text += 'sistant","uuid":"5328d5f9","timestamp":"2025-12-12T03:01:53.464Z"}\n'
    path.write_text(text)
    return path


def test_a_claude_code_session_becomes_steps(tmp_path: Path) -> None:
    path = write_jsonl(
        tmp_path / "8c0be6e5.jsonl", claude_code_session("sympy__sympy-12300", "sympy/sympy")
    )
    experience = read_past_experience(path)
    trajectory_ = experience.trajectory
    assert experience.instance_id == "sympy__sympy-12300"
    assert (trajectory_.trajectory_id, trajectory_.repo) == ("8c0be6e5", "sympy/sympy")
    assert trajectory_.created_at == datetime(2025, 12, 9, 20, 18, 28, 889000, tzinfo=UTC)
    steps = [[(turn.role, turn.content) for turn in step.turns] for step in trajectory_.steps]
    assert steps == [
        [
            (
                "user",
                "Fix this bug:\n  instance_id: sympy__sympy-12300\n  repo: sympy/sympy\n"
                "  problem_statement: ...",
            ),
            ("assistant", "Reading the matrix code."),
            ("assistant", '[Bash] {"command": "grep -n _entry diagonal.py"}'),
            ("tool", "11:    def _entry(self, i, j):"),
        ],
        [
            ("assistant", "The entry ignores symbolic indices; fixing it."),
            ("tool", "tests pass\n[image]"),
        ],
    ]
    thinking = read_past_experience(path, include_thinking=True).trajectory
    assert ("assistant", "Let me look at diagonal.py") in [
        (t.role, t.content) for t in thinking.all_turns()
    ]
    assert all("EqgF" not in turn.content for turn in thinking.all_turns())


def test_broken_lines_are_refused_unless_skipped(tmp_path: Path) -> None:
    path = write_jsonl(tmp_path / "0c18eb7c.jsonl", claude_code_session("a__b-1", "a/b"), torn=True)
    with pytest.raises(SwebenchImportError, match=r"0c18eb7c\.jsonl:12: not a JSON object"):
        read_past_experience(path)
    assert read_past_experience(path, skip_broken_lines=True).skipped_lines == [12]


def test_past_experience_edge_cases() -> None:
    def events(*lines: dict[str, Any]) -> list[Event]:
        return [Event(number, line) for number, line in enumerate(lines, start=1)]

    # Many parallel tool calls: a step continues in the next one at 20 turns.
    calls = [{"type": "tool_use", "name": "Read", "input": {"n": n}} for n in range(25)]
    parallel = events(
        {
            "type": "user",
            "timestamp": "2025-01-01T00:00:00Z",
            "message": {"content": "go\nrepo: a/b"},
        },
        {"type": "assistant", "timestamp": "2025-01-01T00:00:01Z", "message": {"content": calls}},
    )
    made, _, _ = trajectory_from_events(parallel, trajectory_id="s1")
    assert [len(step.turns) for step in made.steps] == [MAX_STEP_TURNS, 6]
    # A tool output over the turn cap is cut there, with a marker.
    huge = events(
        {"role": "user", "content": "hi", "timestamp": "2025-01-01T00:00:00Z"},
        {"role": "tool", "content": "x" * (MAX_TURN_CHARS + 10)},
        {"role": "system", "content": "skipped"},
    )
    made, _, cut = trajectory_from_events(huge, trajectory_id="s2", repo="a/b")
    assert cut == 1
    last = made.steps[0].turns[-1].content
    assert len(last) == MAX_TURN_CHARS and last.endswith("more characters cut by the import]")
    # Re-dated to its base task: offsets kept.
    base = datetime(2017, 1, 5, tzinfo=UTC)
    made, _, _ = trajectory_from_events(parallel, trajectory_id="s3", dated_at=base)
    assert made.created_at == base
    assert made.steps[1].turns[0].timestamp == base + timedelta(seconds=1)
    with pytest.raises(SwebenchImportError, match="no repository given"):
        trajectory_from_events(
            events({"role": "user", "content": "hi", "timestamp": "2025-01-01T00:00:00Z"}),
            trajectory_id="s4",
        )
    with pytest.raises(SwebenchImportError, match="no turn is dated"):
        trajectory_from_events(
            events({"role": "user", "content": "hi"}), trajectory_id="s5", repo="a/b"
        )
    with pytest.raises(SwebenchImportError, match="no user, assistant or tool turn"):
        trajectory_from_events(events({"type": "summary"}), trajectory_id="s6", repo="a/b")
    with pytest.raises(SwebenchImportError, match=":1: a user event without a message"):
        trajectory_from_events(events({"type": "user"}), trajectory_id="s7", repo="a/b")
    with pytest.raises(SwebenchImportError, match="unknown role 'robot'"):
        trajectory_from_events(
            events({"role": "robot", "content": "x"}), trajectory_id="s8", repo="a/b"
        )


def _snapshot_tree(root: Path) -> None:
    files = {
        "sympy/matrices/expressions/diagonal.py": "class DiagonalMatrix: ...\n",
        "sympy/matrices/expressions/tests/test_diagonal.py": "def test_DiagonalMatrix(): ...\n",
    }
    for name, text in files.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text(text)


def test_a_swecontextbench_bundle_is_imported(sympy_sample: Path, tmp_path: Path) -> None:
    snapshots = tmp_path / "snapshots"
    _snapshot_tree(snapshots / "sympy__sympy-12426")
    base_task = {
        **json.loads(sympy_sample.read_text()),
        "instance_id": "sympy__sympy-12300",
        "created_at": "2017-03-01T10:00:00Z",
    }
    (tmp_path / "base.json").write_text(json.dumps(base_task))
    related = write_jsonl(
        tmp_path / "8c0be6e5.jsonl", claude_code_session("sympy__sympy-12300", "sympy/sympy")
    )
    other = write_jsonl(
        tmp_path / "0c18eb7c.jsonl",
        claude_code_session("sympy__sympy-99999", "sympy/sympy", "2016-05-01T00:00:00Z"),
        torn=True,
    )
    conditions = Conditions(
        {
            "sympy__sympy-12426": TaskConditions(
                relevant=["8c0be6e5"], noisy=["0c18eb7c", "8c0be6e5"]
            )
        }
    )
    imported = import_swecontextbench(
        [sympy_sample],
        [related, other],
        conditions,
        snapshots,
        tmp_path / "bundle",
        repo_specs={"sympy/sympy": SYMPY_SPEC},
        base_instances=[tmp_path / "base.json"],
        skip_broken_lines=True,
    )
    assert imported.dated_by_base_task == ["8c0be6e5"]
    assert imported.skipped_lines == {"0c18eb7c": [12]}
    bundle = imported.bundle
    assert bundle == load_coding_bundle(tmp_path / "bundle")
    assert bundle.tasks[0].snapshot == "snapshots/sympy__sympy-12426.tar.gz"
    dated = {t.trajectory_id: t.created_at for t in bundle.trajectories}
    assert dated["8c0be6e5"] == datetime(2017, 3, 1, 10, tzinfo=UTC)
    assert [t.trajectory_id for t in bundle.scope("sympy__sympy-12426", "noisy")] == [
        "0c18eb7c",
        "8c0be6e5",
    ]
    with tarfile.open(tmp_path / "bundle" / bundle.tasks[0].snapshot) as archive:
        assert "sympy/matrices/expressions/diagonal.py" in archive.getnames()
    # Without the base task the recorded 2025 date is after the task's, which is refused.
    with pytest.raises(CodingBundleError, match="after the task's created_at"):
        import_swecontextbench(
            [sympy_sample],
            [related, other],
            conditions,
            snapshots,
            tmp_path / "again",
            repo_specs={"sympy/sympy": SYMPY_SPEC},
            skip_broken_lines=True,
        )


def test_an_import_names_what_the_operator_must_supply(sympy_sample: Path, tmp_path: Path) -> None:
    conditions = Conditions({})
    with pytest.raises(
        SwebenchImportError, match="no test command given for repository 'sympy/sympy'"
    ):
        import_swecontextbench(
            [sympy_sample], [], conditions, tmp_path, tmp_path / "b", repo_specs={}
        )
    with pytest.raises(
        SwebenchImportError, match=r"no snapshot; place sympy__sympy-12426\.tar\.gz"
    ):
        import_swecontextbench(
            [sympy_sample],
            [],
            conditions,
            tmp_path,
            tmp_path / "b",
            repo_specs={"sympy/sympy": SYMPY_SPEC},
        )
    bad = _tar_gz(tmp_path / "sympy__sympy-12426.tar.gz", [(_member(".git/HEAD"), b"x")])
    with pytest.raises(
        SwebenchImportError, match=re.escape(f"{bad}: member '.git/HEAD' is repository history")
    ):
        import_swecontextbench(
            [sympy_sample],
            [],
            conditions,
            tmp_path,
            tmp_path / "b",
            repo_specs={"sympy/sympy": SYMPY_SPEC},
        )


# --- synthetic-coding ---------------------------------------------------------------------------


@pytest.fixture(scope="module")
def synthetic(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, CodingBundle]:
    root = tmp_path_factory.mktemp("synthetic-coding")
    return root, materialise_synthetic_coding(root)


def test_synthetic_coding_is_a_valid_bundle(synthetic: tuple[Path, CodingBundle]) -> None:
    root, bundle = synthetic
    assert bundle == load_coding_bundle(root)
    assert len(bundle.tasks) == 8
    assert {task.repo for task in bundle.tasks} == {"tally", "almanac", "knobs"}
    assert sorted(task.task_type for task in bundle.tasks) == ["debug"] * 4 + ["development"] * 4
    assert all(task.stand_in is not None for task in bundle.tasks)


def test_synthetic_coding_snapshots_are_reproducible(
    synthetic: tuple[Path, CodingBundle], tmp_path: Path
) -> None:
    _, bundle = synthetic
    again = materialise_synthetic_coding(tmp_path)
    assert {t.snapshot_sha256 for t in again.tasks} == {t.snapshot_sha256 for t in bundle.tasks}
    assert again == bundle


def _snapshot_text(root: Path, snapshot: str) -> str:
    with tarfile.open(root / snapshot) as archive:
        return "\n".join(
            archive.extractfile(member).read().decode()  # type: ignore[union-attr]
            for member in archive.getmembers()
            if member.isreg()
        )


def test_each_convention_is_stated_only_in_its_relevant_trajectory(
    synthetic: tuple[Path, CodingBundle],
) -> None:
    root, bundle = synthetic
    texts = {
        t.trajectory_id: "\n".join(turn.content for turn in t.all_turns())
        for t in bundle.trajectories
    }
    for task in bundle.tasks:
        assert task.stand_in is not None
        convention = task.stand_in.convention
        stating = sorted(tid for tid, text in texts.items() if convention in text)
        assert stating == bundle.conditions.root[task.task_id].relevant, task.task_id
        assert convention not in task.problem_statement
        assert convention not in _snapshot_text(root, task.snapshot)
        assert all(convention not in other.problem_statement for other in bundle.tasks)


def test_noisy_scopes_add_same_repository_distractors(synthetic: tuple[Path, CodingBundle]) -> None:
    _, bundle = synthetic
    repos = {t.trajectory_id: t.repo for t in bundle.trajectories}
    for task in bundle.tasks:
        lists = bundle.conditions.root[task.task_id]
        assert len(lists.relevant) == 1
        distractors = set(lists.noisy) - set(lists.relevant)
        assert set(lists.relevant) <= set(lists.noisy)
        assert 2 <= len(distractors) <= 4
        assert {repos[tid] for tid in lists.noisy} == {task.repo}
        assert all(t.latest < task.created_at for t in bundle.scope(task.task_id, "noisy"))


def test_synthetic_sources_are_stored_as_text() -> None:
    files = repository_files("tally")
    assert "tally/money.py" in files and "tests/test_money.py" in files
    assert not any(name.endswith(".txt") for name in files)
    with pytest.raises(ValueError, match="no repository 'nope'"):
        repository_files("nope")


def test_load_limits_can_be_set(tmp_path: Path) -> None:
    root = write_bundle(tmp_path)
    with pytest.raises(CodingBundleError, match=r"tasks\.jsonl:1: line longer than 10 bytes"):
        load_coding_bundle(root, BundleLimits(max_line_bytes=10))
