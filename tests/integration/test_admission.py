"""Admission before dequeue (aml_pipeline.stage_worker) on a real nats-server and nx-27017: a
version's work is fetched only under its capacity, one version's limits never hold another's
work, nothing waits un-acknowledged, and a failed job's queued work never reaches a handler."""

from __future__ import annotations

import asyncio
import math
import time
from collections import defaultdict
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from itertools import pairwise
from typing import Any

import pytest
from faststream.nats import NatsBroker
from nats.aio.msg import Msg
from pymongo import AsyncMongoClient
from stage_support import FunctionStage

from aml_contract import subjects
from aml_contract.messages import QuestionWork
from aml_pipeline.capacity import Admission, Capacity, CapacityLimiter, Refused
from aml_pipeline.jobs import fail_job
from aml_pipeline.stage_worker import (
    LLM_REUSE_LIMIT,
    RATE_PATIENCE_SECONDS,
    REFRESH_SECONDS,
    REUSE_LIMIT,
    WANTED_SECONDS,
    StageWorker,
    WorkItem,
    llm_lanes,
    participant_lanes,
)
from aml_runtime.broker import JetStreamBus, declare_streams, make_broker, publish_work
from aml_runtime.settings import CommonSettings, LLMSettings
from aml_runtime.stores import Stores

pytestmark = pytest.mark.integration


@dataclass
class Seen:
    """What the handler saw: per version, each item's delivery count and departure times."""

    deliveries: dict[str, list[int]] = field(default_factory=lambda: defaultdict(list))
    departures: dict[str, list[float]] = field(default_factory=lambda: defaultdict(list))
    in_flight: dict[str, int] = field(default_factory=lambda: defaultdict(int))
    peak: dict[str, int] = field(default_factory=lambda: defaultdict(int))


def _handler(seen: Seen, hold: float) -> Any:
    async def handle(work: QuestionWork, item: WorkItem) -> None:
        version = work.version_id
        seen.deliveries[version].append(item.delivered)
        # Requests in flight, as the participant sees them (the next item under a slot gets
        # ready while the current one's request is out, `StageWorker._process`).
        async with item.admission.request() as departure:
            seen.in_flight[version] += 1
            seen.peak[version] = max(seen.peak[version], seen.in_flight[version])
            try:
                departure.at = time.time()
                seen.departures[version].append(departure.at)
                await asyncio.sleep(hold)
            finally:
                seen.in_flight[version] -= 1
        await item.delivery.ack()

    return handle


@pytest.fixture
async def env(nats_url: str, mongo_url: str, request: pytest.FixtureRequest) -> AsyncIterator[Any]:
    settings = CommonSettings(nats_url=nats_url, ack_wait_seconds=5.0)
    broker = make_broker(settings)
    await broker.connect()
    await declare_streams(broker)
    client: AsyncMongoClient[dict[str, Any]] = AsyncMongoClient(mongo_url)
    db = client[f"aml_admission_{request.node.name[:40]}"]
    yield settings, broker, db
    # Work a test left queued must not become another test's lane, nor its consumers stand in
    # the way of another's (a work-queue stream takes one consumer per subject).
    js = broker.connection.jetstream()
    await js.purge_stream(subjects.WORK_STREAM)
    for consumer in await js.consumers_info(subjects.WORK_STREAM):
        await js.delete_consumer(subjects.WORK_STREAM, consumer.name)
    await broker.stop()
    await client.close()


async def _versions(db: Any, **capacities: tuple[int, float]) -> None:
    for version, (concurrency, rps) in capacities.items():
        await db.versions.insert_one(
            {"_id": version, "capacity": {"max_concurrency": concurrency, "max_rps": rps}}
        )


async def _publish(broker: NatsBroker, version: str, job: str, count: int) -> None:
    for index in range(count):
        work = QuestionWork(job_id=job, version_id=version, item_id=f"{job}/{index}")
        await publish_work(JetStreamBus(broker), "search", work, work.item_id)


def _worker(settings: CommonSettings, db: Any, durable: str, seen: Seen, hold: float) -> Any:
    return StageWorker(
        participant_lanes("search", durable, Stores.over(db)),
        FunctionStage(QuestionWork, _handler(seen, hold)),
        # As a service's (`capacity_limiter`): rate slots may be reserved ahead.
        CapacityLimiter(Stores.over(db), rate_patience_seconds=RATE_PATIENCE_SECONDS),
        settings,
        max_in_flight=8,
    )


def _participant_worker(
    settings: CommonSettings, db: Any, stage: subjects.WorkStage, durable: str, handle: Any
) -> Any:
    """A participant stage's worker (Adds or Searches) over `handle`, admitted as a service's
    is, for the tests where the adder and the searcher share a version's slots."""
    return StageWorker(
        participant_lanes(stage, durable, Stores.over(db)),
        FunctionStage(QuestionWork, handle),
        CapacityLimiter(Stores.over(db), rate_patience_seconds=RATE_PATIENCE_SECONDS),
        settings,
        max_in_flight=16,
    )


async def _until(condition: Any, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        await asyncio.sleep(0.05)


async def test_a_hostile_rate_holds_only_its_own_work(env: Any) -> None:
    """A version declaring 0.001 requests/s gets one item through; another version's 30 items
    all pass, each delivered once; the hostile version's other items were never fetched."""
    settings, broker, db = env
    durable = "t-hostile"
    await _versions(db, **{"ver-hostile": (4, 0.001), "ver-polite": (4, 100.0)})
    await _publish(broker, "ver-hostile", "jhostile", 6)
    await _publish(broker, "ver-polite", "jpolite", 30)
    seen = Seen()
    worker = _worker(settings, db, durable, seen, hold=0.02)
    await worker.start(broker)
    try:
        await _until(lambda: len(seen.deliveries["ver-polite"]) >= 30)
        await asyncio.sleep(1.5)  # time enough for a wrongly admitted hostile item to show
    finally:
        await worker.stop()
    assert seen.deliveries["ver-polite"] == [1] * 30
    assert seen.deliveries["ver-hostile"] == [1]
    js = broker.connection.jetstream()
    hostile = await js.consumer_info(subjects.WORK_STREAM, f"{durable}-ver-hostile")
    # The other five are still in the broker, never handed to anyone: nothing waits un-acked.
    assert hostile.num_pending == 5
    assert hostile.num_ack_pending == 0
    assert hostile.num_redelivered == 0


async def test_two_workers_hold_a_shared_concurrency_and_rate(env: Any, mongo_url: str) -> None:
    """Two worker processes' worth (separate database clients) serve one version declaring two
    at a time and five per second: never more than two at once, never more than five
    departures in any second."""
    settings, broker, db = env
    await _versions(db, **{"ver-shared": (2, 5.0)})
    await _publish(broker, "ver-shared", "jshared", 16)
    seen = Seen()
    other_client: AsyncMongoClient[dict[str, Any]] = AsyncMongoClient(mongo_url)
    other_db = other_client[db.name]
    workers = [
        _worker(settings, db, "t-shared", seen, hold=0.3),
        _worker(settings, other_db, "t-shared", seen, hold=0.3),
    ]
    for worker in workers:
        await worker.start(broker)
    try:
        await _until(lambda: len(seen.deliveries["ver-shared"]) >= 16)
    finally:
        for worker in workers:
            await worker.stop()
        await other_client.close()
    assert seen.deliveries["ver-shared"] == [1] * 16
    assert seen.peak["ver-shared"] == 2
    departures = sorted(seen.departures["ver-shared"])
    for first in departures:
        assert sum(1 for t in departures if first <= t < first + 1.0) <= 5
    # 16 departures at five per second need at least two full periods after the first five.
    assert departures[-1] - departures[0] >= 2.0


async def test_a_saturated_slot_gets_its_next_item_ready_during_the_call(env: Any) -> None:
    """One slot, items that read for a while before their request: the next item is fetched
    and does its reading while the current request is out, and its request leaves when that
    one's answer is in, never while it is out."""
    settings, broker, db = env
    await _versions(db, **{"ver-one": (1, 1000.0)})
    await _publish(broker, "ver-one", "jone", 8)
    marks: list[tuple[str, str, float]] = []

    async def handle(work: QuestionWork, item: WorkItem) -> None:
        marks.append(("ready", work.item_id, time.monotonic()))
        await asyncio.sleep(0.05)  # its reads and audit record
        async with item.admission.request():
            marks.append(("sent", work.item_id, time.monotonic()))
            await asyncio.sleep(0.15)  # the participant's answer
            marks.append(("answered", work.item_id, time.monotonic()))
        await item.delivery.ack()

    worker = StageWorker(
        participant_lanes("search", "t-one", Stores.over(db)),
        FunctionStage(QuestionWork, handle),
        CapacityLimiter(Stores.over(db), rate_patience_seconds=RATE_PATIENCE_SECONDS),
        settings,
        max_in_flight=8,
    )
    await worker.start(broker)
    try:
        await _until(lambda: sum(1 for m in marks if m[0] == "answered") >= 8)
    finally:
        await worker.stop()
    at = {(kind, item): moment for kind, item, moment in marks}
    order = [item for kind, item, _ in marks if kind == "sent"]
    assert len(order) == 8
    for previous, following in pairwise(order):
        # Never two requests out at once under one slot.
        assert at["sent", following] >= at["answered", previous]
    # Within a run under one admission, the next item got ready while the request was out.
    overlapped = [
        following
        for previous, following in pairwise(order)
        if at["sent", previous] <= at["ready", following] < at["answered", previous]
    ]
    assert len(overlapped) >= len(order) - 1 - 8 // REUSE_LIMIT


async def test_a_failed_jobs_queued_work_never_reaches_a_handler(env: Any) -> None:
    settings, broker, db = env
    await _versions(db, **{"ver-failing": (1, 100.0)})
    await db.jobs.insert_one({"_id": "jfailing", "state": "running", "version_id": "ver-failing"})
    await _publish(broker, "ver-failing", "jfailing", 10)
    await _publish(broker, "ver-failing", "jother", 3)
    await fail_job(
        Stores.over(db), JetStreamBus(broker), "jfailing", "search", "contract_error", "test"
    )
    job = await db.jobs.find_one({"_id": "jfailing"})
    assert job is not None and job["state"] == "failed"
    js = broker.connection.jetstream()
    queued = "aml.work.search.ver-failing.*"
    info = await js.stream_info(subjects.WORK_STREAM, subjects_filter=queued)
    assert (info.state.subjects or {}) == {"aml.work.search.ver-failing.jother": 3}
    seen = Seen()
    worker = _worker(settings, db, "t-failing", seen, hold=0.0)
    await worker.start(broker)
    try:
        await _until(lambda: len(seen.deliveries["ver-failing"]) >= 3)
        await asyncio.sleep(0.5)
    finally:
        await worker.stop()
    assert len(seen.deliveries["ver-failing"]) == 3


async def test_answerer_and_scorer_share_one_llm_budget(env: Any) -> None:
    """The LLM's declared concurrency is one budget for the deployment: an answer worker and a
    score worker (as two services would) never have more than that many items at once."""
    settings, broker, db = env
    llm = LLMSettings(nats_url=settings.nats_url, ack_wait_seconds=5.0, llm_concurrency=3)
    together = {"now": 0, "peak": 0}
    seen: list[str] = []

    async def handle(work: QuestionWork, item: WorkItem) -> None:
        together["now"] += 1
        together["peak"] = max(together["peak"], together["now"])
        await asyncio.sleep(0.1)
        together["now"] -= 1
        seen.append(work.item_id)
        await item.delivery.ack()

    workers = [
        StageWorker(
            llm_lanes(stage, f"t-{stage}", llm),
            FunctionStage(QuestionWork, handle),
            CapacityLimiter(Stores.over(db)),
            llm,
            max_in_flight=8,
        )
        for stage in ("answer", "score")
    ]
    for stage in ("answer", "score"):
        for index in range(12):
            work = QuestionWork(job_id="jllm", version_id="ver-llm", item_id=f"{stage}-{index}")
            await publish_work(JetStreamBus(broker), stage, work, work.item_id)
    for worker in workers:
        await worker.start(broker)
    try:
        await _until(lambda: len(seen) >= 24)
    finally:
        for worker in workers:
            await worker.stop()
    assert sorted(seen) == sorted(f"{s}-{i}" for s in ("answer", "score") for i in range(12))
    assert together["peak"] == 3


class _CountingLimiter(CapacityLimiter):
    """Counts the admissions granted (each one a concurrency slot taken)."""

    granted = 0

    async def try_admit(self, capacity: Capacity) -> Admission | Refused:
        admission = await super().try_admit(capacity)
        if isinstance(admission, Admission):
            self.granted += 1
        return admission


async def test_a_busy_lane_serves_items_in_a_row_under_one_admission(env: Any) -> None:
    """A lane with work keeps its concurrency slot for up to REUSE_LIMIT items in a row (a rate
    slot is still taken for each request), then gives it back: 20 items, one at a time, in
    three admissions, not twenty; each item delivered once, the declared limits held."""
    settings, broker, db = env
    await _versions(db, **{"ver-busy": (1, 50.0)})
    await _publish(broker, "ver-busy", "jbusy", 20)
    seen = Seen()
    limiter = _CountingLimiter(Stores.over(db))
    worker = StageWorker(
        participant_lanes("search", "t-busy", Stores.over(db)),
        FunctionStage(QuestionWork, _handler(seen, 0.01)),
        limiter,
        settings,
        max_in_flight=8,
    )
    await worker.start(broker)
    try:
        await _until(lambda: len(seen.deliveries["ver-busy"]) >= 20)
    finally:
        await worker.stop()
    assert seen.deliveries["ver-busy"] == [1] * 20
    assert seen.peak["ver-busy"] == 1
    assert math.ceil(20 / REUSE_LIMIT) <= limiter.granted <= math.ceil(20 / REUSE_LIMIT) + 1
    # Every item acknowledged (the last ACK is a publish the broker may still be reading).
    js = broker.connection.jetstream()
    await broker.connection.flush()
    deadline = time.monotonic() + 5.0
    info = await js.consumer_info(subjects.WORK_STREAM, "t-busy-ver-busy")
    while info.num_ack_pending and time.monotonic() < deadline:
        await asyncio.sleep(0.05)
        info = await js.consumer_info(subjects.WORK_STREAM, "t-busy-ver-busy")
    assert info.num_ack_pending == 0 and info.num_pending == 0


async def test_stages_sharing_the_llm_budget_take_turns(env: Any) -> None:
    """An answer worker that holds the whole shared budget and always has work does not keep it
    to itself: each slot goes back after LLM_REUSE_LIMIT items in a row, and the score worker,
    waiting for one, gets it; scoring starts long before the last answer. The runs are longer
    than a participant lane's, so the two stages race for the budget's slots less often."""
    settings, broker, db = env
    llm = LLMSettings(nats_url=settings.nats_url, ack_wait_seconds=5.0, llm_concurrency=2)
    order: list[str] = []

    async def handle(work: QuestionWork, item: WorkItem) -> None:
        await asyncio.sleep(0.02)
        order.append(work.item_id.split("-")[0])
        await item.delivery.ack()

    async def freed(key: str) -> None:
        # As the services announce a freed slot (aml_pipeline.stage_worker.capacity_limiter).
        await broker.connection.publish(subjects.CAPACITY_FREED, key.encode())

    items = 3 * LLM_REUSE_LIMIT
    for stage in ("answer", "score"):
        for index in range(items):
            # Ids of their own: the broker drops a message id it saw within two minutes.
            work = QuestionWork(job_id="jturns", version_id="ver-t", item_id=f"{stage}-t{index}")
            await publish_work(JetStreamBus(broker), stage, work, work.item_id)
    stores = Stores.over(db)
    limiters = {stage: _CountingLimiter(stores, notify=freed) for stage in ("answer", "score")}
    answer, score = (
        StageWorker(
            llm_lanes(stage, f"t-turns-{stage}", llm),
            FunctionStage(QuestionWork, handle),
            limiters[stage],
            llm,
            max_in_flight=8,
        )
        for stage in ("answer", "score")
    )
    await answer.start(broker)
    try:
        await _until(lambda: len(order) >= 2)  # both slots are the answer worker's
        await score.start(broker)
        try:
            await _until(lambda: len(order) >= 2 * items)
        finally:
            await score.stop()
    finally:
        await answer.stop()
    assert sorted(order) == ["answer"] * items + ["score"] * items
    # Without the limit, the first score would follow the last answer.
    assert order.index("score") <= 2 * LLM_REUSE_LIMIT + 2 < items
    # Longer runs than a participant's lane: runs of REUSE_LIMIT would need `items / REUSE_LIMIT`
    # admissions for the answers alone.
    assert limiters["answer"].granted < items / REUSE_LIMIT


@pytest.mark.wallclock  # waits out idle polls: runs beside the other tests
async def test_an_idle_worker_reads_the_stream_rarely_and_still_finds_a_redelivery(
    env: Any,
) -> None:
    """New work rings the doorbell, so the stream's counts are re-read only every
    REFRESH_SECONDS, for what nothing announces: an idle worker asks the broker at most once in
    four seconds (re-reading every second asked four or five times), and an item whose first
    delivery was never acknowledged (its worker died) is redelivered after ack_wait, found by a
    re-read (no publish rings for it) and served."""
    settings, broker, db = env
    await _versions(db, **{"ver-idle": (1, 10.0)})
    deliveries: list[int] = []

    async def handle(work: QuestionWork, item: WorkItem) -> None:
        deliveries.append(item.delivered)
        if item.delivered > 1:
            await item.delivery.ack()

    reads: list[str] = []

    async def read(msg: Msg) -> None:
        reads.append(msg.subject)

    watch = await broker.connection.subscribe(
        f"$JS.API.STREAM.INFO.{subjects.WORK_STREAM}", cb=read
    )
    worker = StageWorker(
        participant_lanes("search", "t-idle", Stores.over(db)),
        FunctionStage(QuestionWork, handle),
        CapacityLimiter(Stores.over(db)),
        settings,
        max_in_flight=2,
    )
    await worker.start(broker)
    try:
        await asyncio.sleep(4.0)
        assert len(reads) <= 1, reads
        await _publish(broker, "ver-idle", "jidle", 1)
        await _until(lambda: len(deliveries) >= 1, timeout=5.0)
        # ack_wait (5 s) for the redelivery, then at most REFRESH_SECONDS until it is seen.
        await _until(
            lambda: deliveries == [1, 2],
            timeout=settings.ack_wait_seconds + REFRESH_SECONDS + 5.0,
        )
    finally:
        await worker.stop()
        await watch.unsubscribe()


async def test_adds_and_searches_short_of_one_versions_slots_share_them(env: Any) -> None:
    """While both the adder and the searcher are refused a version's slots, Adds take an eighth
    of its capacity (one slot at least) and Searches the rest, so written conversations are
    searched while others are still being written; either alone takes all of it. The version's
    limit holds for the two together throughout."""
    settings, broker, db = env
    await _versions(db, **{"ver-share": (8, 1000.0)})
    now = {"add": 0, "search": 0}
    peak = {"add": 0, "search": 0, "both": 0}
    done: dict[str, list[str]] = {"add": [], "search": []}

    def handler(stage: str) -> Any:
        async def handle(work: QuestionWork, item: WorkItem) -> None:
            async with item.admission.request() as departure:
                departure.at = time.time()
                now[stage] += 1
                peak[stage] = max(peak[stage], now[stage])
                peak["both"] = max(peak["both"], now["add"] + now["search"])
                try:
                    await asyncio.sleep(0.05)
                finally:
                    now[stage] -= 1
            done[stage].append(work.item_id)
            await item.delivery.ack()

        return handle

    def worker(stage: subjects.WorkStage) -> Any:
        return _participant_worker(settings, db, stage, f"t-share-{stage}", handler(stage))

    async def publish(stage: subjects.WorkStage, prefix: str, count: int) -> None:
        for index in range(count):
            work = QuestionWork(job_id="jshare", version_id="ver-share", item_id=f"{prefix}{index}")
            await publish_work(JetStreamBus(broker), stage, work, work.item_id)

    await publish("add", "a", 300)
    await publish("search", "s", 160)
    adder, searcher = worker("add"), worker("search")
    await adder.start(broker)
    await searcher.start(broker)
    try:
        # Both short of slots: once they have heard of each other, each keeps to its share.
        await _until(lambda: len(done["search"]) >= 40)
        peak.update(add=0, search=0)
        await _until(lambda: len(done["search"]) == 160)
        assert peak["add"] == 1 and peak["search"] == 7
        assert len(done["add"]) < 250  # still queued when the Searches were done
        # Adds alone take all of it once the searcher no longer asks ...
        await asyncio.sleep(1.0)
        peak["add"] = 0
        await _until(lambda: len(done["add"]) == 300)
        assert peak["add"] >= 6
        # ... and Searches alone too.
        peak["search"] = 0
        await publish("search", "t", 60)
        await _until(lambda: len(done["search"]) == 220)
        assert peak["search"] >= 6
    finally:
        await searcher.stop()
        await adder.stop()
    assert sorted(done["search"]) == sorted(f"{p}{i}" for p, n in (("s", 160), ("t", 60))
                                            for i in range(n))  # fmt: skip
    assert sorted(done["add"]) == sorted(f"a{i}" for i in range(300))
    assert peak["both"] <= 8


async def test_adds_beside_searches_get_their_rate_slot_every_period(env: Any) -> None:
    """At a version declaring a rate (4 at once, 10/s, LoCoMo's benchmark participant) the
    adder's share is one rate slot while the searcher wants the rest. Each Add (0.3 s) ends long
    before that slot frees again (1 s and the margin after it left), and the adder must still be
    the one to take it as it frees: Adds leave one rate period apart, not two or three (when the
    adder said it wanted the slot only when refused, the searcher had stopped keeping off it by
    the time it freed, and a written conversation's Searches starved the next one's Adds)."""
    settings, broker, db = env
    await _versions(db, **{"ver-period": (4, 10.0)})
    departures: dict[str, list[float]] = {"add": [], "search": []}

    async def publish(stage: subjects.WorkStage, item_id: str) -> None:
        work = QuestionWork(job_id="jperiod", version_id="ver-period", item_id=item_id)
        await publish_work(JetStreamBus(broker), stage, work, item_id)

    def handler(stage: str, hold: float) -> Any:
        async def handle(work: QuestionWork, item: WorkItem) -> None:
            async with item.admission.request() as departure:
                departure.at = time.time()
                departures[stage].append(departure.at)
                await asyncio.sleep(hold)
            await item.delivery.ack()
            if stage == "add":
                # Two users' chains: a user's next Add is handed on once this one is confirmed.
                user, _, seq = work.item_id.partition("-")
                await publish("add", f"{user}-{int(seq) + 1}")

        return handle

    def worker(stage: subjects.WorkStage, hold: float) -> Any:
        return _participant_worker(settings, db, stage, f"t-period-{stage}", handler(stage, hold))

    # Ids of their own: the broker drops an id another test published within its window.
    for index in range(150):
        await publish("search", f"period-s{index}")
    for user in ("period_u1", "period_u2"):
        await publish("add", f"{user}-1")
    said: list[float] = []

    async def heard(msg: Msg) -> None:
        if msg.data.decode() == "add ver-period":
            said.append(time.time())

    watch = await broker.connection.subscribe(subjects.CAPACITY_WANTED, cb=heard)
    adder, searcher = worker("add", 0.3), worker("search", 0.1)
    await searcher.start(broker)
    await adder.start(broker)
    try:
        await _until(lambda: len(departures["add"]) >= 12)
    finally:
        await adder.stop()
        await searcher.stop()
        await watch.unsubscribe()
    searches = departures["search"]
    # Measured while the searcher still had work: it wanted its share throughout.
    adds = [moment for moment in departures["add"] if moment < searches[-1] - 1.0][2:]
    gaps = sorted(later - earlier for earlier, later in pairwise(adds))
    assert len(gaps) >= 6
    assert gaps[len(gaps) // 2] < 1.5, gaps
    # Why: when each Add's slot freed, the searcher had heard the adder want it within the
    # time it keeps to its share after each word.
    for moment in adds:
        last_word = max(said_at for said_at in said if said_at <= moment)
        assert moment - last_word < WANTED_SECONDS, (moment - last_word, gaps)
    every = sorted(departures["add"] + searches)
    for first in every:
        assert sum(1 for moment in every if first <= moment < first + 1.0) <= 10
