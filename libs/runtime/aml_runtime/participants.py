"""The one client for calling a participant's memory system (SPEC R-4.2 - R-4.10).

Every call sends a body built once by the caller, byte for byte the same on every attempt; the
retry table is R-4.10's; each attempt is reported to an observer so it lands in the audit trail.
Responses are validated against the contract and never repaired: an invalid one is a contract
violation with a precise reason.
"""

from __future__ import annotations

import asyncio
import contextlib
import email.utils
import json
import random
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from datetime import UTC, datetime
from typing import Any, Literal

import httpx
from pydantic import BaseModel, SecretStr, ValidationError

from aml_contract.api import AuthMethod
from aml_contract.participant import AddAccepted, AddResponse, SearchItem, SearchResponse
from aml_runtime.capacity import Admission, Capacity, CapacityLimiter, Departure
from aml_runtime.settings import ParticipantCallSettings
from aml_runtime.telemetry import stage_span
from aml_runtime.urlsafety import SafeTransport, UnsafeUrl

Failure = Literal[
    "contract_error",
    "authentication_error",
    "access_denied",
    "wrong_url",
    "participant_outage",
    "run_limit_reached",
]

ADD_RETRYABLE = frozenset({408, 409, 425, 429, 500, 502, 503, 504, 524})
SEARCH_RETRYABLE = frozenset({408, 425, 429, 500, 502, 503, 504})
_FINAL: dict[int, tuple[Failure, str]] = {
    400: ("contract_error", "the participant rejected the request as malformed (HTTP 400)"),
    422: ("contract_error", "the participant rejected the request as invalid (HTTP 422)"),
    401: ("authentication_error", "the participant rejected the credentials (HTTP 401)"),
    403: ("access_denied", "the participant denied access (HTTP 403)"),
    404: ("wrong_url", "the endpoint URL does not exist (HTTP 404)"),
}


class Endpoint(BaseModel):
    add_url: str
    search_url: str
    health_url: str
    add_status_url_template: str | None = None
    auth_method: AuthMethod
    secret: SecretStr | None = None
    # Declared capacity, shared by every replica calling this participant.
    capacity: Capacity | None = None
    # Declared run limit: at most this many requests per run, counted per `run_key`
    # (the job) across every replica.
    run_key: str | None = None
    max_requests: int | None = None


class Attempt(BaseModel):
    """One HTTP exchange, as the audit trail keeps it (R-7.3)."""

    operation: Literal["add", "add_status", "search", "health"]
    attempt: int
    started_at: datetime
    # The participant's time only: request sent -> response received (or the error).
    latency_ms: float
    # The platform's own wait for the participant's capacity before this attempt (R-7.3 keeps
    # it apart so a participant is never charged for AML's queueing).
    queued_ms: float = 0.0
    status: int | None
    error_class: str | None
    outcome: Literal["ok", "retry", "final"]


class CallFailed(Exception):
    def __init__(self, kind: Failure, reason: str) -> None:
        super().__init__(reason)
        self.kind = kind
        self.reason = reason


class RetryPolicy(BaseModel):
    max_attempts: int = 5
    backoff_base_seconds: float = 0.5
    backoff_max_seconds: float = 30.0
    # A participant's Retry-After is honoured up to this long: past it, a worker would sit idle
    # for the participant's say-so, and the bounded attempts end the call sooner anyway.
    retry_after_max_seconds: float = 600.0

    def delay(self, attempt: int, retry_after: float | None) -> float:
        """Exponential backoff with full jitter; a server's Retry-After wins when it is longer."""
        ceiling = min(self.backoff_max_seconds, self.backoff_base_seconds * 2 ** (attempt - 1))
        backoff = random.uniform(0, ceiling)
        if retry_after is None:
            return backoff
        return max(backoff, min(retry_after, self.retry_after_max_seconds))


Observer = Callable[[Attempt], Awaitable[None]]


def auth_headers(method: AuthMethod, secret: SecretStr | None) -> dict[str, str]:
    if method == "none" or secret is None:
        return {}
    key = secret.get_secret_value()
    if method == "token":
        return {"Authorization": f"Token {key}"}
    if method == "bearer":
        return {"Authorization": f"Bearer {key}"}
    return {"X-Api-Key": key}


def parse_retry_after(value: str | None, now: datetime | None = None) -> float | None:
    """Retry-After as delta-seconds or an HTTP-date (RFC 9110 10.2.3)."""
    if not value:
        return None
    value = value.strip()
    if value.isascii() and value.isdigit():
        return float(value)
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError, IndexError):
        return None
    if when.tzinfo is None:
        # The asctime and "-0000" forms carry no zone; HTTP dates are always GMT.
        when = when.replace(tzinfo=UTC)
    return max(0.0, (when - (now or datetime.now(UTC))).total_seconds())


def validate_add_response(payload: Any, request_id: str, user_id: str, session_id: str) -> None:
    if not isinstance(payload, dict):
        raise CallFailed("contract_error", "add response: body must be a JSON object")
    try:
        response = AddResponse.model_validate(payload)
    except ValidationError as exc:
        raise CallFailed("contract_error", f"add response: {_first_error(exc)}") from None
    if response.success is not True:
        raise CallFailed("contract_error", "add response: success must be true")
    expected = {"request_id": request_id, "user_id": user_id, "session_id": session_id}
    for field, value in expected.items():
        if getattr(response, field) != value:
            raise CallFailed("contract_error", f"add response: {field} must echo the request's")


def validate_search_response(payload: Any, top_k: int) -> list[SearchItem]:
    if isinstance(payload, list):
        raise CallFailed("contract_error", "search response: a top-level array is not allowed")
    if not isinstance(payload, dict):
        raise CallFailed("contract_error", "search response: body must be a JSON object")
    if "data" not in payload:
        wrapper = " (an `items` wrapper is not allowed)" if "items" in payload else ""
        raise CallFailed("contract_error", f"search response: `data` is missing{wrapper}")
    if not isinstance(payload["data"], list):
        raise CallFailed("contract_error", "search response: `data` must be an array")
    if len(payload["data"]) > top_k:
        raise CallFailed(
            "contract_error",
            f"search response: {len(payload['data'])} items exceed top_k={top_k}",
        )
    try:
        return SearchResponse.model_validate(payload).data
    except ValidationError as exc:
        raise CallFailed("contract_error", f"search response: {_first_error(exc)}") from None


def _first_error(exc: ValidationError) -> str:
    error = exc.errors()[0]
    loc = list(error["loc"])
    if len(loc) >= 2 and loc[0] == "data" and isinstance(loc[1], int):
        # Items are numbered from 1 for people reading the error summary.
        where = f"item {loc[1] + 1}: " + ".".join(str(part) for part in loc[2:])
    else:
        where = ".".join(str(part) for part in loc)
    return f"{where}: {error['msg']}" if where else str(error["msg"])


class ParticipantClient:
    def __init__(
        self,
        http: httpx.AsyncClient,
        policy: RetryPolicy,
        timeout: float,
        limiter: CapacityLimiter | None = None,
    ) -> None:
        self._http = http
        self._policy = policy
        self._timeout = timeout
        self._limiter = limiter

    @contextlib.asynccontextmanager
    async def _exchange(
        self, endpoint: Endpoint, admission: Admission | None
    ) -> AsyncIterator[Departure]:
        """One HTTP exchange: it counts against the run's declared request limit and leaves
        under the participant's declared capacity. A work item's `admission` already holds a
        concurrency slot (and the rate slot of its first request); without one (a direct
        caller) the exchange is admitted on its own and waits for it."""
        if self._limiter is None:
            yield Departure()
            return
        if endpoint.run_key is not None and endpoint.max_requests is not None:
            spent = await self._limiter.spend(endpoint.run_key)
            if spent > endpoint.max_requests:
                raise CallFailed(
                    "run_limit_reached",
                    f"the run reached its declared limit of {endpoint.max_requests} requests",
                )
        if endpoint.capacity is None:
            yield Departure()
            return
        own = admission is None
        held = admission or await self._limiter.admit(endpoint.capacity)
        try:
            async with held.request() as departure:
                yield departure
        finally:
            if own:
                await held.release()

    @classmethod
    def from_settings(
        cls, settings: ParticipantCallSettings, limiter: CapacityLimiter | None = None
    ) -> ParticipantClient:
        # Redirects are never followed: a participant must not steer AML to another target.
        # Every connection goes through the checks, health checks and status polls too.
        http = httpx.AsyncClient(
            transport=SafeTransport(allow_loopback=settings.allow_loopback_targets),
            follow_redirects=False,
        )
        policy = RetryPolicy(
            max_attempts=settings.participant_max_attempts,
            backoff_base_seconds=settings.participant_backoff_base_seconds,
            backoff_max_seconds=settings.participant_backoff_max_seconds,
        )
        return cls(http, policy, settings.participant_timeout_seconds, limiter)

    async def aclose(self) -> None:
        await self._http.aclose()

    async def add(
        self,
        endpoint: Endpoint,
        body: bytes,
        ids: tuple[str, str, str],
        observe: Observer,
        admission: Admission | None = None,
    ) -> None:
        """Write one chunk; returns once the participant confirmed it persisted (R-4.6)."""
        request_id, user_id, session_id = ids
        response = await self._send(
            "add", endpoint.add_url, endpoint, body, ADD_RETRYABLE, observe, admission
        )
        payload = _json(response, "add")
        if response.status_code == 202:
            if not endpoint.add_status_url_template:
                raise CallFailed(
                    "contract_error", "add returned 202 but the version has no Add-status URL"
                )
            try:
                task = AddAccepted.model_validate(payload)
            except ValidationError:
                raise CallFailed("contract_error", "add 202 response: task_id missing") from None
            payload = await self._poll(endpoint, task.task_id, observe, admission)
        validate_add_response(payload, request_id, user_id, session_id)

    async def search(
        self,
        endpoint: Endpoint,
        body: bytes,
        top_k: int,
        observe: Observer,
        admission: Admission | None = None,
    ) -> list[SearchItem]:
        url = endpoint.search_url
        response = await self._send(
            "search", url, endpoint, body, SEARCH_RETRYABLE, observe, admission
        )
        if response.status_code != 200:
            raise CallFailed(
                "contract_error", f"search: expected HTTP 200, got {response.status_code}"
            )
        return validate_search_response(_json(response, "search"), top_k)

    async def health(self, endpoint: Endpoint) -> bool:
        try:
            response = await self._http.get(endpoint.health_url, timeout=10.0)
        except (httpx.HTTPError, UnsafeUrl):
            return False
        return 200 <= response.status_code < 300

    async def _poll(
        self, endpoint: Endpoint, task_id: str, observe: Observer, admission: Admission | None
    ) -> Any:
        template = endpoint.add_status_url_template or ""
        url = template.replace("{task_id}", task_id)
        # A task may take as long as one Add request may; after that it is an outage.
        deadline = time.monotonic() + self._timeout
        attempt = 0
        while True:
            attempt += 1
            if time.monotonic() > deadline:
                raise CallFailed(
                    "participant_outage",
                    f"add task {task_id} not finished within {self._timeout:.0f}s",
                )
            timing = _Timing()
            try:
                async with self._exchange(endpoint, admission) as departure:
                    timing.sent()
                    response = await self._http.get(
                        url,
                        headers=auth_headers(endpoint.auth_method, endpoint.secret),
                        timeout=self._timeout,
                        extensions={"trace": departure.trace},
                    )
            except UnsafeUrl as exc:
                await observe(timing.attempt("add_status", attempt, None, exc, "final"))
                raise CallFailed("wrong_url", f"add status: {exc.reason}") from None
            except httpx.HTTPError as exc:
                await observe(timing.attempt("add_status", attempt, None, exc, "retry"))
                await asyncio.sleep(self._policy.delay(min(attempt, 8), None))
                continue
            status = response.status_code
            if status in _FINAL:
                # R-4.10's final statuses do not heal by polling on until the deadline.
                await observe(timing.attempt("add_status", attempt, status, None, "final"))
                kind, reason = _FINAL[status]
                raise CallFailed(kind, f"add status: {reason}")
            outcome: Literal["ok", "retry"] = "ok" if status == 200 else "retry"
            await observe(timing.attempt("add_status", attempt, status, None, outcome))
            if status == 200:
                payload = _json(response, "add status")
                state = payload.get("status") if isinstance(payload, dict) else None
                if state in {"done", "completed", "succeeded", "success"}:
                    return payload.get("result", payload)
                if state in {"failed", "error"}:
                    raise CallFailed("contract_error", f"add task {task_id} failed: {payload}")
            await asyncio.sleep(self._policy.delay(min(attempt, 8), None))

    async def _send(
        self,
        operation: Literal["add", "search"],
        url: str,
        endpoint: Endpoint,
        body: bytes,
        retryable: frozenset[int],
        observe: Observer,
        admission: Admission | None,
    ) -> httpx.Response:
        headers = {"Content-Type": "application/json"} | auth_headers(
            endpoint.auth_method, endpoint.secret
        )
        last = ""
        for attempt in range(1, self._policy.max_attempts + 1):
            timing = _Timing()
            retry_after: float | None = None
            # A retryable failure is audited as "final" on the last attempt: none follows it.
            again: Literal["retry", "final"] = (
                "retry" if attempt < self._policy.max_attempts else "final"
            )
            try:
                span = stage_span(
                    f"participant.{operation}", attempt=attempt, participant_call=True
                )
                async with self._exchange(endpoint, admission) as departure:
                    timing.sent()
                    with span as current:
                        try:
                            response = await self._http.post(
                                url,
                                content=body,
                                headers=headers,
                                timeout=self._timeout,
                                extensions={"trace": departure.trace},
                            )
                        except httpx.HTTPError as exc:
                            current.set_attribute("error.type", type(exc).__name__)
                            raise
                        current.set_attribute("http.response.status_code", response.status_code)
            except UnsafeUrl as exc:
                # A refused target will not become safe by retrying.
                await observe(timing.attempt(operation, attempt, None, exc, "final"))
                raise CallFailed("wrong_url", f"{operation}: {exc.reason}") from None
            except httpx.HTTPError as exc:
                await observe(timing.attempt(operation, attempt, None, exc, again))
                last = f"network error: {type(exc).__name__}"
            else:
                status = response.status_code
                if status in (200, 202) and not (operation == "search" and status == 202):
                    await observe(timing.attempt(operation, attempt, status, None, "ok"))
                    return response
                if status in _FINAL:
                    await observe(timing.attempt(operation, attempt, status, None, "final"))
                    kind, reason = _FINAL[status]
                    raise CallFailed(kind, f"{operation}: {reason}")
                if status not in retryable:
                    await observe(timing.attempt(operation, attempt, status, None, "final"))
                    raise CallFailed("contract_error", f"{operation}: unexpected HTTP {status}")
                await observe(timing.attempt(operation, attempt, status, None, again))
                last = f"HTTP {status}"
                retry_after = parse_retry_after(response.headers.get("Retry-After"))
            if attempt < self._policy.max_attempts:
                await asyncio.sleep(self._policy.delay(attempt, retry_after))
        raise CallFailed(
            "participant_outage",
            f"{operation}: no success after {self._policy.max_attempts} attempts (last: {last})",
        )


def _json(response: httpx.Response, what: str) -> Any:
    try:
        return json.loads(response.content)
    except ValueError:
        raise CallFailed("contract_error", f"{what} response: body is not valid JSON") from None


class _Timing:
    """When an attempt began waiting for capacity, and when its request was sent."""

    def __init__(self) -> None:
        self.queued_from = time.monotonic()
        self.started = datetime.now(UTC)
        self.t0: float | None = None

    def sent(self) -> None:
        self.started, self.t0 = datetime.now(UTC), time.monotonic()

    def attempt(
        self,
        operation: Literal["add", "add_status", "search", "health"],
        attempt: int,
        status: int | None,
        error: Exception | None,
        outcome: Literal["ok", "retry", "final"],
    ) -> Attempt:
        end = time.monotonic()
        sent = self.t0 if self.t0 is not None else end
        return Attempt(
            operation=operation,
            attempt=attempt,
            started_at=self.started,
            latency_ms=round((end - sent) * 1000, 3),
            queued_ms=round((sent - self.queued_from) * 1000, 3),
            status=status,
            error_class=type(error).__name__ if error else None,
            outcome=outcome,
        )
