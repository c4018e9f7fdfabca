"""Publishes on a real nats-server with JetStream: `publish` and `publish_work` go through
`JetStreamBus` on nats-py's public JetStream API (not through FastStream's broker.publish and its
middlewares), so what the consumers rely on is checked here: the message id the broker
de-duplicates by, the trace context, the stream guard and a body that FastStream subscribers
decode into their model."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest
from faststream.nats import NatsBroker
from nats.aio.msg import Msg
from nats.js.errors import APIError
from opentelemetry import trace
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from pydantic_core import to_json

from aml_contract import subjects
from aml_contract.messages import JobFinished, JobSubmitted, QuestionFacts, QuestionWork
from aml_runtime.broker import (
    EVENT_PULL_SECONDS,
    JetStreamBus,
    _publish,
    declare_streams,
    handle_events,
    make_broker,
    publish,
    publish_work,
)
from aml_runtime.settings import CommonSettings

pytestmark = pytest.mark.integration


@pytest.fixture
def provider() -> TracerProvider:
    """A tracer provider of the test's own (not the global one), keeping its spans in memory."""
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(InMemorySpanExporter()))
    return provider


def _trace_id_of(traceparent: str) -> str:
    version, trace_id, _span_id, _flags = traceparent.split("-")
    assert version == "00"
    return trace_id


async def test_work_is_deduplicated_by_its_id_and_carries_the_trace(
    broker: NatsBroker, provider: TracerProvider
) -> None:
    facts = QuestionFacts(
        dataset_id="locomo",
        question_id="q-7",
        user_id="u-1",
        question="Où était-elle ?",
        category=2,
        category_name="temporal",
        gold_answer=None,
        options=["a", "b"],
        f1_variant="plain",
    )
    work = QuestionWork(job_id="job-p1", version_id="ver-p1", item_id="q-7", facts=facts)
    with provider.get_tracer("test").start_as_current_span("release") as span:
        await publish_work(JetStreamBus(broker), "search", work, "ver-p1/q-7")
        # The same message id again (a re-publish after a crash) is dropped by the broker.
        await publish_work(JetStreamBus(broker), "search", work, "ver-p1/q-7")
    publisher_trace = format(span.get_span_context().trace_id, "032x")

    js = broker.connection.jetstream()
    subject = subjects.work_subject("search", "ver-p1", "job-p1")
    sub = await js.pull_subscribe(subject, durable="t-publishing-work", stream=subjects.WORK_STREAM)
    messages = await sub.fetch(10, timeout=1.0)
    assert len(messages) == 1
    [msg] = messages
    await msg.ack()
    assert msg.headers is not None
    assert msg.headers["Nats-Msg-Id"] == "aml.work.search:ver-p1/q-7"
    assert msg.headers["content-type"] == "application/json"
    assert _trace_id_of(msg.headers["traceparent"]) == publisher_trace
    # The bytes FastStream's broker.publish sent for the same model (its pydantic serializer on
    # the JSON-mode dump), which the stage worker validates as they are.
    assert msg.data == to_json(work.model_dump(mode="json"))
    assert QuestionWork.model_validate_json(msg.data) == work


async def test_a_publish_outside_any_span_carries_no_trace(broker: NatsBroker) -> None:
    work = QuestionWork(job_id="job-p2", version_id="ver-p2", item_id="q-1")
    await publish_work(JetStreamBus(broker), "answer", work, "ver-p2/q-1")

    js = broker.connection.jetstream()
    subject = subjects.work_subject("answer", "ver-p2", "job-p2")
    sub = await js.pull_subscribe(subject, durable="t-publishing-bare", stream=subjects.WORK_STREAM)
    [msg] = await sub.fetch(1, timeout=1.0)
    await msg.ack()
    assert msg.headers is not None and "traceparent" not in msg.headers


async def test_a_publish_to_the_wrong_stream_fails(broker: NatsBroker) -> None:
    work = QuestionWork(job_id="job-p3", version_id="ver-p3", item_id="q-1")
    subject = subjects.work_subject("score", "ver-p3", "job-p3")
    with pytest.raises(APIError):
        await _publish(JetStreamBus(broker), subject, subjects.EVENTS_STREAM, work, "wrong-stream")


@pytest.fixture
async def event_broker(
    nats_url: str, provider: TracerProvider
) -> AsyncIterator[tuple[NatsBroker, list[tuple[object, str]]]]:
    """A broker as the services make it (with the telemetry middleware), whose FastStream
    subscribers on `aml.jobs.submitted` (the scheduler's) and `aml.jobs.finished` (the
    publisher's) record each decoded event with the trace id its handler ran in."""
    settings = CommonSettings(nats_url=nats_url)
    broker = make_broker(settings, provider)
    received: list[tuple[object, str]] = []

    async def dropped(event: object, kind: str, reason: str) -> None:
        raise AssertionError(f"gave up: {kind} {reason}")

    async def record(event: object) -> None:
        trace_id = trace.get_current_span().get_span_context().trace_id
        received.append((event, format(trace_id, "032x")))

    # As the scheduler and the publisher consume them (`handle_events`).
    submitted, finished = subjects.JOB_SUBMITTED, subjects.JOB_FINISHED
    handle_events(
        broker, settings, submitted, "t-publishing-submitted", 1, JobSubmitted, record, dropped
    )
    handle_events(
        broker, settings, finished, "t-publishing-finished", 1, JobFinished, record, dropped
    )

    async with broker:
        await broker.connect()
        await declare_streams(broker)
        await broker.start()
        yield broker, received


async def test_events_are_decoded_by_faststream_subscribers_in_the_publishers_trace(
    event_broker: tuple[NatsBroker, list[tuple[object, str]]], provider: TracerProvider
) -> None:
    broker, received = event_broker
    submitted = JobSubmitted(job_id="job-p4")
    finished = JobFinished(job_id="job-p4", state="completed")
    with provider.get_tracer("test").start_as_current_span("gateway") as span:
        await publish(JetStreamBus(broker), subjects.JOB_SUBMITTED, submitted, "submitted:job-p4")
        await publish(JetStreamBus(broker), subjects.JOB_FINISHED, finished, "finished:job-p4")
    publisher_trace = format(span.get_span_context().trace_id, "032x")

    loop = asyncio.get_running_loop()
    deadline = loop.time() + 10.0
    while len(received) < 2:
        assert loop.time() < deadline, received
        await asyncio.sleep(0.05)
    # Decoded into the handlers' models (not left as dicts or bytes), each handler continuing
    # the trace its message carried.
    assert sorted(received, key=lambda r: type(r[0]).__name__) == [
        (finished, publisher_trace),
        (submitted, publisher_trace),
    ]


async def test_an_idle_event_subscriber_asks_rarely_and_a_message_is_handled_at_once(
    event_broker: tuple[NatsBroker, list[tuple[object, str]]],
) -> None:
    """One pull per subscriber held open at the broker (EVENT_PULL_SECONDS), not a probe and a
    one-second pull after it: an idle subscriber asks at most once in four seconds (pulls with a
    1 s timeout asked four to eight times), and the pull held open answers a new event as soon
    as it is published."""
    broker, received = event_broker
    pulls: list[str] = []

    async def seen(msg: Msg) -> None:
        pulls.append(msg.subject)

    api = f"$JS.API.CONSUMER.MSG.NEXT.{subjects.EVENTS_STREAM}.t-publishing-submitted"
    watch = await broker.connection.subscribe(api, cb=seen)
    try:
        await asyncio.sleep(4.0)
        assert len(pulls) <= 1, pulls
        loop = asyncio.get_running_loop()
        sent = loop.time()
        await publish(
            JetStreamBus(broker), subjects.JOB_SUBMITTED, JobSubmitted(job_id="job-p5"), "idle:p5"
        )
        while not received:
            assert loop.time() - sent < EVENT_PULL_SECONDS / 2, "the held pull did not answer"
            await asyncio.sleep(0.01)
    finally:
        await watch.unsubscribe()
    assert received[0][0] == JobSubmitted(job_id="job-p5")


async def test_an_event_that_is_not_its_model_is_acknowledged_not_redelivered(
    event_broker: tuple[NatsBroker, list[tuple[object, str]]],
) -> None:
    broker, received = event_broker
    headers = {"Nats-Msg-Id": "malformed:p6", "content-type": "application/json"}
    bus = JetStreamBus(broker)
    await bus.send(subjects.JOB_SUBMITTED, subjects.EVENTS_STREAM, b'{"job": 1}', headers)
    await publish(bus, subjects.JOB_SUBMITTED, JobSubmitted(job_id="job-p6"), "after:p6")
    loop = asyncio.get_running_loop()
    deadline = loop.time() + 10.0
    while not received:
        assert loop.time() < deadline
        await asyncio.sleep(0.05)
    # Only the well-formed one reached the handler; the other is gone from the consumer (a
    # delivery cannot make it an event), not waiting to be redelivered after ack_wait.
    assert [event for event, _ in received] == [JobSubmitted(job_id="job-p6")]
    js = broker.connection.jetstream()
    info = await js.consumer_info(subjects.EVENTS_STREAM, "t-publishing-submitted")
    assert info.num_ack_pending == 0 and info.num_pending == 0
