"""Every behaviour of nats-server and nats-py that the platform's JetStream seam relies on
(`aml_runtime.broker`: `JetStreamBus` for writes, `WorkPull` for the stage workers' pulls),
checked on a real nats-server, so that an upgrade of either that changes one fails here by name
rather than as lost or stuck work somewhere in a job. (The publishes' de-duplication, trace
context and decoding by FastStream subscribers: tests/integration/test_publishing.py.)"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
import uuid
from collections.abc import AsyncIterator

import pytest
from faststream.nats import NatsBroker
from nats.aio.client import Client
from nats.js.api import RetentionPolicy, StorageType, StreamConfig
from nats.js.errors import APIError

from aml_runtime.broker import JetStreamBus, WorkPull

pytestmark = pytest.mark.integration

ACK_WAIT = 30.0


@pytest.fixture
async def stream(broker: NatsBroker) -> AsyncIterator[str]:
    """A work-queue stream of the test's own (as the platform's work stream is)."""
    name = f"SEAM{uuid.uuid4().hex[:8].upper()}"
    js = broker.connection.jetstream()
    await js.add_stream(
        StreamConfig(
            name=name,
            subjects=[f"{name.lower()}.>"],
            retention=RetentionPolicy.WORK_QUEUE,
            storage=StorageType.MEMORY,
            duplicate_window=60.0,
        )
    )
    yield name
    await js.delete_stream(name)


async def _send(broker: NatsBroker, stream: str, subject: str, body: bytes, msg_id: str) -> None:
    headers = {"Nats-Msg-Id": msg_id, "content-type": "application/json"}
    await JetStreamBus(broker).send(subject, stream, body, headers)


async def _queued(broker: NatsBroker, stream: str) -> int:
    info = await broker.connection.jetstream().stream_info(stream)
    return int(info.state.messages)


@contextlib.asynccontextmanager
async def _pull(
    broker: NatsBroker, stream: str, lane: str, subject: str
) -> AsyncIterator[WorkPull]:
    pull = await WorkPull.open(broker.connection, stream, lane, subject, ACK_WAIT)
    try:
        yield pull
    finally:
        await pull.close()


async def test_the_broker_connection_is_a_nats_py_client(broker: NatsBroker) -> None:
    # FastStream's public `NatsBroker.connection`: what the bus and the pulls are built on.
    assert isinstance(broker.connection, Client)


async def test_an_empty_pull_answers_at_once_and_a_full_one_with_one_message(
    broker: NatsBroker, stream: str
) -> None:
    subject = f"{stream.lower()}.work.a"
    async with _pull(broker, stream, "lane-a", subject) as pull:
        # `no_wait`: the server answers an empty consumer's pull with a 404 status at once,
        # not after the pull's 2 s bound.
        started = time.monotonic()
        assert await pull.next() is None
        assert time.monotonic() - started < 0.5

        for n in range(3):
            await _send(broker, stream, subject, json.dumps({"n": n}).encode(), f"a-{n}")
        msg = await pull.next()
        assert msg is not None and json.loads(msg.data) == {"n": 0}
        # One message per pull (batch 1): admission took capacity for one item only.
        assert await _queued(broker, stream) == 3
        # JetStream's metadata (parsed from the reply subject) counts the delivery.
        assert msg.metadata.num_delivered == 1
        assert msg.headers is not None and msg.headers["Nats-Msg-Id"] == "a-0"
        # The public acknowledgements of a plain nats-py message work on a pulled one.
        await msg.in_progress()
        await msg.ack()
        await asyncio.sleep(0.1)
        assert await _queued(broker, stream) == 2  # a work queue drops what was acked


async def test_a_nak_with_a_delay_comes_back_after_it_counted_once_more(
    broker: NatsBroker, stream: str
) -> None:
    subject = f"{stream.lower()}.work.b"
    async with _pull(broker, stream, "lane-b", subject) as pull:
        await _send(broker, stream, subject, b"{}", "b-1")
        first = await pull.next()
        assert first is not None
        await first.nak(delay=0.5)
        # Held for its delay: the lane looks empty meanwhile (what `run_delivery`'s growing
        # delays rely on) ...
        assert await pull.next() is None
        await asyncio.sleep(0.8)
        # ... then delivered again, its delivery counted (what the retry budget is read from).
        again = await pull.next()
        assert again is not None and again.metadata.num_delivered == 2
        await again.ack()


async def test_an_answer_to_a_pull_that_gave_up_is_handed_back_at_once(
    broker: NatsBroker, stream: str
) -> None:
    subject = f"{stream.lower()}.work.c"
    async with _pull(broker, stream, "lane-c", subject) as pull:
        await _send(broker, stream, subject, b"{}", "c-1")
        # A pull whose answer arrives after its caller stopped waiting: it sits in the inbox.
        request = json.dumps({"batch": 1, "no_wait": True}).encode()
        api = f"$JS.API.CONSUMER.MSG.NEXT.{stream}.lane-c"
        await broker.connection.publish(api, request, reply=pull.inbox.subject)
        await asyncio.sleep(0.2)
        assert pull.inbox.pending_msgs == 1
        # The next pull hands it back (a NAK without delay) instead of leaving it to ack_wait
        # (30 s here): it comes again as a second delivery within moments.
        deadline = time.monotonic() + 2.0
        msg = await pull.next()
        while msg is None and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
            msg = await pull.next()
        assert msg is not None and msg.metadata.num_delivered == 2
        assert pull.inbox.pending_msgs == 0
        await msg.ack()


async def test_a_consumer_reading_other_subjects_is_replaced_and_the_work_kept(
    broker: NatsBroker, stream: str
) -> None:
    old, new = f"{stream.lower()}.old.x", f"{stream.lower()}.new.x"
    await _send(broker, stream, new, b"{}", "d-1")
    first = await WorkPull.open(broker.connection, stream, "lane-d", old, ACK_WAIT)
    await first.close()
    # An earlier release's consumer of the same name with another filter subject.
    second = await WorkPull.open(broker.connection, stream, "lane-d", new, ACK_WAIT)
    try:
        info = await broker.connection.jetstream().consumer_info(stream, "lane-d")
        assert info.config.filter_subject == new
        assert info.config.max_deliver == -1  # the delivery budget is `run_delivery`'s
        msg = await second.next()
        assert msg is not None
        await msg.ack()
        # Opened again with the same subject (another replica, a restart): the same consumer.
        third = await WorkPull.open(broker.connection, stream, "lane-d", new, ACK_WAIT)
        await third.close()
        assert (await broker.connection.jetstream().consumer_info(stream, "lane-d")).name == (
            "lane-d"
        )
    finally:
        await second.close()


async def test_a_send_is_deduplicated_guarded_by_its_stream_and_purged_by_subject(
    broker: NatsBroker, stream: str
) -> None:
    one, other = f"{stream.lower()}.job.one", f"{stream.lower()}.job.other"
    for _ in range(2):
        await _send(broker, stream, one, b"{}", "e-1")  # the second is a duplicate: kept once
    await _send(broker, stream, other, b"{}", "e-2")
    assert await _queued(broker, stream) == 2
    # The expected-stream header: a subject of another stream is refused, not stored there.
    with pytest.raises(APIError):
        await JetStreamBus(broker).send(one, "NOT_" + stream, b"{}", {"Nats-Msg-Id": "e-3"})
    await JetStreamBus(broker).purge(stream, one)
    assert await _queued(broker, stream) == 1
