"""The real `ParticipantClient` against the real participant simulator over loopback HTTP (SPEC
R-4.3, R-4.6 - R-4.10): the retry table status by status for Add and Search, network errors,
Retry-After, every malformed answer, asynchronous Adds, and health checks.

The expectations are written from the SPEC, not copied from the client's constants, so that a
drift in either shows up here. One simulator serves the whole module from a background thread;
each test loads its own script (which also clears the records).
"""

from __future__ import annotations

import email.utils
import json
import math
import time
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from typing import Any, Literal

import pytest
from pydantic import SecretStr

from aml_contract.participant import AddRequest, Message, SearchRequest, encode
from aml_participant_simulator import RequestRecord, Script, Simulator
from aml_pipeline.participants import (
    Attempt,
    CallFailed,
    Endpoint,
    ParticipantClient,
)
from aml_runtime.settings import ParticipantCallSettings

Operation = Literal["add", "search"]

KEY = "sim-key"
AUTH = {"method": "bearer", "key": KEY}
MAX_ATTEMPTS = 4
TOP_K = 3
IDS = ("req-1", "user-1", "sess-1")

# as the SPEC states it.
ADD_RETRYABLE = {408, 409, 425, 429, 500, 502, 503, 504, 524}
SEARCH_RETRYABLE = {408, 425, 429, 500, 502, 503, 504}
FINAL = {
    400: "contract_error",
    422: "contract_error",
    401: "authentication_error",
    403: "access_denied",
    404: "wrong_url",
}
TABLE = sorted(ADD_RETRYABLE | SEARCH_RETRYABLE | set(FINAL))
# Statuses outside the table: a contract error, never retried.
OUTSIDE = [418, 501]


def retryable(operation: Operation) -> set[int]:
    return ADD_RETRYABLE if operation == "add" else SEARCH_RETRYABLE


# --- fixtures -----------------------------------------------------------------------------


@dataclass
class Participant:
    simulator: Simulator
    url: str

    def load(self, value: dict[str, Any]) -> None:
        """A fresh script (through its JSON form, as scripts are written); clears the records
        and the memories."""
        script = {"auth": AUTH, **value}
        self.simulator.replace_script(Script.model_validate_json(json.dumps(script)))

    def endpoint(self, status_template: bool = False) -> Endpoint:
        return Endpoint(
            add_url=f"{self.url}/add",
            search_url=f"{self.url}/search",
            health_url=f"{self.url}/health",
            add_status_url_template=f"{self.url}/tasks/{{task_id}}" if status_template else None,
            auth_method="bearer",
            secret=SecretStr(KEY),
        )

    def requests(self, endpoint: str | None = None) -> list[RequestRecord]:
        return [r for r in self.simulator.requests if endpoint is None or r.endpoint == endpoint]


@pytest.fixture(scope="module")
def served() -> Iterator[Participant]:
    simulator = Simulator(Script())
    with simulator.running() as url:
        yield Participant(simulator, url)


@pytest.fixture
def participant(served: Participant) -> Participant:
    served.load({})
    return served


@pytest.fixture
async def client() -> AsyncIterator[ParticipantClient]:
    settings = ParticipantCallSettings(
        allow_loopback_targets=True,
        participant_max_attempts=MAX_ATTEMPTS,
        participant_backoff_base_seconds=0.001,
        participant_backoff_max_seconds=0.004,
        participant_timeout_seconds=5.0,
    )
    participant_client = ParticipantClient.from_settings(settings)
    yield participant_client
    await participant_client.aclose()


class Observed:
    def __init__(self) -> None:
        self.attempts: list[Attempt] = []

    async def __call__(self, attempt: Attempt) -> None:
        self.attempts.append(attempt)

    def outcomes(self) -> list[tuple[str, int, int | None, str]]:
        return [(a.operation, a.attempt, a.status, a.outcome) for a in self.attempts]


def add_body() -> bytes:
    # Non-ASCII text and an explicit timestamp: what must arrive byte for byte on every attempt.
    request = AddRequest(
        request_id=IDS[0],
        messages=[
            Message(
                role="user", content="Zoë adopted a cat named Miso ☕", timestamp=1_700_000_000_000
            )
        ],
        user_id=IDS[1],
        session_id=IDS[2],
    )
    return encode(request)


def search_body(query: str = "What is Zoë's cat called?") -> bytes:
    return encode(SearchRequest(query=query, user_id=IDS[1], top_k=TOP_K))


async def call(
    client: ParticipantClient,
    participant: Participant,
    operation: Operation,
    body: bytes,
    observe: Observed,
) -> None:
    if operation == "add":
        await client.add(participant.endpoint(), body, IDS, observe)
    else:
        assert await client.search(participant.endpoint(), body, TOP_K, observe) == []


def body_for(operation: Operation) -> bytes:
    return add_body() if operation == "add" else search_body()


def assert_same_request_every_time(
    participant: Participant, operation: Operation, body: bytes, count: int
) -> None:
    """R-4.10: every attempt is the byte-identical body, the same request_id, with credentials."""
    records = participant.requests()
    assert len(records) == count
    for record in records:
        assert (record.method, record.path, record.endpoint) == ("POST", f"/{operation}", operation)
        assert record.body == body
        assert record.header("authorization") == f"Bearer {KEY}"
        assert record.header("content-type") == "application/json"
        if operation == "add":
            assert json.loads(record.body)["request_id"] == IDS[0]
    # One scripted sequence (per request_id / per query), walked attempt by attempt.
    assert [r.attempt for r in records] == list(range(count))
    assert len({r.sequence_key for r in records}) == 1


# --- 1. the status matrix -------------------------------------------------------------------


def expected_failure(operation: Operation, status: int) -> tuple[str, str, int]:
    """(kind, reason, requests) for a status the participant answers forever."""
    if status in FINAL:
        return FINAL[status], f"(HTTP {status})", 1
    if status in retryable(operation):
        reason = f"{operation}: no success after {MAX_ATTEMPTS} attempts (last: HTTP {status})"
        return "participant_outage", reason, MAX_ATTEMPTS
    return "contract_error", f"{operation}: unexpected HTTP {status}", 1


@pytest.mark.parametrize("status", TABLE + OUTSIDE)
@pytest.mark.parametrize("operation", ["add", "search"])
async def test_status_forever(
    participant: Participant, client: ParticipantClient, operation: Operation, status: int
) -> None:
    participant.load({operation: {"then": {"status": status, "body": '{"detail":"scripted"}'}}})
    body = body_for(operation)
    observe = Observed()
    with pytest.raises(CallFailed) as failed:
        await call(client, participant, operation, body, observe)
    kind, reason, count = expected_failure(operation, status)
    assert failed.value.kind == kind
    assert reason in failed.value.reason
    assert failed.value.reason.startswith(f"{operation}: ")
    assert_same_request_every_time(participant, operation, body, count)
    assert [r.status for r in participant.requests()] == [status] * count
    # One Attempt per HTTP exchange; every one a retry but the last, which is final.
    outcomes = ["retry"] * (count - 1) + ["final"]
    assert observe.outcomes() == [
        (operation, n, status, outcomes[n - 1]) for n in range(1, count + 1)
    ]
    assert all(a.error_class is None and a.latency_ms >= 0 for a in observe.attempts)


@pytest.mark.parametrize("status", TABLE + OUTSIDE)
@pytest.mark.parametrize("operation", ["add", "search"])
async def test_status_twice_then_success(
    participant: Participant, client: ParticipantClient, operation: Operation, status: int
) -> None:
    participant.load({operation: {"responses": [{"status": status}] * 2}})
    body = body_for(operation)
    observe = Observed()
    if status in retryable(operation):
        await call(client, participant, operation, body, observe)
        assert_same_request_every_time(participant, operation, body, 3)
        assert [r.status for r in participant.requests()] == [status, status, 200]
        assert observe.outcomes() == [
            (operation, 1, status, "retry"),
            (operation, 2, status, "retry"),
            (operation, 3, 200, "ok"),
        ]
        if operation == "add":
            # Stored once, by the attempt that succeeded.
            assert [m.id for m in participant.simulator.memories] == [f"{IDS[0]}#0"]
    else:
        # Final: never retried, even though a retry would have succeeded.
        with pytest.raises(CallFailed) as failed:
            await call(client, participant, operation, body, observe)
        kind, reason, count = expected_failure(operation, status)
        assert (failed.value.kind, count) == (kind, 1)
        assert reason in failed.value.reason
        assert_same_request_every_time(participant, operation, body, 1)
        assert observe.outcomes() == [(operation, 1, status, "final")]
        assert participant.simulator.memories == []


async def test_409_is_never_success_for_add(
    participant: Participant, client: ParticipantClient
) -> None:
    # A 409 carrying a perfectly valid success body is still a conflict, to be retried.
    ok = {"success": True, "request_id": IDS[0], "user_id": IDS[1], "session_id": IDS[2]}
    participant.load({"add": {"then": {"status": 409, "body": json.dumps(ok)}}})
    observe = Observed()
    with pytest.raises(CallFailed) as failed:
        await client.add(participant.endpoint(), add_body(), IDS, observe)
    assert failed.value.kind == "participant_outage"
    assert len(participant.requests()) == MAX_ATTEMPTS
    assert [a.outcome for a in observe.attempts] == ["retry"] * (MAX_ATTEMPTS - 1) + ["final"]


async def test_wrong_credentials_are_an_authentication_error(
    participant: Participant, client: ParticipantClient
) -> None:
    # The simulator's own credential check (not a scripted status) answers 401.
    endpoint = participant.endpoint().model_copy(update={"secret": SecretStr("wrong")})
    observe = Observed()
    with pytest.raises(CallFailed) as failed:
        await client.add(endpoint, add_body(), IDS, observe)
    assert failed.value.kind == "authentication_error"
    (record,) = participant.requests()
    assert (record.outcome, record.status) == ("unauthorized", 401)
    assert observe.outcomes() == [("add", 1, 401, "final")]


# --- 2. network errors ----------------------------------------------------------------------


@pytest.mark.parametrize("operation", ["add", "search"])
async def test_dropped_connections_are_retried(
    participant: Participant, client: ParticipantClient, operation: Operation
) -> None:
    drops = [{"mode": "drop"}, {"mode": "drop", "abort": True}]
    participant.load({operation: {"responses": drops}})
    body = body_for(operation)
    observe = Observed()
    await call(client, participant, operation, body, observe)
    assert_same_request_every_time(participant, operation, body, 3)
    assert [(r.outcome, r.status) for r in participant.requests()] == [
        ("drop", None),
        ("drop", None),
        ("ok", 200),
    ]
    assert [(a.attempt, a.status, a.outcome) for a in observe.attempts] == [
        (1, None, "retry"),
        (2, None, "retry"),
        (3, 200, "ok"),
    ]
    assert all(a.error_class for a in observe.attempts[:2])
    assert observe.attempts[2].error_class is None


@pytest.mark.parametrize("operation", ["add", "search"])
async def test_dropped_forever_is_an_outage(
    participant: Participant, client: ParticipantClient, operation: Operation
) -> None:
    participant.load({operation: {"then": {"mode": "drop"}}})
    body = body_for(operation)
    observe = Observed()
    with pytest.raises(CallFailed) as failed:
        await call(client, participant, operation, body, observe)
    assert failed.value.kind == "participant_outage"
    assert "network error" in failed.value.reason
    assert_same_request_every_time(participant, operation, body, MAX_ATTEMPTS)
    assert [a.outcome for a in observe.attempts] == ["retry"] * (MAX_ATTEMPTS - 1) + ["final"]


async def test_a_dropped_add_that_persisted_is_stored_once(
    participant: Participant, client: ParticipantClient
) -> None:
    # The participant processed the write but the answer was lost: the retry (same request_id)
    # must not create a second memory.
    participant.load({"add": {"responses": [{"mode": "drop", "persist": True}]}})
    await client.add(participant.endpoint(), add_body(), IDS, Observed())
    assert len(participant.requests()) == 2
    assert [m.id for m in participant.simulator.memories] == [f"{IDS[0]}#0"]


# --- 3. Retry-After ---------------------------------------------------------------------------


@pytest.mark.parametrize("form", ["seconds", "http-date"])
@pytest.mark.parametrize("operation", ["add", "search"])
async def test_retry_after_is_honoured(
    participant: Participant,
    client: ParticipantClient,
    operation: Operation,
    form: str,
) -> None:
    if form == "seconds":
        value, at_least = "1", 1.0
    else:
        # HTTP dates have whole seconds: the next whole second plus two is more than two
        # seconds away now, and so still more than a second away when the 429 arrives.
        value, at_least = email.utils.formatdate(math.ceil(time.time()) + 2, usegmt=True), 1.0
    participant.load(
        {operation: {"responses": [{"status": 429, "headers": {"Retry-After": value}}]}}
    )
    body = body_for(operation)
    observe = Observed()
    await call(client, participant, operation, body, observe)
    first, second = participant.requests()
    assert first.header("authorization") == second.header("authorization") == f"Bearer {KEY}"
    assert first.body == second.body == body
    gap = second.arrived_monotonic - first.arrived_monotonic
    # The policy's own backoff is a few milliseconds: the wait is the server's.
    assert at_least <= gap < 4.0
    assert [a.outcome for a in observe.attempts] == ["retry", "ok"]


# --- 4. malformed answers -------------------------------------------------------------------


@pytest.mark.parametrize(
    ("operation", "mode", "reason"),
    [
        ("add", "missing_ids", "add response: request_id: Field required"),
        ("add", "success_false", "add response: success must be true"),
        ("add", "wrong_request_id", "add response: request_id must echo the request's"),
        ("add", "not_json", "add response: body is not valid JSON"),
        ("search", "missing_ids", "search response: item 1: id: Field required"),
        ("search", "items_wrapper", "an `items` wrapper is not allowed"),
        ("search", "top_level_array", "a top-level array is not allowed"),
        ("search", "too_many_items", f"{TOP_K + 1} items exceed top_k={TOP_K}"),
        ("search", "empty_id", "item 1: id: String should have at least 1 character"),
        ("search", "empty_content", "item 1: content"),
        ("search", "non_numeric_score", "item 1: score"),
        ("search", "not_json", "search response: body is not valid JSON"),
    ],
)
async def test_malformed_answers_are_contract_errors_never_retried(
    participant: Participant,
    client: ParticipantClient,
    operation: Operation,
    mode: str,
    reason: str,
) -> None:
    participant.load({operation: {"responses": [{"mode": mode}]}})
    body = body_for(operation)
    observe = Observed()
    with pytest.raises(CallFailed) as failed:
        await call(client, participant, operation, body, observe)
    assert failed.value.kind == "contract_error"
    assert reason in failed.value.reason
    assert_same_request_every_time(participant, operation, body, 1)
    assert participant.requests()[0].outcome == mode
    # The exchange itself was fine (HTTP 200); the contract check after it failed.
    assert observe.outcomes() == [(operation, 1, 200, "ok")]


async def test_correct_answers_pass(participant: Participant, client: ParticipantClient) -> None:
    # The same client and simulator answering correctly: the failures above are the modes'.
    await client.add(participant.endpoint(), add_body(), IDS, Observed())
    items = await client.search(participant.endpoint(), search_body("Miso cat"), TOP_K, Observed())
    assert [(item.id, item.content) for item in items] == [
        (f"{IDS[0]}#0", "Zoë adopted a cat named Miso ☕")
    ]


# --- 5. asynchronous Add (202 + polling) ----------------------------------------------------


async def test_async_add_polls_until_done(
    participant: Participant, client: ParticipantClient
) -> None:
    participant.load({"add": {"responses": [{"mode": "async_202", "pending_polls": 2}]}})
    observe = Observed()
    await client.add(participant.endpoint(status_template=True), add_body(), IDS, observe)
    add, *polls = participant.requests()
    assert (add.endpoint, add.status, add.body) == ("add", 202, add_body())
    assert [(r.method, r.path, r.status) for r in polls] == [("GET", "/tasks/task-1", 200)] * 3
    assert all(r.header("authorization") == f"Bearer {KEY}" for r in polls)
    assert observe.outcomes() == [
        ("add", 1, 202, "ok"),
        ("add_status", 1, 200, "ok"),
        ("add_status", 2, 200, "ok"),
        ("add_status", 3, 200, "ok"),
    ]
    # Searchable once done.
    assert [m.id for m in participant.simulator.memories] == [f"{IDS[0]}#0"]


async def test_async_add_task_failure_is_a_contract_error(
    participant: Participant, client: ParticipantClient
) -> None:
    failing = {"mode": "async_202", "pending_polls": 1, "task_result": "failed"}
    participant.load({"add": {"responses": [failing]}})
    observe = Observed()
    with pytest.raises(CallFailed) as failed:
        await client.add(participant.endpoint(status_template=True), add_body(), IDS, observe)
    assert failed.value.kind == "contract_error"
    assert "add task task-1 failed" in failed.value.reason
    assert [r.endpoint for r in participant.requests()] == ["add", "tasks", "tasks"]
    assert participant.simulator.memories == []


async def test_async_add_poll_survives_a_transient_status_error(
    participant: Participant, client: ParticipantClient
) -> None:
    participant.load(
        {
            "add": {"responses": [{"mode": "async_202"}]},
            "tasks": {"responses": [{"status": 503}]},
        }
    )
    observe = Observed()
    await client.add(participant.endpoint(status_template=True), add_body(), IDS, observe)
    assert [(r.endpoint, r.status) for r in participant.requests()] == [
        ("add", 202),
        ("tasks", 503),
        ("tasks", 200),
    ]
    assert [a.outcome for a in observe.attempts] == ["ok", "retry", "ok"]


@pytest.mark.parametrize(
    ("status", "kind"),
    [(404, "wrong_url"), (401, "authentication_error"), (403, "access_denied")],
)
async def test_async_add_poll_final_statuses_are_final(
    participant: Participant, client: ParticipantClient, status: int, kind: str
) -> None:
    # A status URL that does not exist (or refuses the key) will not start working: R-4.10's
    # final statuses end the poll at once, rather than after the whole Add timeout.
    participant.load(
        {
            "add": {"responses": [{"mode": "async_202"}]},
            "tasks": {"then": {"status": status}},
        }
    )
    observe = Observed()
    started = time.monotonic()
    with pytest.raises(CallFailed) as failed:
        await client.add(participant.endpoint(status_template=True), add_body(), IDS, observe)
    assert time.monotonic() - started < 2.0
    assert failed.value.kind == kind
    assert failed.value.reason.startswith("add status: ")
    assert f"HTTP {status}" in failed.value.reason
    assert [(r.endpoint, r.status) for r in participant.requests()] == [
        ("add", 202),
        ("tasks", status),
    ]
    assert observe.outcomes() == [("add", 1, 202, "ok"), ("add_status", 1, status, "final")]


async def test_202_without_a_status_url_is_a_contract_error(
    participant: Participant, client: ParticipantClient
) -> None:
    participant.load({"add": {"responses": [{"mode": "async_202"}]}})
    observe = Observed()
    with pytest.raises(CallFailed) as failed:
        await client.add(participant.endpoint(), add_body(), IDS, observe)
    assert failed.value.kind == "contract_error"
    assert "no Add-status URL" in failed.value.reason
    assert [r.endpoint for r in participant.requests()] == ["add"]
    assert observe.outcomes() == [("add", 1, 202, "ok")]


async def test_search_202_is_a_contract_error(
    participant: Participant, client: ParticipantClient
) -> None:
    participant.load({"search": {"then": {"status": 202, "body": '{"task_id":"t"}'}}})
    with pytest.raises(CallFailed) as failed:
        await client.search(participant.endpoint(), search_body(), TOP_K, Observed())
    assert (failed.value.kind, failed.value.reason) == (
        "contract_error",
        "search: unexpected HTTP 202",
    )
    assert len(participant.requests()) == 1


# --- 6. health ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("outcome", "healthy"),
    [
        ({}, True),
        ({"status": 204}, True),
        ({"status": 503}, False),
        ({"status": 500}, False),
        ({"status": 404}, False),
        ({"mode": "drop"}, False),
    ],
)
async def test_health(
    participant: Participant, client: ParticipantClient, outcome: dict[str, Any], healthy: bool
) -> None:
    participant.load({"health": {"then": outcome}})
    assert await client.health(participant.endpoint()) is healthy
    (record,) = participant.requests()
    assert (record.method, record.path, record.endpoint) == ("GET", "/health", "health")
    # Unauthenticated: the key is never sent to the health URL.
    assert record.header("authorization") is None
    assert all(KEY not in value for _, value in record.headers)
