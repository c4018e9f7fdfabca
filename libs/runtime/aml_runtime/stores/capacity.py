"""The capacity slots of every key (`capacity_slots`): the only code that reads or writes them.

A key's pool is `<key>/c` (concurrency) or `<key>/r` (rate), one document per slot, each with
the moment it is free again (`free_at`, epoch seconds), its `holder`, and whether that moment is
known (`stamped`). Which slots an admission may take, for how long and when they free again are
the rules of `aml_pipeline.capacity`, which passes the moments in; this store only takes, gives
back and reads slots.

THE hot path of the platform: every admission takes its slots here. Every filter, update, sort
and option below is the one `aml_pipeline.capacity` sent before this store existed (the `pool`
index of `aml_runtime.documents` serves them on nx-27017), each method is one database
operation (`ensure_pool`: one per slot, once per pool and size in a process), and what comes
back is returned as the operation returned it, not validated."""

from __future__ import annotations

import contextlib
from typing import NamedTuple

from pymongo import ASCENDING, ReturnDocument, UpdateOne
from pymongo.asynchronous.database import AsyncDatabase
from pymongo.errors import DuplicateKeyError

from aml_runtime.db import Document


class SlotRange(NamedTuple):
    """The slots of `pool` with an index in [low, high): the ones an admission may take."""

    pool: str
    low: int
    high: int

    def query(self) -> Document:
        return {"pool": self.pool, "index": {"$gte": self.low, "$lt": self.high}}


class SlotStore:
    def __init__(self, db: AsyncDatabase[Document]) -> None:
        self._db = db

    async def ensure_pool(self, pool: str, size: int) -> None:
        """Create the pool's slots `0 .. size - 1` that do not exist yet, free."""
        for index in range(size):
            with contextlib.suppress(DuplicateKeyError):
                await self._db.capacity_slots.insert_one(
                    {"_id": f"{pool}/{index}", "pool": pool, "index": index, "free_at": 0.0,
                     "holder": None}
                )  # fmt: skip

    async def take_slot(
        self, slots: SlotRange, holder: str, now: float, until: float
    ) -> str | None:
        """A slot of `slots` free at `now`, held by `holder` until `until`: its id, or None when
        none is free."""
        taken = await self._db.capacity_slots.find_one_and_update(
            {**slots.query(), "free_at": {"$lte": now}},
            # `stamped: False` until the holder stamps it (rate) or frees it: a waiter cannot
            # know when a locked slot frees, only that it will be soon.
            {"$set": {"free_at": until, "holder": holder, "stamped": False}},
            return_document=ReturnDocument.AFTER,
        )
        if taken is not None and taken["holder"] == holder:
            return str(taken["_id"])
        return None

    async def reserve_rate_slot(
        self, slots: SlotRange, holder: str, free_by: float, locked_until: float
    ) -> tuple[str, float] | None:
        """The slot of `slots` that is free first, if it is free by `free_by`: locked for
        `holder` until `locked_until`; its id and the moment it was free (None: none is)."""
        before = await self._db.capacity_slots.find_one_and_update(
            {**slots.query(), "free_at": {"$lte": free_by}},
            {"$set": {"free_at": locked_until, "holder": holder, "stamped": False}},
            sort=[("free_at", ASCENDING)],
            return_document=ReturnDocument.BEFORE,
        )
        if before is None:
            return None
        return str(before["_id"]), float(before["free_at"])

    async def first_to_free(self, slots: SlotRange) -> Document | None:
        """The slot of `slots` free first: only its `free_at` and `stamped` (and `_id`)."""
        return await self._db.capacity_slots.find_one(
            slots.query(),
            {"free_at": 1, "stamped": 1},
            sort=[("free_at", ASCENDING)],
        )

    async def free_slots(self, holder: str, frees: list[tuple[str, float]]) -> None:
        """Each (slot, free_at) of `holder` is free at its moment, known: one round trip."""
        await self._db.capacity_slots.bulk_write(
            [
                UpdateOne(
                    {"_id": slot, "holder": holder},
                    {"$set": {"free_at": free_at, "stamped": True}},
                )
                for slot, free_at in frees
            ],
            ordered=False,
        )

    async def give_back(self, slot: str, holder: str, free_at: float) -> None:
        """A slot `holder` took and never used is free again at `free_at`."""
        await self._set_free_at(slot, holder, free_at)

    async def renew_lease(self, slot: str, holder: str, until: float) -> None:
        """`holder` keeps its slot until `until` (a lease renewed while its item runs)."""
        await self._set_free_at(slot, holder, until)

    async def _set_free_at(self, slot: str, holder: str, free_at: float) -> None:
        await self._db.capacity_slots.update_one(
            {"_id": slot, "holder": holder}, {"$set": {"free_at": free_at, "stamped": True}}
        )
