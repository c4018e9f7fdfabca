"""Add one chunk. The scheduler releases a user's chunks one at a time and in order, so this
handler only has to be idempotent: a chunk already confirmed is never sent again, only its
completion is re-announced (the publish is de-duplicated by the broker)."""

from __future__ import annotations

from dataclasses import dataclass

from faststream.nats import NatsBroker
from pymongo.asynchronous.database import AsyncDatabase

from aml_contract import subjects
from aml_contract.messages import AddDone, AddWork, Outcome, message_id
from aml_pipeline.audit import VALID, CallRecorder
from aml_pipeline.jobs import Endpoints, job_is_active, record_error
from aml_pipeline.participants import CallFailed, ParticipantClient
from aml_pipeline.progress import count_final
from aml_pipeline.stage_worker import WorkItem
from aml_runtime.broker import FinalFailure, publish, run_delivery
from aml_runtime.clock import now, now_us
from aml_runtime.db import Document
from aml_runtime.documents import FailureKind
from aml_runtime.settings import CommonSettings
from aml_runtime.telemetry import stage_span


@dataclass
class SendChunk:
    settings: CommonSettings
    db: AsyncDatabase[Document]
    broker: NatsBroker
    client: ParticipantClient
    endpoints: Endpoints

    async def __call__(self, work: AddWork, item: WorkItem) -> None:
        async def attempt() -> None:
            await self.add(work, item)

        async def give_up(kind: FailureKind, reason: str) -> None:
            await self.finish(work, "failed", {"failure_kind": kind, "failure": reason})
            await record_error(self.db, work.job_id, "add", kind, work.request_id, reason)

        # An Add chunk's item id is its request_id: both attributes, so `aml trace` finds Adds
        # and questions alike by `aml.item_id`.
        ids = {
            "job_id": work.job_id,
            "item_id": work.request_id,
            "request_id": work.request_id,
            "stage": "add",
        }
        with stage_span("aml.add", delivery=item.delivered, **ids):
            await run_delivery(item.delivery, self.settings, attempt, give_up)

    async def add(self, work: AddWork, item: WorkItem) -> None:
        chunk = await self.db.add_chunks.find_one({"_id": work.request_id})
        if chunk is None:
            raise FinalFailure(
                FailureKind.PLATFORM_ERROR, f"chunk {work.request_id} is not planned"
            )
        if chunk["state"] != "pending":
            # Its writer counted it (or died first: the repair counts it); announce it again.
            await self.announce(work, chunk["state"])
            return
        # Checked after admission, right before the call: a failed job's work is dropped here.
        if not await job_is_active(self.db, work.job_id):
            return
        endpoint = await self.endpoints.get(work.version_id, work.job_id)
        ids = (chunk["_id"], chunk["user_id"], chunk["session_id"])
        async with CallRecorder(
            self.db, work.job_id, "add", work.request_id, item.delivered, work.version_id
        ) as observe:
            try:
                await self.client.add(endpoint, chunk["body"], ids, observe, item.admission)
            except CallFailed as exc:
                if exc.kind == FailureKind.CONTRACT_ERROR:
                    await observe.validated(exc.reason)
                raise FinalFailure(exc.kind, exc.reason) from None
            await observe.validated(VALID)
        await self.finish(work, "done", {})

    async def finish(self, work: AddWork, outcome: Outcome, fields: Document) -> None:
        at_us = now_us()
        updated = await self.db.add_chunks.update_one(
            {"_id": work.request_id, "state": "pending"},
            {"$set": {"state": outcome, "finished_at": now(), "at_us": at_us, **fields}},
        )
        # The guarded update did nothing when an earlier delivery finished the chunk first; its
        # outcome stands and was counted by that delivery (or, if it died, by the repair).
        if updated.modified_count:
            await count_final(self.db, work.job_id, "add", outcome, at_us)
        await self.announce(work, outcome)

    async def announce(self, work: AddWork, outcome: Outcome) -> None:
        done = AddDone(job_id=work.job_id, request_id=work.request_id, outcome=outcome)
        await publish(self.broker, subjects.ADD_DONE, done, message_id("add-done", work.request_id))
