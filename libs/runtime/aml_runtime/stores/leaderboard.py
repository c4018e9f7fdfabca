"""The leaderboard's entries (`leaderboard`): the only code that reads or writes them.

The gateway publishes an entry when an admin approves a job (one per job: the unique `job_id`
index refuses a second), disqualifies it, and shows the standing ones; the publisher's gate
compares a new run with every entry, disqualified ones included."""

from __future__ import annotations

from collections.abc import AsyncIterator
from datetime import datetime

from pymongo.asynchronous.database import AsyncDatabase

from aml_runtime.db import Document

# An entry is a plain document: the gateway builds the public answer from it field by field
# (`aml_gateway.publication`), so nothing else stored on it can reach the public.


class LeaderboardStore:
    def __init__(self, db: AsyncDatabase[Document]) -> None:
        self._db = db

    async def publish_entry(self, entry: Document) -> None:
        """`DuplicateKeyError` when the job has an entry already."""
        await self._db.leaderboard.insert_one(entry)

    async def entry(self, entry_id: str) -> Document | None:
        return await self._db.leaderboard.find_one({"_id": entry_id})

    async def entry_of_job(self, job_id: str) -> Document | None:
        return await self._db.leaderboard.find_one({"job_id": job_id})

    async def latest_entries(self, limit: int) -> AsyncIterator[Document]:
        """Every entry, disqualified ones included, newest first, at most `limit`."""
        async for entry in self._db.leaderboard.find({}).sort("published_at", -1).limit(limit):
            yield entry

    async def entries(self) -> AsyncIterator[Document]:
        """Every entry, disqualified ones included, read as iterated."""
        async for entry in self._db.leaderboard.find({}):
            yield entry

    async def standing_entries(self, query: Document, limit: int) -> list[Document]:
        """The entries matching `query` that are not disqualified, at most `limit`."""
        return await self._db.leaderboard.find({**query, "disqualified": False}).to_list(limit)

    async def standing_placements(self) -> list[Document]:
        """Only the `track`, `board` and `job_id` of every entry not disqualified."""
        return await self._db.leaderboard.find(
            {"disqualified": False}, {"track": 1, "board": 1, "job_id": 1}
        ).to_list(None)

    async def disqualify_entry(self, entry_id: str, reason: str, at: datetime) -> bool:
        """Disqualify the entry unless it is already; whether this call did."""
        updated = await self._db.leaderboard.update_one(
            {"_id": entry_id, "disqualified": False},
            {
                "$set": {
                    "disqualified": True,
                    "disqualified_reason": reason,
                    "disqualified_at": at,
                }
            },
        )
        return updated.modified_count != 0
