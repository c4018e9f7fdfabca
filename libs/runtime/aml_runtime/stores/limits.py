"""The gateway's per-address rate limits (`rate_limits`): the only code that reads or writes them.

One document per (limit, client address), `_id` `<limit>/<address>`, shared by every gateway
replica, so N replicas allow what one would. It holds the bucket as one moment, `tat` (epoch
seconds): the bucket is full when `tat` is not after now and holds `burst - (tat - now) / period`
tokens otherwise (a token bucket kept as its "theoretical arrival time", GCRA). Taking a token
is `$max` of `tat` with now (`catch_up`), then `$inc` of one period guarded by `tat` being low
enough to leave a token (`take`): both are single-document atomic operators nx-27017 serves
(it has no aggregation-pipeline updates), they commute across replicas, and `tat` only ever
grows, so concurrent takes from any number of replicas never hand out more than the bucket
holds. The arithmetic is `aml_gateway.limits`'s; this store only applies it.

`expires` (a date) is never before the moment the bucket is full again: the TTL index of
`aml_runtime.documents` deletes a document then, and a missing document is a full bucket, so
the collection holds only the addresses that are limited now."""

from __future__ import annotations

from datetime import datetime

from pymongo import ReturnDocument
from pymongo.asynchronous.database import AsyncDatabase
from pymongo.errors import DuplicateKeyError

from aml_runtime.db import Document


class LimitStore:
    def __init__(self, db: AsyncDatabase[Document]) -> None:
        self._db = db

    async def bucket(self, key: str) -> float | None:
        """The bucket's `tat`, or None when there is none (a full bucket)."""
        found = await self._db.rate_limits.find_one({"_id": key}, {"tat": 1})
        return None if found is None else float(found["tat"])

    async def catch_up(self, key: str, now: float, expires: datetime) -> float:
        """`tat` raised to `now` if it is earlier (the bucket created full if absent), kept at
        least until `expires`; the `tat` after."""
        update = {"$max": {"tat": now, "expires": expires}}
        try:
            after = await self._db.rate_limits.find_one_and_update(
                {"_id": key}, update, upsert=True, return_document=ReturnDocument.AFTER
            )
        except DuplicateKeyError:
            # Two replicas created the bucket at once: it exists now, so this one updates it.
            after = await self._db.rate_limits.find_one_and_update(
                {"_id": key}, update, return_document=ReturnDocument.AFTER
            )
        return now if after is None else float(after["tat"])

    async def take(self, key: str, at_most: float, step: float, expires: datetime) -> float | None:
        """If `tat` is at most `at_most`, add `step` to it and keep the bucket at least until
        `expires`: the `tat` after, or None when `tat` was later (no token) or there is no
        bucket."""
        after = await self._db.rate_limits.find_one_and_update(
            {"_id": key, "tat": {"$lte": at_most}},
            {"$inc": {"tat": step}, "$max": {"expires": expires}},
            return_document=ReturnDocument.AFTER,
        )
        return None if after is None else float(after["tat"])
