"""Evaluation Access Requests (`access_requests`): the only code that reads or writes them.

The gateway stores a request pending, an admin decides it once (a guarded update on `pending`),
and the requester of a new key takes the key held for it once (a guarded update on `held`).
A request holds its Memory System Key only as a reference into `secrets`, and the held
Leaderboard API Key only sealed (`aml_gateway.access_requests`)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from datetime import datetime

from pymongo import ReturnDocument
from pymongo.asynchronous.database import AsyncDatabase

from aml_contract.api.access_requests import AccessState
from aml_runtime.db import Document

# A request is a plain document: the gateway's `view` builds the API's answer from it field by
# field, and nothing else reads one.


class AccessRequestStore:
    def __init__(self, db: AsyncDatabase[Document]) -> None:
        self._db = db

    async def store_access_request(self, request: Document) -> None:
        await self._db.access_requests.insert_one(request)

    async def by_state(self, state: AccessState | None, limit: int) -> AsyncIterator[Document]:
        """The requests in `state` (all without one), oldest first, at most `limit`."""
        query = {} if state is None else {"state": state}
        async for document in (
            self._db.access_requests.find(query).sort("created_at", 1).limit(limit)
        ):
            yield document

    async def access_request(self, request_id: str) -> Document | None:
        return await self._db.access_requests.find_one({"_id": request_id})

    async def team_access_request(self, request_id: str, team_id: str) -> Document | None:
        """The request if it is bound to the team."""
        return await self._db.access_requests.find_one({"_id": request_id, "team_id": team_id})

    async def requester_access_request(self, request_id: str, token_hash: str) -> Document | None:
        """The request if `token_hash` is the hash of its request token."""
        return await self._db.access_requests.find_one(
            {"_id": request_id, "request_token_hash": token_hash}
        )

    async def decide_access_request(self, request_id: str, decision: Document) -> bool:
        """Write the decision if the request is still pending; whether this call decided it."""
        decided = await self._db.access_requests.update_one(
            {"_id": request_id, "state": "pending"}, {"$set": decision}
        )
        return decided.modified_count != 0

    async def take_held_key(
        self, request_id: str, token_hash: str, delivered_at: datetime
    ) -> Document | None:
        """Mark the held key delivered and drop its sealed copy, in one atomic write: the
        request as it was before (None when no key was held, or another read took it)."""
        mine = {"_id": request_id, "request_token_hash": token_hash}
        return await self._db.access_requests.find_one_and_update(
            {**mine, "key_delivery.state": "held"},
            {"$set": {"key_delivery": {"state": "delivered", "delivered_at": delivered_at}}},
            return_document=ReturnDocument.BEFORE,
        )
