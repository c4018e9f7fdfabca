"""Add one chunk. A user's chunks are released one at a time and in order (by the scheduler, or
by this handler right after it confirmed the previous one: `aml_pipeline.chains`), so this
handler only has to be idempotent: a chunk already confirmed is never sent again, only its
completion is re-announced (the publish is de-duplicated by the broker).

Outcomes are counted on the job in batches (`aml_pipeline.progress.OutcomeCounter`), as the
question stages count theirs: the job document holds the order of every user, so an update of
it per Add cost more the larger the job, on top of the operations each Add needs."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable
from dataclasses import dataclass, field
from typing import NamedTuple

from aml_contract import subjects
from aml_contract.messages import AddDone, AddWork, Outcome, message_id
from aml_contract.participant import user_chunk_id
from aml_pipeline.audit import VALID, CallRecorder
from aml_pipeline.capacity import turn
from aml_pipeline.chains import HandedOn, goes_on_by_itself, release_add
from aml_pipeline.jobs import Endpoints, JobStates, record_error
from aml_pipeline.participants import CallFailed, ParticipantClient
from aml_pipeline.progress import Counted, OutcomeCounter
from aml_pipeline.stage_worker import WorkItem
from aml_runtime.broker import Bus, FinalFailure, publish
from aml_runtime.clock import now_us
from aml_runtime.db import Document
from aml_runtime.documents import FailureKind
from aml_runtime.settings import CommonSettings
from aml_runtime.stores import Stores


@dataclass
class SendChunk:
    settings: CommonSettings
    # The planned chunks (`plans`), the audit trail, the job's counters and errors.
    stores: Stores
    bus: Bus
    client: ParticipantClient
    endpoints: Endpoints
    # Whether an Add's job is still active, known without a read per Add (`JobStates`).
    jobs: JobStates
    counter: OutcomeCounter = field(init=False)
    # The next chunks of chains this process handed on, for their Adds (`HandedOn`).
    handed_on: HandedOn = field(default_factory=HandedOn)

    def __post_init__(self) -> None:
        self.counter = OutcomeCounter(self.stores)

    @property
    def work(self) -> type[AddWork]:
        return AddWork

    async def close(self) -> None:
        """Count what is still pending (a stopping worker)."""
        await self.counter.drain()

    async def handle(self, work: AddWork, item: WorkItem) -> None:
        async def attempt() -> None:
            await self.add(work, item)

        async def give_up(kind: FailureKind, reason: str) -> None:
            await self.finish(work, "failed", {"failure_kind": kind, "failure": reason})
            await record_error(self.stores, work.job_id, "add", kind, work.request_id, reason)

        # An Add chunk's item id is its request_id: both attributes, so `aml trace` finds Adds
        # and questions alike by `aml.item_id`.
        ids = {
            "job_id": work.job_id,
            "item_id": work.request_id,
            "request_id": work.request_id,
            "stage": "add",
        }
        await item.run(self.settings, "aml.add", ids, attempt, give_up)

    async def add(self, work: AddWork, item: WorkItem) -> None:
        # Both reads at once: the chunk (unless this process handed it on and read it then),
        # and whether its job is still active (checked after admission, right before the call:
        # a failed job's work is dropped here).
        handed_on = self.handed_on.take(work.request_id, item.delivered)
        chunk: Document | None
        if handed_on is not None:
            chunk, active = dict(handed_on), await self.jobs.is_active(work.job_id)
        else:
            chunk, active = await asyncio.gather(
                self.stores.plans.chunk(work.request_id),
                self.jobs.is_active(work.job_id),
            )
        if chunk is None:
            raise FinalFailure(
                FailureKind.PLATFORM_ERROR, f"chunk {work.request_id} is not planned"
            )
        chain = Chain(str(chunk["user_id"]), int(chunk["seq"]))
        if chunk["state"] != "pending":
            # Its writer counted it (or died first: the repair counts it); announce it again.
            await self.announce(work, chunk["state"], chain)
            return
        if not active:
            return
        endpoint = await self.endpoints.get(work.version_id, work.job_id)
        ids = (chunk["_id"], chunk["user_id"], chunk["session_id"])
        # The user's next chunk, whole, read while this one's request is out: nothing but its
        # own Add changes it (a pending chunk's gate is planned and fixed), and the Add it is
        # handed on to here sends it without reading it again (`HandedOn`).
        successor = asyncio.ensure_future(
            self.stores.plans.chunk(user_chunk_id(chain.user_id, chain.seq + 1))
        )
        try:
            async with CallRecorder(
                self.stores, work.job_id, "add", work.request_id, item.delivered, work.version_id
            ) as observe:
                # The call under the slot's turn: the Add served next under the same admission
                # gets ready meanwhile and waits here, then checks its job again.
                async with turn(item.admission):
                    if item.admission is not None and not await self.jobs.is_active(work.job_id):
                        return
                    try:
                        await self.client.add(endpoint, chunk["body"], ids, observe, item.admission)
                    except CallFailed as exc:
                        if exc.kind == FailureKind.CONTRACT_ERROR:
                            await observe.validated(exc.reason)
                        raise FinalFailure(exc.kind, exc.reason) from None
                following = await successor
                await self.finish(
                    work, "done", {}, chain, following, audit=observe.validated(VALID)
                )
        finally:
            if not successor.done():
                successor.cancel()
            elif not successor.cancelled():
                # Read, so that a failed read of a successor never used is not reported.
                successor.exception()

    async def finish(
        self,
        work: AddWork,
        outcome: Outcome,
        fields: Document,
        chain: Chain | None = None,
        successor: Document | None = None,
        audit: Awaitable[None] | None = None,
    ) -> None:
        """Store the chunk's outcome (with its audit record, at once), hand the user's next Add
        on when nothing gates it (`aml_pipeline.chains`), announce the outcome, count it."""
        at_us = now_us()
        stored = self.stores.plans.mark_chunk(work.request_id, outcome, at_us, fields)
        if audit is not None:
            updated, _ = await asyncio.gather(stored, audit)
        else:
            updated = await stored
        goes_on = outcome == "done" and chain is not None and goes_on_by_itself(successor)
        if goes_on:
            assert chain is not None and successor is not None
            self.handed_on.keep(successor)
            await release_add(
                self.bus, work.job_id, work.version_id, chain.user_id, str(successor["_id"])
            )
        # Announced before it is counted: the scheduler waits for the announcement, the
        # job's progress counter for nobody (a crash in between is the repair's to count, as
        # one right before the count always was).
        await self.announce(work, outcome, chain, next_released=goes_on)
        # The guarded update did nothing when an earlier delivery finished the chunk first; its
        # outcome stands and was counted by that delivery (or, if it died, by the repair).
        if updated:
            self.counter.count(Counted(work.job_id, work.request_id, "add", outcome, at_us))

    async def announce(
        self,
        work: AddWork,
        outcome: Outcome,
        chain: Chain | None = None,
        next_released: bool = False,
    ) -> None:
        where = {"user_id": chain.user_id, "seq": chain.seq} if chain is not None else {}
        done = AddDone(
            job_id=work.job_id,
            request_id=work.request_id,
            outcome=outcome,
            next_released=next_released,
            **where,
        )
        await publish(self.bus, subjects.ADD_DONE, done, message_id("add-done", work.request_id))


class Chain(NamedTuple):
    """An Add's user and its place in the user's chain."""

    user_id: str
    seq: int
