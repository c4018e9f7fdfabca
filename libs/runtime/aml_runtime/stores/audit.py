"""The audit trail of participant calls (`calls`, SPEC R-7.3): the only code that reads or writes
it.

One record per HTTP attempt, written by the adder's and the searcher's `CallRecorder`
(`aml_pipeline.audit`): inserted as the attempt ends, and on the answered attempt the contract
validation's outcome, written with it or, rarely, set on it afterwards. The gateway shows a
job's records to its team a page at a time; the stall watchdog reads a stalled job's latest
call; the scheduler streams a completed job's records once, item by item, for its efficiency
figures. Retention keeps the records (their metadata is what the audit shows).

Every filter, update, sort and option below is the one its caller sent before this store
existed: a record is written once per attempt (the hottest write of a participant call), the
pages are read in `_id` order, and each method is one database operation, as before.

Records are returned as stored, plain documents: records written before the trail named the
work item `item_id` carry it as `request_id`, and every reader reads a record's optional fields
with `.get`."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

from bson import ObjectId
from pymongo import ASCENDING, DESCENDING
from pymongo.asynchronous.database import AsyncDatabase

from aml_runtime.db import Document

# What the efficiency figures read of a record (aml_evaluation.efficiency.CallAttempt), once
# per record of a completed job: a projection, not the record.
EFFICIENCY_FIELDS = {
    "_id": 0,
    "item_id": 1,
    "request_id": 1,
    "operation": 1,
    "attempt": 1,
    "latency_ms": 1,
    "status": 1,
    "error_class": 1,
    "outcome": 1,
    "validation": 1,
}


def _of_item(item_id: str) -> Document:
    # Records written before the audit trail named the work item `item_id` carry it as
    # `request_id` (also a question's id): an existing database's trail stays readable.
    return {"$or": [{"item_id": item_id}, {"item_id": {"$exists": False}, "request_id": item_id}]}


class AuditStore:
    def __init__(self, db: AsyncDatabase[Document]) -> None:
        self._db = db

    # -- the recorder (aml_pipeline.audit) ------------------------------------------------------

    async def record_attempt(self, record: Document) -> Any:
        """Insert one attempt's record (with its validation, when it has one); the record's
        `_id`. A plain document: the attempt's fields as the participant client reported them,
        once per HTTP attempt."""
        return (await self._db.calls.insert_one(record)).inserted_id

    async def record_validation(self, record_id: Any, outcome: str) -> None:
        """Set the validation on an attempt recorded without one."""
        await self._db.calls.update_one({"_id": record_id}, {"$set": {"validation": outcome}})

    # -- readers --------------------------------------------------------------------------------

    async def calls_page(
        self,
        job_id: str,
        *,
        stage: str | None,
        item_id: str | None,
        add_request_id: str | None,
        after: ObjectId | None,
        limit: int,
    ) -> list[Document]:
        """The job's records oldest first (`_id` order) from after the record `after`, of
        `stage`, of the work item `item_id`, of the Add whose contract request_id is
        `add_request_id` (each filter only when given): at most `limit` + 1 records, as stored,
        the last one there only to tell that there is a next page."""
        query: Document = {"job_id": job_id}
        if stage is not None:
            query["stage"] = stage
        # Each filter is an `$or` of its own (see _of_item): given both, both must hold.
        items: list[Document] = []
        if item_id is not None:
            items.append(_of_item(item_id))
        if add_request_id is not None:
            items.append({"stage": "add", **_of_item(add_request_id)})
        if items:
            query["$and"] = items
        if after is not None:
            query["_id"] = {"$gt": after}
        return await self._db.calls.find(query).sort("_id", ASCENDING).limit(limit + 1).to_list()

    async def attempts_by_item(self, job_id: str) -> AsyncIterator[Document]:
        """Every record of the job, only `EFFICIENCY_FIELDS`, each item's records together in
        `attempt` order (sorted by `item_id`, then `attempt`: the `(job_id, item_id, attempt)`
        index serves the sort, the `job_id` index the filter on nx-27017), so a reader holds one
        item at a time. Once per completed job, streamed."""
        found = self._db.calls.find({"job_id": job_id}, EFFICIENCY_FIELDS)
        async for record in found.sort([("item_id", ASCENDING), ("attempt", ASCENDING)]):
            yield record

    async def latest_call(self, job_id: str, stage: str) -> Document | None:
        """The job's record at `stage` started last, as stored (read with `.get`). Once per
        stalled job: a sort over the job's records is fine."""
        return await self._db.calls.find_one(
            {"job_id": job_id, "stage": stage}, sort=[("started_at", DESCENDING)]
        )
