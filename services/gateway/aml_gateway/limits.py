"""Brakes on what a client can make the gateway do (issue 15): a cap on request bodies, enforced
before they are read, and per-address token buckets for access requests and failed
authentications, kept in MongoDB (`aml_runtime.stores.limits`) so that they hold for every
gateway replica together (issue 34). Everything is held on the app (`Services.limits`, the
middleware instance); nothing is module-level state."""

from __future__ import annotations

import ipaddress
import json
import math
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

import structlog
from fastapi import HTTPException
from pymongo.errors import PyMongoError
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from aml_gateway.refusals import QuotaExceeded
from aml_gateway.settings import GatewaySettings
from aml_runtime.stores.limits import LimitStore

log = structlog.get_logger()


class BodyTooLarge(HTTPException):
    """Raised from `receive` when a streamed body passes the cap; answered 413 (FastAPI
    re-raises HTTP errors met while reading a body, the app's handler shapes it)."""

    def __init__(self, limit: int) -> None:
        super().__init__(413, {"reason": _too_large(limit)}, headers={"Connection": "close"})


def _too_large(limit: int) -> str:
    return f"the request body is larger than {limit} bytes"


class BodyLimit:
    """Pure ASGI middleware: a declared Content-Length above `max_bytes` is answered 413 before
    any of the body is read; a body without one (chunked) is counted as it arrives and refused
    as soon as it passes the cap, so at most `max_bytes` (plus one network read) is ever held."""

    def __init__(self, app: ASGIApp, max_bytes: int) -> None:
        self.app = app
        self.max_bytes = max_bytes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        declared = _content_length(scope)
        if declared is not None and declared > self.max_bytes:
            await self._refuse(send)
            return
        received = 0
        started = False

        async def limited() -> Message:
            nonlocal received
            message = await receive()
            if message["type"] == "http.request":
                received += len(message.get("body", b""))
                if received > self.max_bytes:
                    raise BodyTooLarge(self.max_bytes)
            return message

        async def tracked(message: Message) -> None:
            nonlocal started
            if message["type"] == "http.response.start":
                started = True
            await send(message)

        try:
            await self.app(scope, limited, tracked)
        except BodyTooLarge:
            # Read outside a route (no handler shaped it): answered here if nothing was sent.
            if started:
                raise
            await self._refuse(send)

    async def _refuse(self, send: Send) -> None:
        body = json.dumps({"detail": {"reason": _too_large(self.max_bytes)}}).encode()
        await send(
            {
                "type": "http.response.start",
                "status": 413,
                "headers": [
                    (b"content-type", b"application/json"),
                    (b"content-length", str(len(body)).encode()),
                    # The unread rest of the body makes the connection unusable.
                    (b"connection", b"close"),
                ],
            }
        )
        await send({"type": "http.response.body", "body": body})


def _content_length(scope: Scope) -> int | None:
    for name, value in scope.get("headers", []):
        if name == b"content-length":
            try:
                return int(value)
            except ValueError:
                return None  # the server refuses a malformed length itself
    return None


@dataclass
class _Bucket:
    tokens: float
    at: float


class RateLimiter:
    """Token buckets per client address: `burst` at once, earned back at `per_second`. At most
    `max_clients` addresses are remembered; the one seen least recently is forgotten first (a
    forgotten address starts again with a full bucket)."""

    def __init__(
        self,
        burst: int,
        per_second: float,
        max_clients: int,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.burst = burst
        self.per_second = per_second
        self.max_clients = max_clients
        self.clock = clock
        self._buckets: OrderedDict[str, _Bucket] = OrderedDict()

    def __len__(self) -> int:
        return len(self._buckets)

    def _bucket(self, client: str) -> _Bucket:
        at = self.clock()
        bucket = self._buckets.get(client)
        if bucket is None:
            bucket = _Bucket(float(self.burst), at)
            self._buckets[client] = bucket
            while len(self._buckets) > self.max_clients:
                self._buckets.popitem(last=False)
        else:
            self._buckets.move_to_end(client)
            earned = (at - bucket.at) * self.per_second
            bucket.tokens = min(float(self.burst), bucket.tokens + earned)
            bucket.at = at
        return bucket

    def wait(self, client: str) -> float | None:
        """Seconds until `client` has a token again, or None when it has one now."""
        bucket = self._bucket(client)
        if bucket.tokens >= 1:
            return None
        return (1 - bucket.tokens) / self.per_second

    def take(self, client: str) -> float | None:
        """Take a token: None when taken, else the seconds until one is there."""
        waiting = self.wait(client)
        if waiting is None:
            self._buckets[client].tokens -= 1
        return waiting


class LimitUnavailable(HTTPException):
    """The shared bucket of a limit that fails closed could not be read or changed: answered
    503 with Retry-After, never let through unlimited."""

    def __init__(self, what: str) -> None:
        super().__init__(
            503,
            {"reason": f"the limit on {what} cannot be checked now; retry shortly"},
            headers={"Retry-After": str(UNAVAILABLE_RETRY_SECONDS)},
        )


# What a refused caller is told to wait while the limits' store does not answer.
UNAVAILABLE_RETRY_SECONDS = 5


class SharedRateLimiter:
    """`RateLimiter`'s token buckets (`burst` at once, earned back at `per_second`), kept in
    the `rate_limits` collection, so every gateway replica takes from the same bucket: the
    declared limit holds for all of them together. Time is the wall clock (`clock`, epoch
    seconds), the one the replicas share; their skew shifts a refill by as much, never the
    number of tokens.

    A token is taken with two atomic operations (`LimitStore.catch_up`, `LimitStore.take`),
    exact under any concurrency: of simultaneous takes from any replicas, at most the tokens
    the bucket holds succeed. The one per-process fast path is a refusal: an address found
    empty until some moment stays empty until then (the stored moment only grows), so it is
    refused again without a round trip, which keeps a flood from one address off the database
    and cannot let more through than the store would.

    Where the store does not answer, a limiter that `fails_closed` refuses (`LimitUnavailable`,
    503); one that does not falls back to a per-process `RateLimiter` with the same settings,
    which bounds each replica alone (N replicas: at most N times the limit) for as long as the
    store is away."""

    def __init__(
        self,
        store: LimitStore,
        name: str,
        burst: int,
        per_second: float,
        max_clients: int,
        *,
        fails_closed: bool,
        what: str,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.store = store
        self.name = name
        self.burst = burst
        self.period = 1 / per_second
        self.fails_closed = fails_closed
        self.what = what
        self.clock = clock
        self.fallback = RateLimiter(burst, per_second, max_clients)
        self.max_clients = max_clients
        # Address -> the epoch second until which it is known to have no token.
        self._empty_until: OrderedDict[str, float] = OrderedDict()

    def _key(self, client: str) -> str:
        return f"{self.name}/{client}"

    def _expires(self, now: float) -> datetime:
        # No later than the bucket can be full again after a take at `now`.
        return datetime.fromtimestamp(now + self.burst * self.period, UTC)

    def _known_empty(self, client: str, now: float) -> float | None:
        until = self._empty_until.get(client)
        if until is None:
            return None
        if until <= now:
            del self._empty_until[client]
            return None
        return until - now

    def _waiting(self, client: str, tat: float | None, now: float) -> float | None:
        """Seconds until a bucket at `tat` has a token (None: it has one), remembered when
        positive."""
        if tat is None:
            return None
        waiting = tat - now - (self.burst - 1) * self.period
        if waiting <= 0:
            return None
        self._empty_until[client] = now + waiting
        self._empty_until.move_to_end(client)
        while len(self._empty_until) > self.max_clients:
            self._empty_until.popitem(last=False)
        return waiting

    def _unavailable(self, error: PyMongoError) -> None:
        # The address stays out of the log; the error's class says what failed.
        log.warning(
            "rate_limit_store_unavailable",
            limit=self.name,
            error=type(error).__name__,
            fails_closed=self.fails_closed,
        )
        if self.fails_closed:
            raise LimitUnavailable(self.what) from error

    async def wait(self, client: str) -> float | None:
        """Seconds until `client` has a token again, or None when it has one now."""
        now = self.clock()
        known = self._known_empty(client, now)
        if known is not None:
            return known
        try:
            tat = await self.store.bucket(self._key(client))
        except PyMongoError as error:
            self._unavailable(error)
            return self.fallback.wait(client)
        return self._waiting(client, tat, now)

    async def take(self, client: str) -> float | None:
        """Take a token: None when taken, else the seconds until one is there."""
        now = self.clock()
        known = self._known_empty(client, now)
        if known is not None:
            return known
        key = self._key(client)
        expires = self._expires(now)
        at_most = now + (self.burst - 1) * self.period
        try:
            tat = await self.store.catch_up(key, now, expires)
            if tat <= at_most:
                taken = await self.store.take(key, at_most, self.period, expires)
                if taken is not None:
                    # The last token taken: the next caller is refused without a round trip.
                    self._waiting(client, taken, now)
                    return None
                # Another replica took the last token in between: read how long it lasts.
                tat = await self.store.bucket(key) or now
        except PyMongoError as error:
            self._unavailable(error)
            return self.fallback.take(client)
        return self._waiting(client, tat, now) or self.period


@dataclass
class Limits:
    access_request_rate: SharedRateLimiter
    auth_failures: SharedRateLimiter

    @classmethod
    def from_settings(cls, settings: GatewaySettings, store: LimitStore) -> Limits:
        return cls(
            # Access requests fall back to per-process buckets: storing one needs the database
            # anyway, and a brief outage of the limits alone should not turn applicants away.
            access_request_rate=SharedRateLimiter(
                store,
                "access_requests",
                settings.access_request_burst,
                settings.access_requests_per_hour / 3600,
                settings.rate_limit_addresses,
                fails_closed=False,
                what="access requests",
            ),
            # Failed authentications fail closed: every authenticated route needs the database
            # anyway, and an outage must never be a window for guessing keys or the admin token
            # at N times the limit.
            auth_failures=SharedRateLimiter(
                store,
                "auth_failures",
                settings.auth_failure_burst,
                settings.auth_failures_per_minute / 60,
                settings.rate_limit_addresses,
                fails_closed=True,
                what="failed authentications",
            ),
        )


def client_address(scope: Scope) -> str:
    """The address a limit is kept for: the peer uvicorn reports (the forwarded client when
    its `--forwarded-allow-ips` trusts the proxy); an IPv6 client by its /64, which one host
    usually holds whole."""
    client = scope.get("client")
    host = client[0] if client else ""
    try:
        address = ipaddress.ip_address(host)
    except ValueError:
        return host
    if isinstance(address, ipaddress.IPv6Address):
        if address.ipv4_mapped is not None:
            return str(address.ipv4_mapped)
        return str(ipaddress.IPv6Network(f"{address}/64", strict=False))
    return str(address)


def too_many(waiting: float, what: str, now: datetime) -> QuotaExceeded:
    """A refusal answered like a quota's: 429 with Retry-After and `next_allowed_at`."""
    seconds = max(1, math.ceil(waiting))
    return QuotaExceeded(
        f"too many {what} from this address; retry in {seconds} s",
        next_allowed_at=now + timedelta(seconds=seconds),
        judged_at=now,
    )
