"""The delivery policy on a real nats-server with JetStream, through the stage worker that every
worker uses: transient failures come back, an item that exhausts its deliveries is given up with
its reason, and publishes are de-duplicated."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from faststream.nats import NatsBroker
from pymongo import AsyncMongoClient
from stage_support import FunctionStage

from aml_contract import subjects
from aml_contract.messages import QuestionWork
from aml_pipeline.capacity import CapacityLimiter
from aml_pipeline.stage_worker import StageWorker, WorkItem, participant_lanes
from aml_runtime.broker import (
    FinalFailure,
    JetStreamBus,
    declare_streams,
    publish_work,
    run_delivery,
)
from aml_runtime.settings import CommonSettings
from aml_runtime.stores import Stores

pytestmark = pytest.mark.integration


async def _run(
    nats_url: str, mongo_url: str, version: str, behaviour: dict[str, int], wait: float
) -> tuple[list[tuple[str, int]], list[tuple[str, str, str]]]:
    """Work `behaviour`'s items with the production worker; `behaviour[item]` = failures before
    success (-1: always fail, -2: a final error at once)."""
    settings = CommonSettings(
        nats_url=nats_url, max_deliver=3, ack_wait_seconds=5, redelivery_delay_seconds=0.05
    )
    deliveries: list[tuple[str, int]] = []
    given_up: list[tuple[str, str, str]] = []

    async def handle(work: QuestionWork, item: WorkItem) -> None:
        deliveries.append((work.item_id, item.delivered))

        async def attempt() -> None:
            failures = behaviour[work.item_id]
            if failures == -2:
                raise FinalFailure("contract_error", "search item 1: id must be a non-empty string")
            if failures == -1 or item.delivered <= failures:
                raise ConnectionError("participant unreachable")

        async def give_up(kind: str, reason: str) -> None:
            given_up.append((work.item_id, kind, reason))

        await run_delivery(item.delivery, settings, attempt, give_up)

    client: AsyncMongoClient[dict[str, Any]] = AsyncMongoClient(mongo_url)
    db = client[f"aml_delivery_{version}"]
    await db.versions.insert_one(
        {"_id": version, "capacity": {"max_concurrency": 4, "max_rps": 100.0}}
    )
    broker = NatsBroker(nats_url)
    async with broker:
        await broker.connect()
        await declare_streams(broker)
        worker = StageWorker(
            participant_lanes("search", "t-delivery", Stores.over(db)),
            FunctionStage(QuestionWork, handle),
            CapacityLimiter(Stores.over(db)),
            settings,
            max_in_flight=4,
        )
        await worker.start(broker)
        for item in behaviour:
            work = QuestionWork(job_id="job", version_id=version, item_id=item)
            await publish_work(JetStreamBus(broker), "search", work, f"{version}/{item}")
            # The same message id again is dropped by the broker.
            await publish_work(JetStreamBus(broker), "search", work, f"{version}/{item}")
        # Until every item is settled (or the bound passes): a loaded machine may be slow.
        loop = asyncio.get_running_loop()
        deadline = loop.time() + wait
        while len(_settled(behaviour, deliveries, given_up)) < len(behaviour):
            assert loop.time() < deadline, (deliveries, given_up)
            await asyncio.sleep(0.05)
        await asyncio.sleep(0.5)  # a duplicate delivery, were there one, would show now
        await worker.stop()
    await client.close()
    return deliveries, given_up


def _settled(
    behaviour: dict[str, int],
    deliveries: list[tuple[str, int]],
    given_up: list[tuple[str, str, str]],
) -> set[str]:
    """Items that succeeded or were given up."""
    gave_up = {item for item, _, _ in given_up}
    passed = {item for item, n in deliveries if 0 <= behaviour[item] < n}
    return gave_up | passed


async def test_retry_give_up_and_deduplication(nats_url: str, mongo_url: str) -> None:
    behaviour = {"ok": 0, "flaky": 1, "down": -1, "invalid": -2}
    deliveries, given_up = await _run(nats_url, mongo_url, "ver-t1", behaviour, 30.0)

    count = {item: sum(1 for i, _ in deliveries if i == item) for item in behaviour}
    # De-duplicated publish: "ok" once; "flaky" once more after its failure; "down" until the
    # budget of 3 deliveries is spent; a final error is not retried at all.
    assert count == {"ok": 1, "flaky": 2, "down": 3, "invalid": 1}
    assert sorted(given_up) == [
        ("down", "platform_error", "gave up after 3 deliveries: ConnectionError: "
         "participant unreachable"),
        ("invalid", "contract_error", "search item 1: id must be a non-empty string"),
    ]  # fmt: skip


async def test_nothing_left_unacknowledged(nats_url: str, mongo_url: str) -> None:
    await _run(nats_url, mongo_url, "ver-t2", {"a": 1, "b": -1}, 30.0)
    broker = NatsBroker(nats_url)
    async with broker:
        await broker.connect()
        js = broker.connection.jetstream()
        info = await js.consumer_info(subjects.WORK_STREAM, "t-delivery-ver-t2")
        assert info.num_ack_pending == 0 and info.num_pending == 0
        assert info.config.max_deliver == -1  # the budget is the handler's, see run_delivery
