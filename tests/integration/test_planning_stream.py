"""The scheduler plans a job from its datasets read a piece at a time (`open_dataset_stream`,
`planning.parts_of`) and stores its written texts as it goes (merging a text met again into its
stored document), on a real nx-27017: the stored documents and the job's fields are those of
planning each dataset whole at once, also when the plan is run again over an interrupted one."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any, cast

import pytest
from pymongo import AsyncMongoClient
from pymongo.asynchronous.database import AsyncDatabase
from scripts import load_benchmark

from aml_evaluation.chunker import chunker_version
from aml_evaluation.registration import register_dataset
from aml_evaluation.registry import bundle_hash, load_dataset, registered
from aml_pipeline.chains import active_window, add_order
from aml_pipeline.evaluation_spec import build_evaluation_spec
from aml_pipeline.jobs import version_capacity
from aml_runtime.db import Document
from aml_runtime.documents import ensure_indexes
from aml_runtime.stores import Stores
from aml_runtime.stores.plans import PlanStore
from aml_scheduler.handlers import ScheduleJobs
from aml_scheduler.planning import plan_chunks, plan_questions, plan_written_texts
from aml_scheduler.settings import SchedulerSettings

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]
STREAMING = ROOT / "tests" / "data" / "streaming" / "streaming_v1.json"


def _generator() -> Any:
    """The load benchmark's LoCoMo-format generator (`--scenario scale`)."""
    return load_benchmark("pipeline_load_planning")


@pytest.fixture(scope="module")
def datasets_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A generated LoCoMo-format dataset (its small talk repeats across conversations, so many
    texts are written for several users) and the streaming test dataset, registered."""
    root = tmp_path_factory.mktemp("datasets")
    generator = _generator()
    generated = root / "gen" / "scale.json"
    generator.write_scale_dataset(generated, generator.Size(adds=48, questions=18, users=6))
    register_dataset(generated, "locomo", "gen", root)
    (root / "str").mkdir()
    (root / "str" / "streaming_v1.json").write_bytes(STREAMING.read_bytes())
    register_dataset(root / "str" / "streaming_v1.json", "locomo", "str", root)
    return root


@pytest.fixture
async def db(mongo_url: str) -> AsyncIterator[AsyncDatabase[Document]]:
    client: AsyncMongoClient[Document] = AsyncMongoClient(mongo_url)
    database = client[f"plan_{uuid.uuid4().hex[:8]}"]
    await ensure_indexes(database)
    yield database
    await client.close()


def _scheduler(db: AsyncDatabase[Document], root: Path) -> ScheduleJobs:
    settings = SchedulerSettings(datasets_root=root)
    # Neither the broker, the participant client nor the secrets serve a plan.
    unused = cast(Any, None)
    scheduler = ScheduleJobs(
        settings, Stores.over(db), unused, unused, unused, build_evaluation_spec(settings), "c"
    )
    # Small parts and few written texts held: many parts, and texts met again after their
    # documents are stored.
    scheduler.part_turns = 30
    scheduler.written_pairs_held = 25
    return scheduler


def _whole_plan(job_id: str, datasets: list[str], root: Path, top_k: int) -> dict[str, Any]:
    """What planning each dataset whole at once stores (the plan before it was streamed)."""
    chunks: list[Document] = []
    questions: list[Document] = []
    job: dict[str, Any] = {"f1_variants": {}, "chunkers": {}, "dataset_bundles": {}}
    for dataset_id in datasets:
        dataset = load_dataset(dataset_id, root)
        chunks += [chunk.stored() for chunk in plan_chunks(job_id, dataset)]
        questions += [q.stored() for q in plan_questions(job_id, dataset, top_k)]
        job["f1_variants"][dataset_id] = dataset.f1_variant
        job["chunkers"][dataset_id] = chunker_version(dataset)
        job["dataset_bundles"][dataset_id] = bundle_hash(registered(dataset_id, root).manifest)
    bodies = [chunk["body"] for chunk in chunks if chunk.get("body") is not None]
    # The version's capacity is not declared: the default's window.
    window = active_window(version_capacity({"_id": ""}))
    job["users"] = add_order((chunk["user_id"] for chunk in chunks),
                             (question["user_id"] for question in questions), window)  # fmt: skip
    job["totals"] = {"add": len(chunks), "questions": len(questions)}
    return {
        "add_chunks": _by_id(chunks),
        "questions": _by_id(questions),
        "written_texts": _by_id(plan_written_texts(job_id, bodies)),
        "job": job,
    }


def _by_id(documents: list[Document]) -> list[Document]:
    return sorted(documents, key=lambda doc: str(doc["_id"]))


async def _stored(db: AsyncDatabase[Document], job_id: str) -> dict[str, Any]:
    found: dict[str, Any] = {}
    for name in ("add_chunks", "questions", "written_texts"):
        found[name] = _by_id(await db[name].find({"job_id": job_id}).to_list())
    job = await db.jobs.find_one({"_id": job_id})
    assert job is not None
    found["job"] = {key: job[key] for key in ("f1_variants", "chunkers", "dataset_bundles",
                                              "users", "totals")}  # fmt: skip
    return found


async def _plan(
    db: AsyncDatabase[Document], scheduler: ScheduleJobs, job_id: str, datasets: list[str]
) -> None:
    job = {"_id": job_id, "planned": False, "state": "queued", "datasets": datasets}
    await db.jobs.replace_one({"_id": job_id}, job, upsert=True)
    await scheduler._plan(job)


async def test_a_streamed_plan_stores_what_planning_each_dataset_whole_did(
    db: AsyncDatabase[Document], datasets_root: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    merged: list[int] = []
    merge = PlanStore._merge_written

    async def counted(plans: PlanStore, docs: list[Document]) -> None:
        merged.append(len(docs))
        await merge(plans, docs)

    monkeypatch.setattr(PlanStore, "_merge_written", counted)
    scheduler = _scheduler(db, datasets_root)
    datasets = ["synthetic", "gen", "str"]
    await _plan(db, scheduler, "job-s", datasets)
    # Texts met again after their documents were stored, merged into them.
    assert len(merged) > 1 and sum(merged) > 20
    expected = _whole_plan("job-s", datasets, datasets_root, scheduler.evaluation_spec.top_k)
    assert await _stored(db, "job-s") == expected
    # Texts written for several users, in parts stored apart: merged, their users sorted.
    shared = [doc for doc in expected["written_texts"] if len(doc["users"]) > 2]
    assert shared
    assert all(doc["users"] == sorted(doc["users"]) for doc in expected["written_texts"])
    gen_users = {user for user in expected["job"]["users"] if ":gen:" in user}
    assert len(gen_users) == 6


async def test_planning_again_over_an_interrupted_plan_stores_the_same(
    db: AsyncDatabase[Document], datasets_root: Path
) -> None:
    scheduler = _scheduler(db, datasets_root)
    datasets = ["gen", "str"]
    await _plan(db, scheduler, "job-r", datasets)
    expected = await _stored(db, "job-r")
    # What a plan interrupted mid-way leaves: some documents missing, some texts stored with
    # only their first users (their later parts not merged yet), the job not planned.
    texts = expected["written_texts"]
    for doc in texts[::3]:
        await db.written_texts.delete_one({"_id": doc["_id"]})
    for doc in texts[1::3]:
        first_only = {"$set": {"users": doc["users"][:1]}}
        await db.written_texts.update_one({"_id": doc["_id"]}, first_only)
    for doc in expected["add_chunks"][::2]:
        await db.add_chunks.delete_one({"_id": doc["_id"]})
    await _plan(db, scheduler, "job-r", datasets)
    assert await _stored(db, "job-r") == expected
    # And once more, over a whole plan: nothing changes.
    await _plan(db, scheduler, "job-r", datasets)
    assert await _stored(db, "job-r") == expected


async def test_the_written_text_merge_reads_and_writes_by_id(
    db: AsyncDatabase[Document], datasets_root: Path
) -> None:
    """Merging a text met again reads its document by `_id` and writes it guarded by the size
    of its users: both served by the `_id` index."""
    await _plan(db, _scheduler(db, datasets_root), "job-i", ["gen"])
    ids = [doc["_id"] async for doc in db.written_texts.find({"job_id": "job-i"}, {"_id": 1})]
    for query in ({"_id": {"$in": ids[:50]}}, {"_id": ids[0], "users": {"$size": 2}}):
        plan = await db.command("explain", {"find": "written_texts", "filter": query})
        text = str(plan.get("queryPlanner", {}).get("winningPlan"))
        # nx-27017 reports its SQLite plan ("SEARCH ... USING INDEX"); MongoDB its stages.
        assert "USING INDEX" in text or "IXSCAN" in text or "IDHACK" in text, (query, text)
