"""MongoDB access (PyMongo's native async API). What is stored, and the indexes over it:
`aml_runtime.documents`."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from pymongo import AsyncMongoClient
from pymongo.asynchronous.database import AsyncDatabase

from aml_runtime.settings import CommonSettings

Document = dict[str, Any]


def connect(settings: CommonSettings) -> tuple[AsyncMongoClient[Document], AsyncDatabase[Document]]:
    client: AsyncMongoClient[Document] = AsyncMongoClient(settings.mongo_url, tz_aware=True)
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
