"""The `aml check` contract rules (SPEC R-4.1 - R-4.11): plain functions from what was observed
(statuses, validated items, call failures, received bodies) to one verdict per rule, with the
fix a failure or warning calls for. Nothing here makes a call, so every rule is tested on
hand-made observations; `probe` makes the calls and feeds these.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Literal

from pydantic import BaseModel

from aml_contract.participant import SearchItem
from aml_evaluation.isolation import content_text, find_leaks, owners_of_texts
from aml_pipeline.participants import CallFailed
from aml_pipeline.urlsafety import UnsafeUrl, check_url

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
