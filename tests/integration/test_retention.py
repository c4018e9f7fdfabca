"""Retention (R-7.5) on a real nx-27017: a run's derived data is deleted 30 days after the job
ended, unless an admin keeps it longer through the gateway; results and audit metadata stay."""

from __future__ import annotations

from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from gateway_support import ADMIN, Gateway, open_gateway
from pymongo import AsyncMongoClient

from aml_pipeline.retention import purge_due, purge_expired
from aml_runtime.db import Document
from aml_runtime.stores import Stores

pytestmark = pytest.mark.integration

NOW = datetime(2027, 5, 1, 12, 0, tzinfo=UTC)
DAY = timedelta(days=1)


def test_purge_is_due_thirty_days_after_the_end_unless_kept() -> None:
    ended = NOW - 30 * DAY
    assert purge_due(ended, None, NOW)
    assert not purge_due(ended + timedelta(seconds=1), None, NOW)
    assert not purge_due(None, None, NOW)  # still running
    assert not purge_due(ended, NOW + DAY, NOW)
    assert purge_due(ended, NOW, NOW)  # the extension has ended


@pytest.fixture
async def gateway(mongo_url: str, nats_url: str) -> AsyncIterator[Gateway]:
    async with open_gateway(mongo_url, nats_url, lambda: NOW) as gw:
        yield gw


async def _seed(db: Any, job_id: str, finished_days_ago: float) -> None:
    await db.jobs.insert_one(
        {"_id": job_id, "state": "completed", "finished_at": NOW - finished_days_ago * DAY,
         "results": {"overall": {"questions": 1}}}
    )  # fmt: skip
    await db.add_chunks.insert_one({"_id": f"{job_id}/a", "job_id": job_id, "body": b"{}"})
    await db.questions.insert_one({"_id": f"{job_id}/q", "job_id": job_id, "search_body": b"{}"})
    await db.searches.insert_one(
        {"_id": f"{job_id}/q", "job_id": job_id, "state": "done", "candidates": [{"id": "m"}]}
    )
    await db.answers.insert_one({"_id": f"{job_id}/q", "job_id": job_id, "answer": "Paris"})
    await db.scores.insert_one(
        {"_id": f"{job_id}/q", "job_id": job_id, "judge_label": "CORRECT", "f1": 1.0,
         "judge_replies": ['{"label": "CORRECT"}']}
    )  # fmt: skip
    await db.written_texts.insert_one({"_id": f"{job_id}/d", "job_id": job_id, "users": ["u"]})
    await db.calls.insert_one({"job_id": job_id, "item_id": f"{job_id}/a", "status": 200})


async def test_old_runs_lose_their_data_and_keep_their_results(gateway: Gateway) -> None:
    mongo: AsyncMongoClient[Document] = AsyncMongoClient(gateway.settings.mongo_url)
    db = mongo[gateway.settings.mongo_db]
    try:
        await _seed(db, "old", 31)
        await _seed(db, "recent", 29)
        await _seed(db, "kept", 45)
        keep = await gateway.client.post(
            "/v1/admin/jobs/kept/retention",
            json={"keep_until": (NOW + 10 * DAY).isoformat(), "reason": "integrity review"},
            headers=ADMIN,
        )
        assert keep.status_code == 200, keep.text
        past = {"keep_until": (NOW - DAY).isoformat(), "reason": "x"}
        response = await gateway.client.post(
            "/v1/admin/jobs/kept/retention", json=past, headers=ADMIN
        )
        assert response.status_code == 422
        missing = {"keep_until": (NOW + DAY).isoformat(), "reason": "x"}
        response = await gateway.client.post(
            "/v1/admin/jobs/nope/retention", json=missing, headers=ADMIN
        )
        assert response.status_code == 404

        assert await purge_expired(Stores.over(db), NOW) == ["old"]
        assert await purge_expired(Stores.over(db), NOW) == []  # once
        assert (await db.add_chunks.find_one({"_id": "old/a"}))["body"] is None
        assert (await db.questions.find_one({"_id": "old/q"}))["search_body"] is None
        assert (await db.searches.find_one({"_id": "old/q"}))["candidates"] == []
        assert (await db.answers.find_one({"_id": "old/q"}))["answer"] is None
        score = await db.scores.find_one({"_id": "old/q"})
        assert score["judge_replies"] == [] and score["judge_label"] == "CORRECT"
        assert await db.written_texts.count_documents({"job_id": "old"}) == 0
        assert await db.calls.count_documents({"job_id": "old"}) == 1  # audit metadata stays
        job = await db.jobs.find_one({"_id": "old"})
        assert job["results"] == {"overall": {"questions": 1}} and job["retention_purged_at"]
        for untouched in ("recent", "kept"):
            assert (await db.answers.find_one({"_id": f"{untouched}/q"}))["answer"] == "Paris"

        # Deleted data cannot be kept any more.
        late = await gateway.client.post(
            "/v1/admin/jobs/old/retention", json=missing, headers=ADMIN
        )
        assert late.status_code == 409
        # After the extension, the kept job goes too.
        assert sorted(await purge_expired(Stores.over(db), NOW + 10 * DAY)) == ["kept", "recent"]
    finally:
        await mongo.close()
