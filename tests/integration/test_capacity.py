"""Declared capacity (R-4.12) held by slots in the nx-27017 MongoDB wire server across several
independent clients, as replicas would be."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import pytest
from pymongo import AsyncMongoClient, monitoring

from aml_pipeline.capacity import Admission, Capacity, CapacityLimiter, Refused
from aml_runtime.stores import Stores

pytestmark = pytest.mark.integration


async def _drive(
    mongo_url: str, key: str, replicas: int, calls: int, max_concurrency: int, max_rps: float
) -> tuple[int, list[float]]:
    """`calls` requests, each admitted and sent under the capacity, through `replicas`
    limiters; returns the peak concurrency and the departure stamps."""
    clients: list[AsyncMongoClient[dict[str, Any]]] = [
        AsyncMongoClient(mongo_url) for _ in range(replicas)
    ]
    limiters = [CapacityLimiter(Stores.over(client["aml_capacity"])) for client in clients]
    capacity = Capacity(key=key, max_concurrency=max_concurrency, max_rps=max_rps)
    in_flight = peak = 0
    departures: list[float] = []

    async def call(limiter: CapacityLimiter) -> None:
        nonlocal in_flight, peak
        admission = await limiter.admit(capacity)
        try:
            async with admission.request() as departure:
                in_flight += 1
                peak = max(peak, in_flight)
                # What httpcore's trace reports when the request's headers go out.
                await departure.trace("http11.send_request_headers.started", {})
                assert departure.at is not None
                departures.append(departure.at)
                await asyncio.sleep(0.05)
                in_flight -= 1
        finally:
            await admission.release()

    await asyncio.gather(*(call(limiters[i % replicas]) for i in range(calls)))
    for client in clients:
        await client.close()
    return peak, sorted(departures)


async def test_concurrency_never_exceeds_the_declared_limit(mongo_url: str) -> None:
    peak, starts = await _drive(mongo_url, "v-conc", 4, 24, max_concurrency=3, max_rps=1000)
    assert len(starts) == 24
    assert peak <= 3
    assert peak >= 2  # the limiter is not simply serialising everything


async def test_rate_never_exceeds_the_declared_limit(mongo_url: str) -> None:
    _, departures = await _drive(mongo_url, "v-rate", 4, 12, max_concurrency=50, max_rps=4)
    # Slots are stamped with the departure itself, so any second holds at most 4 departures
    # however loaded the machine is (the margin only adds room).
    for first in departures:
        assert sum(1 for t in departures if first <= t < first + 1.0) <= 4
    assert departures[-1] - departures[0] >= 2.0  # 12 departures at 4/s need two periods


async def test_fractional_rate(mongo_url: str) -> None:
    _, departures = await _drive(mongo_url, "v-frac", 2, 5, max_concurrency=5, max_rps=2.5)
    # 2.5/s: two slots of one second each; never three departures within a second.
    assert len(departures) == 5
    for first in departures:
        assert sum(1 for t in departures if first <= t < first + 1.0) <= 2
    assert departures[-1] - departures[0] >= 2.0


async def test_an_admission_never_waits(mongo_url: str) -> None:
    """try_admit answers at once: the refusing pool while the key is at its limit, and a slot
    again once an admission is released (the rule that lets a worker skip a busy version)."""
    client: AsyncMongoClient[dict[str, Any]] = AsyncMongoClient(mongo_url)
    limiter = CapacityLimiter(Stores.over(client["aml_capacity"]))
    capacity = Capacity(key="v-busy", max_concurrency=1, max_rps=1000)
    first = await limiter.try_admit(capacity)
    assert isinstance(first, Admission)
    assert await limiter.try_admit(capacity) == Refused("concurrency")
    # Another replica (its own client) is refused by the database.
    other_client: AsyncMongoClient[dict[str, Any]] = AsyncMongoClient(mongo_url)
    other = CapacityLimiter(Stores.over(other_client["aml_capacity"]))
    assert await other.try_admit(capacity) == Refused("concurrency")
    await other_client.close()
    await first.release()
    again = await limiter.try_admit(capacity)
    assert isinstance(again, Admission)
    await again.release()
    # A rate slot taken but never used is given back: the next admission is not delayed.
    slow = Capacity(key="v-unused", max_concurrency=5, max_rps=0.001)
    unused = await limiter.try_admit(slow)
    assert isinstance(unused, Admission)
    await unused.release()
    used = await limiter.try_admit(slow)
    assert isinstance(used, Admission)
    async with used.request():
        pass
    await used.release()
    # Used once, the only rate slot of 0.001/s is gone for 1000 s, and the wait says so.
    assert await limiter.try_admit(slow) == Refused("rate")
    assert await limiter.wait_hint(slow, "rate") > 900
    await client.close()


class _Commands(monitoring.CommandListener):
    """The database commands a client sent, by name, while `recording`."""

    def __init__(self) -> None:
        self.recording = False
        self.sent: list[str] = []

    def started(self, event: monitoring.CommandStartedEvent) -> None:
        if self.recording:
            self.sent.append(event.command_name)

    def succeeded(self, event: monitoring.CommandSucceededEvent) -> None:
        pass

    def failed(self, event: monitoring.CommandFailedEvent) -> None:
        pass


async def test_a_release_stamps_and_frees_in_one_round_trip(mongo_url: str) -> None:
    """The used rate slot's stamp (its departure + the period + the margin) and the freed
    concurrency slot are written together when the item is released: one command."""
    commands = _Commands()
    client: AsyncMongoClient[dict[str, Any]] = AsyncMongoClient(
        mongo_url, event_listeners=[commands]
    )
    db = client["aml_capacity"]
    limiter = CapacityLimiter(Stores.over(db), rate_margin_seconds=0.05)
    capacity = Capacity(key="v-settle", max_concurrency=2, max_rps=4)
    admission = await limiter.try_admit(capacity)
    assert isinstance(admission, Admission)
    async with admission.request() as departure:
        await departure.trace("http11.send_request_headers.started", {})
    assert departure.at is not None
    commands.recording = True
    await admission.release(notify=False)
    commands.recording = False
    assert commands.sent == ["update"]
    rate = await db.capacity_slots.find_one({"pool": "v-settle/r", "holder": admission.holder})
    assert rate is not None and rate["stamped"]
    assert rate["free_at"] == pytest.approx(departure.at + 1.0 + 0.05)
    held = await db.capacity_slots.find_one({"pool": "v-settle/c", "holder": admission.holder})
    assert held is not None and held["free_at"] == 0.0
    # Free again for the next admission, without waiting for any lease.
    again = await limiter.try_admit(capacity)
    assert isinstance(again, Admission) and again.concurrency_slot == admission.concurrency_slot
    await again.release()
    await client.close()


async def test_a_second_request_of_an_item_never_waits_on_its_own_unwritten_stamp(
    mongo_url: str,
) -> None:
    """With one rate slot, a retry under the same admission needs the slot its first request
    used: the first stamp is written before the wait, so the retry leaves one period after
    the first request, not after the 30 s lock of an unstamped slot."""
    client: AsyncMongoClient[dict[str, Any]] = AsyncMongoClient(mongo_url)
    limiter = CapacityLimiter(Stores.over(client["aml_capacity"]), rate_margin_seconds=0.05)
    capacity = Capacity(key="v-retry", max_concurrency=1, max_rps=1.0)
    admission = await limiter.try_admit(capacity)
    assert isinstance(admission, Admission)
    departures = []
    for _ in range(2):
        async with admission.request() as departure:
            await departure.trace("http11.send_request_headers.started", {})
            assert departure.at is not None
            departures.append(departure.at)
    await admission.release()
    await client.close()
    assert 1.0 <= departures[1] - departures[0] < 5.0


async def test_the_next_items_rate_slot_is_waited_for_only_within_patience(
    mongo_url: str,
) -> None:
    """A busy lane's admission serves its next item once the next rate slot frees, if that is
    within its patience, keeping its concurrency slot; a wait beyond it gives up at once."""
    client: AsyncMongoClient[dict[str, Any]] = AsyncMongoClient(mongo_url)
    limiter = CapacityLimiter(Stores.over(client["aml_capacity"]), rate_margin_seconds=0.0)
    capacity = Capacity(key="v-patient", max_concurrency=1, max_rps=4.0)
    admission = await limiter.try_admit(capacity)
    assert isinstance(admission, Admission)
    departures = []
    for served in range(8):
        if served:
            assert await admission.next_rate_slot(patience=1.5)
        async with admission.request() as departure:
            await departure.trace("http11.send_request_headers.started", {})
            assert departure.at is not None
            departures.append(departure.at)
    # Four slots a second: each of the second four waited for a slot of the first four.
    assert all(departures[i + 4] - departures[i] >= 1.0 for i in range(4))
    assert departures[7] - departures[0] < 1.5
    # The next slot frees more than 0.1 s from now: no wait, no slot, the stamps written.
    assert not await admission.next_rate_slot(patience=0.1)
    assert admission.rate_slot is None
    await admission.release()
    # The concurrency slot was held throughout (one admission); free now for the next one.
    assert await limiter.try_admit(capacity) == Refused("rate")
    await client.close()


async def test_the_next_rate_slot_is_reserved_in_one_command_and_given_back_as_it_was(
    mongo_url: str,
) -> None:
    """A busy lane reserves the key's first slot to free (one command, however far within its
    patience the slot frees) and sends no earlier than that; a reservation released unused
    leaves the slot free when it was, never earlier, so no request can leave early."""
    commands = _Commands()
    client: AsyncMongoClient[dict[str, Any]] = AsyncMongoClient(
        mongo_url, event_listeners=[commands]
    )
    db = client["aml_capacity"]
    limiter = CapacityLimiter(Stores.over(db), rate_margin_seconds=0.0)
    # Two at once, so that the refusal below is the rate's (one rate slot).
    capacity = Capacity(key="v-reserve", max_concurrency=2, max_rps=1.0)
    admission = await limiter.try_admit(capacity)
    assert isinstance(admission, Admission)
    async with admission.request() as departure:
        await departure.trace("http11.send_request_headers.started", {})
    assert departure.at is not None
    # The only slot is stamped (written because it frees within the patience), then reserved.
    commands.recording = True
    assert await admission.next_rate_slot(patience=1.5)
    commands.recording = False
    assert commands.sent == ["update", "findAndModify"]
    assert time.time() >= departure.at + 1.0
    await admission.release(notify=False)
    # Reserved ahead of its time and given back unused: free at the stamp, not at the release.
    second = await limiter.try_admit(capacity)
    assert isinstance(second, Admission)
    async with second.request() as later:
        await later.trace("http11.send_request_headers.started", {})
    assert later.at is not None
    commands.sent.clear()
    commands.recording = True
    waiting = asyncio.create_task(second.next_rate_slot(patience=1.5))
    await asyncio.sleep(0.2)
    assert commands.sent == ["update", "findAndModify"]  # reserved, now waiting for its time
    assert not waiting.done()
    # Meanwhile the key's admissions are refused here without a command.
    assert await limiter.try_admit(capacity) == Refused("rate")
    assert commands.sent == ["update", "findAndModify"]
    waiting.cancel()
    with pytest.raises(asyncio.CancelledError):
        await waiting
    commands.recording = False
    await second.release(notify=False)
    slot = await db.capacity_slots.find_one({"pool": "v-reserve/r"})
    assert slot is not None and slot["free_at"] == pytest.approx(later.at + 1.0)
    await client.close()


async def test_a_key_held_here_in_full_is_refused_without_a_command(mongo_url: str) -> None:
    """With every concurrency slot of a key held by this process, an admission is refused
    without asking the database (only a release here can free one, and it is announced); once
    one is released, the next admission is the database's again."""
    commands = _Commands()
    client: AsyncMongoClient[dict[str, Any]] = AsyncMongoClient(
        mongo_url, event_listeners=[commands]
    )
    limiter = CapacityLimiter(Stores.over(client["aml_capacity"]))
    capacity = Capacity(key="v-held-here", max_concurrency=2, max_rps=1000)
    held = [await limiter.try_admit(capacity) for _ in range(2)]
    assert all(isinstance(admission, Admission) for admission in held)
    commands.recording = True
    assert await limiter.try_admit(capacity) == Refused("concurrency")
    assert commands.sent == []
    first = held[0]
    assert isinstance(first, Admission)
    await first.release(notify=False)
    again = await limiter.try_admit(capacity)
    assert isinstance(again, Admission)
    assert "findAndModify" in commands.sent
    for admission in (again, held[1]):
        assert isinstance(admission, Admission)
        await admission.release(notify=False)
    await client.close()


async def test_an_admission_reserves_its_rate_slot_ahead_within_the_patience(
    mongo_url: str,
) -> None:
    """A limiter with patience admits under the key's first rate slot to free within it, says
    how long until it is free, and lets no request leave before then; one without patience
    refuses the same slot. A reservation released unused frees the slot when it was free."""
    client: AsyncMongoClient[dict[str, Any]] = AsyncMongoClient(mongo_url)
    db = client["aml_capacity"]
    patient = CapacityLimiter(Stores.over(db), rate_margin_seconds=0.0, rate_patience_seconds=1.5)
    capacity = Capacity(key="v-ahead", max_concurrency=3, max_rps=1.0)
    first = await patient.try_admit(capacity)
    assert isinstance(first, Admission)
    assert first.rate_wait() == 0.0
    async with first.request() as departure:
        await departure.trace("http11.send_request_headers.started", {})
    assert departure.at is not None
    await first.release(notify=False)
    # The only slot frees one period after that departure: not now, but within the patience.
    assert await CapacityLimiter(Stores.over(db)).try_admit(capacity) == Refused("rate")
    second = await patient.try_admit(capacity)
    assert isinstance(second, Admission)
    assert 0.5 < second.rate_wait() <= 1.0
    async with second.request() as later:
        await later.trace("http11.send_request_headers.started", {})
    assert later.at is not None and later.at >= departure.at + 1.0
    await second.release(notify=False)
    # Reserved ahead and given back unused: free when it was, not at the release.
    third = await patient.try_admit(capacity)
    assert isinstance(third, Admission)
    waited = third.rate_wait()
    assert waited > 0.5
    await third.release(notify=False)
    slot = await db.capacity_slots.find_one({"pool": "v-ahead/r"})
    assert slot is not None and slot["free_at"] == pytest.approx(later.at + 1.0)
    await client.close()


async def test_a_lane_polls_seldom_for_a_key_its_process_holds(mongo_url: str) -> None:
    """A refused concurrency slot is waited for by announcement; the poll that covers a lost one
    is frequent only while this process holds none of the key (its own release announces)."""
    client: AsyncMongoClient[dict[str, Any]] = AsyncMongoClient(mongo_url)
    limiter = CapacityLimiter(Stores.over(client["aml_capacity"]))
    capacity = Capacity(key="v-poll", max_concurrency=2)
    assert await limiter.wait_hint(capacity, "concurrency") <= 1.0
    admission = await limiter.try_admit(capacity)
    assert isinstance(admission, Admission)
    assert await limiter.wait_hint(capacity, "concurrency") >= 2.0
    await admission.release(notify=False)
    assert await limiter.wait_hint(capacity, "concurrency") <= 1.0
    await client.close()
