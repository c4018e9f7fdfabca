"""The gateway's per-address token buckets and body cap (`aml_gateway.limits`), without a
server: refill, Retry-After, bounded memory, address keys; the shared buckets over the fake of
their store (two limiters on one store are two gateway replicas), and what each limit does
when the store does not answer."""

from __future__ import annotations

import asyncio
from typing import cast

import pytest
from fake_stores import MemoryLimitStore
from pymongo.errors import ServerSelectionTimeoutError
from starlette.types import Message

from aml_gateway.limits import (
    BodyLimit,
    LimitUnavailable,
    RateLimiter,
    SharedRateLimiter,
    client_address,
)
from aml_runtime.stores.limits import LimitStore


class Clock:
    def __init__(self) -> None:
        self.at = 0.0

    def __call__(self) -> float:
        return self.at


def test_a_burst_then_one_token_per_period() -> None:
    clock = Clock()
    limiter = RateLimiter(burst=3, per_second=0.5, max_clients=10, clock=clock)
    assert [limiter.take("a") for _ in range(3)] == [None, None, None]
    assert limiter.take("a") == 2.0  # one token every 2 s
    assert limiter.wait("b") is None  # another address is not affected
    clock.at = 1.0
    assert limiter.take("a") == 1.0
    clock.at = 2.0
    assert limiter.take("a") is None
    clock.at = 1000.0
    # Earned back up to the burst, never more.
    assert [limiter.take("a") for _ in range(4)][-1] is not None


def test_memory_is_bounded_by_forgetting_the_least_recently_seen() -> None:
    limiter = RateLimiter(burst=1, per_second=0.001, max_clients=100, clock=Clock())
    for n in range(100_000):
        limiter.take(f"10.0.{n // 256}.{n % 256}")
    assert len(limiter) == 100
    limiter.take("kept")
    for n in range(99):
        limiter.wait(f"other-{n}")
    limiter.wait("kept")  # seen again: moved to the recent end
    limiter.take("one-more")
    assert limiter.take("kept") is not None  # still remembered, still empty


def _shared(
    store: MemoryLimitStore, clock: Clock, fails_closed: bool = True, **changes: float
) -> SharedRateLimiter:
    return SharedRateLimiter(
        cast(LimitStore, store),
        "auth_failures",
        int(changes.get("burst", 3)),
        changes.get("per_second", 0.5),
        100,
        fails_closed=fails_closed,
        what="failed authentications",
        clock=clock,
    )


def test_a_shared_bucket_has_the_semantics_of_the_local_one() -> None:
    async def run() -> None:
        clock = Clock()
        clock.at = 1000.0
        limiter = _shared(MemoryLimitStore(), clock)
        assert [await limiter.take("a") for _ in range(3)] == [None, None, None]
        assert await limiter.take("a") == 2.0  # one token every 2 s
        assert await limiter.wait("a") == 2.0
        assert await limiter.wait("b") is None  # another address is not affected
        clock.at = 1001.0
        assert await limiter.take("a") == 1.0
        clock.at = 1002.0
        assert await limiter.wait("a") is None
        assert await limiter.take("a") is None
        clock.at = 3000.0
        # Earned back up to the burst, never more.
        taken = [await limiter.take("a") for _ in range(4)]
        assert taken[:3] == [None, None, None] and taken[3] is not None

    asyncio.run(run())


def test_two_replicas_share_one_bucket_even_when_they_take_at_once() -> None:
    async def run() -> None:
        clock = Clock()
        clock.at = 1000.0
        store = MemoryLimitStore()
        one, two = _shared(store, clock, burst=5), _shared(store, clock, burst=5)
        # Three failures on each: the sixth, on either replica, finds the bucket empty.
        assert [await one.take("a") for _ in range(3)] == [None, None, None]
        assert [await two.take("a") for _ in range(2)] == [None, None]
        assert await two.take("a") is not None
        assert await one.wait("a") is not None  # `one` learns it from the store
        # Twenty takes at once across both from a full bucket: five succeed.
        racing = [_shared(store, clock, burst=5) for _ in range(4)]
        taken = await asyncio.gather(*(racing[n % 4].take("c") for n in range(20)))
        assert taken.count(None) == 5

    asyncio.run(run())


class _Down(MemoryLimitStore):
    async def bucket(self, key: str) -> float | None:
        raise ServerSelectionTimeoutError("no server")

    async def catch_up(self, key: str, now: float, expires: object) -> float:  # type: ignore[override]
        raise ServerSelectionTimeoutError("no server")


def test_without_the_store_failed_auth_fails_closed_access_requests_per_process() -> None:
    async def run() -> None:
        clock = Clock()
        closed = _shared(_Down(), clock)
        with pytest.raises(LimitUnavailable) as refused:
            await closed.wait("a")
        assert refused.value.status_code == 503 and refused.value.headers
        with pytest.raises(LimitUnavailable):
            await closed.take("a")
        # Falls back to this process's bucket: still a limit, the same one per process.
        fallback = _shared(_Down(), clock, fails_closed=False)
        assert [await fallback.take("a") for _ in range(3)] == [None, None, None]
        assert await fallback.take("a") is not None

    asyncio.run(run())


def test_client_addresses() -> None:
    assert client_address({"client": ("192.0.2.7", 5)}) == "192.0.2.7"
    assert client_address({"client": ("2001:db8::1", 5)}) == "2001:db8::/64"
    assert client_address({"client": ("2001:db8::ffff:1", 5)}) == "2001:db8::/64"
    assert client_address({"client": ("::ffff:192.0.2.7", 5)}) == "192.0.2.7"
    assert client_address({"client": None}) == ""


def _run(limit: int, headers: list[tuple[bytes, bytes]], chunks: list[bytes]) -> list[Message]:
    """The middleware around an app that reads the whole body, then answers 200."""
    sent: list[Message] = []
    read: list[int] = []
    pending = [
        {"type": "http.request", "body": chunk, "more_body": i < len(chunks) - 1}
        for i, chunk in enumerate(chunks)
    ]

    async def receive() -> Message:
        return pending.pop(0)

    async def send(message: Message) -> None:
        sent.append(message)

    async def app(scope: object, receive: object, send: object) -> None:
        more = True
        while more:
            message = await receive()  # type: ignore[operator]
            read.append(len(message["body"]))
            more = message["more_body"]
        await send({"type": "http.response.start", "status": 200, "headers": []})  # type: ignore[operator]
        await send({"type": "http.response.body", "body": b""})  # type: ignore[operator]

    scope = {"type": "http", "method": "POST", "headers": headers}
    asyncio.run(BodyLimit(app, limit)(scope, receive, send))
    return sent


def test_the_body_cap() -> None:
    declared = _run(100, [(b"content-length", b"101")], [b"x" * 101])
    assert declared[0]["status"] == 413
    streamed = _run(100, [], [b"x" * 60, b"x" * 60, b"x" * 60])
    assert streamed[0]["status"] == 413
    assert _run(100, [(b"content-length", b"100")], [b"x" * 100])[0]["status"] == 200
    assert _run(100, [], [b"x" * 50, b"x" * 50])[0]["status"] == 200
