"""Declared capacity (R-4.12) held by slots in the nx-27017 MongoDB wire server across several
independent clients, as replicas would be."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import pytest
from pymongo import AsyncMongoClient

from aml_runtime.capacity import CapacityLimiter

pytestmark = pytest.mark.integration


async def _drive(
    mongo_url: str, key: str, replicas: int, calls: int, max_concurrency: int, max_rps: float
) -> tuple[int, list[float]]:
    clients: list[AsyncMongoClient[dict[str, Any]]] = [
        AsyncMongoClient(mongo_url) for _ in range(replicas)
    ]
    limiters = [CapacityLimiter(client["aml_capacity"]) for client in clients]
    in_flight = peak = 0
    starts: list[float] = []

    async def call(limiter: CapacityLimiter) -> None:
        nonlocal in_flight, peak
        async with limiter.slot(key, max_concurrency, max_rps):
            in_flight += 1
            peak = max(peak, in_flight)
            starts.append(time.monotonic())
            await asyncio.sleep(0.05)
            in_flight -= 1

    await asyncio.gather(*(call(limiters[i % replicas]) for i in range(calls)))
    for client in clients:
        await client.close()
    return peak, sorted(starts)


async def test_concurrency_never_exceeds_the_declared_limit(mongo_url: str) -> None:
    peak, starts = await _drive(mongo_url, "v-conc", 4, 24, max_concurrency=3, max_rps=1000)
    assert len(starts) == 24
    assert peak <= 3
    assert peak >= 2  # the limiter is not simply serialising everything


async def test_rate_never_exceeds_the_declared_limit(mongo_url: str) -> None:
    _, starts = await _drive(mongo_url, "v-rate", 4, 12, max_concurrency=50, max_rps=4)
    # Any one-second window holds at most 4 starts (less the scheduling delay between a slot's
    # write and this test noting the start, which a loaded 2-core machine can stretch).
    for first in starts:
        assert sum(1 for t in starts if first <= t < first + 0.9) <= 4
    assert starts[-1] - starts[0] >= 2.0  # 12 starts at 4/s need at least two seconds


async def test_fractional_rate(mongo_url: str) -> None:
    _, starts = await _drive(mongo_url, "v-slow", 2, 3, max_concurrency=5, max_rps=2.5)
    # ceil(2.5) = 3 slots, each reusable after 1.2 s: three starts can go at once.
    assert len(starts) == 3
