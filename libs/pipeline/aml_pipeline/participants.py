"""The one client for calling a participant's memory system (SPEC R-4.2 - R-4.10).

Every call sends a body built once by the caller, byte for byte the same on every attempt; the
retry table is R-4.10's; each attempt is reported to an observer so it lands in the audit trail.
Responses are validated against the contract and never repaired: an invalid one is a contract
violation with a precise reason.

Every answer is read as a stream, bounded by its operation's size limit (`MAX_RESPONSE_BYTES`,
counted after decompression) and by a total deadline per attempt on top of httpx's per-phase
timeouts, so a participant can neither grow a shared process nor hold a call by trickling bytes.
Anything a participant's bytes can make go wrong while reading, parsing, validating or building
the status URL is a contract violation (final, R-4.9), never a platform error.
"""

from __future__ import annotations

import asyncio
import contextlib
import email.utils
import json
import random
import time
import zlib
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, Literal
from urllib.parse import quote

import httpx
from pydantic import BaseModel, Field, SecretStr, ValidationError

from aml_contract.api.vocabulary import AuthMethod
from aml_contract.participant import (
    MAX_JSON_DEPTH,
    MAX_RESPONSE_BYTES,
    MAX_STORED_SEARCH_ITEMS_BYTES,
    AddAccepted,
    AddResponse,
    SearchItem,
    SearchResponse,
)
from aml_pipeline.capacity import Admission, Capacity, CapacityLimiter, Departure
from aml_pipeline.outages import OutageExpired, Outages
from aml_pipeline.urlsafety import SafeTransport, UnsafeUrl
from aml_runtime.documents import FailureKind
from aml_runtime.settings import ParticipantCallSettings
from aml_runtime.telemetry import stage_span

# The kinds a call to the participant fails with (all of them the participant's).
Failure = Literal[
    FailureKind.CONTRACT_ERROR,
    FailureKind.AUTHENTICATION_ERROR,
    FailureKind.ACCESS_DENIED,
    FailureKind.WRONG_URL,
    FailureKind.PARTICIPANT_OUTAGE,
    FailureKind.RUN_LIMIT_REACHED,
]

Operation = Literal["add", "add_status", "search", "health"]

# Per-phase timeouts (httpx): connecting gets at most this long; reading, writing and waiting
# for a pooled connection get the call's timeout. On top, each attempt has a total deadline
# (the call's timeout; Health's below), which a server trickling its answer cannot stretch.
CONNECT_TIMEOUT_SECONDS = 10.0
HEALTH_TIMEOUT_SECONDS = 10.0
# Only encodings whose output AML can bound while decoding are asked for and accepted.
ACCEPT_ENCODING = "gzip, deflate"
# Participant text quoted in a reason is cut to this many characters.
REASON_QUOTE_MAX = 200

ADD_RETRYABLE = frozenset({408, 409, 425, 429, 500, 502, 503, 504, 524})
SEARCH_RETRYABLE = frozenset({408, 425, 429, 500, 502, 503, 504})
_FINAL: dict[int, tuple[Failure, str]] = {
    400: (
        FailureKind.CONTRACT_ERROR,
        "the participant rejected the request as malformed (HTTP 400)",
    ),
    422: (FailureKind.CONTRACT_ERROR, "the participant rejected the request as invalid (HTTP 422)"),
    401: (FailureKind.AUTHENTICATION_ERROR, "the participant rejected the credentials (HTTP 401)"),
    403: (FailureKind.ACCESS_DENIED, "the participant denied access (HTTP 403)"),
    404: (FailureKind.WRONG_URL, "the endpoint URL does not exist (HTTP 404)"),
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

    operation: Operation
    attempt: int
    # When the request's headers started going out (when it was handed to the HTTP client, if
    # it never got that far).
    started_at: datetime
    # The participant's time only: request sent -> response received (or the error).
    latency_ms: float
    # The platform's own time before the request left: its wait for the participant's capacity
    # and, on a fresh connection, the connect (R-7.3 keeps it apart so a participant is never
    # charged for AML's queueing).
    queued_ms: float = 0.0
    status: int | None
    error_class: str | None
    outcome: Literal["ok", "retry", "final"]
    # Body bytes read (after decompression; reading stops past the operation's limit); None when
    # the body was not read.
    response_bytes: int | None = None
    # The contract violation found while reading the answer (too large, undecodable): set only
    # on such an attempt, which is final.
    validation: str | None = None


class DeadlineExceeded(httpx.TimeoutException):
    """An attempt outlived its total deadline (e.g. a server trickling its answer): a timeout,
    retried like any other network error."""


class BodyRejected(Exception):
    """The answer's body broke a reading limit: too large, or an undecodable encoding."""

    def __init__(self, reason: str, size: int, error_class: str) -> None:
        super().__init__(reason)
        self.reason = reason
        self.size = size
        self.error_class = error_class
        # The answer's HTTP status, set by the client.
        self.status: int | None = None


class CallFailed(Exception):
    def __init__(self, kind: Failure, reason: str, ends_job: bool = False) -> None:
        super().__init__(reason)
        self.kind = kind
        self.reason = reason
        # The participant was down longer than its outage window: every job waiting on it ends.
        self.ends_job = ends_job


# Answers that say the participant (or what stands in front of it) is down or overloaded, not
# that this request is wrong: its lane pauses instead of failing the work. 500 is left
# out: a server that is up but fails one request (a query it cannot handle) must not stop the
# run; its item fails after the retry table's attempts, as before.
DOWN_STATUSES = frozenset({429, 502, 503, 504, 524})


def participant_down(status: int | None, error: Exception | None) -> bool:
    """Whether a failed attempt says the participant is unreachable: no connection, a reset
    or a timeout (any transport error), or one of `DOWN_STATUSES`."""
    if error is not None:
        return isinstance(error, httpx.TransportError)
    return status in DOWN_STATUSES


class RetryPolicy(BaseModel):
    max_attempts: int = 5
    backoff_base_seconds: float = 3.0
    backoff_max_seconds: float = 30.0
    # The share of each back-off's ceiling that is always waited ("equal jitter"): with full
    # jitter five attempts could all fall within a second or two of a participant's restart.
    # With the defaults, five attempts span 22.5 to 45 s.
    backoff_floor_share: float = Field(default=0.5, ge=0, le=1)
    # A participant's Retry-After is honoured up to this long: past it, a worker would sit idle
    # for the participant's say-so, and the bounded attempts end the call sooner anyway.
    retry_after_max_seconds: float = 600.0

    def delay(self, attempt: int, retry_after: float | None) -> float:
        """Exponential backoff with jitter above a floor (`backoff_floor_share` of the
        ceiling); a server's Retry-After wins when it is longer."""
        ceiling = min(self.backoff_max_seconds, self.backoff_base_seconds * 2 ** (attempt - 1))
        backoff = random.uniform(ceiling * self.backoff_floor_share, ceiling)
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


def short(text: str, limit: int = REASON_QUOTE_MAX) -> str:
    """Participant text as it may be quoted in a reason: bounded, control characters escaped."""
    cut = text[:limit]
    cut = "".join(ch if ch.isprintable() else repr(ch)[1:-1] for ch in cut)
    return cut + ("…" if len(text) > limit else "")


def parse_json(body: bytes, what: str) -> Any:
    """A participant's JSON answer, or a contract violation: invalid JSON or encoding, nesting
    deeper than MAX_JSON_DEPTH, or an object key holding NUL (which no store can keep)."""
    try:
        payload = json.loads(body)
    except RecursionError:
        raise CallFailed(
            FailureKind.CONTRACT_ERROR,
            f"{what} response: JSON nested deeper than {MAX_JSON_DEPTH} levels",
        ) from None
    except ValueError:
        # JSONDecodeError, UnicodeDecodeError, an integer beyond the digit limit.
        raise CallFailed(
            FailureKind.CONTRACT_ERROR, f"{what} response: body is not valid JSON"
        ) from None
    # A NUL reaches a key only as the escape \u0000, or in a body that is not UTF-8 (json.loads
    # also reads UTF-16 and UTF-32, where every ASCII character has a zero byte): without either,
    # no key needs looking at.
    keys_may_hold_nul = b"\x00" in body or b"\\u0000" in body
    problem = _structure_problem(payload, keys_may_hold_nul)
    if problem is not None:
        raise CallFailed(FailureKind.CONTRACT_ERROR, f"{what} response: {problem}")
    return payload


def _structure_problem(payload: Any, keys_may_hold_nul: bool = True) -> str | None:
    # Iterative, containers only: bounded by the body size, never by Python's stack.
    stack: list[tuple[Any, int]] = [(payload, 1)]
    while stack:
        value, depth = stack.pop()
        if depth > MAX_JSON_DEPTH:
            return f"JSON nested deeper than {MAX_JSON_DEPTH} levels"
        if isinstance(value, dict):
            if keys_may_hold_nul and any("\x00" in key for key in value):
                return "an object key contains a NUL character"
            stack.extend(
                (child, depth + 1) for child in value.values() if isinstance(child, dict | list)
            )
        elif isinstance(value, list):
            stack.extend((child, depth + 1) for child in value if isinstance(child, dict | list))
    return None


def validate_add_response(payload: Any, request_id: str, user_id: str, session_id: str) -> None:
    if not isinstance(payload, dict):
        raise CallFailed(FailureKind.CONTRACT_ERROR, "add response: body must be a JSON object")
    try:
        response = AddResponse.model_validate(payload)
    except ValidationError as exc:
        raise CallFailed(FailureKind.CONTRACT_ERROR, f"add response: {_first_error(exc)}") from None
    if response.success is not True:
        raise CallFailed(FailureKind.CONTRACT_ERROR, "add response: success must be true")
    expected = {"request_id": request_id, "user_id": user_id, "session_id": session_id}
    for field, value in expected.items():
        if getattr(response, field) != value:
            raise CallFailed(
                FailureKind.CONTRACT_ERROR, f"add response: {field} must echo the request's"
            )


_INT32 = range(-(2**31), 2**31)
_INT64 = range(-(2**63), 2**63)


def _decimal_keys_bytes(count: int) -> int:
    """Bytes of the keys "0".."count-1" with their NULs: how BSON names an array's elements."""
    total, digits, start = 0, 1, 0
    while start < count:
        end = min(count, 10**digits)
        total += (end - start) * (digits + 1)
        start, digits = end, digits + 1
    return total


def _utf8_length(text: str) -> int:
    # UnicodeEncodeError for a lone surrogate, which JSON's \\ud800 escapes can carry.
    return len(text) if text.isascii() else len(text.encode("utf-8"))


def bson_size(value: Any, stop_above: int) -> int:
    """The bytes parsed JSON takes as a BSON value, counted without encoding it; the count
    stops as soon as it passes `stop_above` (so an answer built to swell, a 4 MiB array of
    zeros being ~25 MiB of BSON, costs no more memory than it took to parse). OverflowError for
    an integer that needs more than 64 bits, UnicodeEncodeError for a lone surrogate."""
    total = 0
    stack = [value]
    while stack and total <= stop_above:
        current = stack.pop()
        if isinstance(current, dict):
            total += 5
            for key, child in current.items():
                total += 2 + _utf8_length(key)
                stack.append(child)
        elif isinstance(current, list):
            total += 5 + len(current) + _decimal_keys_bytes(len(current))
            for child in current:
                # Scalars inline: an array of millions of numbers never fills the stack.
                if isinstance(child, dict | list):
                    stack.append(child)
                else:
                    total += _scalar_bytes(child)
                    if total > stop_above:
                        break
        else:
            total += _scalar_bytes(current)
    return total


def _scalar_bytes(value: Any) -> int:
    if isinstance(value, str):
        return 5 + _utf8_length(value)
    if isinstance(value, bool):
        return 1
    if isinstance(value, int):
        if value in _INT32:
            return 4
        if value in _INT64:
            return 8
        raise OverflowError("an integer needs more than 64 bits")
    if isinstance(value, float):
        return 8
    return 0  # None


def storage_problem(value: Any, limit: int) -> str | None:
    """Why parsed JSON cannot be stored as it is, or None."""
    try:
        size = bson_size(value, limit)
    except OverflowError:
        return "an integer needs more than 64 bits (no store keeps it)"
    except UnicodeEncodeError:
        return "a string holds a lone surrogate (not valid Unicode, no store keeps it)"
    if size > limit:
        return f"the items take more than {limit} bytes to store"
    return None


def validate_search_response(payload: Any, top_k: int) -> list[SearchItem]:
    if isinstance(payload, list):
        raise CallFailed(
            FailureKind.CONTRACT_ERROR, "search response: a top-level array is not allowed"
        )
    if not isinstance(payload, dict):
        raise CallFailed(FailureKind.CONTRACT_ERROR, "search response: body must be a JSON object")
    if "data" not in payload:
        wrapper = " (an `items` wrapper is not allowed)" if "items" in payload else ""
        raise CallFailed(FailureKind.CONTRACT_ERROR, f"search response: `data` is missing{wrapper}")
    if not isinstance(payload["data"], list):
        raise CallFailed(FailureKind.CONTRACT_ERROR, "search response: `data` must be an array")
    if len(payload["data"]) > top_k:
        raise CallFailed(
            FailureKind.CONTRACT_ERROR,
            f"search response: {len(payload['data'])} items exceed top_k={top_k}",
        )
    problem = storage_problem(payload["data"], MAX_STORED_SEARCH_ITEMS_BYTES)
    if problem is not None:
        raise CallFailed(FailureKind.CONTRACT_ERROR, f"search response: {problem}")
    try:
        return SearchResponse.model_validate(payload).data
    except ValidationError as exc:
        raise CallFailed(
            FailureKind.CONTRACT_ERROR, f"search response: {_first_error(exc)}"
        ) from None


def _first_error(exc: ValidationError) -> str:
    error = exc.errors()[0]
    loc = list(error["loc"])
    if len(loc) >= 2 and loc[0] == "data" and isinstance(loc[1], int):
        # Items are numbered from 1 for people reading the error summary.
        where = f"item {loc[1] + 1}: " + ".".join(str(part) for part in loc[2:])
    else:
        where = ".".join(str(part) for part in loc)
    message = f"{where}: {error['msg']}" if where else str(error["msg"])
    return short(message)


AnswerHook = Callable[[Operation, int, bytes], None]


@dataclass
class _Answer:
    status: int
    headers: httpx.Headers
    # The decoded body when it was read (an answer the client uses), else empty.
    body: bytes
    read: bool


class ParticipantClient:
    def __init__(
        self,
        http: httpx.AsyncClient,
        policy: RetryPolicy,
        timeout: float,
        limiter: CapacityLimiter | None = None,
        on_answer: AnswerHook | None = None,
        outages: Outages | None = None,
        outage_seconds: float = 600.0,
    ) -> None:
        self._http = http
        self._policy = policy
        self._timeout = timeout
        self._limiter = limiter
        # Without it (a direct caller: `aml check`, the scheduler's Health check) a call whose
        # attempts are spent fails at once, as the retry table alone says.
        self._outages = outages
        self._outage_seconds = outage_seconds
        # Sees every answer's status and the body as read (`aml check` reports them).
        self._on_answer = on_answer

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
                    FailureKind.RUN_LIMIT_REACHED,
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
        cls,
        settings: ParticipantCallSettings,
        limiter: CapacityLimiter | None = None,
        outages: Outages | None = None,
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
        return cls(
            http,
            policy,
            settings.participant_timeout_seconds,
            limiter,
            outages=outages,
            outage_seconds=settings.participant_outage_seconds,
        )

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
        answer = await self._send(
            "add", endpoint.add_url, endpoint, body, ADD_RETRYABLE, observe, admission
        )
        payload = parse_json(answer.body, "add")
        if answer.status == 202:
            if not endpoint.add_status_url_template:
                raise CallFailed(
                    FailureKind.CONTRACT_ERROR,
                    "add returned 202 but the version has no Add-status URL",
                )
            if not isinstance(payload, dict) or "task_id" not in payload:
                raise CallFailed(FailureKind.CONTRACT_ERROR, "add 202 response: task_id missing")
            try:
                task = AddAccepted.model_validate(payload)
            except ValidationError as exc:
                raise CallFailed(
                    FailureKind.CONTRACT_ERROR, f"add 202 response: {_first_error(exc)}"
                ) from None
            url = status_url(endpoint.add_status_url_template, task.task_id)
            payload = await self._poll(endpoint, url, task.task_id, observe, admission)
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
        answer = await self._send(
            "search", url, endpoint, body, SEARCH_RETRYABLE, observe, admission
        )
        if answer.status != 200:
            raise CallFailed(
                FailureKind.CONTRACT_ERROR, f"search: expected HTTP 200, got {answer.status}"
            )
        return validate_search_response(parse_json(answer.body, "search"), top_k)

    async def health(self, endpoint: Endpoint) -> bool:
        """2xx within the Health deadline, with a body within its limit (the body is read, not
        decoded: it is never used)."""
        deadline = min(HEALTH_TIMEOUT_SECONDS, self._timeout)
        try:
            answer = await self._fetch(
                "health", "GET", endpoint.health_url, {}, None, None, deadline, decode=False
            )
        except (httpx.HTTPError, UnsafeUrl, BodyRejected):
            return False
        return 200 <= answer.status < 300

    async def _fetch(
        self,
        operation: Operation,
        method: str,
        url: str,
        headers: dict[str, str],
        content: bytes | None,
        trace: Any,
        deadline: float,
        *,
        decode: bool = True,
        wanted: Callable[[int], bool] = lambda status: True,
    ) -> _Answer:
        """One attempt: send, then read the body (when `wanted` for its status) as a stream
        bounded by the operation's size limit, all within `deadline` seconds."""
        timeout = httpx.Timeout(deadline, connect=min(CONNECT_TIMEOUT_SECONDS, deadline))
        extensions = {"trace": trace} if trace is not None else None
        try:
            request = self._http.build_request(
                method,
                url,
                content=content,
                headers={"Accept-Encoding": ACCEPT_ENCODING, **headers},
                timeout=timeout,
                extensions=extensions,
            )
        except httpx.InvalidURL as exc:
            raise UnsafeUrl(f"the URL is invalid ({short(str(exc), 80)})") from None
        try:
            async with asyncio.timeout(deadline):
                response = await self._http.send(request, stream=True)
                try:
                    if not wanted(response.status_code):
                        answer = _Answer(response.status_code, response.headers, b"", False)
                    else:
                        cap = MAX_RESPONSE_BYTES[operation]
                        try:
                            body = await read_capped(response, cap, operation, decode=decode)
                        except BodyRejected as exc:
                            exc.status = response.status_code
                            if self._on_answer is not None:
                                self._on_answer(operation, response.status_code, b"")
                            raise
                        answer = _Answer(response.status_code, response.headers, body, True)
                finally:
                    await response.aclose()
        except TimeoutError:
            raise DeadlineExceeded(
                f"no complete answer within the {deadline:g}s attempt deadline", request=request
            ) from None
        if self._on_answer is not None:
            self._on_answer(operation, answer.status, answer.body)
        return answer

    async def _poll(
        self,
        endpoint: Endpoint,
        url: str,
        task_id: str,
        observe: Observer,
        admission: Admission | None,
    ) -> Any:
        # A task may take as long as one Add request may; after that it is an outage.
        deadline = time.monotonic() + self._timeout
        headers = auth_headers(endpoint.auth_method, endpoint.secret)
        attempt = 0
        while True:
            attempt += 1
            left = deadline - time.monotonic()
            if left <= 0:
                raise CallFailed(
                    FailureKind.PARTICIPANT_OUTAGE,
                    f"add task {short(task_id, 80)} not finished within {self._timeout:.0f}s",
                )
            timing = _Timing()
            try:
                async with self._exchange(endpoint, admission) as departure:
                    timing.sent(departure)
                    answer = await self._fetch(
                        "add_status", "GET", url, headers, None, departure.trace,
                        min(self._timeout, max(left, 1.0)), wanted=lambda status: status == 200,
                    )  # fmt: skip
            except UnsafeUrl as exc:
                await observe(timing.attempt("add_status", attempt, None, exc, "final"))
                raise CallFailed(FailureKind.WRONG_URL, f"add status: {exc.reason}") from None
            except BodyRejected as exc:
                await observe(timing.rejected("add_status", attempt, exc))
                raise CallFailed(FailureKind.CONTRACT_ERROR, exc.reason) from None
            except httpx.HTTPError as exc:
                await observe(timing.attempt("add_status", attempt, None, exc, "retry"))
                await asyncio.sleep(self._policy.delay(min(attempt, 8), None))
                continue
            status = answer.status
            size = len(answer.body) if answer.read else None
            if status in _FINAL:
                # R-4.10's final statuses do not heal by polling on until the deadline.
                await observe(timing.attempt("add_status", attempt, status, None, "final"))
                kind, reason = _FINAL[status]
                raise CallFailed(kind, f"add status: {reason}")
            outcome: Literal["ok", "retry"] = "ok" if status == 200 else "retry"
            await observe(timing.attempt("add_status", attempt, status, None, outcome, size))
            if status == 200:
                payload = parse_json(answer.body, "add status")
                state = payload.get("status") if isinstance(payload, dict) else None
                if state in {"done", "completed", "succeeded", "success"}:
                    assert isinstance(payload, dict)
                    return payload.get("result", payload)
                if state in {"failed", "error"}:
                    told = short(answer.body.decode("utf-8", "replace"))
                    raise CallFailed(
                        FailureKind.CONTRACT_ERROR, f"add task {short(task_id, 80)} failed: {told}"
                    )
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
    ) -> _Answer:
        """The call with R-4.10's retries; when its failures say the participant is down, the
        participant's outage (`aml_pipeline.outages`) instead of a failure: the call waits out
        the pause and sends the same bytes again, until the outage outlives its window."""
        headers = {"Content-Type": "application/json"} | auth_headers(
            endpoint.auth_method, endpoint.secret
        )
        # Only an answer the client uses is read; any other status's body is left unread.
        accepted = {200} if operation == "search" else {200, 202}
        # An outage is a capacity key's (the version's); a call without one cannot pause.
        key = endpoint.capacity.key if endpoint.capacity is not None else ""
        outages = self._outages if key else None
        last = ""
        attempt = 0
        # Attempts since the call began or last waited out a pause, and when the first of the
        # failures in a row was sent (the outage's start, if they turn out to be one).
        since_pause = 0
        failing_since: float | None = None
        while True:
            if outages is not None and outages.is_paused(key):
                await self._wait_out(outages, key, endpoint, operation)
                since_pause = 0
            attempt += 1
            since_pause += 1
            timing = _Timing()
            retry_after: float | None = None
            status: int | None = None
            error: Exception | None = None
            try:
                span = stage_span(
                    f"participant.{operation}", attempt=attempt, participant_call=True
                )
                async with self._exchange(endpoint, admission) as departure:
                    timing.sent(departure)
                    with span as current:
                        try:
                            answer = await self._fetch(
                                operation, "POST", url, headers, body, departure.trace,
                                self._timeout, wanted=accepted.__contains__,
                            )  # fmt: skip
                        except (httpx.HTTPError, BodyRejected) as exc:
                            current.set_attribute("error.type", type(exc).__name__)
                            raise
                        current.set_attribute("http.response.status_code", answer.status)
            except UnsafeUrl as exc:
                # A refused target will not become safe by retrying.
                await observe(timing.attempt(operation, attempt, None, exc, "final"))
                raise CallFailed(FailureKind.WRONG_URL, f"{operation}: {exc.reason}") from None
            except BodyRejected as exc:
                # Too large or undecodable: a contract violation, final at once.
                await observe(timing.rejected(operation, attempt, exc))
                raise CallFailed(FailureKind.CONTRACT_ERROR, exc.reason) from None
            except httpx.HTTPError as exc:
                error = exc
                last = f"network error: {type(exc).__name__}"
            else:
                status = answer.status
                if status in accepted:
                    size = len(answer.body)
                    await observe(timing.attempt(operation, attempt, status, None, "ok", size))
                    if outages is not None and key is not None:
                        await outages.succeeded(key)
                    return answer
                if status in _FINAL:
                    await observe(timing.attempt(operation, attempt, status, None, "final"))
                    kind, reason = _FINAL[status]
                    raise CallFailed(kind, f"{operation}: {reason}")
                if status not in retryable:
                    await observe(timing.attempt(operation, attempt, status, None, "final"))
                    raise CallFailed(
                        FailureKind.CONTRACT_ERROR, f"{operation}: unexpected HTTP {status}"
                    )
                last = f"HTTP {status}"
                retry_after = parse_retry_after(answer.headers.get("Retry-After"))
            if failing_since is None:
                failing_since = timing.started.timestamp()
            if outages is None or not participant_down(status, error):
                # After a pause the retry table starts again: a participant back from a restart
                # may fail a request or two before it is warm.
                if since_pause >= self._policy.max_attempts:
                    await observe(timing.attempt(operation, attempt, status, error, "final"))
                    raise CallFailed(
                        FailureKind.PARTICIPANT_OUTAGE,
                        f"{operation}: no success after {attempt} attempts (last: {last})",
                    )
                await observe(timing.attempt(operation, attempt, status, error, "retry"))
                await asyncio.sleep(self._policy.delay(since_pause, retry_after))
                continue
            # Down: never final here. While its outage is open, one attempt tells whether the
            # participant is back; otherwise the retry table's attempts, then the pause.
            await observe(timing.attempt(operation, attempt, status, error, "retry"))
            budget = 1 if outages.is_open(key) else self._policy.max_attempts
            if since_pause >= budget:
                try:
                    await outages.declare(
                        key, "participant", failing_since, last, self._outage_seconds
                    )
                except OutageExpired as exc:
                    raise _outage_too_long(operation, exc) from None
                continue
            await asyncio.sleep(self._policy.delay(since_pause, retry_after))

    async def _wait_out(
        self, outages: Outages, key: str, endpoint: Endpoint, operation: str
    ) -> None:
        """Wait while the participant's lane is paused, probing its Health URL; its outage
        outliving the window fails the call, and every job waiting on it (`ends_job`)."""

        async def healthy() -> bool:
            return await self.health(endpoint)

        try:
            await outages.wait(key, healthy)
        except OutageExpired as exc:
            raise _outage_too_long(operation, exc) from None


def _outage_too_long(operation: str, expired: OutageExpired) -> CallFailed:
    """The participant was down past its window: final for the call, and for its job."""
    return CallFailed(
        FailureKind.PARTICIPANT_OUTAGE, f"{operation}: {expired.reason}", ends_job=True
    )


def status_url(template: str, task_id: str) -> str:
    """The Add-status URL for a task: the id percent-encoded into the template (all but
    letters, digits and `-._~`, so it cannot add a path, query, fragment or user), and the
    result a URL httpx accepts; else a contract violation."""
    if not task_id.isprintable():
        raise CallFailed(
            FailureKind.CONTRACT_ERROR, "add 202 response: task_id holds control characters"
        )
    url = template.replace("{task_id}", quote(task_id, safe="-._~"))
    try:
        httpx.URL(url)
    except httpx.InvalidURL:
        raise CallFailed(
            FailureKind.CONTRACT_ERROR, "add 202 response: task_id does not make a valid status URL"
        ) from None
    return url


async def read_capped(
    response: httpx.Response, cap: int, operation: str, *, decode: bool = True
) -> bytes:
    """The body of a streamed response, decoded (gzip, deflate or none) and at most `cap`
    bytes: reading stops as soon as it would exceed it."""
    what = f"{operation.replace('_', ' ')} response"
    declared = response.headers.get("Content-Length", "")
    encoding = response.headers.get("Content-Encoding", "") if decode else ""
    if declared.isascii() and declared.isdigit() and int(declared) > cap and not encoding:
        raise BodyRejected(
            f"{what}: body larger than the {_size(cap)} limit", 0, "ResponseTooLarge"
        )
    out = bytearray()
    if response.is_stream_consumed:
        # Already in memory, decoded (an in-process transport such as httpx.MockTransport).
        _Decoder("", what).feed(response.content, out, cap)
        return bytes(out)
    decoder = _Decoder(encoding, what)
    async for raw in response.aiter_raw():
        decoder.feed(raw, out, cap)
    decoder.finish(out, cap)
    return bytes(out)


class _Decoder:
    """Content-Encoding decoding whose output is bounded as it is produced: a small compressed
    body cannot expand past the limit in memory."""

    def __init__(self, encoding: str, what: str) -> None:
        self._what = what
        names = [n.strip().lower() for n in encoding.split(",") if n.strip()]
        names = [n for n in names if n != "identity"]
        self._raw_deflate_tried = False
        self._deflate = names == ["deflate"]
        if not names:
            self._z: Any = None
        elif names in (["gzip"], ["x-gzip"]):
            self._z = zlib.decompressobj(zlib.MAX_WBITS | 16)
        elif self._deflate:
            self._z = zlib.decompressobj()
        else:
            raise BodyRejected(
                f"{what}: unsupported Content-Encoding {short(encoding, 40)!r}", 0, "BadEncoding"
            )

    def feed(self, data: bytes, out: bytearray, cap: int) -> None:
        if self._z is None:
            out += data
            self._check(out, cap)
            return
        while data:
            try:
                out += self._z.decompress(data, cap + 1 - len(out))
            except zlib.error:
                if self._deflate and not self._raw_deflate_tried and not out:
                    # "deflate" is sometimes sent without its zlib wrapper.
                    self._raw_deflate_tried = True
                    self._z = zlib.decompressobj(-zlib.MAX_WBITS)
                    continue
                raise BodyRejected(
                    f"{self._what}: body is not valid {'deflate' if self._deflate else 'gzip'}",
                    len(out),
                    "BadEncoding",
                ) from None
            self._check(out, cap)
            data = self._z.unconsumed_tail

    def finish(self, out: bytearray, cap: int) -> None:
        if self._z is not None:
            out += self._z.flush()
            self._check(out, cap)

    def _check(self, out: bytearray, cap: int) -> None:
        if len(out) > cap:
            raise BodyRejected(
                f"{self._what}: body larger than the {_size(cap)} limit",
                len(out),
                "ResponseTooLarge",
            )


def _size(n: int) -> str:
    if n % (1024 * 1024) == 0:
        return f"{n // (1024 * 1024)} MiB"
    if n % 1024 == 0:
        return f"{n // 1024} KiB"
    return f"{n} bytes"


class _Timing:
    """When an attempt began waiting for capacity, and when its request was sent: the moment
    its headers started going out (`Departure`), or, for a request that never got that far (no
    connection), the moment it was handed to the HTTP client."""

    def __init__(self) -> None:
        self.queued_from = time.monotonic()
        self.started = datetime.now(UTC)
        self.t0: float | None = None
        self._departure: Departure | None = None

    def sent(self, departure: Departure) -> None:
        self.started, self.t0 = datetime.now(UTC), time.monotonic()
        self._departure = departure

    def _left(self) -> None:
        departure = self._departure
        if departure is not None and departure.sent_at is not None:
            self.started = datetime.fromtimestamp(departure.sent_at, UTC)
            self.t0 = departure.sent_monotonic

    def attempt(
        self,
        operation: Operation,
        attempt: int,
        status: int | None,
        error: Exception | None,
        outcome: Literal["ok", "retry", "final"],
        size: int | None = None,
    ) -> Attempt:
        end = time.monotonic()
        self._left()
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
            response_bytes=size,
        )

    def rejected(self, operation: Operation, attempt: int, error: BodyRejected) -> Attempt:
        """An answer whose body broke a reading limit: final, with the violation recorded."""
        record = self.attempt(operation, attempt, error.status, None, "final", error.size)
        return record.model_copy(
            update={"error_class": error.error_class, "validation": error.reason}
        )
