"""Brakes on what a client can make the gateway do (issue 15): a cap on request bodies, enforced
before they are read, and per-address token buckets for access requests and failed
authentications. Everything is held on the app (`Services.limits`, the middleware instance);
nothing is module-level state."""

from __future__ import annotations

import ipaddress
import json
import math
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timedelta

from fastapi import HTTPException
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from aml_gateway.refusals import QuotaExceeded
from aml_gateway.settings import GatewaySettings


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


@dataclass
class Limits:
    access_request_rate: RateLimiter
    auth_failures: RateLimiter

    @classmethod
    def from_settings(cls, settings: GatewaySettings) -> Limits:
        return cls(
            access_request_rate=RateLimiter(
                settings.access_request_burst,
                settings.access_requests_per_hour / 3600,
                settings.rate_limit_addresses,
            ),
            auth_failures=RateLimiter(
                settings.auth_failure_burst,
                settings.auth_failures_per_minute / 60,
                settings.rate_limit_addresses,
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
