"""A participant's declared capacity (SPEC R-4.12), held across every replica of every service.

Both limits are slots in MongoDB, each with the time it is free again, taken with one atomic
find-and-update, so no replica needs to know of the others:
- concurrency: `max_concurrency` slots; a call holds one for its duration (a lease renewed while
  the call runs, so a crashed holder frees it when the lease ends) and frees it on return;
- rate: `ceil(max_rps)` slots, each reusable `ceil(max_rps) / max_rps` seconds after it was
  taken, so any window of that length holds at most `ceil(max_rps)` starts — never more than
  `max_rps` per second.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import random
import time
import uuid
from collections.abc import AsyncIterator

from pymongo import ReturnDocument
from pymongo.asynchronous.database import AsyncDatabase
from pymongo.errors import DuplicateKeyError

from aml_runtime.db import Document

LEASE_SECONDS = 30.0
_POLL_SECONDS = (0.01, 0.05)


class CapacityLimiter:
    def __init__(self, db: AsyncDatabase[Document], lease_seconds: float = LEASE_SECONDS) -> None:
        self._db = db
        self._lease = lease_seconds
        # Pools whose slot documents this process has already created (sizes included, so a
        # version that raises its declared capacity gets its new slots).
        self._ensured: set[tuple[str, int]] = set()

    @contextlib.asynccontextmanager
    async def slot(self, key: str, max_concurrency: int, max_rps: float) -> AsyncIterator[None]:
        """Wait for a concurrency slot and a rate slot of `key`, hold them for the block."""
        rate_slots = max(1, math.ceil(max_rps))
        period = rate_slots / max_rps
        holder = uuid.uuid4().hex
        concurrency_id = await self._take(f"{key}/c", max_concurrency, self._lease, holder)
        renew = asyncio.create_task(self._renew(concurrency_id, holder))
        try:
            rate_id = await self._take(f"{key}/r", rate_slots, period, holder)
            # Counted from now, when the request is about to leave, not from before the round
            # trip that took the slot: the next start on this slot is a full period later.
            await self._db.capacity_slots.update_one(
                {"_id": rate_id, "holder": holder}, {"$set": {"free_at": time.time() + period}}
            )
            yield
        finally:
            renew.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await renew
            await self._db.capacity_slots.update_one(
                {"_id": concurrency_id, "holder": holder}, {"$set": {"free_at": 0.0}}
            )

    async def spend(self, run_key: str) -> int:
        """Count one request of a run; returns how many the run has made, this one included."""
        usage = await self._db.run_usage.find_one_and_update(
            {"_id": run_key},
            {"$inc": {"requests": 1}},
            upsert=True,
            return_document=ReturnDocument.AFTER,
        )
        assert usage is not None  # upserted
        return int(usage["requests"])

    async def _take(self, pool: str, size: int, hold_for: float, holder: str) -> str:
        await self._ensure(pool, size)
        while True:
            now = time.time()
            taken = await self._db.capacity_slots.find_one_and_update(
                {"pool": pool, "index": {"$lt": size}, "free_at": {"$lte": now}},
                {"$set": {"free_at": now + hold_for, "holder": holder}},
                return_document=ReturnDocument.AFTER,
            )
            if taken is not None and taken["holder"] == holder:
                return str(taken["_id"])
            await asyncio.sleep(random.uniform(*_POLL_SECONDS))

    async def _ensure(self, pool: str, size: int) -> None:
        if (pool, size) in self._ensured:
            return
        for index in range(size):
            with contextlib.suppress(DuplicateKeyError):
                await self._db.capacity_slots.insert_one(
                    {"_id": f"{pool}/{index}", "pool": pool, "index": index, "free_at": 0.0,
                     "holder": None}
                )  # fmt: skip
        self._ensured.add((pool, size))

    async def _renew(self, slot_id: str, holder: str) -> None:
        while True:
            await asyncio.sleep(self._lease / 3)
            await self._db.capacity_slots.update_one(
                {"_id": slot_id, "holder": holder},
                {"$set": {"free_at": time.time() + self._lease}},
            )
