"""The scheduler plans a synthetic-coding job on a real nx-27017 (SPEC R-2.5): planned in parts,
its Adds are exactly the chunker's for the whole dataset under `coding-v1` (`plan_adds`, one
memory user per task and condition), its questions one per scope with the problem statement
searched at top_k 100 whatever the job's top_k, carrying the task and its type; the job records
the chunk rule `coding-v1`."""

from __future__ import annotations

import json
import uuid
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any, cast

import pytest
from pymongo import AsyncMongoClient
from pymongo.asynchronous.database import AsyncDatabase

from aml_contract.participant import encode
from aml_evaluation.chunker import plan_adds
from aml_evaluation.coding.bundle import CONDITIONS, load_coding_bundle
from aml_evaluation.coding.synthetic import SHIPPED_BUNDLE_DIR, SYNTHETIC_CODING_ID
from aml_evaluation.registry import bundle_hash, load_dataset, registered
from aml_evaluation.scoring import CODING_SCORER
from aml_pipeline.chains import active_window, add_order
from aml_pipeline.evaluation_spec import build_evaluation_spec
from aml_pipeline.jobs import version_capacity
from aml_runtime.db import Document
from aml_runtime.documents import ensure_indexes
from aml_runtime.stores import Stores
from aml_scheduler.handlers import ScheduleJobs
from aml_scheduler.settings import SchedulerSettings

pytestmark = pytest.mark.integration

JOB = "job-coding"
JOB_TOP_K = 7  # the job's; coding questions search with the dataset's 100


@pytest.fixture
async def db(mongo_url: str) -> AsyncIterator[AsyncDatabase[Document]]:
    client: AsyncMongoClient[Document] = AsyncMongoClient(mongo_url)
    database = client[f"coding_{uuid.uuid4().hex[:8]}"]
    await ensure_indexes(database)
    yield database
    await client.close()


async def _plan(db: AsyncDatabase[Document], tmp_path: Path) -> None:
    settings = SchedulerSettings(datasets_root=tmp_path, top_k=JOB_TOP_K)
    # Neither the broker, the participant client nor the secrets serve a plan.
    unused = cast(Any, None)
    scheduler = ScheduleJobs(
        settings, Stores.over(db), unused, unused, unused, build_evaluation_spec(settings), "c"
    )
    # Small parts: the dataset is planned in several.
    scheduler.part_turns = 20
    job = {"_id": JOB, "planned": False, "state": "queued", "datasets": [SYNTHETIC_CODING_ID]}
    await db.jobs.insert_one(job)
    await scheduler._plan(job)


async def test_a_synthetic_coding_job_is_planned_as_coding_v1(
    db: AsyncDatabase[Document], tmp_path: Path
) -> None:
    await _plan(db, tmp_path)
    bundle = load_coding_bundle(SHIPPED_BUNDLE_DIR)
    expected = plan_adds(load_dataset(SYNTHETIC_CODING_ID, tmp_path), JOB)

    chunks = await db.add_chunks.find({"job_id": JOB}).sort("_id", 1).to_list()
    assert sorted(chunk["_id"] for chunk in chunks) == sorted(add.request_id for add in expected)
    by_id = {chunk["_id"]: chunk for chunk in chunks}
    for add in expected:
        chunk = by_id[add.request_id]
        assert chunk["body"] == encode(add.request)
        assert (chunk["user_id"], chunk["session_id"], chunk["seq"], chunk["conversation_id"]) == (
            add.user_id,
            add.session_id,
            add.seq,
            add.conversation_id,
        )
        assert chunk["state"] == "pending"

    questions = await db.questions.find({"job_id": JOB}).to_list()
    scopes = [f"{task.task_id}:{condition}" for task in bundle.tasks for condition in CONDITIONS]
    assert sorted(q["question_id"] for q in questions) == sorted(scopes)
    for question in questions:
        task = bundle.task(question["coding_task"])
        condition = question["question_id"].split(":")[1]
        body = json.loads(question["search_body"])
        assert body == {
            "query": task.problem_statement,
            "user_id": f"eval:{JOB}:{SYNTHETIC_CODING_ID}:{task.task_id}:{condition}",
            "top_k": 100,
        }
        assert question["user_id"] == body["user_id"]
        assert (question["category"], question["category_name"]) == (
            CONDITIONS.index(condition) + 1,
            condition,
        )
        facts = (question["task_type"], question["top_k"], question["scorer"])
        assert facts == (task.task_type, 100, CODING_SCORER)
        assert question["gold_answer"] == task.task_id

    job = await db.jobs.find_one({"_id": JOB})
    assert job is not None
    assert job["chunkers"] == {SYNTHETIC_CODING_ID: "coding-v1"}
    assert job["top_k"] == JOB_TOP_K
    assert job["totals"] == {"add": len(expected), "questions": len(scopes)}
    # The version's capacity is not declared: the default's window.
    window = active_window(version_capacity({"_id": ""}))
    assert job["users"] == add_order((add.user_id for add in expected),
                                     (q["user_id"] for q in questions), window)  # fmt: skip
    manifest = registered(SYNTHETIC_CODING_ID, None).manifest
    assert job["dataset_bundles"] == {SYNTHETIC_CODING_ID: bundle_hash(manifest)}

    # A trajectory in both scopes of a task is written for both users: not a leak when the
    # noisy scope's Search returns it.
    relevant = bundle.scope("tally-rate-rounding", "relevant")[0]
    users = {add.user_id for add in expected if add.session_id.endswith(relevant.trajectory_id)}
    prefix = f"eval:{JOB}:{SYNTHETIC_CODING_ID}:tally-rate-rounding"
    assert {f"{prefix}:relevant", f"{prefix}:noisy"} <= users
    written = await db.written_texts.find({"job_id": JOB, "users": f"{prefix}:relevant"}).to_list()
    assert written and all(f"{prefix}:noisy" in doc["users"] for doc in written)
