"""Outages, not failures (SPEC R-4.13), one call at a time on real components: the platform's
`ParticipantClient` against the participant simulator over loopback HTTP, stopped and started
again on the same port, and `complete` against the LLM stand-in's app; the pauses in a real
nx-27017. Whole jobs riding through outages are in test_outage_jobs.py."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from contextlib import AbstractAsyncContextManager
from typing import Any

import httpx
import pytest
from faststream.nats import NatsBroker
from openai import AsyncOpenAI
from pymongo import AsyncMongoClient
from pymongo.asynchronous.database import AsyncDatabase
from stage_support import FunctionStage

from aml_contract import subjects
from aml_contract.messages import QuestionWork
from aml_contract.participant import AddRequest, Message, encode
from aml_devtools.processes import free_port
from aml_llm_standin.app import create_app
from aml_participant_simulator import Outcome, Script, Simulator
from aml_participant_simulator.script import EndpointScript
from aml_participant_simulator.server import serve_in_loop
from aml_pipeline.capacity import Capacity, CapacityLimiter
from aml_pipeline.llm import LLM_CAPACITY_KEY, complete
from aml_pipeline.outages import OutageExpired, Outages, close_abandoned
from aml_pipeline.participants import (
    Attempt,
    CallFailed,
    Endpoint,
    ParticipantClient,
    RetryPolicy,
    participant_down,
)
from aml_pipeline.stage_worker import REFRESH_SECONDS, StageWorker, WorkItem, participant_lanes
from aml_pipeline.urlsafety import SafeTransport
from aml_runtime.broker import FinalFailure, JetStreamBus, declare_streams, publish_work
from aml_runtime.db import Document
from aml_runtime.documents import FailureKind
from aml_runtime.settings import CommonSettings
from aml_runtime.stores import Stores

pytestmark = pytest.mark.integration

HOST = "127.0.0.1"
KEY = "ver-outage"
IDS = ("eval:r:d:c:chunk-1", "eval:r:d:c", "eval:r:s:1")
FAST = RetryPolicy(max_attempts=3, backoff_base_seconds=0.02, backoff_max_seconds=0.05)


@pytest.fixture
async def db(
    mongo_url: str, request: pytest.FixtureRequest
) -> AsyncIterator[AsyncDatabase[Document]]:
    client: AsyncMongoClient[Document] = AsyncMongoClient(mongo_url, tz_aware=True)
    database = client[f"outages_{request.node.name[:40]}"]
    yield database
    await client.drop_database(database.name)
    await client.close()


def _client(outages: Outages | None, window: float = 60.0) -> ParticipantClient:
    http = httpx.AsyncClient(transport=SafeTransport(allow_loopback=True))
    return ParticipantClient(http, FAST, timeout=5.0, outages=outages, outage_seconds=window)


def _endpoint(port: int) -> Endpoint:
    base = f"http://{HOST}:{port}"
    return Endpoint(
        add_url=f"{base}/add",
        search_url=f"{base}/search",
        health_url=f"{base}/health",
        auth_method="none",
        capacity=Capacity(key=KEY, max_concurrency=2, max_rps=None),
    )


def _body() -> bytes:
    request_id, user_id, session_id = IDS
    add = AddRequest(
        request_id=request_id,
        user_id=user_id,
        session_id=session_id,
        messages=[Message(role="user", content="I moved to Lisbon in May.")],
    )
    return encode(add)


class Audit(list[Attempt]):
    """The attempts a call reported, in order (the client's observer)."""

    async def observe(self, attempt: Attempt) -> None:
        self.append(attempt)


def _serving(simulator: Simulator, port: int) -> AbstractAsyncContextManager[str]:
    return serve_in_loop(simulator, HOST, port)


async def _until(predicate: Any, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not await predicate():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        await asyncio.sleep(0.05)


def test_what_says_a_participant_is_down() -> None:
    assert participant_down(None, httpx.ConnectError("refused"))
    assert participant_down(None, httpx.ReadTimeout("slow"))
    assert participant_down(None, httpx.RemoteProtocolError("reset"))
    for status in (429, 502, 503, 504, 524):
        assert participant_down(status, None)
    # A server that is up but fails this request is not an outage.
    for status in (500, 408, 409, 425):
        assert not participant_down(status, None)


async def test_a_participant_that_comes_back_is_waited_for_and_sent_the_same_bytes(
    db: AsyncDatabase[Document],
) -> None:
    port = free_port(HOST)
    simulator = Simulator(Script())
    outages = Outages(Stores.over(db))
    client = _client(outages)
    attempts = Audit()
    observe = attempts.observe

    body = _body()
    call = asyncio.create_task(client.add(_endpoint(port), body, IDS, observe))

    async def paused() -> bool:
        return await db.lane_pauses.find_one({"_id": KEY, "paused": True}) is not None

    # Nothing listens: the retry table's attempts are spent, then the lane pauses.
    await _until(paused, 10, "the pause")
    assert outages.is_paused(KEY)
    assert not call.done()
    assert [a.outcome for a in attempts] == ["retry"] * FAST.max_attempts
    assert all(a.error_class == "ConnectError" for a in attempts)
    pause = await db.lane_pauses.find_one({"_id": KEY})
    assert pause is not None and pause["kind"] == "participant"
    assert pause["since"] <= attempts[0].started_at.timestamp() + 0.01

    async with _serving(simulator, port):
        await asyncio.wait_for(call, timeout=15)
        # Probed at its Health URL before the Add was sent again: the same bytes, once.
        kinds = [r.endpoint for r in simulator.requests]
        assert kinds[0] == "health" and kinds[-1] == "add"
        adds = [r for r in simulator.requests if r.endpoint == "add"]
        assert [r.body for r in adds] == [body]
    assert attempts[-1].outcome == "ok" and len(attempts) == FAST.max_attempts + 1
    # The outage is over: the lane's pause is gone, its history kept with start and end.
    assert not outages.is_open(KEY)
    assert await db.lane_pauses.find_one({"_id": KEY}) is None
    history = await db.outages.find({"key": KEY}).to_list()
    assert len(history) == 1 and history[0]["how"] == "ended"
    assert history[0]["until"] > history[0]["since"]
    await client.aclose()


async def test_an_outage_longer_than_its_window_fails_the_call_with_its_start_and_end(
    db: AsyncDatabase[Document],
) -> None:
    port = free_port(HOST)
    outages = Outages(Stores.over(db))
    client = _client(outages, window=2.5)
    attempts = Audit()
    observe = attempts.observe

    started = time.monotonic()
    with pytest.raises(CallFailed) as failed:
        await asyncio.wait_for(client.add(_endpoint(port), _body(), IDS, observe), timeout=20)
    assert time.monotonic() - started >= 2.5
    assert failed.value.kind == FailureKind.PARTICIPANT_OUTAGE
    assert failed.value.ends_job
    reason = failed.value.reason
    assert "participant unreachable from " in reason and " UTC to " in reason
    assert "AML_PARTICIPANT_OUTAGE_SECONDS = 2.5 s" in reason
    assert "ConnectError" in reason
    # Nothing was sent while it waited: the retry table's attempts, no more.
    assert len(attempts) == FAST.max_attempts
    history = await db.outages.find({"key": KEY}).to_list()
    assert [h["how"] for h in history] == ["expired"]
    # No longer paused; for one more window a call that finds it still down fails at once
    # instead of waiting a window of its own.
    expired = await db.lane_pauses.find_one({"_id": KEY})
    assert expired is not None and not expired["paused"] and expired["expired_at"]
    assert not outages.is_paused(KEY)
    attempts.clear()
    with pytest.raises(CallFailed) as again:
        await asyncio.wait_for(client.add(_endpoint(port), _body(), IDS, observe), timeout=5)
    assert again.value.ends_job and len(attempts) == 1
    assert again.value.reason.startswith("add: participant unreachable from ")
    # The participant back: the first success closes it (its history already written).
    async with _serving(Simulator(Script()), port):
        await client.add(_endpoint(port), _body(), IDS, observe)
    assert await db.lane_pauses.find_one({"_id": KEY}) is None
    assert len(await db.outages.find({"key": KEY}).to_list()) == 1
    await client.aclose()


async def test_a_failure_that_is_not_an_outage_fails_the_item_as_before(
    db: AsyncDatabase[Document],
) -> None:
    port = free_port(HOST)
    script = Script(add=EndpointScript(responses=[Outcome(status=500)] * 10))
    outages = Outages(Stores.over(db))
    client = _client(outages)

    observe = Audit().observe

    async with _serving(Simulator(script), port):
        with pytest.raises(CallFailed) as failed:
            await client.add(_endpoint(port), _body(), IDS, observe)
    assert failed.value.kind == FailureKind.PARTICIPANT_OUTAGE and not failed.value.ends_job
    assert "no success after 3 attempts (last: HTTP 500)" in failed.value.reason
    assert await db.lane_pauses.find_one({"_id": KEY}) is None
    await client.aclose()


async def test_while_an_outage_is_open_a_call_tries_once_before_it_waits(
    db: AsyncDatabase[Document],
) -> None:
    """Health answers but Add does not (503): each resume costs one attempt per waiting call,
    the pause keeps its start, and its window still ends it."""
    port = free_port(HOST)
    script = Script(add=EndpointScript(responses=[Outcome(status=503)] * 50))
    outages = Outages(Stores.over(db))
    client = _client(outages, window=7.0)
    attempts = Audit()
    observe = attempts.observe

    async with _serving(Simulator(script), port) as _:
        with pytest.raises(CallFailed) as failed:
            await asyncio.wait_for(client.add(_endpoint(port), _body(), IDS, observe), 30)
    assert failed.value.ends_job and "HTTP 503" in failed.value.reason
    # 3 attempts, then one per resume (probes at 2 s and 6 s after the pause): never 3 again.
    assert FAST.max_attempts + 1 <= len(attempts) <= FAST.max_attempts + 3
    history = await db.outages.find({"key": KEY}).to_list()
    assert len(history) == 1 and history[0]["how"] == "expired"
    assert history[0]["seconds"] >= 7.0
    await client.aclose()


async def test_replicas_share_one_pause_and_one_probe_at_a_time(
    db: AsyncDatabase[Document],
) -> None:
    """Two processes' calls of one participant: one pause document, the Health URL probed by
    one of them per interval, both calls resumed when it answers."""
    port = free_port(HOST)
    simulator = Simulator(Script(health=EndpointScript(responses=[Outcome(status=503)])))
    replicas = [Outages(Stores.over(db)), Outages(Stores.over(db))]
    clients = [_client(outages) for outages in replicas]

    observe = Audit().observe

    calls = [
        asyncio.create_task(client.add(_endpoint(port), _body(), IDS, observe))
        for client in clients
    ]

    async def both_paused() -> bool:
        return all(outages.is_paused(KEY) for outages in replicas)

    await _until(both_paused, 10, "both replicas paused")
    async with _serving(simulator, port):
        await asyncio.wait_for(asyncio.gather(*calls), timeout=30)
        health = [r for r in simulator.requests if r.endpoint == "health"]
    # A 503, then 200: two probes in all, 2 and 6 s after the pause (the interval grows), not
    # one per replica.
    assert len(health) == 2
    assert health[1].arrived_monotonic - health[0].arrived_monotonic > 3.5
    assert len(await db.outages.find({"key": KEY}).to_list()) == 1
    for client in clients:
        await client.aclose()


async def test_a_pause_no_call_waits_for_is_closed_after_its_window(
    db: AsyncDatabase[Document],
) -> None:
    outages = Outages(Stores.over(db))
    moment = time.time()
    await outages.declare(KEY, "participant", moment - 100, "ConnectError", 30)
    assert await close_abandoned(Stores.over(db), moment) == [KEY]
    assert await db.lane_pauses.find_one({"_id": KEY}) is None
    assert (await db.outages.find_one({"key": KEY}) or {}).get("how") == "expired"


async def test_an_expired_outage_is_forgotten_a_window_after_it_expired(
    db: AsyncDatabase[Document],
) -> None:
    outages = Outages(Stores.over(db))
    moment = time.time()
    pause = await outages.declare(KEY, "participant", moment - 40, "ConnectError", 30)
    await outages.expire(pause, moment - 10)
    assert await close_abandoned(Stores.over(db), moment) == []
    assert await close_abandoned(Stores.over(db), moment + 21) == [KEY]
    assert await db.lane_pauses.find_one({"_id": KEY}) is None
    assert len(await db.outages.find({"key": KEY}).to_list()) == 1


class _Switch:
    """An ASGI wrapper that answers 503 while `down` (an LLM endpoint in an outage)."""

    def __init__(self, app: Any) -> None:
        self.app = app
        self.down = True
        self.chats = 0

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] == "http" and scope["path"].endswith("/chat/completions"):
            self.chats += 1
        if scope["type"] == "http" and self.down:
            await send({"type": "http.response.start", "status": 503, "headers": []})
            await send({"type": "http.response.body", "body": b'{"error": "down"}'})
            return
        await self.app(scope, receive, send)


async def test_an_llm_outage_pauses_and_the_call_completes_when_it_answers(
    db: AsyncDatabase[Document],
) -> None:
    switch = _Switch(create_app(latency_s=0.0, capacity=4))
    outages = Outages(Stores.over(db))
    async with serve_in_loop(switch, HOST, free_port(HOST)) as url:
        llm = AsyncOpenAI(base_url=f"{url}/v1", api_key="unset", max_retries=0)
        call = asyncio.create_task(
            complete(llm, "m", "Where is it?", 8, outages=outages, outage_seconds=60)
        )

        async def paused() -> bool:
            return outages.is_paused(LLM_CAPACITY_KEY)

        await _until(paused, 5, "the LLM's pause")
        pause = await db.lane_pauses.find_one({"_id": LLM_CAPACITY_KEY})
        assert pause is not None and pause["kind"] == "llm" and pause["reason"] == "HTTP 503"
        # One chat call, then nothing while paused (the probe reads the model list).
        await asyncio.sleep(1.0)
        assert switch.chats == 1 and not call.done()
        switch.down = False
        reply = await asyncio.wait_for(call, timeout=15)
        assert reply and switch.chats == 2
        await llm.close()
    assert await db.lane_pauses.find_one({"_id": LLM_CAPACITY_KEY}) is None
    assert len(await db.outages.find({"key": LLM_CAPACITY_KEY}).to_list()) == 1


async def test_an_llm_outage_longer_than_its_window_is_the_platforms_failure(
    db: AsyncDatabase[Document],
) -> None:
    switch = _Switch(create_app(latency_s=0.0, capacity=4))
    outages = Outages(Stores.over(db))
    async with serve_in_loop(switch, HOST, free_port(HOST)) as url:
        llm = AsyncOpenAI(base_url=f"{url}/v1", api_key="unset", max_retries=0)
        with pytest.raises(FinalFailure) as failed:
            await asyncio.wait_for(
                complete(llm, "m", "q", 8, outages=outages, outage_seconds=2.5), timeout=20
            )
        await llm.close()
    assert failed.value.kind == FailureKind.PLATFORM_ERROR
    assert "answer model unreachable from " in failed.value.reason
    assert "AML_LLM_OUTAGE_SECONDS = 2.5 s" in failed.value.reason


async def test_expiry_is_told_to_every_waiting_call(db: AsyncDatabase[Document]) -> None:
    outages = Outages(Stores.over(db))
    await outages.declare(KEY, "participant", time.time(), "ConnectError", 1.0)

    async def never() -> bool:
        return False

    waits = [asyncio.create_task(outages.wait(KEY, never)) for _ in range(3)]
    done = await asyncio.wait_for(asyncio.gather(*waits, return_exceptions=True), timeout=10)
    assert all(isinstance(result, OutageExpired) for result in done)


async def test_a_paused_lane_takes_no_work_and_resumes_when_another_replica_says_so(
    nats_url: str, db: AsyncDatabase[Document]
) -> None:
    """The stage worker (real nats-server): a paused version's queued work stays in the broker
    while another version's is served; a replica lifting the pause announces it on core NATS,
    and the waiting work is taken within moments, not at the next refresh."""
    settings = CommonSettings(nats_url=nats_url, ack_wait_seconds=5)
    served: list[str] = []

    async def handle(work: QuestionWork, item: WorkItem) -> None:
        served.append(work.item_id)
        await item.delivery.ack()

    paused, other = "ver-paused", "ver-running"
    for version in (paused, other):
        await db.versions.insert_one(
            {"_id": version, "capacity": {"max_concurrency": 2, "max_rps": 100.0}}
        )
    broker = NatsBroker(nats_url)
    async with broker:
        await broker.connect()
        await declare_streams(broker)

        async def announce(key: str) -> None:
            await broker.connection.publish(subjects.LANE_OUTAGE, key.encode())

        here, elsewhere = Outages(Stores.over(db), announce), Outages(Stores.over(db), announce)
        await elsewhere.declare(paused, "participant", time.time(), "ConnectError", 600)
        worker = StageWorker(
            participant_lanes("search", "t-outage", Stores.over(db)),
            FunctionStage(QuestionWork, handle),
            CapacityLimiter(Stores.over(db)),
            settings,
            max_in_flight=4,
            outages=here,
        )
        await worker.start(broker)
        for version in (paused, other):
            work = QuestionWork(job_id="job-o", version_id=version, item_id=f"{version}/q1")
            await publish_work(JetStreamBus(broker), "search", work, work.item_id)

        async def other_served() -> bool:
            return f"{other}/q1" in served

        await _until(other_served, 10, "the running version's work")
        await asyncio.sleep(1.5)
        assert served == [f"{other}/q1"] and here.is_paused(paused)

        # Lifted by another replica (its probe answered): the announcement wakes the lane.
        await db.lane_pauses.update_one({"_id": paused}, {"$set": {"paused": False}})
        lifted = time.monotonic()
        await announce(paused)

        async def paused_served() -> bool:
            return f"{paused}/q1" in served

        await _until(paused_served, 10, "the resumed version's work")
        # Well before the worker's own periodic re-read would have found it.
        assert time.monotonic() - lifted < REFRESH_SECONDS
        await worker.stop()
