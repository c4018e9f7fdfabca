"""The leaderboard's entries (`leaderboard`) and the per-question headline values of the runs
that may become entries (`headline_outcomes`): the only code that reads or writes them.

The gateway publishes an entry when an admin approves a job (one per job: the unique `job_id`
index refuses a second), disqualifies it, and shows the standing ones; the publisher's gate
compares a new run with every entry, disqualified ones included. The scheduler keeps a full
run's per-question values when it completes the job; the gateway reads them to tell whether two
adjacent entries of a board are distinguishable (`aml_gateway.ties`)."""

from __future__ import annotations

import struct
import zlib
from collections.abc import AsyncIterator, Mapping
from datetime import datetime
from typing import Final

from pydantic import BaseModel, Field
from pymongo.asynchronous.database import AsyncDatabase

from aml_contract.api.results import Headline
from aml_runtime.db import Document

# An entry is a plain document: the gateway builds the public answer from it field by field
# (`aml_gateway.publication`), so nothing else stored on it can reach the public.

# How `headline_outcomes` documents hold their values: the question keys sorted, joined by
# newlines, UTF-8, zlib; their values in that order as little-endian float64, zlib. One BSON
# field per question would cost some 30 bytes each (300 KB for 10,000 questions) and forbid keys
# with dots; this takes 26 KB for 10,000 LoCoMo-like keys with 0/1 values, 98 KB with F1 values.
OUTCOMES_ENCODING: Final = "keys-lines-zlib+values-f64le-zlib-v1"


class HeadlineOutcomes(BaseModel):
    """One run's questions that count in Overall, each with its value in Overall's headline
    figure (`aml_evaluation.aggregate.headline_values`), as read back."""

    job_id: str
    headline: Headline
    values: dict[str, float] = Field(description="Question key -> value.")


def encode_outcomes(outcomes: HeadlineOutcomes) -> Document:
    keys = sorted(outcomes.values)
    if any("\n" in key for key in keys):
        raise ValueError("a question key holds a newline, the encoding's separator")
    values = struct.pack(f"<{len(keys)}d", *(outcomes.values[key] for key in keys))
    return {
        "_id": outcomes.job_id,
        "headline": outcomes.headline,
        "questions": len(keys),
        "encoding": OUTCOMES_ENCODING,
        "keys": zlib.compress("\n".join(keys).encode("utf-8")),
        "values": zlib.compress(values),
    }


def decode_outcomes(document: Mapping[str, object]) -> HeadlineOutcomes:
    count = document["questions"]
    keys_blob, values_blob = document["keys"], document["values"]
    assert isinstance(count, int) and isinstance(keys_blob, bytes)
    assert isinstance(values_blob, bytes) and document["encoding"] == OUTCOMES_ENCODING
    keys = zlib.decompress(keys_blob).decode("utf-8").split("\n") if count else []
    values = struct.unpack(f"<{count}d", zlib.decompress(values_blob))
    return HeadlineOutcomes.model_validate(
        {"job_id": document["_id"], "headline": document["headline"],
         "values": dict(zip(keys, values, strict=True))}
    )  # fmt: skip


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

    async def keep_headline_outcomes(self, outcomes: HeadlineOutcomes) -> None:
        """Store a run's per-question headline values (by job id: a completion repeated by a
        redelivery or another replica writes the same document again)."""
        document = encode_outcomes(outcomes)
        await self._db.headline_outcomes.update_one(
            {"_id": document.pop("_id")}, {"$set": document}, upsert=True
        )

    async def headline_outcomes_of(self, job_id: str) -> HeadlineOutcomes | None:
        """A run's per-question headline values; None for a run that has none kept (not a full
        run, or completed before they were)."""
        document = await self._db.headline_outcomes.find_one({"_id": job_id})
        return None if document is None else decode_outcomes(document)

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
