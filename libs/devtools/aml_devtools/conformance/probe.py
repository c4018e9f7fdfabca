"""The probing half of `aml check`: the calls made to a memory system, through the platform's
own `ParticipantClient` and validators, so a server that passes here is judged by the very code
that judges it during a run. What the server answers is recorded and handed to `rules`.
Loopback targets are allowed (a team checks the server on its own machine); every other R-4.1
refusal still applies.
"""

from __future__ import annotations

import asyncio
import secrets
import time
from collections.abc import Sequence

import httpx
from pydantic import BaseModel, SecretStr

from aml_contract.api.vocabulary import AuthMethod
from aml_contract.participant import (
    MAX_RESPONSE_BYTES,
    AddRequest,
    Message,
    SearchItem,
    SearchRequest,
    add_request_id,
    encode,
    memory_session_id,
    memory_user_id,
)
from aml_devtools.conformance.report import Report, stats
from aml_devtools.conformance.rules import (
    Operation,
    RuleResult,
    async_rule,
    call_results,
    empty_rule,
    health_rule,
    idempotency_rule,
    isolation_rule,
    merge,
    result,
    searchable_rule,
    shown,
    top_k_rule,
    unauthenticated_rule,
    url_rules,
)
from aml_evaluation.isolation import content_text
from aml_pipeline.participants import (
    Attempt,
    BodyRejected,
    CallFailed,
    Endpoint,
    ParticipantClient,
    RetryPolicy,
    read_capped,
)
from aml_pipeline.urlsafety import SafeTransport, UnsafeUrl


class CheckTarget(BaseModel):
    add_url: str
    search_url: str
    health_url: str
    status_url_template: str | None = None
    auth_method: AuthMethod = "none"
    key: SecretStr | None = None
    timeout_seconds: float = 30.0


class _Exchange(BaseModel):
    operation: Operation
    status: int
    body: bytes


class _Recorder:
    """Keeps every response the server sent: for the received value of a failure and for
    response sizes. The bodies are the ones the client read, within its size limits: a check
    is bounded the way an evaluation is."""

    def __init__(self, target: CheckTarget) -> None:
        self._target = target
        self.exchanges: list[_Exchange] = []
        # The participant's own time per exchange, by operation (the client's audit figure).
        self.latency_ms: dict[Operation, list[float]] = {}

    def on_answer(self, operation: Operation, status: int, body: bytes) -> None:
        self.exchanges.append(_Exchange(operation=operation, status=status, body=body))

    async def observe(self, attempt: Attempt) -> None:
        self.latency_ms.setdefault(attempt.operation, []).append(attempt.latency_ms)

    def last_body(self, since: int) -> bytes | None:
        recent = self.exchanges[since:]
        # An answer whose body the client did not read (or refused) shows nothing.
        return (recent[-1].body or None) if recent else None


class _Prober:
    def __init__(self, target: CheckTarget, http: httpx.AsyncClient, recorder: _Recorder) -> None:
        self.target = target
        self.http = http
        self.recorder = recorder
        # Few, quick retries: a check should report a flaky server fast, not ride it out.
        policy = RetryPolicy(max_attempts=2, backoff_base_seconds=0.2, backoff_max_seconds=1.0)
        self.client = ParticipantClient(
            http, policy, target.timeout_seconds, on_answer=recorder.on_answer
        )
        self.endpoint = Endpoint(
            add_url=target.add_url,
            search_url=target.search_url,
            health_url=target.health_url,
            add_status_url_template=target.status_url_template,
            auth_method=target.auth_method,
            secret=target.key,
        )
        self.key = target.key.get_secret_value() if target.key else None

    def received(self, since: int) -> str | None:
        return shown(self.recorder.last_body(since), self.key)

    async def add(self, request: AddRequest) -> tuple[CallFailed | None, str | None]:
        since = len(self.recorder.exchanges)
        try:
            await self.client.add(
                self.endpoint,
                encode(request),
                (request.request_id, request.user_id, request.session_id),
                self.recorder.observe,
            )
        except CallFailed as exc:
            return exc, self.received(since)
        return None, None

    async def search(
        self, user_id: str, query: str, top_k: int
    ) -> tuple[list[SearchItem] | None, CallFailed | None, str | None]:
        since = len(self.recorder.exchanges)
        body = encode(SearchRequest(query=query, user_id=user_id, top_k=top_k))
        try:
            items = await self.client.search(self.endpoint, body, top_k, self.recorder.observe)
        except CallFailed as exc:
            return None, exc, self.received(since)
        return items, None, None

    async def health(self) -> RuleResult:
        since = len(self.recorder.exchanges)
        started = time.monotonic()
        await self.client.health(self.endpoint)
        elapsed = (time.monotonic() - started) * 1000
        recent = self.recorder.exchanges[since:]
        status = recent[-1].status if recent else None
        if recent:
            self.recorder.latency_ms.setdefault("health", []).append(round(elapsed, 3))
        return health_rule(status, self.received(since))

    async def without_key(self, user_id: str) -> RuleResult:
        since = len(self.recorder.exchanges)
        body = encode(SearchRequest(query="anything", user_id=user_id, top_k=1))
        timeout = self.target.timeout_seconds
        try:
            async with asyncio.timeout(timeout):
                async with self.http.stream(
                    "POST",
                    self.target.search_url,
                    content=body,
                    headers={"Content-Type": "application/json", "Accept-Encoding": "identity"},
                    timeout=timeout,
                ) as response:
                    status = response.status_code
                    try:
                        received = await read_capped(
                            response, MAX_RESPONSE_BYTES["search"], "search", decode=False
                        )
                    except BodyRejected:
                        received = b""
        except (httpx.HTTPError, UnsafeUrl, TimeoutError):
            return unauthenticated_rule(None, None)
        self.recorder.on_answer("search", status, received)
        return unauthenticated_rule(status, self.received(since))


def _conversation(run: str, name: str, texts: Sequence[str], chunk: int = 0) -> AddRequest:
    start = 1_700_000_000_000
    return AddRequest(
        request_id=add_request_id(run, "conformance", name, chunk),
        user_id=memory_user_id(run, "conformance", name),
        session_id=memory_session_id(run, name, f"session-{chunk + 1}"),
        messages=[
            Message(role="user" if i % 2 == 0 else "assistant", content=text, timestamp=start + i)
            for i, text in enumerate(texts)
        ],
    )


def _count(items: list[SearchItem] | None, marker: str) -> int | None:
    if items is None:
        return None
    return sum(marker in (content_text(item.content) or "") for item in items)


async def run_check(target: CheckTarget) -> Report:
    """Probe the server under fresh random user_ids, then judge what was observed."""
    recorder = _Recorder(target)
    http = httpx.AsyncClient(transport=SafeTransport(allow_loopback=True), follow_redirects=False)
    prober = _Prober(target, http, recorder)
    try:
        return await _probe(target, prober, recorder)
    finally:
        await http.aclose()


async def _probe(target: CheckTarget, prober: _Prober, recorder: _Recorder) -> Report:
    run = "check-" + secrets.token_hex(4)
    # Marker words no real conversation contains, so a hit can only be the memory just written.
    marker_a, marker_b, marker_k = (f"zq{word}{secrets.token_hex(3)}" for word in "abk")
    first = _conversation(
        run,
        "user-a",
        [
            f"I left my {marker_a} notebook on the kitchen table.",
            f"Noted: the {marker_a} notebook is on the kitchen table.",
        ],
    )
    top_k_texts = [f"Fact number {n} about the {marker_k} garden." for n in range(1, 5)]
    second = _conversation(run, "user-a", top_k_texts, chunk=1)
    other = _conversation(run, "user-b", [f"My {marker_b} bicycle is in the garage."])
    nobody = memory_user_id(run, "conformance", "user-c")

    verdicts: list[RuleResult] = [url_rules([target.add_url, target.search_url, target.health_url])]
    verdicts.append(await prober.health())

    add_failures: list[CallFailed] = []
    for request in (first, other, second):
        failure, received = await prober.add(request)
        verdicts += call_results("add", "add.response", failure, received)
        if failure is not None:
            add_failures.append(failure)
            # One failure is the finding; the others would repeat it.
            break
    written = not add_failures

    found, failure, received = await prober.search(first.user_id, marker_a, 10)
    verdicts += call_results("search", "search.shape", failure, received)
    verdicts.append(searchable_rule(found if written else None, marker_a))

    top_k, failure, received = await prober.search(first.user_id, f"{marker_k} garden", 2)
    verdicts += call_results("search", "search.shape", failure, received)
    verdicts.append(top_k_rule(top_k if written else None, 2, len(top_k_texts)))

    empty, failure, received = await prober.search(nobody, marker_a, 5)
    verdicts += call_results("search", "search.shape", failure, received)
    verdicts.append(empty_rule(empty))

    query = f"{marker_a} notebook kitchen table"
    leaks, failure, received = await prober.search(other.user_id, query, 10)
    verdicts += call_results("search", "search.shape", failure, received)
    writes = [
        (request.user_id, text)
        for request in (first, second, other)
        for message in request.messages
        if (text := content_text(message.content)) is not None
    ]
    verdicts.append(
        isolation_rule(other.user_id, leaks if written else None, writes, [marker_a, marker_k])
    )

    if written:
        failure, received = await prober.add(first)
        again, search_failure, _ = await prober.search(first.user_id, marker_a, 10)
        verdicts.append(
            idempotency_rule(failure, _count(found, marker_a), _count(again, marker_a), received)
        )
        if search_failure is not None:
            verdicts += call_results("search", "search.shape", search_failure, None)
    else:
        verdicts.append(result("add.idempotent", "skip", "not checked: the Add failed"))

    polls = len(recorder.latency_ms.get("add_status", []))
    asynchronous = async_rule(target.status_url_template, polls, not written)
    if asynchronous is not None:
        verdicts.append(asynchronous)
    if target.auth_method != "none" and target.key is not None:
        verdicts.append(await prober.without_key(nobody))

    latency = {
        operation: summary
        for operation in ("health", "add", "add_status", "search")
        if (summary := stats(recorder.latency_ms.get(operation, [])))
    }
    sizes = {
        operation: summary
        for operation in ("health", "add", "add_status", "search")
        if (
            summary := stats(
                [float(len(e.body)) for e in recorder.exchanges if e.operation == operation]
            )
        )
    }
    return Report(results=merge(verdicts), latency_ms=latency, response_bytes=sizes)
