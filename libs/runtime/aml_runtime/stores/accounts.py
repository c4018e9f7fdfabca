"""Teams, their system versions and system names, the sealed Memory System Keys and each run's
request count (`teams`, `versions`, `system_names`, `secrets`, `run_usage`): the only code that
reads or writes them.

Versions are written by the gateway's registry (the admin shortcut or an approved access
request) and read by the gateway and every stage that calls a participant. A Memory System Key
arrives here sealed (`aml_runtime.secrets.SecretBox`) and leaves sealed: this store never sees
it in the clear."""

from __future__ import annotations

from collections.abc import AsyncIterator
from datetime import datetime
from typing import Literal

from pymongo import ReturnDocument
from pymongo.asynchronous.database import AsyncDatabase
from pymongo.errors import DuplicateKeyError

from aml_runtime.db import Document
from aml_runtime.documents import VersionDocument, VersionFields

# How a system name's claim went: made by this call, already the team's, or another team's.
NameClaim = Literal["claimed", "held", "taken"]

# What a job's status shows of its version: one read by primary key.
_PROFILE_FIELDS = {"system_name": 1, "version_label": 1, "board": 1}


def version_document(
    version_id: str, team_id: str, version: VersionFields, created_at: datetime
) -> Document:
    # The fields are a validated model: what is stored is what the pipeline reads.
    return {"_id": version_id, "team_id": team_id, **version.model_dump(), "created_at": created_at}


class AccountStore:
    def __init__(self, db: AsyncDatabase[Document]) -> None:
        self._db = db

    # -- teams ----------------------------------------------------------------------------------
    # A team is the plain document: the routes pass it around as the caller (`TeamDep`).

    async def team(self, team_id: str) -> Document | None:
        return await self._db.teams.find_one({"_id": team_id})

    async def team_by_key_hash(self, key_hash: str) -> Document | None:
        """The team whose Leaderboard API Key has this hash (the unique `key_hash` index)."""
        return await self._db.teams.find_one({"key_hash": key_hash})

    async def team_by_name(self, name: str) -> Document | None:
        return await self._db.teams.find_one({"name": name})

    async def add_team(self, team: Document) -> None:
        await self._db.teams.insert_one(team)

    async def drop_team(self, team_id: str) -> None:
        await self._db.teams.delete_one({"_id": team_id})

    # -- versions -------------------------------------------------------------------------------

    async def version(self, version_id: str) -> Document | None:
        """The whole stored version. A plain document, not a `VersionDocument`: the pipeline
        reads only how to call the version (URLs, auth, key reference, capacity, limits), and a
        version stored with no more than that stays callable."""
        return await self._db.versions.find_one({"_id": version_id})

    async def team_version(self, version_id: str, team_id: str) -> VersionDocument | None:
        """The version if it is the team's (another team's answers like a missing one)."""
        found = await self._db.versions.find_one({"_id": version_id, "team_id": team_id})
        return None if found is None else VersionDocument.model_validate(found)

    async def team_versions(self, team_id: str) -> AsyncIterator[VersionDocument]:
        """The team's versions, oldest first (the `team_id` index)."""
        async for found in self._db.versions.find({"team_id": team_id}).sort("created_at", 1):
            yield VersionDocument.model_validate(found)

    async def version_profile(self, version_id: str | None) -> Document | None:
        """Only `system_name`, `version_label` and `board`: read on every status poll, so the
        projection stands, not a validated whole version."""
        return await self._db.versions.find_one({"_id": version_id}, _PROFILE_FIELDS)

    async def capacity_of(self, version_id: str) -> Document | None:
        """Only the declared `capacity` (and `_id`): read per lane by the stage workers and per
        release by the scheduler, so a projection, not a validated whole version."""
        return await self._db.versions.find_one({"_id": version_id}, {"capacity": 1})

    async def limits_of(self, version_id: str) -> Document | None:
        """Only the declared `run_limits` and `capacity` (and `_id`): read for every active job
        at each reconciliation, so a projection, not a validated whole version."""
        return await self._db.versions.find_one(
            {"_id": version_id}, {"run_limits": 1, "capacity": 1}
        )

    async def bind_version(
        self, version_id: str, team_id: str, version: VersionFields, created_at: datetime
    ) -> None:
        await self._db.versions.insert_one(
            version_document(version_id, team_id, version, created_at)
        )

    async def unbind_version(self, version_id: str) -> None:
        await self._db.versions.delete_one({"_id": version_id})

    # -- system names ---------------------------------------------------------------------------

    async def system_name_taken(self, name: str, team_id: str | None) -> bool:
        """Whether `name` belongs to a team other than `team_id` (None: a team that does not
        exist yet, for which only a free name will do)."""
        claim = await self._db.system_names.find_one({"_id": name})
        if claim is not None:
            return bool(claim["team_id"] != team_id)
        # Versions stored before names were claimed.
        other: Document = {"system_name": name}
        if team_id is not None:
            other["team_id"] = {"$ne": team_id}
        return await self._db.versions.find_one(other, {"_id": 1}) is not None

    async def reserve_system_name(self, name: str, team_id: str, claimed_at: datetime) -> NameClaim:
        """Bind `name` to the team; the unique `_id` decides a race."""
        try:
            await self._db.system_names.insert_one(
                {"_id": name, "team_id": team_id, "claimed_at": claimed_at}
            )
        except DuplicateKeyError:
            claim = await self._db.system_names.find_one({"_id": name})
            if claim is None or claim["team_id"] != team_id:
                return "taken"
            return "held"
        return "claimed"

    async def release_system_name(self, name: str, team_id: str) -> None:
        await self._db.system_names.delete_one({"_id": name, "team_id": team_id})

    # -- sealed Memory System Keys --------------------------------------------------------------

    async def keep_sealed_key(self, secret_ref: str, sealed: bytes) -> None:
        await self._db.secrets.insert_one({"_id": secret_ref, "sealed": sealed})

    async def sealed_key(self, secret_ref: str) -> bytes | None:
        """The key as stored, still sealed (None: no such reference)."""
        stored = await self._db.secrets.find_one({"_id": secret_ref})
        if stored is None:
            return None
        sealed: bytes = stored["sealed"]
        return sealed

    async def drop_sealed_key(self, secret_ref: str) -> None:
        await self._db.secrets.delete_one({"_id": secret_ref})

    # -- run usage ------------------------------------------------------------------------------

    async def count_run_request(self, run_key: str) -> int:
        """Count one request of a run; returns how many the run has made, this one included."""
        usage = await self._db.run_usage.find_one_and_update(
            {"_id": run_key},
            {"$inc": {"requests": 1}},
            upsert=True,
            return_document=ReturnDocument.AFTER,
        )
        assert usage is not None  # upserted
        return int(usage["requests"])
