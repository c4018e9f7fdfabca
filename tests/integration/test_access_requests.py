"""Evaluation Access Requests end to end (R-3.1, R-3.2, R-5.1, R-7.2): the real gateway app on a
real nx-27017 and nats-server, with a loopback HTTP server standing in for the participant's
Health URL."""

from __future__ import annotations

import asyncio
import hashlib
import uuid
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
import structlog
from gateway_support import ADMIN, ADMIN_TOKEN, Clock, Gateway, submit_access_request
from gateway_support import request_body as any_request_body
from pydantic import SecretStr
from pymongo import AsyncMongoClient

from aml_gateway import access_requests
from aml_gateway.main import UnsafeConfiguration, create_app
from aml_gateway.settings import GatewaySettings
from aml_pipeline.jobs import load_endpoint
from aml_runtime.db import Document
from aml_runtime.secrets import SecretBox
from aml_runtime.stores import Stores

pytestmark = pytest.mark.integration

# Sent as the Memory System Key: it must never come back in a response or sit in the database
# in clear text.
CANARY = f"canary-msk-{uuid.uuid4().hex}"


submit = submit_access_request


def request_body(participant: str, **changes: Any) -> dict[str, Any]:
    return any_request_body(participant, **({"memory_system_key": CANARY} | changes))


async def test_new_key_then_add_version(gateway: Gateway, participant: str) -> None:
    gw = gateway
    created = await submit(gw, request_body(participant))
    assert created["state"] == "pending" and created["kind"] == "new_key"
    assert created["health_check"]["ok"] is True
    assert created["has_memory_system_key"] is True
    assert created["declared_models"]["llms"] == ["gpt-4o-mini"]
    assert any(w.startswith("add_url: http is not encrypted") for w in created["warnings"])
    request_id = created["id"]

    listed = await gw.client.get("/v1/admin/access-requests?state=pending", headers=ADMIN)
    assert listed.status_code == 200
    assert request_id in [r["id"] for r in listed.json()]

    approved = await gw.client.post(
        f"/v1/admin/access-requests/{request_id}/approve", headers=ADMIN
    )
    assert approved.status_code == 200, approved.text
    grant = approved.json()
    key = grant["leaderboard_api_key"]
    assert key.startswith("aml_") and grant["request_id"] == request_id

    # Decided once: the key is never shown again.
    again = await gw.client.post(f"/v1/admin/access-requests/{request_id}/approve", headers=ADMIN)
    assert again.status_code == 409 and key not in again.text
    assert "approved" in again.json()["detail"]["reason"]
    late = await gw.client.post(
        f"/v1/admin/access-requests/{request_id}/reject", json={"reason": "no"}, headers=ADMIN
    )
    assert late.status_code == 409
    pending = await gw.client.get("/v1/admin/access-requests?state=pending", headers=ADMIN)
    assert request_id not in [r["id"] for r in pending.json()]

    documents = await gw.db_documents()
    [team] = [d for d in documents if d.get("_id") == grant["team_id"]]
    assert team["key_hash"] == hashlib.sha256(key.encode()).hexdigest()
    assert key not in repr(team)
    assert key not in repr(documents)

    # The new key sees its own request; the version works for the pipeline as created.
    auth = {"Authorization": f"Bearer {key}"}
    own = await gw.client.get(f"/v1/access-requests/{request_id}", headers=auth)
    assert own.status_code == 200
    assert own.json()["state"] == "approved" and own.json()["version_id"] == grant["version_id"]
    mongo: AsyncMongoClient[Document] = AsyncMongoClient(gw.settings.mongo_url)
    try:
        box = SecretBox(gw.settings.secret_keys)
        db = mongo[gw.settings.mongo_db]
        endpoint = await load_endpoint(Stores.over(db), box, grant["version_id"])
        assert endpoint.secret is not None and endpoint.secret.get_secret_value() == CANARY
        assert endpoint.add_status_url_template == f"{participant}/tasks/{{task_id}}"
        assert endpoint.capacity is not None
        assert (endpoint.capacity.max_concurrency, endpoint.capacity.max_rps) == (2, 5.0)
        job = await gw.client.post(
            "/v1/jobs", json={"version_id": grant["version_id"], "run_label": "r1"}, headers=auth
        )
        assert job.status_code == 201, job.text

        # A second version for the same key, whose Health URL is down: recorded, not refused.
        unauthenticated = request_body(participant, kind="add_version", version_label="2.0")
        missing = await gw.client.post("/v1/access-requests", json=unauthenticated)
        assert missing.status_code == 401
        wrong = await gw.client.post(
            "/v1/access-requests",
            json=unauthenticated,
            headers={"Authorization": "Bearer aml_not-a-key"},
        )
        assert wrong.status_code == 401
        second = await submit(
            gw,
            request_body(
                participant,
                kind="add_version",
                version_label="2.0",
                board="industrial",
                tracks=["textual", "coding"],
                health_url=f"{participant}/down",
            ),
            key=key,
        )
        assert second["health_check"]["ok"] is False and second["team_id"] == grant["team_id"]
        assert (await gw.client.get(f"/v1/access-requests/{second['id']}", headers=auth)).json()[
            "state"
        ] == "pending"
        bound = await gw.client.post(
            f"/v1/admin/access-requests/{second['id']}/approve", headers=ADMIN
        )
        assert bound.status_code == 200, bound.text
        assert bound.json()["leaderboard_api_key"] is None
        assert bound.json()["team_id"] == grant["team_id"]
        versions = [v async for v in db.versions.find({"team_id": grant["team_id"]})]
        assert sorted(v["version_label"] for v in versions) == ["1.0", "2.0"]
        assert [v["tracks"] for v in versions if v["version_label"] == "2.0"] == [
            ["textual", "coding"]
        ]
    finally:
        await mongo.close()


async def test_reject_with_reason(gateway: Gateway, participant: str) -> None:
    gw = gateway
    created = await submit(gw, request_body(participant, board="industrial"))
    path = f"/v1/admin/access-requests/{created['id']}"
    empty = await gw.client.post(f"{path}/reject", json={"reason": ""}, headers=ADMIN)
    assert empty.status_code == 422
    rejected = await gw.client.post(
        f"{path}/reject", json={"reason": "Health URL unreachable"}, headers=ADMIN
    )
    assert rejected.status_code == 200
    assert rejected.json()["state"] == "rejected"
    assert rejected.json()["reason"] == "Health URL unreachable"
    assert rejected.json()["decided_at"] is not None
    assert (await gw.client.post(f"{path}/approve", headers=ADMIN)).status_code == 409
    listed = await gw.client.get("/v1/admin/access-requests?state=rejected", headers=ADMIN)
    assert created["id"] in [r["id"] for r in listed.json()]
    # Nothing will ever call the system with a rejected request's key, so it is not kept.
    documents = await gw.db_documents()
    [stored] = [d for d in documents if d.get("_id") == created["id"]]
    assert not [d for d in documents if d.get("_id") == stored["spec"]["secret_ref"]]

    for action in ("approve", "reject"):
        unknown = await gw.client.post(
            f"/v1/admin/access-requests/acc-unknown/{action}", json={"reason": "x"}, headers=ADMIN
        )
        assert unknown.status_code == 404
        assert unknown.json() == {"detail": {"reason": "access request acc-unknown not found"}}


async def test_every_recorded_time_is_the_gateway_clock(
    gateway: Gateway, participant: str, clock: Clock
) -> None:
    gw = gateway
    created = await submit(gw, request_body(participant, system_name="clocked"))
    assert datetime.fromisoformat(created["created_at"]) == clock()
    assert datetime.fromisoformat(created["health_check"]["checked_at"]) == clock()
    clock.advance(timedelta(days=2))
    approved = await gw.client.post(
        f"/v1/admin/access-requests/{created['id']}/approve", headers=ADMIN
    )
    assert approved.status_code == 200, approved.text
    grant = approved.json()
    read = await gw.client.get(
        f"/v1/access-requests/{created['id']}", headers=_bearer(created["request_token"])
    )
    assert datetime.fromisoformat(read.json()["decided_at"]) == clock()
    stored = {d["_id"]: d for d in await gw.db_documents() if isinstance(d.get("_id"), str)}
    assert stored[created["id"]]["key_delivery"]["delivered_at"].replace(tzinfo=UTC) == clock()
    for document_id, field in (
        (grant["team_id"], "created_at"),
        (grant["version_id"], "created_at"),
        ("clocked", "claimed_at"),
    ):
        assert stored[document_id][field].replace(tzinfo=UTC) == clock(), document_id


async def test_concurrent_approvals_decide_once(gateway: Gateway, participant: str) -> None:
    gw = gateway
    created = await submit(gw, request_body(participant, system_name="raced"))
    path = f"/v1/admin/access-requests/{created['id']}/approve"
    responses = await asyncio.gather(*(gw.client.post(path, headers=ADMIN) for _ in range(3)))
    assert sorted(r.status_code for r in responses) == [200, 409, 409]
    documents = await gw.db_documents()
    # The losers' teams and versions were undone: one key, one version for the request.
    teams = [d for d in documents if d.get("access_request_id") == created["id"]]
    versions = [d for d in documents if d.get("system_name") == "raced" and "team_id" in d]
    assert len(teams) == 1 and len(versions) == 1


async def test_openapi_documents_the_workflow(gateway: Gateway) -> None:
    schema = (await gateway.client.get("/openapi.json")).json()
    for path in (
        "/v1/access-requests",
        "/v1/access-requests/{request_id}",
        "/v1/admin/access-requests",
        "/v1/admin/access-requests/{request_id}/approve",
        "/v1/admin/access-requests/{request_id}/reject",
    ):
        assert path in schema["paths"]
    models = schema["components"]["schemas"]
    for name in ("AccessRequest", "AccessRejection", "VersionRegistration", "JobSubmission"):
        assert models[name]["examples"], name
    assert "memory_system_key" not in models["AccessRequestView"]["properties"]


def _invalid_cases(participant: str) -> list[tuple[dict[str, Any], str]]:
    no_disclosure = request_body(participant)
    del no_disclosure["source_disclosure"]
    no_key = request_body(participant, auth_method="token")
    del no_key["memory_system_key"]
    return [
        (
            request_body(participant, add_url="http://10.0.0.1/add"),
            "add_url: 10.0.0.1 is a private",
        ),
        (
            request_body(participant, search_url=participant.replace("//", "//u:p@") + "/s"),
            "search_url: credentials in the URL are not allowed",
        ),
        (
            request_body(participant, add_status_url_template="http://169.254.169.254/{task_id}"),
            "add_status_url_template: 169.254.169.254 is a link-local address",
        ),
        (no_disclosure, "the academic board requires source_disclosure"),
        (
            request_body(participant, declared_models={"embedding_model": "bge-m3"}),
            "the academic board requires the embedding model text-embedding-v4",
        ),
        (
            request_body(participant, declared_models={"llms": ["gpt-4o-mini", "gpt-4o"]}),
            "the academic board requires every LLM to be gpt-4o-mini",
        ),
        (no_key, "memory_system_key is required unless auth_method is `none`"),
        (
            request_body(participant, add_status_url_template=f"{participant}/tasks/ID"),
            "add_status_url_template: the template must contain the {task_id} placeholder",
        ),
        (
            request_body(participant, contact={"name": "A", "email": "a", "organisation": "O"}),
            "contact.email: value is not a valid email address",
        ),
        (request_body(participant, tracks=[]), "tracks: List should have at least 1 item"),
    ]


async def test_invalid_requests_are_refused(gateway: Gateway, participant: str) -> None:
    before = len(await gateway.db_documents())
    for body, reason in _invalid_cases(participant):
        response = await gateway.client.post("/v1/access-requests", json=body)
        assert response.status_code == 422, (reason, response.text)
        detail = response.json()["detail"]
        assert detail["reason"].startswith(reason), (reason, detail)
        for error in detail.get("errors", []):
            assert set(error) == {"loc", "msg", "type"}
    # A refused request leaves nothing behind, in particular no sealed key.
    assert len(await gateway.db_documents()) == before


async def test_validation_errors_never_echo_input(gateway: Gateway, participant: str) -> None:
    body = request_body(participant, capacity=CANARY, tracks=CANARY, contact=CANARY)
    response = await gateway.client.post("/v1/access-requests", json=body)
    assert response.status_code == 422
    detail = response.json()["detail"]
    assert len(detail["errors"]) == 3 and detail["reason"].endswith("(and 2 more)")
    assert CANARY not in response.text
    broken = await gateway.client.post(
        "/v1/access-requests",
        content=f'{{"memory_system_key": "{CANARY}", ',
        headers={"Content-Type": "application/json"},
    )
    assert broken.status_code == 422 and CANARY not in broken.text
    assert broken.json()["detail"]["errors"][0]["type"] == "json_invalid"
    state = await gateway.client.get("/v1/admin/access-requests?state=bogus", headers=ADMIN)
    assert state.status_code == 422
    assert state.json()["detail"]["reason"].startswith("query.state: Input should be")
    unknown = await gateway.client.get("/v1/nowhere")
    assert unknown.json() == {"detail": {"reason": "Not Found"}}


async def test_admin_endpoints_need_the_admin_token(gateway: Gateway, participant: str) -> None:
    gw = gateway
    shortcut = await gw.client.post(
        "/v1/admin/versions",
        headers=ADMIN,
        json={
            "team": "shortcut-team",
            "system_name": "s",
            "version_label": "v1",
            "add_url": f"{participant}/add",
            "search_url": f"{participant}/search",
            "health_url": f"{participant}/health",
            "memory_system_key": CANARY,
        },
    )
    assert shortcut.status_code == 201, shortcut.text
    participant_key = shortcut.json()["leaderboard_api_key"]
    created = await submit(gw, request_body(participant))
    calls = [
        ("GET", "/v1/admin/access-requests", None),
        ("POST", f"/v1/admin/access-requests/{created['id']}/approve", None),
        ("POST", f"/v1/admin/access-requests/{created['id']}/reject", {"reason": "x"}),
        ("POST", "/v1/admin/versions", {}),
    ]
    for credentials in (
        {"Authorization": f"Bearer {participant_key}"},
        {},
        {"Authorization": "Bearer " + "y" * 32},
        {"Authorization": ADMIN_TOKEN},
    ):
        for method, path, body in calls:
            response = await gw.client.request(method, path, json=body, headers=credentials)
            assert response.status_code == 403, (method, path, credentials)
            assert response.json() == {"detail": {"reason": "admin access required"}}
    # Still pending: none of the refused calls decided it.
    listed = await gw.client.get("/v1/admin/access-requests?state=pending", headers=ADMIN)
    assert created["id"] in [r["id"] for r in listed.json()]


async def test_the_memory_system_key_never_leaves_sealed(
    gateway: Gateway, participant: str
) -> None:
    # Self-contained: at least one request holds the canary even when run alone.
    await submit(gateway, request_body(participant))
    assert gateway.bodies
    for body in gateway.bodies:
        assert CANARY not in body
    documents = await gateway.db_documents()
    sealed = [d for d in documents if str(d.get("_id", "")).startswith("sec-")]
    assert sealed, "the keys are stored, sealed"
    assert CANARY not in repr(documents)
    assert CANARY.encode() not in b"".join(d["sealed"] for d in sealed)


def test_production_refuses_a_weak_admin_token() -> None:
    for token in ("", " " * 30, "z" * 23):
        with pytest.raises(UnsafeConfiguration, match="AML_ADMIN_TOKEN"):
            create_app(GatewaySettings(environment="production", admin_token=SecretStr(token)))
    create_app(GatewaySettings(environment="production", admin_token=SecretStr("z" * 24)))
    create_app(GatewaySettings(environment="development", admin_token=SecretStr("")))


# --- The request token and the key's delivery to the requester ------------------------------


def _bearer(secret: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {secret}"}


async def test_the_requester_follows_its_request_and_gets_the_key_once(
    gateway: Gateway, participant: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The module's own logger, recorded (structlog caches the configured one on first use).
    logger = structlog.testing.CapturingLogger()
    monkeypatch.setattr(access_requests, "log", logger)
    token, key = await _follow_request(gateway, participant)
    # The gateway logged the steps, never the token or the key.
    assert "leaderboard_key_delivered" in [call.args[0] for call in logger.calls]
    assert token not in repr(logger.calls) and key not in repr(logger.calls)


async def _follow_request(gw: Gateway, participant: str) -> tuple[str, str]:
    created = await submit(gw, request_body(participant, system_name="token-flow"))
    token = created["request_token"]
    assert token.startswith("amlreq_") and len(token) > 40
    request_id = created["id"]
    path = f"/v1/access-requests/{request_id}"

    documents = await gw.db_documents()
    [stored] = [d for d in documents if d.get("_id") == request_id]
    # Only the hash is stored, the way keys are.
    assert stored["request_token_hash"] == hashlib.sha256(token.encode()).hexdigest()
    assert token not in repr(documents)

    pending = await gw.client.get(path, headers=_bearer(token))
    assert pending.status_code == 200, pending.text
    assert pending.json()["state"] == "pending"
    assert pending.json()["leaderboard_api_key"] is None
    assert pending.json()["key_delivery"] is None
    # The token is never shown again, not even to its holder.
    assert "request_token" not in pending.json()

    # No token, a wrong one, or this token on another request: refused alike.
    other = await submit(gw, request_body(participant, system_name="token-other"))
    assert (await gw.client.get(path)).status_code == 401
    assert (await gw.client.get(path, headers=_bearer("amlreq_wrong"))).status_code == 401
    crossed = await gw.client.get(f"/v1/access-requests/{other['id']}", headers=_bearer(token))
    assert crossed.status_code == 401
    assert crossed.json() == {"detail": {"reason": "unknown Leaderboard API Key or request token"}}

    # Approval: the admin still sees the key (as before); a sealed copy waits for the requester.
    approved = await gw.client.post(
        f"/v1/admin/access-requests/{request_id}/approve", headers=ADMIN
    )
    assert approved.status_code == 200, approved.text
    key = approved.json()["leaderboard_api_key"]
    listed = await gw.client.get("/v1/admin/access-requests?state=approved", headers=ADMIN)
    [seen] = [r for r in listed.json() if r["id"] == request_id]
    assert seen["key_delivery"] == "held" and key not in listed.text
    documents = await gw.db_documents()
    [stored] = [d for d in documents if d.get("_id") == request_id]
    held = stored["key_delivery"]
    assert held["state"] == "held"
    assert key not in repr(documents) and key.encode() not in held["sealed"]
    box = SecretBox(gw.settings.secret_keys)
    assert box.open(held["sealed"]).get_secret_value() == key

    # The first read with the token delivers it; the sealed copy is gone in the same write.
    first = await gw.client.get(path, headers=_bearer(token))
    assert first.status_code == 200, first.text
    assert first.json()["state"] == "approved"
    assert first.json()["leaderboard_api_key"] == key
    assert first.json()["key_delivery"] == "delivered"
    assert first.json()["version_id"] == approved.json()["version_id"]
    [stored] = [d for d in await gw.db_documents() if d.get("_id") == request_id]
    assert stored["key_delivery"]["state"] == "delivered"
    assert "sealed" not in stored["key_delivery"]

    # Later reads say it was delivered; the key itself works and reads the request too.
    again = await gw.client.get(path, headers=_bearer(token))
    assert again.json()["leaderboard_api_key"] is None
    assert again.json()["key_delivery"] == "delivered" and key not in again.text
    own = await gw.client.get(path, headers=_bearer(key))
    assert own.status_code == 200 and own.json()["leaderboard_api_key"] is None
    # A team key reads its own team's requests only.
    assert (
        await gw.client.get(f"/v1/access-requests/{other['id']}", headers=_bearer(key))
    ).status_code == 404
    return token, key


async def test_concurrent_reads_deliver_the_key_once(gateway: Gateway, participant: str) -> None:
    gw = gateway
    created = await submit(gw, request_body(participant, system_name="token-race"))
    path = f"/v1/access-requests/{created['id']}"
    approved = await gw.client.post(
        f"/v1/admin/access-requests/{created['id']}/approve", headers=ADMIN
    )
    key = approved.json()["leaderboard_api_key"]
    reads = await asyncio.gather(
        *(gw.client.get(path, headers=_bearer(created["request_token"])) for _ in range(4))
    )
    assert all(r.status_code == 200 for r in reads)
    delivered = [r.json()["leaderboard_api_key"] for r in reads]
    assert delivered.count(key) == 1 and delivered.count(None) == 3


async def test_rejected_and_add_version_requests(gateway: Gateway, participant: str) -> None:
    gw = gateway
    created = await submit(gw, request_body(participant, system_name="token-rejected"))
    await gw.client.post(
        f"/v1/admin/access-requests/{created['id']}/reject",
        json={"reason": "no repository"},
        headers=ADMIN,
    )
    read = await gw.client.get(
        f"/v1/access-requests/{created['id']}", headers=_bearer(created["request_token"])
    )
    assert read.json()["state"] == "rejected" and read.json()["reason"] == "no repository"
    assert read.json()["leaderboard_api_key"] is None and read.json()["key_delivery"] is None

    # A team that holds a key asks for a version with it: no token, and no key to deliver.
    shortcut = await gw.client.post(
        "/v1/admin/versions",
        headers=ADMIN,
        json={
            "team": "token-team",
            "system_name": "t",
            "version_label": "v1",
            "add_url": f"{participant}/add",
            "search_url": f"{participant}/search",
            "health_url": f"{participant}/health",
            "memory_system_key": CANARY,
        },
    )
    team_key = shortcut.json()["leaderboard_api_key"]
    second = await submit(
        gw,
        # The team's own system: a name another team holds is never approved.
        request_body(participant, kind="add_version", system_name="t", version_label="2.0"),
        key=team_key,
    )
    assert second["request_token"] is None
    await gw.client.post(f"/v1/admin/access-requests/{second['id']}/approve", headers=ADMIN)
    read = await gw.client.get(f"/v1/access-requests/{second['id']}", headers=_bearer(team_key))
    assert read.json()["state"] == "approved" and read.json()["key_delivery"] is None
