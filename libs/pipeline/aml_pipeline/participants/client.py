"""The one client for calling a participant's memory system (SPEC R-4.2 - R-4.10).

Every call sends a body built once by the caller, byte for byte the same on every attempt; each
attempt is reported to an observer so it lands in the audit trail. Each attempt has a total
deadline on top of httpx's per-phase timeouts, so a participant cannot hold a call by trickling
bytes.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import Any, Literal

import httpx

from aml_contract.participant import MAX_RESPONSE_BYTES, SearchItem
from aml_pipeline.capacity import Admission, CapacityLimiter, Departure
from aml_pipeline.outages import OutageExpired, Outages
from aml_pipeline.participants.attempts import Observer, Operation, Timing
from aml_pipeline.participants.endpoint import Endpoint, auth_headers
from aml_pipeline.participants.failures import CallFailed, short
from aml_pipeline.participants.reading import BodyRejected, read_capped
from aml_pipeline.participants.retries import (
    ADD_RETRYABLE,
    FINAL_STATUSES,
    SEARCH_RETRYABLE,
    RetryPolicy,
    parse_retry_after,
    participant_down,
)
from aml_pipeline.participants.validation import (
    parse_json,
    status_url,
    validate_add_accepted,
    validate_add_response,
    validate_search_response,
)
from aml_pipeline.urlsafety import SafeTransport, UnsafeUrl
from aml_runtime.documents import FailureKind
from aml_runtime.settings import ParticipantCallSettings
from aml_runtime.telemetry import stage_span

# Per-phase timeouts (httpx): connecting gets at most this long; reading, writing and waiting
# for a pooled connection get the call's timeout. On top, each attempt has a total deadline
# (the call's timeout; Health's below), which a server trickling its answer cannot stretch.
CONNECT_TIMEOUT_SECONDS = 10.0
HEALTH_TIMEOUT_SECONDS = 10.0
# Only encodings whose output AML can bound while decoding are asked for and accepted.
ACCEPT_ENCODING = "gzip, deflate"


class DeadlineExceeded(httpx.TimeoutException):
    """An attempt outlived its total deadline (e.g. a server trickling its answer): a timeout,
    retried like any other network error."""


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
            task = validate_add_accepted(payload)
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
            timing = Timing()
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
            if status in FINAL_STATUSES:
                # R-4.10's final statuses do not heal by polling on until the deadline.
                await observe(timing.attempt("add_status", attempt, status, None, "final"))
                kind, reason = FINAL_STATUSES[status]
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
            timing = Timing()
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
                if status in FINAL_STATUSES:
                    await observe(timing.attempt(operation, attempt, status, None, "final"))
                    kind, reason = FINAL_STATUSES[status]
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
