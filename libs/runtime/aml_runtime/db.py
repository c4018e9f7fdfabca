"""MongoDB access (PyMongo's native async API). What is stored, and the indexes over it:
`aml_runtime.documents`."""

from __future__ import annotations

from collections.abc import Mapping
from datetime import UTC, datetime
from types import MappingProxyType
from typing import Any

from pymongo import AsyncMongoClient
from pymongo.asynchronous.database import AsyncDatabase

from aml_runtime.settings import CommonSettings

Document = dict[str, Any]


# How every service talks to MongoDB, which in production is a replica set (docs/architecture.md,
# "Deployment at scale"). Stated here rather than left to the URL or the driver's defaults, which
# acknowledge a write once the primary alone holds it in memory: a primary lost after that
# acknowledgement takes the write with it when the set elects another. Every write the platform
# makes decides something (a stage document, a progress counter, an audit record, a gate
# decision, a leaderboard entry), so none is deliberately weaker: each waits until a majority of
# the set has it in its journal. A write interrupted by an election is retried once by the
# driver. Reads go to the primary and see only majority-committed data, so a decision is never
# taken on a write a failover could still roll back. The URL may still name the set
# (`replicaSet=...`); these options win over the same ones in it.
CLIENT_OPTIONS: Mapping[str, Any] = MappingProxyType(
    {
        "w": "majority",
        "journal": True,
        "retryWrites": True,
        "retryReads": True,
        "readPreference": "primary",
        "readConcernLevel": "majority",
    }
)


def connect(settings: CommonSettings) -> tuple[AsyncMongoClient[Document], AsyncDatabase[Document]]:
    client: AsyncMongoClient[Document] = AsyncMongoClient(
        settings.mongo_url, tz_aware=True, **CLIENT_OPTIONS
    )
    return client, client[settings.mongo_db]


def read_time(value: object) -> datetime | None:
    """A stored timestamp as an aware UTC datetime. The embedded wire server (nx-27017) keeps a
    datetime written through `$set` as a naive ISO string; MongoDB keeps a BSON date."""
    if value is None:
        return None
    if isinstance(value, datetime):
        return value if value.tzinfo else value.replace(tzinfo=UTC)
    parsed = datetime.fromisoformat(str(value))
    return parsed if parsed.tzinfo else parsed.replace(tzinfo=UTC)
