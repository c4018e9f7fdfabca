"""A stage's view of its jobs' state (`aml_pipeline.jobs.JobStates`, kept by every question
stage and the adder) on a real nats-server and nx-27017: read at most once a second, and a
failure announced by `fail_job` is heard at once, so the job's remaining items are dropped
without a read."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from typing import Any

import pytest
from faststream.nats import NatsBroker
from pymongo import AsyncMongoClient, monitoring
from pymongo.asynchronous.database import AsyncDatabase

from aml_pipeline.jobs import fail_job
from aml_pipeline.question_stage import QuestionStageWorker
from aml_runtime.broker import JetStreamBus
from aml_runtime.db import Document
from aml_runtime.documents import FailureKind
from aml_runtime.settings import CommonSettings
from aml_runtime.stores import Stores

pytestmark = pytest.mark.integration


class _JobReads(monitoring.CommandListener):
    def __init__(self) -> None:
        self.reads = 0

    def started(self, event: monitoring.CommandStartedEvent) -> None:
        if event.command_name == "find" and event.command.get("find") == "jobs":
            self.reads += 1

    def succeeded(self, event: monitoring.CommandSucceededEvent) -> None:
        pass

    def failed(self, event: monitoring.CommandFailedEvent) -> None:
        pass


@pytest.fixture
async def db_and_reads(mongo_url: str) -> AsyncIterator[tuple[AsyncDatabase[Document], _JobReads]]:
    reads = _JobReads()
    client: AsyncMongoClient[Document] = AsyncMongoClient(mongo_url, event_listeners=[reads])
    yield client["aml_job_state_it"], reads
    await client.close()


async def _unused(*_: Any) -> Document:
    raise AssertionError("not called")


async def test_a_failure_is_heard_at_once_and_a_read_is_reused_for_a_second(
    db_and_reads: tuple[AsyncDatabase[Document], _JobReads], broker: NatsBroker
) -> None:
    db, reads = db_and_reads
    for job_id in ("j-announced", "j-silent"):
        await db.jobs.insert_one(
            {"_id": job_id, "version_id": "ver-1", "state": "running", "top_k": 10}
        )
    # A question stage's view (the adder keeps the same one).
    jobs = QuestionStageWorker(
        "search", CommonSettings(), Stores.over(db), broker, JetStreamBus(broker), _unused
    ).jobs
    job = await jobs.get("j-announced")
    assert job is not None and job["state"] == "running" and job["top_k"] == 10
    assert reads.reads == 1
    assert (await jobs.get("j-announced")) == job
    assert reads.reads == 1  # reused within the second

    # Failed by another process: the announcement reaches this stage well within the second.
    failed_at = time.monotonic()
    await fail_job(
        Stores.over(db),
        JetStreamBus(broker),
        "j-announced",
        "search",
        FailureKind.CONTRACT_ERROR,
        "test",
    )
    while (await jobs.get("j-announced") or {}).get("state") == "running":
        assert time.monotonic() - failed_at < 0.5, "the failure was not heard"
        await asyncio.sleep(0.01)
    assert reads.reads == 1  # heard, not read
    assert (await jobs.get("j-announced") or {}).get("state") == "failed"

    # A state changed without an announcement is seen at the next read, within the second.
    await jobs.get("j-silent")
    await db.jobs.update_one({"_id": "j-silent"}, {"$set": {"state": "failed"}})
    assert (await jobs.get("j-silent") or {}).get("state") == "running"
    await asyncio.sleep(1.05)
    assert (await jobs.get("j-silent") or {}).get("state") == "failed"
    assert reads.reads == 3
