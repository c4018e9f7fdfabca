"""The coding format in the dataset registry (SPEC R-2.5): a bundle read as a `Dataset` (one
conversation per scope, one session per trajectory, one question per scope), its Adds written by
`coding-v1`, nothing but trajectory turns sent, Searches with the problem statement and top_k
100, the planned questions' coding facts, the shipped `synthetic-coding`,
the task files the solve and verify stages read (`aml_evaluation.coding.source`), and
registration's checks with the sandbox's work stood in for (the real sandbox:
tests/integration/test_coding_registration.py)."""

from __future__ import annotations

import hashlib
import json
import shutil
import threading
import zlib
from collections.abc import Sequence
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any, cast

import pytest
from coding_doubles import bundle_adds

from aml_contract.messages import QuestionFacts, QuestionWork
from aml_contract.participant import AddRequest, SearchRequest, encode
from aml_devtools.cli import main
from aml_evaluation.chunker import CODING_CHUNKER_VERSION, chunker_version, plan_adds
from aml_evaluation.coding import source
from aml_evaluation.coding.bundle import (
    CONDITIONS,
    CodingBundle,
    CodingTask,
    Conditions,
    Step,
    TaskConditions,
    Trajectory,
    Turn,
    archive_files,
    load_coding_bundle,
    write_coding_bundle,
)
from aml_evaluation.coding.chunking import unix_ms
from aml_evaluation.coding.dataset import CODING_CATEGORIES, CODING_TOP_K
from aml_evaluation.coding.source import CodingTasks, CodingTaskUnavailable, coding_task_files
from aml_evaluation.coding.synthetic import (
    SHIPPED_BUNDLE_DIR,
    SYNTHETIC_CODING_ID,
    shipped_differences,
)
from aml_evaluation.coding.validation import TaskCheck
from aml_evaluation.datasets import Dataset
from aml_evaluation.registration import (
    RegistrationError,
    register_coding_dataset,
    register_dataset,
)
from aml_evaluation.registry import (
    PACKAGE_DATA_DIR,
    DatasetFileError,
    DatasetManifest,
    ManifestFile,
    canonical_manifest_json,
    load_dataset,
    load_manifest_bundle,
    open_dataset_stream,
    parse_contents,
    read_manifest,
    registered,
)
from aml_evaluation.scoring import CODING_SCORER
from aml_pipeline.coding_track import TaskFiles, registered_tasks
from aml_pipeline.stage_worker import StageCall
from aml_scheduler.planning import plan_chunks, plan_questions
from aml_searcher.handlers import SearchQuestion

NOWHERE = Path("/nonexistent")  # shipped datasets are package data: no datasets root needed
RUN = "job-1"
START = datetime(2024, 1, 10, 9, 0, tzinfo=UTC)
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
SNAPSHOT_FILES = {"calc/__init__.py": b"", "calc/core.py": b"X = 1\n"}
LABEL_WORDS = ("relevant", "noisy")


# --- builders -------------------------------------------------------------------------------


def _trajectory(
    trajectory_id: str, start: datetime, steps: Sequence[Sequence[tuple[str, str]]]
) -> Trajectory:
    """Turns a minute apart; every third turn undated (sent at the trajectory's start)."""
    built, minute = [], 0
    for step in steps:
        turns = []
        for role, content in step:
            moment = None if minute % 3 == 2 else start + timedelta(minutes=minute)
            turns.append(
                Turn.model_validate({"role": role, "content": content, "timestamp": moment})
            )
            minute += 1
        built.append(Step(turns=turns))
    return Trajectory(trajectory_id=trajectory_id, repo="calc", created_at=start, steps=built)


def _task(task_id: str, digest: str, **changes: Any) -> CodingTask:
    payload: dict[str, Any] = {
        "task_id": task_id,
        "repo": "calc",
        "snapshot": "snapshots/calc.tar.gz",
        "snapshot_sha256": digest,
        "problem_statement": f"{task_id}: X should be 2\n\nSee `calc/core.py`.\n",
        "test_patch": TEST_PATCH,
        "gold_patch": GOLD_PATCH,
        "test_command": "python3 -m unittest -v",
        "log_format": "unittest",
        "fail_to_pass": ["test_x (tests.test_calc.TestCalc.test_x)"],
        "pass_to_pass": [],
        "task_type": "development" if task_id.endswith("2") else "debug",
        "created_at": "2024-03-01T00:00:00Z",
    }
    payload.update(changes)
    return CodingTask.model_validate_json(json.dumps(payload))


def write_test_bundle(directory: Path, **task_changes: Any) -> CodingBundle:
    """Two tasks on one snapshot. `calc-a` has 12 steps of 3 turns (36 messages: Adds of six
    whole steps), `calc-b` a step of over 2,000 words (an Add of its own) and is the oldest;
    the conditions files list trajectories newest first, never the order they are sent in."""
    digest = archive_files(SNAPSHOT_FILES, directory / "snapshots" / "calc.tar.gz")
    tool = ("tool", "calc/core.py:1:X = 1")
    long_steps = [[("user", f"step {n}: look at X"), ("assistant", "grep -n X calc"), tool]
                  for n in range(12)]  # fmt: skip
    wordy = [[("user", "why?")], [("assistant", "word " * 2100)], [("user", "thanks")]]
    trajectories = [
        _trajectory("calc-a", START + timedelta(days=5), long_steps),
        _trajectory("calc-b", START, wordy),
        _trajectory(
            "calc-c", START + timedelta(days=9), [[("user", "X is 1"), ("assistant", "ok")]]
        ),
    ]
    conditions = Conditions(
        {
            "calc-1": TaskConditions(relevant=["calc-a"], noisy=["calc-c", "calc-a", "calc-b"]),
            "calc-2": TaskConditions(relevant=["calc-c"], noisy=["calc-c", "calc-b"]),
        }
    )
    bundle = CodingBundle(
        tasks=[_task("calc-1", digest, **task_changes), _task("calc-2", digest)],
        trajectories=trajectories,
        conditions=conditions,
    )
    write_coding_bundle(bundle, directory)
    return bundle


def _always_usable(bundle: CodingBundle, root: Path) -> list[TaskCheck]:
    """The sandbox's work stood in for: every task tells a fix from no fix."""
    return [
        TaskCheck(
            task_id=task.task_id,
            unpatched_resolved=False,
            gold_resolved=True,
            wrong_resolved=None,
            problems=[],
        )
        for task in bundle.tasks
    ]


@pytest.fixture
def calc_root(tmp_path: Path) -> Path:
    root = tmp_path / "datasets"
    write_test_bundle(root / "coding" / "calc")
    register_coding_dataset(root / "coding" / "calc", "calc", root, check_tasks=_always_usable)
    return root


def _shipped() -> tuple[Dataset, CodingBundle]:
    return load_dataset(SYNTHETIC_CODING_ID, NOWHERE), load_coding_bundle(SHIPPED_BUNDLE_DIR)


def _add_bodies(dataset: Dataset) -> list[dict[str, Any]]:
    return [json.loads(chunk.body or b"") for chunk in plan_chunks(RUN, dataset)]


# --- the mapping ----------------------------------------------------------------------------


def test_a_bundle_is_one_conversation_and_one_question_per_scope() -> None:
    dataset, bundle = _shipped()
    rules = (dataset.track, dataset.scorer, dataset.chunk_rule)
    assert rules == ("coding", CODING_SCORER, "coding-v1")
    assert dataset.categories == {1: "relevant", 2: "noisy"} == CODING_CATEGORIES
    assert dataset.search_top_k == CODING_TOP_K == 100
    scopes = [f"{task.task_id}:{condition}" for task in bundle.tasks for condition in CONDITIONS]
    assert [c.conversation_id for c in dataset.conversations] == scopes
    assert [q.question_id for q in dataset.questions] == scopes
    for conversation in dataset.conversations:
        task_id, condition = conversation.conversation_id.split(":")
        scope = bundle.scope(task_id, condition)  # type: ignore[arg-type]
        assert conversation.speakers_are_roles and conversation.speakers == ("user", "assistant")
        assert [s.session_key for s in conversation.sessions] == [t.trajectory_id for t in scope]
        for session, trajectory in zip(conversation.sessions, scope, strict=True):
            assert session.timestamp_ms == unix_ms(trajectory.created_at)
            turns = [
                (index, turn.role, turn.content)
                for index, step in enumerate(trajectory.steps)
                for turn in step.turns
            ]
            assert [(t.step, t.speaker, t.text) for t in session.turns] == turns
    for question in dataset.questions:
        task = bundle.task(question.coding_task or "")
        condition = question.question_id.split(":")[1]
        assert question.question == task.problem_statement  # verbatim
        assert (question.category, question.category_name) == (
            CONDITIONS.index(condition) + 1,
            condition,
        )
        assert question.answer == task.task_id and not question.unanswerable
        assert question.task_type == task.task_type
        assert (question.asked_at, question.evidence) == ((), [])
    assert {q.task_type for q in dataset.questions} == {"debug", "development"}
    # Parsed whole (no item stream for this format), the same dataset.
    _, stream = open_dataset_stream(SYNTHETIC_CODING_ID, NOWHERE)
    (piece,) = list(stream.pieces())
    assert piece == dataset


def test_the_adds_are_exactly_coding_v1s(calc_root: Path) -> None:
    dataset, bundle = _shipped()
    # The registered files read back as the bundle they came from.
    assert plan_adds(dataset, RUN) == bundle_adds(bundle, RUN, SYNTHETIC_CODING_ID)
    assert chunker_version(dataset) == CODING_CHUNKER_VERSION == "coding-v1"

    own = load_dataset("calc", calc_root)
    own_bundle = load_coding_bundle(calc_root / "coding" / "calc")
    adds = plan_adds(own, RUN)
    assert adds == bundle_adds(own_bundle, RUN, "calc")
    # calc-1's relevant scope: calc-a's 36 messages as Adds of six whole steps.
    relevant = [add for add in adds if add.conversation_id == "calc-1:relevant"]
    assert [len(add.request.messages) for add in relevant] == [18, 18]
    assert [m.content for m in relevant[0].request.messages[:3]] == [
        "step 0: look at X", "grep -n X calc", "calc/core.py:1:X = 1",
    ]  # fmt: skip
    # An undated turn is sent at its trajectory's start.
    calc_a = own_bundle.scope("calc-1", "relevant")[0]
    assert relevant[0].request.messages[2].timestamp == unix_ms(calc_a.created_at)
    assert relevant[0].request.messages[1].timestamp == unix_ms(calc_a.created_at) + 60_000
    # The noisy scope: oldest first (calc-b's wordy step alone), then calc-a, then calc-c.
    noisy = [add for add in adds if add.conversation_id == "calc-1:noisy"]
    assert [(add.session_id.rsplit(":", 1)[1], len(add.request.messages)) for add in noisy] == [
        ("calc-b", 1), ("calc-b", 1), ("calc-b", 1), ("calc-a", 18), ("calc-a", 18),
        ("calc-c", 2),
    ]  # fmt: skip
    assert [add.seq for add in noisy] == list(range(1, 7))
    assert {add.user_id for add in noisy} == {f"eval:{RUN}:calc:calc-1:noisy"}
    assert noisy[0].request_id == f"eval:{RUN}:calc:calc-1:noisy:chunk-1"
    assert noisy[0].session_id == f"eval:{RUN}:calc-1:noisy:calc-b"


def test_the_send_order_never_follows_the_conditions_file(tmp_path: Path) -> None:
    bundle = write_test_bundle(tmp_path / "a")
    reordered = Conditions(
        {
            task_id: TaskConditions(relevant=lists.relevant[::-1], noisy=lists.noisy[::-1])
            for task_id, lists in bundle.conditions.root.items()
        }
    )
    other = bundle.model_copy(update={"conditions": reordered})
    assert bundle_adds(other, RUN, "d") == bundle_adds(bundle, RUN, "d")


def test_no_relevance_label_is_sent(calc_root: Path) -> None:
    """An Add carries a trajectory's turns and nothing else; a Search the problem statement,
    the scope and top_k. The scope's own name is the only place a condition appears."""
    for dataset_id in (SYNTHETIC_CODING_ID, "calc"):
        dataset = load_dataset(dataset_id, calc_root)
        bundle = (
            _shipped()[1]
            if dataset_id == SYNTHETIC_CODING_ID
            else load_coding_bundle(calc_root / "coding" / "calc")
        )
        sent: dict[str, list[tuple[str, str]]] = {}
        for body in _add_bodies(dataset):
            assert set(body) == {"request_id", "messages", "user_id", "session_id"}
            for message in body["messages"]:
                assert set(message) == {"role", "content", "timestamp"}
            trajectory_id = body["session_id"].rsplit(":", 1)[1]
            sent.setdefault(body["session_id"], []).extend(
                (m["role"], m["content"]) for m in body["messages"]
            )
            without_scope = json.dumps(body["messages"])
            assert not any(f'"{word}"' in without_scope for word in LABEL_WORDS)
            assert not any(word in trajectory_id for word in LABEL_WORDS)
        by_id = {t.trajectory_id: t for t in bundle.trajectories}
        for session_id, messages in sent.items():
            trajectory = by_id[session_id.rsplit(":", 1)[1]]
            assert messages == [(turn.role, turn.content) for turn in trajectory.all_turns()]
        for question in plan_questions(RUN, dataset, 5):
            request = json.loads(question.search_body or b"")
            assert set(request) == {"query", "user_id", "top_k"}
            assert request["query"] == bundle.task(question.coding_task or "").problem_statement


def test_coding_questions_search_with_top_k_100_and_carry_their_task() -> None:
    dataset, bundle = _shipped()
    questions = plan_questions(RUN, dataset, top_k=5)
    assert len(questions) == 2 * len(bundle.tasks)
    for question in questions:
        stored = question.stored()
        task = bundle.task(stored["coding_task"])
        request = SearchRequest.model_validate_json(question.search_body or b"")
        assert (request.query, request.top_k) == (task.problem_statement, 100)
        assert (
            request.user_id
            == stored["user_id"]
            == (f"eval:{RUN}:{SYNTHETIC_CODING_ID}:{question.question_id}")
        )
        facts = (stored["task_type"], stored["top_k"], stored["scorer"])
        assert facts == (task.task_type, 100, CODING_SCORER)
        assert stored["gold_answer"] == task.task_id
        assert stored["_id"] == f"{RUN}/{SYNTHETIC_CODING_ID}/{question.question_id}"
        carried = QuestionFacts.of(stored)
        assert (carried.coding_task, carried.task_type, carried.top_k) == (
            task.task_id,
            task.task_type,
            100,
        )


def test_other_datasets_plan_exactly_as_before() -> None:
    synthetic = load_dataset("synthetic", NOWHERE)
    assert (synthetic.chunk_rule, synthetic.search_top_k) == (None, None)
    assert chunker_version(synthetic) == "chunk-v1"
    for question in plan_questions(RUN, synthetic, top_k=5):
        stored = question.stored()
        assert not {"coding_task", "task_type", "top_k"} & set(stored)
        assert SearchRequest.model_validate_json(question.search_body or b"").top_k == 5
    for dataset_id in ("synthetic", "synthetic_multimodal", "locomo"):
        canonical = json.loads(canonical_manifest_json(registered(dataset_id, None).manifest))
        assert "search_top_k" not in canonical


async def test_the_search_stage_holds_a_coding_answer_to_its_own_top_k() -> None:
    """The job's top_k is 5 here; a coding question asks for 100 and may get up to 100."""

    class Client:
        def __init__(self) -> None:
            self.asked: list[int] = []

        async def search(
            self, endpoint: object, body: bytes, top_k: int, observe: object, admission: object
        ) -> list[Any]:
            self.asked.append(top_k)
            return []

    class Endpoints:
        async def get(self, version_id: str, job_id: str) -> object:
            return object()

    class Observe:
        async def validated(self, reason: str) -> None:
            pass

    client = Client()
    unused = cast(Any, None)
    search = SearchQuestion(unused, cast(Any, client), cast(Any, Endpoints()), unused)
    work = QuestionWork(job_id=RUN, version_id="v", item_id="i")
    dataset = load_dataset(SYNTHETIC_CODING_ID, NOWHERE)
    coding = plan_questions(RUN, dataset, top_k=5)[0].stored()
    other = plan_questions(RUN, load_dataset("synthetic", NOWHERE), top_k=5)[0].stored()
    for question in (coding, other):
        observe = cast(Any, Observe())
        await search.answered(work, question, {"top_k": 5}, StageCall(delivered=1), observe)
    assert client.asked == [100, 5]


# --- the manifest and the parser --------------------------------------------------------------


def test_a_coding_manifest_keeps_to_the_coding_track_and_scorer(tmp_path: Path) -> None:
    shipped = registered(SYNTHETIC_CODING_ID, None).manifest
    assert (shipped.format, shipped.track, shipped.search_top_k) == ("coding", "coding", 100)
    assert shipped.question_counts == {1: 8, 2: 8}
    with pytest.raises(ValueError, match="on the coding track, not 'textual'"):
        DatasetManifest.model_validate(shipped.model_dump() | {"track": "textual"})
    for change, refusal in (
        ({"scorer": "llm_judge+token_f1"}, "scored by swe_resolved"),
        ({"categories": {1: "noisy", 2: "relevant"}}, "categories are the conditions"),
    ):
        changed = DatasetManifest.model_validate(shipped.model_dump() | change)
        with pytest.raises(DatasetFileError, match=refusal):
            load_dataset_with(changed)


def load_dataset_with(manifest: DatasetManifest) -> Dataset:
    return load_manifest_bundle(manifest, PACKAGE_DATA_DIR)


def _contents(directory: Path, prefix: str = "b") -> list[tuple[str, bytes]]:
    return [(f"{prefix}/{path.name}", path.read_bytes()) for path in sorted(directory.glob("*.j*"))]


def _manifest(contents: list[tuple[str, bytes]]) -> DatasetManifest:
    return DatasetManifest(
        dataset_id="d",
        version="v",
        format="coding",
        track="coding",
        scorer=CODING_SCORER,
        categories={},
        files=[ManifestFile(path=p, sha256=hashlib.sha256(b).hexdigest()) for p, b in contents],
    )


def test_the_parser_refuses_a_bundle_that_breaks_a_static_rule(tmp_path: Path) -> None:
    # A trajectory dated after its task.
    write_test_bundle(tmp_path / "late", created_at="2024-01-12T00:00:00Z")
    contents = _contents(tmp_path / "late")
    with pytest.raises(DatasetFileError, match=r"trajectory 'calc-a' is dated .* after the task"):
        parse_contents(contents, _manifest(contents))
    write_test_bundle(tmp_path / "ok")
    contents = _contents(tmp_path / "ok")
    assert len(parse_contents(contents, _manifest(contents)).questions) == 4
    split = [contents[0], (f"elsewhere/{Path(contents[1][0]).name}", contents[1][1]), contents[2]]
    with pytest.raises(DatasetFileError, match="files are in one directory"):
        parse_contents(split, _manifest(split))
    with pytest.raises(DatasetFileError, match=r"lists exactly tasks\.jsonl"):
        parse_contents(contents[:2], _manifest(contents[:2]))


def test_the_shipped_bundle_is_what_its_sources_give() -> None:
    if "zlib-ng" in zlib.ZLIB_RUNTIME_VERSION:
        pytest.skip(f"zlib {zlib.ZLIB_RUNTIME_VERSION} compresses the snapshots otherwise")
    assert shipped_differences() == []


# --- the task files of the solve and verify stages -----------------------------------------------


def test_a_task_and_its_verified_snapshot_are_found(calc_root: Path) -> None:
    found = coding_task_files(SYNTHETIC_CODING_ID, "tally-allocate", NOWHERE)
    assert found.task == load_coding_bundle(SHIPPED_BUNDLE_DIR).task("tally-allocate")
    assert found.snapshot == SHIPPED_BUNDLE_DIR / "snapshots" / "tally.tar.gz"
    own = coding_task_files("calc", "calc-2", calc_root)
    assert (own.dataset_id, own.task.task_type) == ("calc", "development")
    assert own.snapshot == calc_root / "coding" / "calc" / "snapshots" / "calc.tar.gz"
    for dataset_id, task_id, refusal in (
        ("calc", "calc-9", "task 'calc-9': no such task"),
        ("synthetic", "x", "a locomo dataset, not a coding one"),
        ("nope", "x", "unknown dataset 'nope'"),
    ):
        with pytest.raises(CodingTaskUnavailable, match=refusal):
            coding_task_files(dataset_id, task_id, calc_root)


def test_a_changed_or_missing_file_makes_the_task_unavailable(calc_root: Path) -> None:
    bundle_dir = calc_root / "coding" / "calc"
    snapshot = bundle_dir / "snapshots" / "calc.tar.gz"
    tasks = CodingTasks(calc_root)
    first = tasks.files("calc", "calc-1")
    assert tasks.files("calc", "calc-1") is first  # cached
    archive_files({**SNAPSHOT_FILES, "calc/core.py": b"X = 3\n"}, snapshot)
    with pytest.raises(
        CodingTaskUnavailable, match=r"snapshot 'snapshots/calc\.tar\.gz' .* sha256"
    ):
        tasks.files("calc", "calc-1")
    snapshot.unlink()
    with pytest.raises(CodingTaskUnavailable, match="is missing"):
        coding_task_files("calc", "calc-1", calc_root)
    tasks_file = bundle_dir / "tasks.jsonl"
    tasks_file.write_bytes(tasks_file.read_bytes().replace(b"X should be 2", b"X should be 3"))
    with pytest.raises(CodingTaskUnavailable, match=r"tasks\.jsonl.* has sha256"):
        coding_task_files("calc", "calc-1", calc_root)


def test_a_slow_miss_never_holds_up_another_threads_hit(
    calc_root: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    open_task = registered_tasks(calc_root)  # what the stages' worker threads share
    first = open_task("calc", "calc-1")
    hashing, release = threading.Event(), threading.Event()

    def slow_sha256(path: Path) -> str:
        hashing.set()
        release.wait(30)
        return real_sha256(path)

    real_sha256 = source.file_sha256
    monkeypatch.setattr(source, "file_sha256", slow_sha256)
    missed: list[TaskFiles] = []
    miss = threading.Thread(target=lambda: missed.append(open_task("calc", "calc-2")))
    miss.start()
    try:
        assert hashing.wait(30)
        hits: list[TaskFiles] = []
        hit = threading.Thread(target=lambda: hits.append(open_task("calc", "calc-1")))
        hit.start()
        hit.join(10)
        assert hits == [first]  # served while calc-2's snapshot is still being hashed
    finally:
        release.set()
        miss.join(30)
    assert [files.task.task_id for files in missed] == ["calc-2"]
    assert open_task("calc", "calc-2") is missed[0]  # cached once hashed


# --- registration (the sandbox stood in for) -----------------------------------------------------


def test_a_coding_bundle_is_registered_from_its_directory(calc_root: Path) -> None:
    manifest = read_manifest(calc_root / "manifests" / "calc.json")
    assert (manifest.format, manifest.track, manifest.scorer) == ("coding", "coding", CODING_SCORER)
    assert (manifest.search_top_k, manifest.location) == (100, "datasets_root")
    assert manifest.categories == {1: "relevant", 2: "noisy"}
    assert manifest.question_counts == {1: 2, 2: 2}
    assert [entry.path for entry in manifest.files] == [
        "coding/calc/conditions.json", "coding/calc/tasks.jsonl", "coding/calc/trajectories.jsonl",
    ]  # fmt: skip
    again = register_coding_dataset(
        calc_root / "coding" / "calc", "calc", calc_root, check_tasks=_always_usable
    )
    assert again.outcome == "unchanged"


def test_a_task_failing_its_checks_refuses_the_bundle(tmp_path: Path) -> None:
    root = tmp_path / "datasets"
    write_test_bundle(root / "b")

    def gold_fails(bundle: CodingBundle, directory: Path) -> list[TaskCheck]:
        checks = _always_usable(bundle, directory)
        problem = "task 'calc-2' is not resolved by its gold patch"
        return [checks[0], checks[1].model_copy(update={"problems": [problem]})]

    with pytest.raises(RegistrationError, match="refused: task 'calc-2' is not resolved by its"):
        register_coding_dataset(root / "b", "b", root, check_tasks=gold_fails)
    assert not (root / "manifests").exists()

    def never(bundle: CodingBundle, directory: Path) -> list[TaskCheck]:
        raise AssertionError("tasks are run only on good snapshots")

    (root / "b" / "snapshots" / "calc.tar.gz").unlink()
    with pytest.raises(RegistrationError, match=r"snapshot 'snapshots/calc\.tar\.gz' is missing"):
        register_coding_dataset(root / "b", "b", root, check_tasks=never)
    shutil.rmtree(root / "b" / "snapshots")
    (root / "b" / "conditions.json").unlink()
    with pytest.raises(RegistrationError, match=r"it has no conditions\.json"):
        register_coding_dataset(root / "b", "b", root, check_tasks=never)
    with pytest.raises(RegistrationError, match="registered from its directory"):
        register_dataset(root / "b" / "tasks.jsonl", "coding", "b", root)


def test_the_cli_refuses_options_a_coding_bundle_does_not_take(
    calc_root: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    bundle = str(calc_root / "coding" / "calc")
    common = ["--format", "coding", "--id", "x", "--datasets-root", str(calc_root)]
    assert main(["dataset", "add", bundle, *common, "--track", "textual"]) == 2
    assert "a coding bundle: --track do not apply" in capsys.readouterr().err
    assert main(["dataset", "add", bundle, bundle, *common]) == 2
    assert "name the bundle's directory, once" in capsys.readouterr().err
    assert not (calc_root / "manifests" / "x.json").exists()


def test_an_add_body_is_what_the_contract_encodes() -> None:
    dataset, _ = _shipped()
    expected = [encode(add.request) for add in plan_adds(dataset, RUN)]
    assert [chunk.body for chunk in plan_chunks(RUN, dataset)] == expected
    for body in expected:
        AddRequest.model_validate_json(body)
