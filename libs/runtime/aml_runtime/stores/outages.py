"""Outages (`lane_pauses`, `outages`): the only code that reads or writes them.

`lane_pauses` holds the open outage of a capacity key, one document per key (`_id`: the key),
shared by every replica; `outages` the history of the closed ones, one entry per outage
(`<key>/<since>`). When a key is paused, probed, resumed, expired or closed are the rules of
`aml_pipeline.outages`, which passes the moments in and reads a pause through its model
(`LanePause`): this store returns the pauses as stored, each read or changed by one database
operation with the filter, update, projection, sort and options `aml_pipeline.outages` sent
before this store existed (the guards on `since`, `paused`, `probe_at` and `expired_at` make
each change once, whichever replica gets there first)."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator

from pymongo import ReturnDocument
from pymongo.asynchronous.database import AsyncDatabase
from pymongo.errors import DuplicateKeyError

from aml_runtime.db import Document


class OutageStore:
    def __init__(self, db: AsyncDatabase[Document]) -> None:
        self._db = db

    # -- open outages (`lane_pauses`) -----------------------------------------------------------

    async def pauses(self) -> AsyncIterator[Document]:
        """Every open pause, as stored."""
        async for pause in self._db.lane_pauses.find({}):
            yield pause

    async def pause(self, key: str) -> Document | None:
        """The key's open pause, as stored."""
        return await self._db.lane_pauses.find_one({"_id": key})

    async def pauses_of(self, keys: list[str]) -> AsyncIterator[Document]:
        """The open pauses of `keys` (by id), as stored."""
        async for pause in self._db.lane_pauses.find({"_id": {"$in": keys}}):
            yield pause

    async def paused_kinds(self) -> AsyncIterator[str]:
        """The kind of every pause that pauses its lanes now (resumed or expired ones not)."""
        async for pause in self._db.lane_pauses.find({"paused": True}, {"kind": 1}):
            yield str(pause.get("kind"))

    async def open_pause(self, pause: Document) -> bool:
        """Store a new pause; False when the key has one open already (the unique `_id`)."""
        try:
            await self._db.lane_pauses.insert_one(pause)
        except DuplicateKeyError:
            return False
        return True

    async def pause_again(
        self, key: str, reason: str, probe_at: float | None = None
    ) -> Document | None:
        """The key's open pause, unless it expired, pauses again for `reason` (probed next at
        `probe_at`, unless None: its probe time stays); the pause after, or None when there is
        no such pause."""
        update: Document = {"reason": reason, "paused": True}
        if probe_at is not None:
            update["probe_at"] = probe_at
        return await self._db.lane_pauses.find_one_and_update(
            {"_id": key, "expired_at": None}, {"$set": update},
            return_document=ReturnDocument.AFTER,
        )  # fmt: skip

    async def claim_probe(
        self, key: str, since: float, probe_at: float, next_probe_at: float, interval: float
    ) -> Document | None:
        """Claim the probe due at `probe_at` of the pause open since `since`, still paused: the
        next is due at `next_probe_at`, after `interval`. The pause after, or None when another
        replica claimed it, or the pause changed."""
        return await self._db.lane_pauses.find_one_and_update(
            {"_id": key, "since": since, "paused": True, "probe_at": probe_at},
            {"$set": {"probe_at": next_probe_at, "interval": interval}, "$inc": {"probes": 1}},
            return_document=ReturnDocument.AFTER,
        )

    async def resume(self, key: str, since: float, resumed_at: float) -> Document | None:
        """The pause open since `since` no longer pauses (its probe answered); the pause after,
        or None when it is gone."""
        return await self._db.lane_pauses.find_one_and_update(
            {"_id": key, "since": since},
            {"$set": {"paused": False, "resumed_at": resumed_at}},
            return_document=ReturnDocument.AFTER,
        )

    async def expire(self, key: str, since: float, moment: float) -> Document | None:
        """The pause open since `since` outlived its window at `moment` (once): the pause
        after, or None when it had expired already or is gone."""
        return await self._db.lane_pauses.find_one_and_update(
            {"_id": key, "since": since, "expired_at": None},
            {"$set": {"paused": False, "expired_at": moment}},
            return_document=ReturnDocument.AFTER,
        )

    async def close(self, key: str) -> Document | None:
        """Remove the key's open pause; the pause removed, or None when none was open."""
        return await self._db.lane_pauses.find_one_and_delete({"_id": key})

    async def close_if_since(self, key: str, since: float) -> Document | None:
        """Remove the key's pause if it is the one open since `since`; the pause removed, or
        None when it is not (closed already, or another opened since)."""
        return await self._db.lane_pauses.find_one_and_delete({"_id": key, "since": since})

    # -- history (`outages`) --------------------------------------------------------------------

    async def record(
        self,
        key: str,
        kind: str,
        since: float,
        until: float,
        reason: str,
        probes: int,
        how: str,
    ) -> None:
        """The outage's history entry, once (a second record of the same outage is dropped)."""
        with contextlib.suppress(DuplicateKeyError):
            await self._db.outages.insert_one(
                {
                    "_id": f"{key}/{since:.6f}",
                    "key": key,
                    "kind": kind,
                    "since": since,
                    "until": until,
                    "seconds": round(until - since, 3),
                    "reason": reason,
                    "probes": probes,
                    "how": how,
                }
            )

    async def last_end(self, key: str) -> float | None:
        """When the latest recorded outage of `key` ended (its `until`), if any: the `key`
        index."""
        doc = await self._db.outages.find_one({"key": key}, sort=[("until", -1)])
        return None if doc is None else float(doc["until"])
