"""Retention (SPEC R-7.5): what a run derived from the benchmark and the participant's memory —
the request bodies, the returned candidates, the answers and the judge's replies — is deleted
`retention` after the job ends, unless an admin keeps it longer. Aggregate results, per-question
scores and the audit trail's metadata (status, latency, attempts, validation) stay.
"""

from __future__ import annotations

from datetime import datetime, timedelta

from pymongo.asynchronous.database import AsyncDatabase

from aml_runtime.db import Document, read_time
from aml_runtime.documents import FINISHED_JOB_STATES

RETENTION = timedelta(days=30)

# (collection, fields emptied). Documents stay, so counts and audit metadata survive.
_PURGED_FIELDS: tuple[tuple[str, Document], ...] = (
    ("add_chunks", {"body": None}),
    ("questions", {"search_body": None}),
    ("searches", {"candidates": []}),
    ("answers", {"answer": None}),
    ("scores", {"judge_replies": []}),
)


def purge_due(
    finished_at: datetime | None,
    keep_until: datetime | None,
    now: datetime,
    retention: timedelta = RETENTION,
) -> bool:
    """True once `retention` has passed since the job ended and any admin extension is over."""
    if finished_at is None or now < finished_at + retention:
        return False
    return keep_until is None or now >= keep_until


async def purge_job(db: AsyncDatabase[Document], job_id: str, now: datetime) -> None:
    """Empty the run's derived data. Repeatable: a second pass changes nothing."""
    for collection, emptied in _PURGED_FIELDS:
        await db[collection].update_many({"job_id": job_id}, {"$set": emptied})
    # Texts written to the participant, kept per job only to detect leaks while it ran.
    await db.written_texts.delete_many({"job_id": job_id})
    await db.jobs.update_one({"_id": job_id}, {"$set": {"retention_purged_at": now}})


async def purge_expired(
    db: AsyncDatabase[Document], now: datetime, retention: timedelta = RETENTION
) -> list[str]:
    """Purge every ended job whose retention is over; returns their ids."""
    purged = []
    projection = {"finished_at": 1, "retention_keep_until": 1, "retention_purged_at": 1}
    async for job in db.jobs.find({"state": {"$in": list(FINISHED_JOB_STATES)}}, projection):
        if job.get("retention_purged_at") is not None:
            continue
        finished = read_time(job.get("finished_at"))
        keep_until = read_time(job.get("retention_keep_until"))
        if purge_due(finished, keep_until, now, retention):
            await purge_job(db, job["_id"], now)
            purged.append(job["_id"])
    return purged
