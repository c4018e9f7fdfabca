"""Job progress counters (`aml_runtime.progress`) on the real nx-27017 MongoDB wire server (and
a real nats-server for the scheduler's completion): a final item is counted exactly once
whoever records it and however often, a crash between the record and its increment is
repaired, the scheduler completes a job from its counter, and the gateway's status reads the
counters alone."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta
from typing import Any, cast

import pytest
from faststream.nats import NatsBroker
from pymongo import AsyncMongoClient
from pymongo.asynchronous.database import AsyncDatabase

from aml_gateway.progress import job_status
from aml_runtime.db import Document, ensure_indexes
from aml_runtime.evaluation_spec import build_spec
from aml_runtime.jobs import record_error
from aml_runtime.progress import (
    FINALS,
    _count,
    counters_of,
    micros,
    record_final,
    repair_counters,
)
from aml_scheduler.handlers import Scheduler
from aml_scheduler.settings import SchedulerSettings

pytestmark = pytest.mark.integration

ITEM = "synthetic/s1:q"


@pytest.fixture(scope="module")
async def db(mongo_url: str) -> AsyncIterator[AsyncDatabase[Document]]:
    client: AsyncMongoClient[Document] = AsyncMongoClient(mongo_url, tz_aware=True)
    database = client["aml_progress_it"]
    await ensure_indexes(database)
    yield database
    await client.close()


async def planned_job(
    db: AsyncDatabase[Document], job_id: str, questions: int = 4, **fields: Any
) -> None:
    """A job as the scheduler leaves it after planning: totals set, no counters yet."""
    await db.jobs.insert_one(
        {
            "_id": job_id,
            "team_id": "team-1",
            "version_id": "ver-1",
            "mode": "smoke",
            "track": "textual",
            "run_label": f"label-{job_id}",
            "datasets": ["synthetic"],
            "state": "running",
            "planned": True,
            "created_at": datetime.now(UTC),
            "started_at": datetime.now(UTC),
            "totals": {"add": 2, "questions": questions},
            **fields,
        }
    )


async def counters(db: AsyncDatabase[Document], job_id: str) -> dict[str, int]:
    job = await db.jobs.find_one({"_id": job_id})
    assert job is not None
    return {field: value for field, value in counters_of(job).items() if value}


async def test_a_final_item_counts_once_however_often_it_is_recorded(
    db: AsyncDatabase[Document],
) -> None:
    await planned_job(db, "jonce")
    question = f"jonce/{ITEM}0"
    # A redelivery records the same outcome again.
    assert await record_final(db, "jonce", "search", question, "done") is True
    assert await record_final(db, "jonce", "search", question, "done") is False
    # Ten concurrent deliveries (or replicas) of one message.
    calls = [record_final(db, "jonce", "score", question, "done") for _ in range(10)]
    assert sorted(await asyncio.gather(*calls)) == [False] * 9 + [True]
    # A race that left a question with two terminal records still ends it once.
    other = f"jonce/{ITEM}1"
    both = [record_final(db, "jonce", "answer", other, "failed") for _ in range(5)]
    both += [record_final(db, "jonce", "score", other, "done") for _ in range(5)]
    await asyncio.gather(*both)
    # A state that is not final records nothing.
    assert await record_final(db, "jonce", "answer", f"jonce/{ITEM}2", "pending") is False
    errors = [record_error(db, "jonce", "search", "outage", question, "down") for _ in range(10)]
    await asyncio.gather(*errors)

    assert await counters(db, "jonce") == {
        "progress.search.done": 1,
        "progress.answer.failed": 1,
        "progress.score.done": 2,
        "progress.questions_final": 2,
        "progress.errors": 1,
    }
    # Nothing to repair: the counters are what the records say.
    assert await repair_counters(db, "jonce") is False
    assert (await counters(db, "jonce"))["progress.questions_final"] == 2


async def test_repair_counts_what_a_crash_left_uncounted(db: AsyncDatabase[Document]) -> None:
    await planned_job(db, "jcrash")
    counted = f"jcrash/{ITEM}0"
    assert await record_final(db, "jcrash", "search", counted, "done")
    # A writer died after inserting its final record, before its increment.
    lost = f"jcrash/{ITEM}1"
    await db.searches.insert_one({"_id": lost, "job_id": "jcrash", "state": "failed"})
    at_us = micros(datetime.now(UTC))
    await db[FINALS].insert_one(
        {
            "_id": f"search/{lost}",
            "job_id": "jcrash",
            "stage": "search",
            "item_id": lost,
            "outcome": "failed",
            "at_us": at_us,
        }
    )
    # Another died after its stage document, before its final record (a redelivery finds the
    # document and only re-announces it): the repair backfills the record from the document.
    unrecorded = f"jcrash/{ITEM}2"
    await db.scores.insert_one({"_id": unrecorded, "job_id": "jcrash", "state": "done"})
    await db.searches.insert_one({"_id": f"jcrash/{ITEM}3", "job_id": "jcrash", "state": "x"})
    # And an error-summary entry whose count was lost.
    await db.job_errors.insert_one({"_id": "jcrash/search/x", "job_id": "jcrash", "at_us": 1})
    assert await counters(db, "jcrash") == {"progress.search.done": 1}

    assert await repair_counters(db, "jcrash") is True
    # Backfilled from the documents: the unrecorded score's records, the lost search's question.
    backfilled = await db[FINALS].find({"job_id": "jcrash", "stage": "question"}).to_list()
    assert sorted(doc["item_id"] for doc in backfilled) == [lost, unrecorded]
    repaired = {
        "progress.search.done": 1,
        "progress.search.failed": 1,
        "progress.score.done": 1,
        "progress.questions_final": 2,
        "progress.errors": 1,
    }
    assert await counters(db, "jcrash") == repaired
    assert await repair_counters(db, "jcrash") is False
    # The writer of the lost increment was only slow, not dead: its late increment finds the
    # record already counted by the repair (watermark) and changes nothing.
    late = {"progress.search.failed": 1, "progress.questions_final": 1}
    await _count(db, "jcrash", late, at_us)
    assert await counters(db, "jcrash") == repaired
    # Records written after the repair count as usual.
    assert await record_final(db, "jcrash", "score", f"jcrash/{ITEM}0", "done")
    assert await counters(db, "jcrash") == {
        **repaired,
        "progress.score.done": 2,
        "progress.questions_final": 3,
    }
    job = await db.jobs.find_one({"_id": "jcrash"})
    assert job is not None and job["progress"]["repaired_us"] >= at_us
    # Another job, without a watermark, is counted on its own document and on no other (the
    # guard is not an `$or`, which nx-27017 would apply to another job's document).
    await planned_job(db, "jother")
    assert await record_final(db, "jother", "search", f"jother/{ITEM}0", "done")
    assert await counters(db, "jother") == {"progress.search.done": 1}
    assert await counters(db, "jcrash") == {
        **repaired,
        "progress.score.done": 2,
        "progress.questions_final": 3,
    }


async def test_job_status_reads_the_counters(db: AsyncDatabase[Document]) -> None:
    await planned_job(db, "jstatus")
    for i in range(3):
        await record_final(db, "jstatus", "search", f"jstatus/{ITEM}{i}", "done")
    await record_final(db, "jstatus", "search", f"jstatus/{ITEM}3", "failed")
    await record_error(db, "jstatus", "search", "participant_outage", f"jstatus/{ITEM}3", "503")
    await record_final(db, "jstatus", "add", "jstatus/u1/0", "done")
    await record_final(db, "jstatus", "add", "jstatus/u1/1", "done")
    job = await db.jobs.find_one({"_id": "jstatus"})
    assert job is not None
    # No stage document exists at all: the figures come from the job document alone.
    for collection in ("add_chunks", "searches", "answers", "scores"):
        assert await db[collection].find_one({"job_id": "jstatus"}) is None

    status = await job_status(db, job)
    figures: dict[str, Any] = {s: p.model_dump() for s, p in status.stages.items()}
    assert figures["add"] == {"total": 2, "done": 2, "failed": 0}
    assert figures["search"] == {"total": 4, "done": 3, "failed": 1}
    assert figures["answer"] == {"total": 4, "done": 0, "failed": 0}
    assert status.stage == "answer"  # every search is done or failed
    assert [(e.kind, e.item) for e in status.errors] == [("participant_outage", f"jstatus/{ITEM}3")]


def scheduler(db: AsyncDatabase[Document], broker: NatsBroker) -> Scheduler:
    settings = SchedulerSettings(reconcile_interval_seconds=20)
    # The participant client and the secrets are used only to plan and release, not here.
    unused = cast(Any, None)
    return Scheduler(settings, db, broker, unused, unused, build_spec(settings), "code")


async def question(db: AsyncDatabase[Document], job_id: str, i: int) -> str:
    item = f"{job_id}/{ITEM}{i}"
    await db.questions.insert_one(
        {
            "_id": item,
            "job_id": job_id,
            "dataset_id": "synthetic",
            "category_name": "facts",
            "question_id": f"s1:q{i}",
        }
    )
    return item


async def scored(db: AsyncDatabase[Document], job_id: str, item: str) -> None:
    """A score document as the scorer writes it (the record is the caller's business)."""
    await db.scores.insert_one(
        {
            "_id": item,
            "job_id": job_id,
            "state": "done",
            "category_name": "facts",
            "judge_label": "CORRECT",
            "judge_labels": ["CORRECT"],
            "f1": 1.0,
            "bleu1": 1.0,
        }
    )


async def test_scheduler_completes_a_job_from_its_counter(
    db: AsyncDatabase[Document], broker: NatsBroker
) -> None:
    await planned_job(db, "jdone", questions=2)
    run = scheduler(db, broker)
    first, second = await question(db, "jdone", 0), await question(db, "jdone", 1)
    # An Add chunk confirmed whose writer died before recording it: the completion repairs it.
    await db.add_chunks.insert_one({"_id": "jdone/u/0", "job_id": "jdone", "state": "done"})
    await scored(db, "jdone", first)
    await record_final(db, "jdone", "score", first, "done")
    await run.complete_if_done("jdone")
    assert (await db.jobs.find_one({"_id": "jdone"}) or {})["state"] == "running"

    await db.searches.insert_one({"_id": second, "job_id": "jdone", "state": "failed"})
    await record_final(db, "jdone", "search", second, "failed")
    await run.complete_if_done("jdone")
    job = await db.jobs.find_one({"_id": "jdone"})
    assert job is not None and job["state"] == "completed"
    assert job["results"]["overall"]["judge_accuracy"] is not None
    assert await counters(db, "jdone") == {
        "progress.add.done": 1,
        "progress.search.failed": 1,
        "progress.score.done": 1,
        "progress.questions_final": 2,
    }


async def test_reconciliation_repairs_a_stalled_job_and_completes_it(
    db: AsyncDatabase[Document], broker: NatsBroker
) -> None:
    # The scorer died after storing the last score and before recording it; its redelivery
    # only re-announces it. Nothing has moved for longer than three reconciliation intervals.
    long_ago = datetime.now(UTC) - timedelta(minutes=5)
    await planned_job(db, "jstall", questions=1, started_at=long_ago)
    item = await question(db, "jstall", 0)
    await scored(db, "jstall", item)
    run = scheduler(db, broker)
    await run.complete_if_done("jstall")
    assert (await db.jobs.find_one({"_id": "jstall"}) or {})["state"] == "running"

    await run.reconcile()
    job = await db.jobs.find_one({"_id": "jstall"})
    assert job is not None and job["state"] == "completed", job
    assert (await counters(db, "jstall"))["progress.questions_final"] == 1
    # A job that moved recently is left alone by the reconciliation's repair.
    await planned_job(db, "jbusy", questions=1)
    busy = await question(db, "jbusy", 0)
    await scored(db, "jbusy", busy)
    await run.reconcile()
    assert (await db.jobs.find_one({"_id": "jbusy"}) or {})["state"] == "running"
    assert await counters(db, "jbusy") == {}
