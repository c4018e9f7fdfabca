"""The adder's handler against in-memory stores, a fake participant and FastStream's
in-memory NATS broker: a chunk already final is never sent again (only re-announced), a pending
chunk of a job that is no longer active is not sent, and a confirmed Add is marked done and
counted once however many deliveries race for it."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any, cast

import pytest
from fake_stores import MemoryStores, memory_stores
from fakes import Document, TestBrokerBus
from faststream.nats import JStream, NatsBroker, NatsMessage, TestNatsBroker
from faststream.nats.testing import PatchedMessage

from aml_adder.handlers import SendChunk
from aml_adder.settings import AdderSettings
from aml_contract import subjects
from aml_contract.messages import AddWork, message_id
from aml_pipeline.capacity import Admission
from aml_pipeline.jobs import Endpoints, JobStates
from aml_pipeline.participants import CallFailed, Endpoint, Observer, ParticipantClient
from aml_pipeline.stage_worker import WorkItem
from aml_runtime.broker import FetchedDelivery
from aml_runtime.documents import ACTIVE_JOB_STATES

JOB = "job-1"
VERSION = "ver-1"
CHUNK = "eval:job-1:synthetic:syn-1:chunk-1"
BODY = b'{"user_id":"eval:job-1:synthetic:syn-1","messages":[]}'
ENDPOINT = Endpoint(
    add_url="http://participant.test/add",
    search_url="http://participant.test/search",
    health_url="http://participant.test/health",
    auth_method="none",
)
WORK = AddWork(job_id=JOB, version_id=VERSION, request_id=CHUNK)


@dataclass
class FakeParticipant:
    """The participant client's `add`: records what was sent, then confirms it or fails."""

    failure: CallFailed | Exception | None = None
    sent: list[tuple[str | None, bytes, tuple[str, str, str]]] = field(default_factory=list)

    async def add(
        self,
        endpoint: Endpoint,
        body: bytes,
        ids: tuple[str, str, str],
        observe: Observer,
        admission: Admission | None = None,
    ) -> None:
        self.sent.append((endpoint.run_key, body, ids))
        # A real call takes a round trip: a concurrent delivery runs meanwhile.
        await asyncio.sleep(0)
        if self.failure is not None:
            raise self.failure


class ActiveJobs:
    """`JobStates` over the fake job store, read on every call."""

    def __init__(self, stores: MemoryStores) -> None:
        self.stores = stores

    async def is_active(self, job_id: str) -> bool:
        job = self.stores.jobs.jobs.get(job_id)
        return job is not None and job["state"] in ACTIVE_JOB_STATES


class FixedEndpoints:
    async def get(self, version_id: str, job_id: str) -> Endpoint:
        assert version_id == VERSION
        return ENDPOINT.model_copy(update={"run_key": job_id})


class Message(PatchedMessage):
    """A fetched JetStream message (its reply subject carries the delivery count) that
    remembers how it was settled."""

    settled: list[str]

    async def ack(self) -> None:
        self.settled.append("ack")

    async def nak(self, delay: float | None = None) -> None:
        self.settled.append("nak")


def delivery(n: int) -> WorkItem:
    msg = Message(
        _client=cast(Any, None),
        subject=subjects.work_subject("add", VERSION, JOB),
        reply=f"$JS.ACK.{subjects.WORK_STREAM}.adder-{VERSION}.{n}.7.7.1700000000000000000.0",
    )
    msg.settled = []
    # The fake participant takes no capacity, so the item holds none.
    return WorkItem(FetchedDelivery(msg), cast(Admission, None))


def settled(item: WorkItem) -> list[str]:
    return cast(Message, item.delivery.msg).settled


@dataclass
class Rig:
    stores: MemoryStores
    participant: FakeParticipant
    handler: SendChunk
    announced: list[tuple[str, Document]]
    released: list[tuple[str, Document]]

    async def handle(self, work: AddWork, item: WorkItem) -> None:
        """The handler's work on one delivery, its outcome counted (the counter batches them:
        `OutcomeCounter`)."""
        await self.handler.handle(work, item)
        await self.handler.counter.drain()


@pytest.fixture
async def rig() -> AsyncIterator[Rig]:
    stores = memory_stores()
    broker = NatsBroker(logger=None)
    participant = FakeParticipant()
    client = cast(ParticipantClient, participant)
    endpoints = cast(Endpoints, FixedEndpoints())
    handler = SendChunk(
        AdderSettings(),
        stores.typed(),
        TestBrokerBus(broker),
        client,
        endpoints,
        cast(JobStates, ActiveJobs(stores)),
    )
    announced: list[tuple[str, Document]] = []

    @broker.subscriber(subjects.ADD_DONE, stream=JStream(subjects.EVENTS_STREAM, declare=False))
    async def add_done(body: Document, msg: NatsMessage) -> None:
        announced.append((msg.headers["Nats-Msg-Id"], body))

    released: list[tuple[str, Document]] = []

    @broker.subscriber("aml.work.>", stream=JStream(subjects.WORK_STREAM, declare=False))
    async def work(body: Document, msg: NatsMessage) -> None:
        released.append((msg.headers["Nats-Msg-Id"], body))

    async with TestNatsBroker(broker):
        yield Rig(stores, participant, handler, announced, released)


USER = "eval:job-1:synthetic:syn-1"


def store(stores: MemoryStores, chunk_state: str = "pending", job_state: str = "running") -> None:
    stores.jobs.jobs[JOB] = {
        "_id": JOB,
        "state": job_state,
        "version_id": VERSION,
        "totals": {"add": 1, "questions": 0},
    }
    stores.plans.chunks[CHUNK] = {
        "_id": CHUNK,
        "job_id": JOB,
        "state": chunk_state,
        "user_id": USER,
        "session_id": "s1",
        "seq": 1,
        "body": BODY,
    }


def done(outcome: str, read: bool = True, next_released: bool = False) -> tuple[str, Document]:
    """The announcement; with the chunk's user and seq when the adder read the chunk (a give-up
    by the delivery budget did not)."""
    body = {"job_id": JOB, "request_id": CHUNK, "outcome": outcome}
    body |= {"user_id": USER, "seq": 1} if read else {"user_id": None, "seq": None}
    body["next_released"] = next_released
    return message_id("add-done", CHUNK), body


@pytest.mark.parametrize("state", ["done", "failed"])
async def test_a_final_chunk_is_announced_again_never_sent(rig: Rig, state: str) -> None:
    store(rig.stores, chunk_state=state)
    chunk = dict(rig.stores.plans.chunks[CHUNK])
    item = delivery(2)
    await rig.handle(WORK, item)
    assert rig.participant.sent == []
    assert rig.announced == [done(state)]
    assert rig.stores.plans.chunks[CHUNK] == chunk
    assert "progress" not in rig.stores.jobs.jobs[JOB]
    assert settled(item) == ["ack"]


@pytest.mark.parametrize("job_state", ["failed", "completed"])
async def test_a_pending_chunk_of_an_inactive_job_is_not_sent(rig: Rig, job_state: str) -> None:
    store(rig.stores, job_state=job_state)
    item = delivery(1)
    await rig.handle(WORK, item)
    assert rig.participant.sent == []
    assert rig.stores.plans.chunks[CHUNK]["state"] == "pending"
    assert rig.announced == []
    assert "progress" not in rig.stores.jobs.jobs[JOB]
    # Dropped, not retried: the job's remaining work is purged anyway.
    assert settled(item) == ["ack"]


async def test_a_confirmed_add_is_marked_done_and_counted_once(rig: Rig) -> None:
    store(rig.stores)
    await rig.handle(WORK, delivery(1))
    ids = (CHUNK, "eval:job-1:synthetic:syn-1", "s1")
    # The stored body, byte for byte, counted against this job's request limit.
    assert rig.participant.sent == [(JOB, BODY, ids)]
    chunk = rig.stores.plans.chunks[CHUNK]
    assert chunk["state"] == "done" and isinstance(chunk["at_us"], int)
    assert rig.stores.jobs.jobs[JOB]["progress"]["add"] == {"done": 1}
    assert rig.stores.jobs.jobs[JOB]["progress"]["last_us"] == chunk["at_us"]
    assert rig.announced == [done("done")]

    # Redelivered (the ACK was lost): announced again, neither sent nor counted again.
    await rig.handle(WORK, delivery(2))
    assert len(rig.participant.sent) == 1
    assert rig.stores.jobs.jobs[JOB]["progress"]["add"] == {"done": 1}
    assert rig.stores.plans.chunks[CHUNK] == chunk
    assert rig.announced == [done("done")] * 2


async def test_racing_deliveries_count_the_add_once(rig: Rig) -> None:
    store(rig.stores)
    # Both find the chunk pending and reach the participant (at-least-once delivery); only
    # the first to finish it marks and counts it.
    handle = rig.handler.handle
    await asyncio.gather(handle(WORK, delivery(1)), handle(WORK, delivery(2)))
    await rig.handler.counter.drain()
    assert len(rig.participant.sent) == 2
    assert rig.stores.jobs.jobs[JOB]["progress"]["add"] == {"done": 1}
    assert rig.stores.jobs.jobs[JOB]["progress"]["events"] == 1
    assert rig.announced == [done("done")] * 2


async def test_a_refused_add_fails_the_chunk_once_with_its_reason(rig: Rig) -> None:
    store(rig.stores)
    rig.participant.failure = CallFailed("contract_error", "add response: status missing")
    item = delivery(1)
    await rig.handle(WORK, item)
    chunk = rig.stores.plans.chunks[CHUNK]
    assert (chunk["state"], chunk["failure_kind"], chunk["failure"]) == (
        "failed",
        "contract_error",
        "add response: status missing",
    )
    progress = rig.stores.jobs.jobs[JOB]["progress"]
    assert progress["add"] == {"failed": 1} and progress["errors"] == 1
    assert [e["item"] for e in rig.stores.jobs.errors.values()] == [CHUNK]
    assert rig.announced == [done("failed", read=False)]
    assert settled(item) == ["ack"]


async def test_a_transient_error_leaves_the_chunk_pending_until_the_last_delivery(
    rig: Rig,
) -> None:
    store(rig.stores)
    rig.participant.failure = ConnectionResetError("connection reset")
    first = delivery(1)
    await rig.handle(WORK, first)
    assert settled(first) == ["nak"]
    assert rig.stores.plans.chunks[CHUNK]["state"] == "pending"
    assert rig.announced == [] and "progress" not in rig.stores.jobs.jobs[JOB]

    last = delivery(AdderSettings().max_deliver)
    await rig.handle(WORK, last)
    assert settled(last) == ["ack"]
    assert rig.stores.plans.chunks[CHUNK]["failure_kind"] == "platform_error"
    assert rig.stores.jobs.jobs[JOB]["progress"]["add"] == {"failed": 1}
    assert rig.announced == [done("failed", read=False)]


@pytest.mark.parametrize(
    ("successor", "hands_on"),
    [
        ({"state": "pending"}, True),
        # Searches are asked right before it: the scheduler releases them first.
        ({"state": "pending", "searched_before": ["q1"]}, False),
        # Already sent (a redelivery of this one): nothing to hand on.
        ({"state": "done"}, False),
        (None, False),  # the user's last chunk: its questions are the scheduler's to release
    ],
)
async def test_a_confirmed_add_hands_the_users_next_add_on_when_nothing_gates_it(
    rig: Rig, successor: Document | None, hands_on: bool
) -> None:
    store(rig.stores)
    following = f"{USER}:chunk-2"
    if successor is not None:
        rig.stores.plans.chunks[following] = {
            "_id": following, "job_id": JOB, "user_id": USER, "seq": 2, **successor
        }  # fmt: skip
    await rig.handle(WORK, delivery(1))
    assert rig.announced == [done("done", next_released=hands_on)]
    if hands_on:
        # Under the id the scheduler would publish it with: the broker keeps one of the two.
        assert rig.released == [
            (
                message_id(subjects.WORK_ADD, following),
                {"job_id": JOB, "version_id": VERSION, "request_id": following},
            )
        ]
    else:
        assert rig.released == []


def store_successor(stores: MemoryStores) -> str:
    """The user's second chunk, pending, after `store`'s first; its id."""
    following = f"{USER}:chunk-2"
    stores.plans.chunks[following] = {
        "_id": following, "job_id": JOB, "user_id": USER, "session_id": "s2", "seq": 2,
        "state": "pending", "body": b"second session",
    }  # fmt: skip
    return following


async def test_a_handed_on_chunk_is_sent_without_being_read_again(
    rig: Rig, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The adder read the user's next chunk, whole, while this one's request was out; the Add
    it hands that chunk on to sends it from there. A later delivery of it reads it again."""
    store(rig.stores)
    following = store_successor(rig.stores)
    reads: list[str] = []
    read = rig.stores.plans.chunk

    async def counted(request_id: str) -> Document | None:
        reads.append(request_id)
        return await read(request_id)

    monkeypatch.setattr(rig.stores.plans, "chunk", counted)
    await rig.handle(WORK, delivery(1))
    # The first chunk read on its own, the second alongside the first one's request.
    assert reads == [CHUNK, following]
    second = AddWork(job_id=JOB, version_id=VERSION, request_id=following)
    await rig.handle(second, delivery(1))
    # Its own successor's read (there is none) is the only one.
    third = f"{USER}:chunk-3"
    assert reads == [CHUNK, following, third]
    assert rig.participant.sent[-1] == (JOB, b"second session", (following, USER, "s2"))
    assert rig.stores.plans.chunks[following]["state"] == "done"

    # Its message delivered again (the ACK was lost): read, found done, not sent again.
    await rig.handle(second, delivery(2))
    assert reads == [CHUNK, following, third, following]
    assert len(rig.participant.sent) == 2


async def test_a_handed_on_chunk_delivered_again_first_is_read(
    rig: Rig, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Its first delivery went elsewhere (another replica sent it, then died before the ACK):
    the one that handed it on reads it and does not send it again."""
    store(rig.stores)
    following = store_successor(rig.stores)
    await rig.handle(WORK, delivery(1))
    rig.stores.plans.chunks[following]["state"] = "done"
    second = AddWork(job_id=JOB, version_id=VERSION, request_id=following)
    await rig.handle(second, delivery(2))
    assert len(rig.participant.sent) == 1
