"""The participant contract and client logic (SPEC R-4.2 - R-4.10), without any server: pure
functions, and `ParticipantClient._send` driven through `httpx.MockTransport`."""

from __future__ import annotations

import json
import random
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from email.utils import format_datetime
from typing import Any

import httpx
import pytest
from pydantic import PrivateAttr, SecretStr, ValidationError

from aml_contract.participant import AddRequest, Message, SearchRequest, encode
from aml_pipeline.participants import (
    ADD_RETRYABLE,
    SEARCH_RETRYABLE,
    Attempt,
    CallFailed,
    Endpoint,
    ParticipantClient,
    RetryPolicy,
    auth_headers,
    parse_retry_after,
    validate_add_response,
    validate_search_response,
)
from aml_runtime.settings import ParticipantCallSettings

NOW = datetime(2025, 3, 4, 12, 0, 0, tzinfo=UTC)

# --- auth headers (R-4.2) -------------------------------------------------------------------


@pytest.mark.parametrize(
    ("method", "expected"),
    [
        ("token", {"Authorization": "Token s3cr3t"}),
        ("bearer", {"Authorization": "Bearer s3cr3t"}),
        ("x-api-key", {"X-Api-Key": "s3cr3t"}),
        ("none", {}),
    ],
)
def test_auth_headers_per_method(method: Any, expected: dict[str, str]) -> None:
    assert auth_headers(method, SecretStr("s3cr3t")) == expected


@pytest.mark.parametrize("method", ["token", "bearer", "x-api-key", "none"])
def test_auth_headers_without_secret_send_nothing(method: Any) -> None:
    assert auth_headers(method, None) == {}


# --- Retry-After ----------------------------------------------------------------------------


def test_retry_after_delta_seconds() -> None:
    assert parse_retry_after("120", now=NOW) == 120.0
    assert parse_retry_after(" 5 ", now=NOW) == 5.0
    assert parse_retry_after("0", now=NOW) == 0.0


def test_retry_after_http_date() -> None:
    later = format_datetime(NOW + timedelta(seconds=90), usegmt=True)
    assert later.endswith("GMT")
    assert parse_retry_after(later, now=NOW) == pytest.approx(90.0)


def test_retry_after_rfc850_date() -> None:
    assert parse_retry_after("Tuesday, 04-Mar-25 12:00:30 GMT", now=NOW) == pytest.approx(30.0)


def test_retry_after_date_in_the_past_is_zero() -> None:
    earlier = format_datetime(NOW - timedelta(hours=1), usegmt=True)
    assert parse_retry_after(earlier, now=NOW) == 0.0


@pytest.mark.parametrize("value", ["soon", "1.5", "-5", "12abc", "Mon, 99 Foo 2025", "   "])
def test_retry_after_garbage_is_none(value: str) -> None:
    assert parse_retry_after(value, now=NOW) is None


@pytest.mark.parametrize("value", ["", None])
def test_retry_after_empty_is_none(value: str | None) -> None:
    assert parse_retry_after(value, now=NOW) is None


def test_retry_after_asctime_date() -> None:
    assert parse_retry_after("Tue Mar  4 12:00:30 2025", now=NOW) == pytest.approx(30.0)


def test_retry_after_superscript_digit_is_garbage() -> None:
    assert parse_retry_after("²", now=NOW) is None


# --- RetryPolicy.delay ----------------------------------------------------------------------


def test_delay_bounded_by_backoff_max() -> None:
    random.seed(1234)
    policy = RetryPolicy(backoff_base_seconds=0.5, backoff_max_seconds=3.0)
    for attempt in range(1, 30):
        for _ in range(50):
            assert 0.0 <= policy.delay(attempt, None) <= 3.0


def test_delay_never_below_retry_after() -> None:
    random.seed(99)
    policy = RetryPolicy(backoff_base_seconds=0.5, backoff_max_seconds=30.0)
    for attempt in range(1, 8):
        for retry_after in (0.0, 0.2, 4.0, 60.0):
            assert policy.delay(attempt, retry_after) >= retry_after
    # A Retry-After beyond backoff_max still wins: the server asked for it.
    assert policy.delay(1, 45.0) == 45.0


def test_delay_ceiling_grows_with_attempts() -> None:
    random.seed(7)
    policy = RetryPolicy(backoff_base_seconds=1.0, backoff_max_seconds=1000.0)
    maxima = [max(policy.delay(attempt, None) for _ in range(400)) for attempt in (1, 2, 3, 4, 5)]
    for attempt, observed in enumerate(maxima, start=1):
        ceiling = 2 ** (attempt - 1)
        assert observed <= ceiling
        # Jitter up to the ceiling: 400 samples come close to the top.
        assert observed > 0.9 * ceiling
    assert maxima == sorted(maxima)


def test_delay_draws_between_its_floor_and_its_ceiling(monkeypatch: pytest.MonkeyPatch) -> None:
    seen: list[tuple[float, float]] = []

    def uniform(low: float, high: float) -> float:
        seen.append((low, high))
        return high

    monkeypatch.setattr(random, "uniform", uniform)
    policy = RetryPolicy(backoff_base_seconds=0.5, backoff_max_seconds=5.0)
    assert [policy.delay(a, None) for a in (1, 2, 3, 4, 5, 6)] == [0.5, 1.0, 2.0, 4.0, 5.0, 5.0]
    # Half of each ceiling is always waited (equal jitter), never zero.
    assert seen == [(c / 2, c) for c in (0.5, 1.0, 2.0, 4.0, 5.0, 5.0)]


def test_five_attempts_span_tens_of_seconds_by_default() -> None:
    """A participant's restart or a load balancer's blip of a few seconds is ridden through by
    the retries alone (R-4.13): the four waits between five attempts are never shorter than
    22.5 s in all with the defaults, whatever the draw."""
    policy = RetryPolicy()
    settings = ParticipantCallSettings()
    assert policy.backoff_base_seconds == settings.participant_backoff_base_seconds
    assert policy.max_attempts == settings.participant_max_attempts == 5
    random.seed(5)
    spans = [sum(policy.delay(attempt, None) for attempt in range(1, 5)) for _ in range(500)]
    assert min(spans) >= 22.5 and max(spans) <= 45.0


# --- Add response (R-4.6) -------------------------------------------------------------------

IDS = ("eval:j:ds:c1:chunk-1", "eval:j:ds:c1", "eval:j:c1:session_1")


def _add_payload(**overrides: Any) -> dict[str, Any]:
    payload: dict[str, Any] = {
        "success": True,
        "request_id": IDS[0],
        "user_id": IDS[1],
        "session_id": IDS[2],
    }
    payload.update(overrides)
    return {k: v for k, v in payload.items() if v is not _MISSING}


_MISSING = object()


def _contract_error(call: Callable[[], Any]) -> str:
    with pytest.raises(CallFailed) as info:
        call()
    assert info.value.kind == "contract_error"
    assert info.value.reason == str(info.value)
    return info.value.reason


def test_add_response_success() -> None:
    validate_add_response(_add_payload(), *IDS)
    validate_add_response(_add_payload(extra_field="ignored"), *IDS)


def test_add_response_success_false() -> None:
    reason = _contract_error(lambda: validate_add_response(_add_payload(success=False), *IDS))
    assert "success" in reason


@pytest.mark.parametrize("field", ["success", "request_id", "user_id", "session_id"])
def test_add_response_missing_field(field: str) -> None:
    payload = _add_payload(**{field: _MISSING})
    reason = _contract_error(lambda: validate_add_response(payload, *IDS))
    assert field in reason


@pytest.mark.parametrize("field", ["request_id", "user_id", "session_id"])
def test_add_response_wrong_echo(field: str) -> None:
    payload = _add_payload(**{field: "eval:someone-else"})
    reason = _contract_error(lambda: validate_add_response(payload, *IDS))
    assert field in reason
    assert "echo" in reason


@pytest.mark.parametrize("body", [[], ["x"], "ok", 1, None, True])
def test_add_response_non_object(body: Any) -> None:
    reason = _contract_error(lambda: validate_add_response(body, *IDS))
    assert "object" in reason


@pytest.mark.parametrize("value", [1, "true"])
def test_add_response_success_must_be_json_true(value: Any) -> None:
    _contract_error(lambda: validate_add_response(_add_payload(success=value), *IDS))


# --- Search response (R-4.8) ----------------------------------------------------------------


def _item(n: int, **overrides: Any) -> dict[str, Any]:
    item: dict[str, Any] = {"id": f"m{n}", "content": f"memory {n}", "score": 1.0 / n}
    item.update(overrides)
    return item


def test_search_response_valid() -> None:
    payload = {
        "data": [_item(1), _item(2, score=3, created_at="2024-01-01"), {"id": "x", "content": "y"}],
        "took_ms": 12,
    }
    items = validate_search_response(payload, top_k=3)
    assert [i.id for i in items] == ["m1", "m2", "x"]
    assert items[1].score == 3
    assert items[2].score is None


def test_search_response_empty_data() -> None:
    assert validate_search_response({"data": []}, top_k=5) == []


def test_search_response_top_level_array() -> None:
    reason = _contract_error(lambda: validate_search_response([_item(1)], top_k=5))
    assert "array" in reason


def test_search_response_items_wrapper() -> None:
    reason = _contract_error(lambda: validate_search_response({"items": [_item(1)]}, top_k=5))
    assert "items" in reason
    assert "data" in reason


def test_search_response_non_object() -> None:
    _contract_error(lambda: validate_search_response("nope", top_k=5))


@pytest.mark.parametrize("data", [{"0": _item(1)}, "m1", None, 3])
def test_search_response_data_not_a_list(data: Any) -> None:
    reason = _contract_error(lambda: validate_search_response({"data": data}, top_k=5))
    assert "data" in reason


def test_search_response_more_than_top_k() -> None:
    payload = {"data": [_item(n) for n in range(1, 5)]}
    assert len(validate_search_response(payload, top_k=4)) == 4
    reason = _contract_error(lambda: validate_search_response(payload, top_k=3))
    assert "top_k=3" in reason
    assert "4 items" in reason


def test_search_response_empty_id_names_the_item() -> None:
    payload = {"data": [_item(1), _item(2), _item(3, id="")]}
    reason = _contract_error(lambda: validate_search_response(payload, top_k=10))
    assert "item 3" in reason
    assert "id" in reason


def test_search_response_missing_id_names_the_item() -> None:
    bad = _item(2)
    del bad["id"]
    reason = _contract_error(lambda: validate_search_response({"data": [_item(1), bad]}, 10))
    assert "item 2" in reason


def test_search_response_empty_content() -> None:
    reason = _contract_error(
        lambda: validate_search_response({"data": [_item(1, content="")]}, top_k=10)
    )
    assert "item 1" in reason
    assert "content" in reason


@pytest.mark.parametrize("score", ["high", "0.5", True, [1]])
def test_search_response_non_numeric_score(score: Any) -> None:
    reason = _contract_error(
        lambda: validate_search_response({"data": [_item(1), _item(2, score=score)]}, top_k=10)
    )
    assert "item 2" in reason
    assert "score" in reason


def test_search_response_content_parts_accepted() -> None:
    parts = [
        {"type": "text", "text": "a photo of a dog"},
        {"type": "image_url", "image_url": {"url": "https://example.org/dog.png"}},
    ]
    items = validate_search_response({"data": [_item(1, content=parts)]}, top_k=1)
    assert isinstance(items[0].content, list)
    assert len(items[0].content) == 2


def test_search_response_empty_content_array_rejected() -> None:
    _contract_error(lambda: validate_search_response({"data": [_item(1, content=[])]}, 10))


# --- retry table (R-4.10) -------------------------------------------------------------------


def test_retry_tables_match_spec() -> None:
    assert frozenset({408, 409, 425, 429, 500, 502, 503, 504, 524}) == ADD_RETRYABLE
    assert frozenset({408, 425, 429, 500, 502, 503, 504}) == SEARCH_RETRYABLE
    for final in (400, 401, 403, 404, 409, 422):
        assert final not in SEARCH_RETRYABLE
    for final in (400, 401, 403, 404, 422):
        assert final not in ADD_RETRYABLE


# --- request encoding (R-4.4, R-4.7) --------------------------------------------------------


def _add_request(content: Any = "Mira: hello") -> AddRequest:
    return AddRequest(
        request_id=IDS[0],
        messages=[Message(role="user", content=content, timestamp=1_700_000_000_000)],
        user_id=IDS[1],
        session_id=IDS[2],
    )


def test_encode_is_byte_stable() -> None:
    first = encode(_add_request())
    assert first == encode(_add_request())
    assert encode(AddRequest.model_validate_json(first)) == first
    search = SearchRequest(query="Where?", user_id=IDS[1], top_k=100)
    assert encode(search) == encode(SearchRequest.model_validate_json(encode(search)))


def test_encode_is_compact_json() -> None:
    body = encode(SearchRequest(query="Where?", user_id="u", top_k=5))
    assert body == b'{"query":"Where?","top_k":5,"user_id":"u"}'


def test_encode_excludes_unset_options() -> None:
    plain = json.loads(encode(SearchRequest(query="q", user_id="u", top_k=5)))
    assert "options" not in plain
    assert b"null" not in encode(SearchRequest(query="q", user_id="u", top_k=5))
    choice = json.loads(encode(SearchRequest(query="q", user_id="u", top_k=5, options=["a", "b"])))
    assert choice["options"] == ["a", "b"]


def test_encode_excludes_none_timestamp() -> None:
    request = AddRequest(
        request_id="r", messages=[Message(role="user", content="hi")], user_id="u", session_id="s"
    )
    assert "timestamp" not in json.loads(encode(request))["messages"][0]


def test_encode_is_utf8_not_ascii_escaped() -> None:
    body = encode(_add_request("Zoë: café ☕ 東京"))
    assert "Zoë: café ☕ 東京".encode() in body
    assert b"\\u" not in body
    assert json.loads(body.decode("utf-8"))["messages"][0]["content"] == "Zoë: café ☕ 東京"


@pytest.mark.parametrize("extra", ["metadata", "app_id", "agent_id", "async_mode"])
def test_add_request_rejects_extra_fields(extra: str) -> None:
    payload = json.loads(encode(_add_request()))
    payload[extra] = {"k": "v"} if extra == "metadata" else "x"
    with pytest.raises(ValidationError):
        AddRequest.model_validate(payload)


@pytest.mark.parametrize("extra", ["filters", "rerank", "keyword_search"])
def test_search_request_rejects_extra_fields(extra: str) -> None:
    with pytest.raises(ValidationError):
        SearchRequest.model_validate({"query": "q", "user_id": "u", "top_k": 5, extra: True})


def test_requests_reject_empty_content() -> None:
    with pytest.raises(ValidationError):
        _add_request("")
    with pytest.raises(ValidationError):
        _add_request([])
    with pytest.raises(ValidationError):
        AddRequest(request_id="r", messages=[], user_id="u", session_id="s")
    with pytest.raises(ValidationError):
        SearchRequest(query="", user_id="u", top_k=5)
    with pytest.raises(ValidationError):
        SearchRequest(query="q", user_id="", top_k=5)
    with pytest.raises(ValidationError):
        SearchRequest(query="q", user_id="u", top_k=0)


# --- ParticipantClient._send through a MockTransport ----------------------------------------


class RecordingPolicy(RetryPolicy):
    """A real RetryPolicy that also remembers what it was asked."""

    _calls: list[tuple[int, float | None]] = PrivateAttr(default_factory=list)

    def delay(self, attempt: int, retry_after: float | None) -> float:
        self._calls.append((attempt, retry_after))
        return super().delay(attempt, retry_after)


FAST = {"backoff_base_seconds": 0.001, "backoff_max_seconds": 0.002}

ENDPOINT = Endpoint(
    add_url="http://participant.test/add",
    search_url="http://participant.test/search",
    health_url="http://participant.test/health",
    auth_method="bearer",
    secret=SecretStr("k-123"),
)


class Script:
    """Answers requests with a scripted list of (status, headers, json body)."""

    def __init__(self, responses: list[tuple[int, dict[str, str], Any]]) -> None:
        self.responses = list(responses)
        self.requests: list[httpx.Request] = []

    def __call__(self, request: httpx.Request) -> httpx.Response:
        self.requests.append(request)
        status, headers, body = self.responses.pop(0)
        return httpx.Response(status, headers=headers, json=body)


def _client(script: Script, policy: RetryPolicy) -> ParticipantClient:
    http = httpx.AsyncClient(transport=httpx.MockTransport(script))
    return ParticipantClient(http, policy, timeout=5.0)


def _ok_add() -> dict[str, Any]:
    return _add_payload()


class Observed:
    def __init__(self) -> None:
        self.attempts: list[Attempt] = []

    async def __call__(self, attempt: Attempt) -> None:
        self.attempts.append(attempt)

    def outcomes(self) -> list[tuple[str, int, int | None, str]]:
        return [(a.operation, a.attempt, a.status, a.outcome) for a in self.attempts]


async def test_add_retries_503_then_succeeds_with_identical_bytes() -> None:
    script = Script([(503, {}, {}), (503, {}, {}), (200, {}, _ok_add())])
    observe = Observed()
    client = _client(script, RetryPolicy(max_attempts=5, **FAST))
    body = encode(_add_request("Zoë: bonjour"))
    await client.add(ENDPOINT, body, IDS, observe)
    await client.aclose()
    assert len(script.requests) == 3
    assert all(r.content == body for r in script.requests)
    assert all(r.method == "POST" and str(r.url) == ENDPOINT.add_url for r in script.requests)
    assert all(r.headers["Authorization"] == "Bearer k-123" for r in script.requests)
    assert all(r.headers["Content-Type"] == "application/json" for r in script.requests)
    assert observe.outcomes() == [
        ("add", 1, 503, "retry"),
        ("add", 2, 503, "retry"),
        ("add", 3, 200, "ok"),
    ]
    assert all(a.latency_ms >= 0 and a.error_class is None for a in observe.attempts)


async def test_add_retries_409() -> None:
    script = Script([(409, {}, {}), (200, {}, _ok_add())])
    observe = Observed()
    client = _client(script, RetryPolicy(max_attempts=3, **FAST))
    await client.add(ENDPOINT, encode(_add_request()), IDS, observe)
    assert [a.outcome for a in observe.attempts] == ["retry", "ok"]


async def test_search_409_is_final_contract_error() -> None:
    script = Script([(409, {}, {}), (200, {}, {"data": []})])
    observe = Observed()
    client = _client(script, RetryPolicy(max_attempts=5, **FAST))
    body = encode(SearchRequest(query="q", user_id=IDS[1], top_k=5))
    with pytest.raises(CallFailed) as info:
        await client.search(ENDPOINT, body, 5, observe)
    assert info.value.kind == "contract_error"
    assert "409" in info.value.reason
    assert len(script.requests) == 1
    assert observe.outcomes() == [("search", 1, 409, "final")]


@pytest.mark.parametrize(
    ("status", "kind"),
    [
        (400, "contract_error"),
        (422, "contract_error"),
        (401, "authentication_error"),
        (403, "access_denied"),
        (404, "wrong_url"),
    ],
)
@pytest.mark.parametrize("operation", ["add", "search"])
async def test_final_statuses(status: int, kind: str, operation: str) -> None:
    script = Script([(status, {}, {"detail": "no"}), (200, {}, {})])
    observe = Observed()
    client = _client(script, RetryPolicy(max_attempts=5, **FAST))
    with pytest.raises(CallFailed) as info:
        if operation == "add":
            await client.add(ENDPOINT, encode(_add_request()), IDS, observe)
        else:
            await client.search(ENDPOINT, b"{}", 5, observe)
    assert info.value.kind == kind
    assert str(status) in info.value.reason
    assert len(script.requests) == 1
    assert [a.outcome for a in observe.attempts] == ["final"]


async def test_429_retry_after_is_honoured() -> None:
    script = Script([(429, {"Retry-After": "0"}, {}), (200, {}, {"data": [_item(1)]})])
    observe = Observed()
    policy = RecordingPolicy(max_attempts=3, **FAST)
    client = _client(script, policy)
    items = await client.search(ENDPOINT, b'{"query":"q"}', 5, observe)
    assert [i.id for i in items] == ["m1"]
    assert policy._calls == [(1, 0.0)]
    assert [a.outcome for a in observe.attempts] == ["retry", "ok"]


async def test_retry_after_value_reaches_the_policy(monkeypatch: pytest.MonkeyPatch) -> None:
    """A longer Retry-After is passed on, and the policy then sleeps at least that long."""

    class NoSleep(RecordingPolicy):
        def delay(self, attempt: int, retry_after: float | None) -> float:
            real = super().delay(attempt, retry_after)
            assert retry_after is None or real >= retry_after
            return 0.0

    script = Script([(503, {"Retry-After": "7"}, {}), (200, {}, _ok_add())])
    policy = NoSleep(max_attempts=3, **FAST)
    await _client(script, policy).add(ENDPOINT, encode(_add_request()), IDS, Observed())
    assert policy._calls == [(1, 7.0)]


async def test_exhausted_attempts_is_participant_outage() -> None:
    script = Script([(503, {}, {})] * 3 + [(200, {}, _ok_add())])
    observe = Observed()
    policy = RecordingPolicy(max_attempts=3, **FAST)
    client = _client(script, policy)
    with pytest.raises(CallFailed) as info:
        await client.add(ENDPOINT, encode(_add_request()), IDS, observe)
    assert info.value.kind == "participant_outage"
    assert "3 attempts" in info.value.reason
    assert "503" in info.value.reason
    assert len(script.requests) == 3
    assert [a.outcome for a in observe.attempts] == ["retry", "retry", "final"]
    # No pointless sleep after the last attempt.
    assert [attempt for attempt, _ in policy._calls] == [1, 2]


async def test_network_errors_are_retried() -> None:
    calls = 0

    def handler(request: httpx.Request) -> httpx.Response:
        nonlocal calls
        calls += 1
        if calls == 1:
            raise httpx.ConnectError("refused", request=request)
        return httpx.Response(200, json={"data": []})

    observe = Observed()
    http = httpx.AsyncClient(transport=httpx.MockTransport(handler))
    client = ParticipantClient(http, RetryPolicy(max_attempts=3, **FAST), timeout=5.0)
    assert await client.search(ENDPOINT, b"{}", 5, observe) == []
    assert [(a.status, a.error_class, a.outcome) for a in observe.attempts] == [
        (None, "ConnectError", "retry"),
        (200, None, "ok"),
    ]


async def test_network_errors_exhausted_is_outage() -> None:
    def handler(request: httpx.Request) -> httpx.Response:
        raise httpx.ReadTimeout("slow", request=request)

    http = httpx.AsyncClient(transport=httpx.MockTransport(handler))
    client = ParticipantClient(http, RetryPolicy(max_attempts=2, **FAST), timeout=5.0)
    with pytest.raises(CallFailed) as info:
        await client.search(ENDPOINT, b"{}", 5, Observed())
    assert info.value.kind == "participant_outage"
    assert "ReadTimeout" in info.value.reason


async def test_add_202_without_status_template_is_contract_error() -> None:
    script = Script([(202, {}, {"task_id": "t-1"})])
    observe = Observed()
    client = _client(script, RetryPolicy(max_attempts=3, **FAST))
    assert ENDPOINT.add_status_url_template is None
    with pytest.raises(CallFailed) as info:
        await client.add(ENDPOINT, encode(_add_request()), IDS, observe)
    assert info.value.kind == "contract_error"
    assert "202" in info.value.reason
    assert len(script.requests) == 1


async def test_search_202_is_not_success() -> None:
    script = Script([(202, {}, {"data": []})])
    observe = Observed()
    with pytest.raises(CallFailed) as info:
        await _client(script, RetryPolicy(**FAST)).search(ENDPOINT, b"{}", 5, observe)
    assert info.value.kind == "contract_error"
    assert observe.outcomes() == [("search", 1, 202, "final")]


async def test_add_200_with_bad_echo_is_contract_error() -> None:
    script = Script([(200, {}, _add_payload(user_id="eval:other"))])
    with pytest.raises(CallFailed) as info:
        await _client(script, RetryPolicy(**FAST)).add(
            ENDPOINT, encode(_add_request()), IDS, Observed()
        )
    assert info.value.kind == "contract_error"
    assert "user_id" in info.value.reason


async def test_search_validates_top_k() -> None:
    script = Script([(200, {}, {"data": [_item(1), _item(2)]})])
    with pytest.raises(CallFailed) as info:
        await _client(script, RetryPolicy(**FAST)).search(ENDPOINT, b"{}", 1, Observed())
    assert info.value.kind == "contract_error"


async def test_no_auth_header_for_none_method() -> None:
    script = Script([(200, {}, {"data": []})])
    endpoint = ENDPOINT.model_copy(update={"auth_method": "none", "secret": None})
    await _client(script, RetryPolicy(**FAST)).search(endpoint, b"{}", 5, Observed())
    assert "Authorization" not in script.requests[0].headers
    assert "X-Api-Key" not in script.requests[0].headers


def test_retry_after_is_capped() -> None:
    policy = RetryPolicy(backoff_base_seconds=0.001, retry_after_max_seconds=60)
    assert policy.delay(1, 86_400.0) == 60
    assert policy.delay(1, 5.0) == 5.0
