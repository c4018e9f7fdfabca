"""NATS JetStream plumbing shared by the services: the streams, durable pull consumers with
manual acknowledgement, de-duplicated publishes, and the delivery policy for one work item."""

from __future__ import annotations

import asyncio
import contextlib
import json
import math
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field, replace
from functools import cached_property
from typing import Any, Protocol, TypeVar

import structlog
from faststream import AckPolicy
from faststream.nats import JStream, NatsBroker, NatsMessage, PullSub
from faststream.nats.opentelemetry import NatsTelemetryMiddleware
from nats.aio.client import Client
from nats.aio.msg import Msg
from nats.aio.subscription import Subscription
from nats.errors import TimeoutError as NatsTimeout
from nats.js import JetStreamContext
from nats.js.api import AckPolicy as JsAckPolicy
from nats.js.api import ConsumerConfig, RetentionPolicy, StorageType, StreamConfig
from nats.js.errors import APIError, BadRequestError, NotFoundError
from opentelemetry import propagate
from opentelemetry.sdk.trace import TracerProvider
from pydantic import BaseModel, ValidationError

from aml_contract import subjects
from aml_contract.messages import AddWork, QuestionWork, message_id
from aml_runtime.documents import FailureKind
from aml_runtime.settings import CommonSettings

log = structlog.get_logger()

# Longer than the longest Add with all its retries (5 attempts of up to 30 minutes), so a
# re-publish of work still in flight is always dropped by the broker.
DUPLICATE_WINDOW_SECONDS = 6 * 3600.0

_STREAMS = (
    StreamConfig(
        name=subjects.WORK_STREAM,
        subjects=list(subjects.WORK_SUBJECTS),
        retention=RetentionPolicy.WORK_QUEUE,
        storage=StorageType.FILE,
        duplicate_window=DUPLICATE_WINDOW_SECONDS,
    ),
    StreamConfig(
        name=subjects.EVENTS_STREAM,
        subjects=list(subjects.EVENT_SUBJECTS),
        retention=RetentionPolicy.WORK_QUEUE,
        storage=StorageType.FILE,
        duplicate_window=DUPLICATE_WINDOW_SECONDS,
    ),
    StreamConfig(
        name=subjects.FINISHED_STREAM,
        subjects=[subjects.JOB_FINISHED],
        retention=RetentionPolicy.LIMITS,
        storage=StorageType.FILE,
        duplicate_window=DUPLICATE_WINDOW_SECONDS,
    ),
)
_STREAM_OF: dict[str, str] = {
    subject: str(config.name) for config in _STREAMS for subject in config.subjects or ()
} | {prefix: subjects.WORK_STREAM for prefix in subjects.WORK_PREFIX.values()}


# Between two reconnection attempts to a lost NATS server.
RECONNECT_WAIT_SECONDS = 2


def reconnect_options(settings: CommonSettings) -> dict[str, Any]:
    """A lost connection is retried every `RECONNECT_WAIT_SECONDS` for longer than
    `dependency_loss_exit_seconds`, after which the service's guard ends the process: the
    connection is never closed for good while the service runs, because FastStream's pull loop
    would then re-fetch on a closed connection without ever yielding (`aml_runtime.service`)."""
    attempts = math.ceil(settings.dependency_loss_exit_seconds / RECONNECT_WAIT_SECONDS) + 10
    return {"reconnect_time_wait": RECONNECT_WAIT_SECONDS, "max_reconnect_attempts": attempts}


def make_broker(
    settings: CommonSettings, tracer_provider: TracerProvider | None = None
) -> NatsBroker:
    """With a tracer provider, every message a FastStream subscriber consumes continues the trace
    its headers carry, in a process span (FastStream's NATS telemetry middleware). Publishes do
    not go through the broker (`JetStreamBus`, `publish`): they carry the current trace
    themselves."""
    options = reconnect_options(settings)
    if tracer_provider is None:
        return NatsBroker(settings.nats_servers, logger=None, **options)
    telemetry = NatsTelemetryMiddleware(
        tracer_provider=tracer_provider, include_messages_counters=False
    )
    return NatsBroker(settings.nats_servers, logger=None, middlewares=(telemetry,), **options)


class StreamReplicasUnavailable(RuntimeError):
    """The NATS deployment cannot hold the streams with the replicas asked for: one line for
    the operator, not a retry (no restart of the service would change it)."""


# JetStream's error codes for a stream whose replicas the cluster cannot place: replicas above
# 1 on a server that is not clustered; fewer JetStream nodes (or too little room on them) than
# replicas, which a cluster reports as either of the other two (nats-server's errors.json).
_NOT_CLUSTERED = 10074
_INSUFFICIENT_RESOURCES = 10023
_NO_SUITABLE_PEERS = 10005
_CANNOT_PLACE = (_NOT_CLUSTERED, _INSUFFICIENT_RESOURCES, _NO_SUITABLE_PEERS)


def stream_configs(replicas: int) -> tuple[StreamConfig, ...]:
    return tuple(replace(config, num_replicas=replicas) for config in _STREAMS)


async def declare_streams(broker: NatsBroker, replicas: int | None = None) -> None:
    """Create the streams if absent, so publishers never race the consumers' start-up, with
    `replicas` copies each (None: `AML_STREAM_REPLICAS` of this process's environment); an
    existing stream is brought up (or down) to them. Raises `StreamReplicasUnavailable` when
    the cluster cannot place them."""
    if replicas is None:
        replicas = CommonSettings().stream_replicas
    await declare_streams_on(broker.connection, replicas)


async def declare_streams_on(connection: Client, replicas: int) -> None:
    """`declare_streams` over a plain nats-py connection (a start check has no broker yet)."""
    js = connection.jetstream()
    for config in stream_configs(replicas):
        try:
            try:
                await js.add_stream(config=config)
            except BadRequestError as exc:
                if exc.err_code in _CANNOT_PLACE:
                    raise
                # Exists with another configuration (an older release, other replicas): bring
                # it up to date.
                await js.update_stream(config=config)
        except APIError as exc:
            if exc.err_code in _CANNOT_PLACE:
                raise StreamReplicasUnavailable(
                    _replicas_problem(str(config.name), replicas, exc)
                ) from None
            raise


def _replicas_problem(stream: str, replicas: int, exc: APIError) -> str:
    if exc.err_code == _NOT_CLUSTERED:
        where = "the NATS server is a single server, not a JetStream cluster"
    else:
        where = f"the NATS cluster has fewer than {replicas} JetStream nodes available"
    return (
        f"stream {stream} cannot have {replicas} replicas (AML_STREAM_REPLICAS): {where} "
        f"({exc.description}); run {replicas} clustered nodes or lower AML_STREAM_REPLICAS"
    )


# How long an event subscriber's pull waits at the broker for a message (nats-py's default).
EVENT_PULL_SECONDS = 5.0


def subscriber_options(
    settings: CommonSettings, subject: str, durable: str, concurrency: int
) -> dict[str, Any]:
    """Durable pull consumer, manual acks, bounded deliveries: see `run_delivery`."""
    return {
        "subject": subject,
        "stream": JStream(name=_STREAM_OF[subject], declare=False),
        "durable": durable,
        # One message per pull, held open up to EVENT_PULL_SECONDS: the broker answers a pull as
        # soon as a message comes, so the wait adds no latency, while an idle subscriber asks
        # once per wait instead of twice a second (a batched pull is a no-wait probe and then
        # a lingering request, each answered "nothing" when idle). `max_workers` still runs
        # `concurrency` events at once.
        "pull_sub": PullSub(batch_size=1, timeout=EVENT_PULL_SECONDS),
        "ack_policy": AckPolicy.MANUAL,
        "max_workers": concurrency,
        "config": ConsumerConfig(
            # Unlimited at the broker: `run_delivery` enforces the budget itself, so that recording
            # the failure can itself be retried if the database is briefly away.
            max_deliver=-1,
            ack_wait=settings.ack_wait_seconds,
            max_ack_pending=max(concurrency * 4, 16),
        ),
    }


Handler = TypeVar("Handler", bound=Callable[..., Awaitable[None]])


def consume(
    broker: NatsBroker, settings: CommonSettings, subject: str, durable: str, concurrency: int
) -> Callable[[Handler], Handler]:
    """Register a handler on `subject` with the options of `subscriber_options`."""
    subscriber = broker.subscriber(**subscriber_options(settings, subject, durable, concurrency))

    def register(handler: Handler) -> Handler:
        subscriber(handler)
        return handler

    return register


Event = TypeVar("Event", bound=BaseModel)


def handle_events(
    broker: NatsBroker,
    settings: CommonSettings,
    subject: str,
    durable: str,
    concurrency: int,
    event_type: type[Event],
    handle: Callable[[Event], Awaitable[None]],
    give_up: Callable[[Event, FailureKind, str], Awaitable[None]],
) -> None:
    """Run `handle` on every event of `subject` (a durable consumer, `consume`) under the
    delivery policy (`run_delivery`), `give_up` told of an event that ran out of deliveries: the
    one wrapper every event consumer uses. An event that is not an `event_type` is logged and
    acknowledged (no delivery could make it one)."""

    @consume(broker, settings, subject, durable, concurrency)
    async def deliver(msg: NatsMessage) -> None:
        delivery = FastStreamDelivery(msg)
        try:
            event = event_type.model_validate_json(msg.body)
        except ValidationError as exc:
            log.warning("event.malformed", subject=subject, error=str(exc)[:300])
            await delivery.ack()
            return

        async def gave_up(kind: FailureKind, reason: str) -> None:
            await give_up(event, kind, reason)

        await run_delivery(delivery, settings, lambda: handle(event), gave_up)


# How long a publish waits for the stream's acknowledgement (FastStream's and nats-py's usual
# default), so that a publish fails (and is retried) as soon as it always did.
PUBLISH_TIMEOUT_SECONDS = 0.5

# What FastStream's subscribers decode as JSON (`faststream`'s ContentTypes.JSON).
JSON_CONTENT_TYPE = "application/json"


class Bus(Protocol):
    """Where handlers hand work and events on, the platform's one seam to JetStream's writes:
    a publish to a stream, awaited until the stream stored it (or found it a duplicate of one
    with the same `Nats-Msg-Id` within its duplicate window), and the purge of a job's queued
    work. `JetStreamBus` in the services; a recording fake in the handlers' unit tests."""

    async def send(
        self, subject: str, stream: str, body: bytes, headers: dict[str, str]
    ) -> None: ...

    async def purge(self, stream: str, subject: str) -> None: ...


@dataclass(frozen=True)
class JetStreamBus:
    """`Bus` on nats-py's public JetStream API, over the connection of the service's FastStream
    broker (read at each call: the broker connects when the service starts, after its handlers
    are built). Not through `broker.publish`: FastStream's publish middleware stack, and the two
    spans its telemetry middleware made per publish, were a large share of the services' CPU per
    message; the body is pydantic's JSON, with the content type by which FastStream's
    subscribers decode it (`publish`). The library behaviours relied on are named by
    tests/integration/test_jetstream_seam.py."""

    broker: NatsBroker

    async def send(self, subject: str, stream: str, body: bytes, headers: dict[str, str]) -> None:
        js = self.broker.connection.jetstream()
        await js.publish(
            subject, body, timeout=PUBLISH_TIMEOUT_SECONDS, stream=stream, headers=headers
        )

    async def purge(self, stream: str, subject: str) -> None:
        await self.broker.connection.jetstream().purge_stream(stream, subject=subject)


async def publish(bus: Bus, subject: str, message: BaseModel, msg_id: str) -> None:
    """Publish `message` on `subject` to its stream, de-duplicated by `msg_id`, with the current
    trace context."""
    await _publish(bus, subject, _STREAM_OF[subject], message, msg_id)


async def publish_work(
    bus: Bus, stage: subjects.WorkStage, work: AddWork | QuestionWork, item_id: str
) -> None:
    """Hand an item to a stage, on its version's and job's work subject."""
    subject = subjects.work_subject(stage, work.version_id, work.job_id)
    msg_id = message_id(subjects.WORK_PREFIX[stage], item_id)
    await _publish(bus, subject, subjects.WORK_STREAM, work, msg_id)


async def _publish(bus: Bus, subject: str, stream: str, message: BaseModel, msg_id: str) -> None:
    # A header of ours wins over FastStream's own content type; the trace context is the
    # publisher's current span's.
    headers = {"Nats-Msg-Id": msg_id, "content-type": JSON_CONTENT_TYPE}
    propagate.inject(headers)
    await bus.send(subject, stream, message.model_dump_json().encode(), headers)


# How long a pull waits for the broker's answer (it answers a `no_wait` pull at once; this
# only bounds a lost answer).
_PULL_ANSWER_SECONDS = 2.0
# A message handed back is redelivered at once (the broker would otherwise hold it for
# ack_wait).
_HAND_BACK_SECONDS = 0.0
# Admission bounds what is fetched; the broker's own bound only has to be larger, or a
# `no_wait` pull at the bound would linger instead of answering at once.
_MAX_ACK_PENDING = 10_000


@dataclass
class WorkPull:
    """One durable pull consumer of the work stream, fetched one message at a time and only when
    asked: a stage worker takes an item only once it holds the capacity to call for it
    (`aml_pipeline.stage_worker`), so a pull must answer at once when there is nothing. nats-py's
    `PullSubscription.fetch(1)` always lingers at the broker until its timeout, so the pull here
    is JetStream's own pull request, `$JS.API.CONSUMER.MSG.NEXT.<stream>.<consumer>` with
    `no_wait` (the server's documented API), published on the public client with this pull's
    inbox as the reply subject; the message arrives as a plain nats-py `Msg`, acknowledged with
    its public methods. tests/integration/test_jetstream_seam.py names every behaviour of the
    server and of nats-py this relies on."""

    nc: Client
    stream: str
    consumer: str
    inbox: Subscription
    # One pull at a time on the inbox: an answer must not be taken (or handed back as stale)
    # by another pull.
    _pulling: asyncio.Lock = field(default_factory=asyncio.Lock)

    @classmethod
    async def open(
        cls, nc: Client, stream: str, consumer: str, filter_subject: str, ack_wait: float
    ) -> WorkPull:
        """The consumer made if absent (or replaced, when an earlier release's consumer of the
        same name reads other subjects: a work-queue stream keeps the messages, only the
        reading position is new), with explicit acks and no delivery limit at the broker
        (`run_delivery` enforces the budget itself)."""
        js = nc.jetstream()
        if not await cls._reads(js, stream, consumer, filter_subject):
            await cls._make(js, stream, consumer, filter_subject, ack_wait)
        return cls(nc, stream, consumer, await nc.subscribe(nc.new_inbox()))

    @staticmethod
    async def _reads(js: JetStreamContext, stream: str, consumer: str, subject: str) -> bool:
        """Whether the consumer exists and reads `subject`; one that reads another is deleted."""
        with contextlib.suppress(NotFoundError):
            info = await js.consumer_info(stream, consumer)
            if info.config.filter_subject == subject:
                return True
            await js.delete_consumer(stream, consumer)
        return False

    @staticmethod
    async def _make(
        js: JetStreamContext, stream: str, consumer: str, filter_subject: str, ack_wait: float
    ) -> None:
        config = ConsumerConfig(
            durable_name=consumer,
            filter_subject=filter_subject,
            ack_policy=JsAckPolicy.EXPLICIT,
            ack_wait=ack_wait,
            max_deliver=-1,
            max_ack_pending=_MAX_ACK_PENDING,
        )
        with contextlib.suppress(BadRequestError):
            await js.add_consumer(stream, config)
        # Another replica may have created it at the same moment: it must exist now.
        await js.consumer_info(stream, consumer)

    async def next(self) -> Msg | None:
        """The consumer's next message, or None at once when it has none."""
        async with self._pulling:
            await self._hand_back_stale()
            request = json.dumps({"batch": 1, "no_wait": True}).encode()
            api = f"$JS.API.CONSUMER.MSG.NEXT.{self.stream}.{self.consumer}"
            await self.nc.publish(api, request, reply=self.inbox.subject)
            try:
                msg = await self.inbox.next_msg(timeout=_PULL_ANSWER_SECONDS)
            except NatsTimeout:
                return None
        if _is_status(msg):
            return None  # 404 no messages, 408 expired, 409 limits: nothing fetched
        return msg

    async def close(self) -> None:
        with contextlib.suppress(Exception):
            await self.inbox.unsubscribe()

    async def _hand_back_stale(self) -> None:
        """A message that answered a pull after the pull gave up was never taken: it goes back
        to the broker at once instead of waiting out ack_wait."""
        while self.inbox.pending_msgs:
            try:
                stale = await self.inbox.next_msg(timeout=0.01)
            except NatsTimeout:
                return
            if not _is_status(stale):
                await stale.nak(delay=_HAND_BACK_SECONDS)


def _is_status(msg: Msg) -> bool:
    """A status answer of the broker to a pull (no message in it)."""
    return bool(msg.headers and msg.headers.get("Status"))


class FinalFailure(Exception):
    """Raised by a handler to fail the item at once, without retry, with a FailureKind and
    reason (e.g. a contract violation): no later delivery could end it differently."""

    def __init__(self, kind: FailureKind, reason: str, ends_job: bool = False) -> None:
        super().__init__(reason)
        self.kind = kind
        self.reason = reason
        # Not only this item: its job cannot go on (a participant down past its outage window).
        self.ends_job = ends_job


GiveUp = Callable[[FailureKind, str], Awaitable[None]]


class Delivery(Protocol):
    """One delivery of a JetStream message, however it was received (a FastStream subscriber
    or a stage worker's own fetch)."""

    @property
    def delivered(self) -> int: ...
    @property
    def subject(self) -> str: ...
    async def ack(self) -> None: ...
    async def nack(self, delay: float) -> None: ...
    async def in_progress(self) -> None: ...


@dataclass(frozen=True)
class FastStreamDelivery:
    msg: NatsMessage

    @property
    def delivered(self) -> int:
        return int(self.msg.raw_message.metadata.num_delivered)

    @property
    def subject(self) -> str:
        return str(self.msg.raw_message.subject)

    async def ack(self) -> None:
        await self.msg.ack()

    async def nack(self, delay: float) -> None:
        await self.msg.nack(delay=delay)

    async def in_progress(self) -> None:
        await self.msg.in_progress()


@dataclass
class FetchedDelivery:
    msg: Msg
    # Told when the message was NACKed, with the delay before it comes back.
    on_nack: Callable[[float], None] | None = None
    # Hold the ACK until `send_held_ack`: the stage worker sends it right after the capacity
    # announcement, and two publishes in a row leave in one socket write.
    hold_ack: bool = False
    _ack_held: bool = False

    @cached_property
    def delivered(self) -> int:
        # Read once: nats-py parses the reply subject anew on every `metadata` access, and a
        # stage asks for the count several times per item (its span, its audit record, its
        # retry budget).
        return int(self.msg.metadata.num_delivered)

    @property
    def subject(self) -> str:
        return self.msg.subject

    async def ack(self) -> None:
        if self.hold_ack:
            self._ack_held = True
            return
        await self.msg.ack()

    async def send_held_ack(self) -> None:
        if self._ack_held:
            self._ack_held = False
            await self.msg.ack()

    async def nack(self, delay: float) -> None:
        await self.msg.nak(delay=delay)
        if self.on_nack is not None:
            self.on_nack(delay)

    async def in_progress(self) -> None:
        await self.msg.in_progress()


async def run_delivery(
    delivery: Delivery,
    settings: CommonSettings,
    work: Callable[[], Awaitable[None]],
    give_up: GiveUp,
) -> None:
    """At-least-once processing of one delivery.

    `work` must be idempotent. A transient failure is NACKed with a growing delay and comes back;
    the last allowed delivery (or a `FinalFailure`) calls `give_up` with a kind and reason,
    which records the item as failed, so a job never waits on a message that will not come back.
    While `work` runs, progress heartbeats keep the broker from redelivering a long call elsewhere.
    """
    delivered = delivery.delivered
    if delivered > settings.max_deliver:
        # The previous delivery ran out of budget but could not record it (or crashed the worker).
        await give_up(FailureKind.PLATFORM_ERROR, f"gave up after {delivered - 1} deliveries")
        await delivery.ack()
        return
    heartbeat = asyncio.create_task(_heartbeat(delivery, settings.ack_wait_seconds / 3))
    try:
        await work()
    except FinalFailure as exc:
        await give_up(exc.kind, exc.reason)
    except Exception as exc:
        reason = f"{type(exc).__name__}: {exc}"
        if delivered >= settings.max_deliver:
            log.warning("delivery.exhausted", subject=delivery.subject, reason=reason)
            await give_up(
                FailureKind.PLATFORM_ERROR, f"gave up after {delivered} deliveries: {reason}"
            )
        else:
            log.warning("delivery.retry", subject=delivery.subject, reason=reason)
            heartbeat.cancel()
            await delivery.nack(settings.redelivery_delay_seconds * 2 ** (delivered - 1))
            return
    finally:
        heartbeat.cancel()
    await delivery.ack()


async def _heartbeat(delivery: Delivery, every: float) -> None:
    while True:
        await asyncio.sleep(every)
        await delivery.in_progress()
