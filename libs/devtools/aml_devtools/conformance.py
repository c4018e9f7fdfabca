"""`aml check`: a participant's own conformance check of its Add/Search/Health endpoints
against the contract (SPEC R-4.2 - R-4.11), before it asks for an evaluation.

The calls go through the platform's own `ParticipantClient` and validators, so a server that
passes here is judged by the very code that judges it during a run. The rules are plain
functions over what was observed (statuses, validated items, failures); the probing and the
printing stay at the edge. Loopback targets are allowed (a team checks the server on its own
machine); every other R-4.1 refusal still applies.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import os
import secrets
import time
from collections.abc import Iterable, Sequence
from typing import Literal

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
from aml_evaluation.isolation import content_text, find_leaks, owners_of_texts
from aml_pipeline.participants import (
    Attempt,
    BodyRejected,
    CallFailed,
    Endpoint,
    ParticipantClient,
    RetryPolicy,
    read_capped,
)
from aml_pipeline.urlsafety import SafeTransport, UnsafeUrl, check_url

Status = Literal["pass", "warn", "fail", "skip"]
Operation = Literal["add", "add_status", "search", "health"]

# Report order; `add.async_202` and `auth.required` appear only when they apply.
RULES: tuple[str, ...] = (
    "urls",
    "health",
    "auth.accepted",
    "add.response",
    "add.async_202",
    "add.searchable",
    "add.idempotent",
    "search.shape",
    "search.top_k",
    "search.empty",
    "isolation",
    "auth.required",
)

FIXES: dict[str, str] = {
    "urls": "register https URLs on a public host name: plain http is accepted with a warning, "
    "loopback and private addresses are refused",
    "health": "answer GET on the Health URL with any 2xx, without requiring credentials",
    "auth.accepted": "accept the declared auth header: token → `Authorization: Token <key>`, "
    "bearer → `Authorization: Bearer <key>`, x-api-key → `X-Api-Key: <key>`",
    "add.response": "answer Add with HTTP 200 and exactly "
    '{"success": true, "request_id", "user_id", "session_id"} echoing the request\'s ids '
    "(or 202 with a task_id when an Add-status URL is declared)",
    "add.async_202": 'answer 202 with {"task_id"}; the status URL must answer 200 with '
    '{"status": "done", "result": <the Add response>} once the memory is searchable',
    "add.searchable": "answer Add only once the memory is persisted and immediately searchable "
    "(no background indexing after the 200)",
    "add.idempotent": "answer a replayed request_id with 200 like any valid Add: a retry carries "
    "the same request_id and body, and a refused one fails the item",
    "search.shape": 'answer Search with HTTP 200 and {"data": [...]} (no `items` wrapper, no '
    "top-level array); each item needs a non-empty string `id` and `content`, an optional "
    "numeric `score`",
    "search.top_k": "return at most `top_k` items (the platform never truncates)",
    "search.empty": 'answer a Search that finds nothing with HTTP 200 and {"data": []}',
    "isolation": "scope every Search to the request's `user_id`: never return another user's "
    "memories",
    "auth.required": "refuse Add and Search requests without the key with 401 or 403",
}

_SEVERITY: dict[Status, int] = {"skip": 0, "pass": 1, "warn": 2, "fail": 3}
# The contract asks no de-duplication: a replay stored twice is advised
# against, never a violation.
REPLAY_ADVICE = (
    "the platform re-sends the same request_id and body on retries; storing it once avoids "
    "duplicate memories"
)
_RECEIVED_MAX = 300


class RuleResult(BaseModel):
    rule: str
    status: Status
    detail: str
    # What the server sent back (truncated, the key masked), when it explains a failure.
    received: str | None = None
    fix: str | None = None


class Stats(BaseModel):
    count: int
    p50: float
    p90: float
    max: float


class Report(BaseModel):
    results: list[RuleResult]
    latency_ms: dict[str, Stats]
    response_bytes: dict[str, Stats]

    @property
    def failed(self) -> list[RuleResult]:
        return [r for r in self.results if r.status == "fail"]

    @property
    def warnings(self) -> list[RuleResult]:
        return [r for r in self.results if r.status == "warn"]


class CheckTarget(BaseModel):
    add_url: str
    search_url: str
    health_url: str
    status_url_template: str | None = None
    auth_method: AuthMethod = "none"
    key: SecretStr | None = None
    timeout_seconds: float = 30.0


# -- pure rules -----------------------------------------------------------------------------


def percentile(values: Sequence[float], fraction: float) -> float:
    """Nearest-rank percentile: always one of the observed values."""
    ordered = sorted(values)
    rank = max(1, math.ceil(fraction * len(ordered)))
    return ordered[rank - 1]


def stats(values: Sequence[float]) -> Stats | None:
    if not values:
        return None
    return Stats(
        count=len(values),
        p50=percentile(values, 0.5),
        p90=percentile(values, 0.9),
        max=max(values),
    )


def shown(body: bytes | str | None, key: str | None) -> str | None:
    """A received body as it may be printed: the key masked wherever it appears (a server that
    echoes headers back must not make the report leak it), then truncated."""
    if body is None:
        return None
    text = body.decode("utf-8", "replace") if isinstance(body, bytes) else body
    if key:
        text = text.replace(key, "[key]")
    if len(text) > _RECEIVED_MAX:
        text = text[:_RECEIVED_MAX] + f"… ({len(text)} characters)"
    return text


def result(
    rule: str, status: Status, detail: str, received: str | None = None, fix: str | None = None
) -> RuleResult:
    """A verdict; a failure or warning carries the rule's fix unless it is given its own."""
    advised = status in ("fail", "warn")
    fix = (fix or FIXES.get(rule)) if advised else None
    return RuleResult(rule=rule, status=status, detail=detail, received=received, fix=fix)


def url_rules(urls: Iterable[str]) -> RuleResult:
    """R-4.1 as far as it needs no DNS. Loopback passes here, since a team checks its server
    on its own machine, but is named: registration would refuse it."""
    notes: list[str] = []
    for url in urls:
        try:
            checked = check_url(url, allow_loopback=True)
        except UnsafeUrl as exc:
            return result("urls", "fail", f"{url}: {exc.reason}")
        try:
            check_url(url, allow_loopback=False)
        except UnsafeUrl:
            notes.append(f"{url} is loopback (allowed here, refused at registration)")
        if checked.insecure:
            notes.append(f"{url} is plain http")
    if notes:
        return result("urls", "warn", "; ".join(notes))
    return result("urls", "pass", "every URL is acceptable")


def health_rule(status: int | None, received: str | None) -> RuleResult:
    if status is None:
        return result("health", "fail", "no HTTP response (connection failed or URL refused)")
    if 200 <= status < 300:
        return result("health", "pass", f"HTTP {status}")
    return result("health", "fail", f"expected a 2xx, got HTTP {status}", received)


def failure_rule(operation: Operation, failure: CallFailed) -> str:
    """Which rule a failed Add or Search call breaks."""
    if failure.kind in ("authentication_error", "access_denied"):
        return "auth.accepted"
    if operation in ("add", "add_status"):
        return "add.response"
    if "exceed top_k" in failure.reason:
        return "search.top_k"
    return "search.shape"


def call_results(
    operation: Operation, rule: str, failure: CallFailed | None, received: str | None
) -> list[RuleResult]:
    """The verdicts one Add or Search call gives: on success its own rule and the auth header
    pass; on failure the rule the failure breaks fails, and the call's own rule, when another,
    could not be checked."""
    if failure is None:
        return [
            result(rule, "pass", f"{operation} answered as the contract asks"),
            result("auth.accepted", "pass", "the auth header was accepted"),
        ]
    broken = failure_rule(operation, failure)
    verdicts = [result(broken, "fail", failure.reason, received)]
    if broken != rule:
        verdicts.append(result(rule, "skip", f"not checked: {failure.reason}"))
    return verdicts


def searchable_rule(items: list[SearchItem] | None, marker: str) -> RuleResult:
    if items is None:
        return result("add.searchable", "skip", "not checked: the Add or the Search failed")
    if any(marker in (content_text(item.content) or "") for item in items):
        return result("add.searchable", "pass", f"a Search right after the Add found {marker!r}")
    ids = ", ".join(item.id for item in items[:5]) or "none"
    return result(
        "add.searchable",
        "fail",
        f"a Search for {marker!r} right after its Add returned no item containing it "
        f"({len(items)} items: {ids})",
    )


def top_k_rule(items: list[SearchItem] | None, top_k: int, available: int) -> RuleResult:
    if items is None:
        return result("search.top_k", "skip", "not checked: the Add or the Search failed")
    if len(items) > top_k:
        return result("search.top_k", "fail", f"{len(items)} items exceed top_k={top_k}")
    note = f"{len(items)} items for top_k={top_k} with {available} matching memories"
    return result("search.top_k", "pass", note)


def empty_rule(items: list[SearchItem] | None) -> RuleResult:
    if items is None:
        return result("search.empty", "skip", "not checked: the Search failed")
    if items:
        ids = ", ".join(item.id for item in items[:5])
        return result(
            "search.empty",
            "fail",
            f"a user with no memories got {len(items)} items ({ids}): they belong to someone else",
        )
    return result("search.empty", "pass", 'a user with no memories got {"data": []}')


def isolation_rule(
    user_id: str,
    items: list[SearchItem] | None,
    writes: Iterable[tuple[str, str]],
    foreign_markers: Iterable[str],
) -> RuleResult:
    """Leaks found two ways: a candidate whose exact text was written only under other users
    (the platform's own R-4.11 check), or one carrying another user's marker word (which also
    catches a memory system that rewrites what it stores)."""
    if items is None:
        return result("isolation", "skip", "not checked: the Add or the Search failed")
    candidates = [item.model_dump() for item in items]
    leaked = {
        leak.candidate_id for leak in find_leaks(user_id, candidates, owners_of_texts(writes))
    }
    markers = list(foreign_markers)
    for item in items:
        if any(marker in (content_text(item.content) or "") for marker in markers):
            leaked.add(item.id)
    if leaked:
        return result(
            "isolation",
            "fail",
            f"a Search for {user_id} returned memories of another user: {sorted(leaked)}",
        )
    return result("isolation", "pass", "no memory of another user was returned")


def idempotency_rule(
    failure: CallFailed | None, before: int | None, after: int | None, received: str | None
) -> RuleResult:
    """A replay must be answered like any valid Add (a failure is a violation); what the
    server does with it is its own concern, so storing it twice is only a warning."""
    if failure is not None:
        return result(
            "add.idempotent", "fail", f"the replayed Add failed: {failure.reason}", received
        )
    if before is None or after is None:
        return result("add.idempotent", "skip", "not checked: a Search failed")
    if after > before:
        return result(
            "add.idempotent",
            "warn",
            f"after replaying the same request_id the memory is found {after} times, "
            f"before {before}: it was stored twice (allowed by the contract)",
            fix=REPLAY_ADVICE,
        )
    return result("add.idempotent", "pass", "the replay answered 200 and stored nothing twice")


def async_rule(template: str | None, polls: int, add_failed: bool) -> RuleResult | None:
    if template is None:
        return None
    if add_failed:
        return result("add.async_202", "skip", "not checked: the Add failed")
    if polls == 0:
        return result(
            "add.async_202",
            "skip",
            "the server answered every Add with 200: the status URL was not exercised",
        )
    return result("add.async_202", "pass", f"202 then {polls} status poll(s) ended in success")


def unauthenticated_rule(status: int | None, received: str | None) -> RuleResult:
    if status is None:
        return result("auth.required", "skip", "no HTTP response to the request without key")
    if status in (401, 403):
        return result("auth.required", "pass", f"a request without the key got HTTP {status}")
    return result(
        "auth.required",
        "warn",
        f"a Search without the key got HTTP {status} instead of 401/403",
        received,
    )


def merge(verdicts: Iterable[RuleResult]) -> list[RuleResult]:
    """One verdict per rule, in report order: the worst observed wins (fail > warn > pass >
    skip), and among equals the first, which is the one the later ones depend on."""
    worst: dict[str, RuleResult] = {}
    for verdict in verdicts:
        held = worst.get(verdict.rule)
        if held is None or _SEVERITY[verdict.status] > _SEVERITY[held.status]:
            worst[verdict.rule] = verdict
    return [worst[rule] for rule in RULES if rule in worst]


# -- probing (I/O) --------------------------------------------------------------------------


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


# -- command line ---------------------------------------------------------------------------


def render(report: Report) -> str:
    lines: list[str] = []
    for verdict in report.results:
        lines.append(f"{verdict.status.upper():<5} {verdict.rule:<15} {verdict.detail}")
        if verdict.received is not None:
            lines.append(f"{'':<22}received: {verdict.received}")
        if verdict.fix is not None:
            lines.append(f"{'':<22}fix: {verdict.fix}")
    for title, table, unit in (
        ("latency", report.latency_ms, "ms"),
        ("response size", report.response_bytes, "bytes"),
    ):
        for operation, s in table.items():
            lines.append(
                f"{title} {operation:<10} p50 {s.p50:.1f} {unit}  p90 {s.p90:.1f} {unit}  "
                f"max {s.max:.1f} {unit}  (n={s.count})"
            )
    failed, warned = len(report.failed), len(report.warnings)
    verdict_line = "conformant" if not failed else f"{failed} rule(s) violated"
    lines.append(f"result: {verdict_line}, {warned} warning(s)")
    return "\n".join(lines)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--add", required=True, help="the Add URL")
    parser.add_argument("--search", required=True, help="the Search URL")
    parser.add_argument("--health", required=True, help="the Health URL")
    parser.add_argument("--status-url", help="the Add-status URL template, with {task_id}")
    parser.add_argument(
        "--auth-method", choices=("none", "token", "bearer", "x-api-key"), default="none"
    )
    key = parser.add_mutually_exclusive_group()
    key.add_argument("--key", help="the Memory System Key (visible to local users: see --key-env)")
    key.add_argument("--key-env", help="environment variable holding the Memory System Key")
    parser.add_argument("--timeout", type=float, default=30.0, help="seconds per request")
    parser.add_argument("--json", action="store_true", help="print the report as JSON")


def target_from_args(args: argparse.Namespace) -> CheckTarget:
    key = args.key if args.key is not None else (os.environ.get(args.key_env or "") or None)
    if args.auth_method != "none" and not key:
        raise ValueError(f"auth method {args.auth_method!r} needs --key or --key-env")
    return CheckTarget(
        add_url=args.add,
        search_url=args.search,
        health_url=args.health,
        status_url_template=args.status_url,
        auth_method=args.auth_method,
        key=SecretStr(key) if key else None,
        timeout_seconds=args.timeout,
    )


def main_from_args(args: argparse.Namespace) -> int:
    """Exit 0 when every rule holds (warnings allowed), 1 on any violation, 2 on bad input."""
    try:
        target = target_from_args(args)
    except ValueError as exc:
        print(f"aml check: {exc}")
        return 2
    report = asyncio.run(run_check(target))
    if args.json:
        print(json.dumps(report.model_dump(mode="json"), indent=2))
    else:
        print(render(report))
    return 1 if report.failed else 0
