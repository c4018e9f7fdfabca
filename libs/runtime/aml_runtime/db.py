"""MongoDB access (PyMongo's native async API) and the indexes every collection relies on."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from pymongo import ASCENDING, AsyncMongoClient
from pymongo.asynchronous.database import AsyncDatabase

from aml_runtime.settings import CommonSettings

Document = dict[str, Any]

# Natural keys are the documents' `_id`s (unique by construction); these are the lookups.
# nx-27017 (measured, 0.8.1) serves an equality filter only from a single-field index, not from
# a compound index's prefix, hence the separate `job_id` indexes: without them reading one
# job's stage documents scans the collection (the progress repair, the final aggregation).
_JOB: list[tuple[str, int]] = [("job_id", ASCENDING)]
_INDEXES: dict[str, list[list[tuple[str, int]]]] = {
    "jobs": [[("team_id", ASCENDING), ("created_at", ASCENDING)]],
    "add_chunks": [
        [("job_id", ASCENDING), ("user_id", ASCENDING), ("seq", ASCENDING)],
        [("job_id", ASCENDING), ("state", ASCENDING)],
        _JOB,
    ],
    "questions": [[("job_id", ASCENDING), ("conversation_id", ASCENDING)], _JOB],
    "searches": [[("job_id", ASCENDING), ("state", ASCENDING)], _JOB],
    "answers": [[("job_id", ASCENDING), ("state", ASCENDING)], _JOB],
    "scores": [[("job_id", ASCENDING), ("state", ASCENDING)], _JOB],
    "calls": [[("job_id", ASCENDING), ("request_id", ASCENDING), ("attempt", ASCENDING)]],
    # The status shows a job's first errors by time: with (job_id, at) nx-27017 reads only those
    # (with job_id alone it sorts all of the job's errors; without an index, the collection).
    "job_errors": [_JOB, [("job_id", ASCENDING), ("at", ASCENDING)]],
    "versions": [[("team_id", ASCENDING)]],
    # The searcher reads a job's written texts at once (retention deletes them the same way).
    "written_texts": [_JOB],
}


def connect(settings: CommonSettings) -> tuple[AsyncMongoClient[Document], AsyncDatabase[Document]]:
    client: AsyncMongoClient[Document] = AsyncMongoClient(settings.mongo_url, tz_aware=True)
    return client, client[settings.mongo_db]


async def ensure_indexes(db: AsyncDatabase[Document]) -> None:
    for collection, indexes in _INDEXES.items():
        for keys in indexes:
            await db[collection].create_index(keys)
    await db["teams"].create_index([("key_hash", ASCENDING)], unique=True)


def read_time(value: object) -> datetime | None:
    """A stored timestamp as an aware UTC datetime. The embedded wire server (nx-27017) keeps a
    datetime written through `$set` as a naive ISO string; MongoDB keeps a BSON date."""
    if value is None:
        return None
    if isinstance(value, datetime):
        return value if value.tzinfo else value.replace(tzinfo=UTC)
    parsed = datetime.fromisoformat(str(value))
    return parsed if parsed.tzinfo else parsed.replace(tzinfo=UTC)
