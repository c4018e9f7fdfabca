"""Refusals from the rule modules become HTTP answers in one place (`aml_gateway.errors`): each
kind its status, the `{"detail": {"reason": ...}}` body with any further public fields, and
for a quota its `next_allowed_at` and Retry-After. A router mounted on an app of its own
answers the same way (`GuardedRoute`). An id, key or host from the request is quoted bounded
(`aml_gateway.refusals.echoed`)."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta

import httpx
import pytest
from fastapi import APIRouter, FastAPI
from pydantic import BaseModel, ConfigDict

from aml_gateway.deps import GuardedRoute
from aml_gateway.errors import install_error_handlers, refusal_response
from aml_gateway.refusals import (
    ECHO_MAX,
    Conflict,
    Invalid,
    NotFound,
    QuotaExceeded,
    Refused,
    echoed,
)
from aml_gateway.registry import check_participant_urls
from aml_pipeline.participants import REASON_QUOTE_MAX

T0 = datetime(2027, 3, 1, 9, 0, tzinfo=UTC)


def _answer(refused: Refused) -> tuple[int, dict[str, object], str | None]:
    response = refusal_response(refused)
    return response.status_code, json.loads(response.body), response.headers.get("Retry-After")


@pytest.mark.parametrize(
    ("refused", "status"),
    [(NotFound("job j1 not found"), 404), (Conflict("taken"), 409), (Invalid("bad"), 422)],
)
def test_each_kind_has_its_status_and_the_one_body_shape(refused: Refused, status: int) -> None:
    assert _answer(refused) == (status, {"detail": {"reason": refused.reason}}, None)


def test_further_public_fields_follow_the_reason() -> None:
    status, body, _ = _answer(Invalid("unknown dataset(s): x", valid_datasets=["a", "b"]))
    assert status == 422
    assert body == {"detail": {"reason": "unknown dataset(s): x", "valid_datasets": ["a", "b"]}}


def test_a_quota_says_when_and_how_long_to_wait() -> None:
    at = T0 + timedelta(minutes=59, seconds=0.2)
    status, body, retry_after = _answer(QuotaExceeded("one per hour", at, T0))
    assert status == 429
    assert body == {"detail": {"reason": "one per hour", "next_allowed_at": at.isoformat()}}
    assert retry_after == str(59 * 60 + 1)  # rounded up: never too early
    # Already due (judged late): still at least one second.
    assert _answer(QuotaExceeded("now", T0, T0 + timedelta(seconds=5)))[2] == "1"


def test_a_quota_without_a_time_has_no_retry_after() -> None:
    status, body, retry_after = _answer(QuotaExceeded("no season is open", None, T0))
    assert status == 429
    assert body == {"detail": {"reason": "no season is open", "next_allowed_at": None}}
    assert retry_after is None


def test_a_more_specific_refusal_answers_like_its_family() -> None:
    class NameTaken(Conflict):
        pass

    assert _answer(NameTaken("system name 'x' is taken"))[0] == 409


async def test_guarded_routers_and_the_app_answer_alike() -> None:
    router = APIRouter(route_class=GuardedRoute)
    plain = APIRouter()

    @router.get("/guarded")
    async def guarded() -> None:
        raise QuotaExceeded("wait", T0 + timedelta(seconds=30), T0)

    @plain.get("/plain")
    async def unguarded() -> None:
        raise QuotaExceeded("wait", T0 + timedelta(seconds=30), T0)

    bare = FastAPI()
    bare.include_router(router)
    full = FastAPI()
    install_error_handlers(full)
    full.include_router(router)
    full.include_router(plain)
    answers = []
    for app, path in ((bare, "/guarded"), (full, "/guarded"), (full, "/plain")):
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://gw") as client:
            response = await client.get(path)
        answers.append((response.status_code, response.json(), response.headers["Retry-After"]))
    expected = (
        429,
        {"detail": {"reason": "wait", "next_allowed_at": "2027-03-01T09:00:30+00:00"}},
        "30",
    )
    assert answers == [expected] * 3


def test_an_echoed_id_is_bounded_and_keeps_its_start() -> None:
    long_id = "j-" + "7" * 4998
    shown = echoed(long_id)
    assert shown == long_id[:ECHO_MAX] + "…"
    assert echoed("j3c4d") == "j3c4d"
    # Control characters cannot forge lines in a reason (or a log line quoting it).
    assert echoed("acc-1\nforged") == "acc-1\\nforged"


class Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")
    name: str


async def test_a_key_the_caller_sent_is_named_bounded() -> None:
    app = FastAPI()
    install_error_handlers(app)

    @app.post("/strict")
    async def strict(body: Strict) -> None:
        pass

    key = "k" * 5000
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://gw") as client:
        response = await client.post("/strict", json={"name": "x", key: 1})
    assert response.status_code == 422
    detail = response.json()["detail"]
    shown = key[:ECHO_MAX] + "…"
    assert detail["reason"] == f"{shown}: Extra inputs are not permitted"
    assert detail["errors"][0]["loc"] == ["body", shown]


async def test_a_refused_url_quotes_its_host_bounded() -> None:
    host = "1" * 1500 + ".5"
    with pytest.raises(Invalid) as refused:
        await check_participant_urls({"add_url": f"https://{host}/add"}, allow_loopback=False)
    reason = refused.value.reason
    assert reason.startswith("add_url: host 1111") and reason.endswith("…")
    assert len(reason) <= len("add_url: ") + REASON_QUOTE_MAX + 1
