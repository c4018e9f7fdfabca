"""Evaluation Access Requests (R-3.1, R-3.2): submitted by participants, decided by admins.

A request holds the complete `VersionFields` of the version it asks for (stored as its `spec`
field), with the Memory System Key already sealed (only its `secret_ref` is kept), so approving
it needs no further data entry and no secret ever sits unencrypted in the database.

**Request token and key delivery.** A `new_key` requester has no key yet, so its request is
answered with a random request token, shown once and stored only as its hash (like keys). The
token reads that one request (`GET /v1/access-requests/{id}`). Approval issues the new
Leaderboard API Key and shows it to the approving admin, as it always did (an operator may hand
it over by hand, and scripted stacks rely on it); beside that it is kept sealed with the
SecretBox on the request, and the requester's first read with the token after approval
returns it and removes the sealed copy in the same atomic write, so it is delivered exactly
once and every later read says `key_delivery: delivered`. A read that took the key but whose
answer was lost cannot be repeated: the admin's copy, or a new request, is the way back.
"""

from __future__ import annotations

import secrets
import uuid
from typing import Any

import structlog
from pydantic import BaseModel, SecretStr

from aml_contract.api.access_requests import (
    AccessApproved,
    AccessRequest,
    AccessRequestCreated,
    AccessRequestStatus,
    AccessRequestView,
    AccessState,
)
from aml_gateway.refusals import Conflict, NotFound, echoed
from aml_gateway.registry import (
    SAMPLE_TASK_ID,
    check_health,
    check_participant_urls,
    check_system_name,
    create_team,
    drop_secret,
    insert_version,
    name_taken_reason,
    store_secret,
)
from aml_gateway.services import Services, key_hash
from aml_runtime.db import Document, read_time
from aml_runtime.documents import VersionFields
from aml_runtime.stores.access_requests import AccessRequestStore

log = structlog.get_logger()

# An admin review list longer than this is paged by narrowing the state filter, not scrolled.
LIST_LIMIT = 500
# The parts of a request's VersionFields shown as they are (the secret reference is not).
_SHOWN_VERSION_FIELDS = (
    "system_name", "version_label", "tracks", "board", "add_url", "search_url", "health_url",
    "add_status_url_template", "auth_method", "capacity", "run_limits",
)  # fmt: skip


def new_request_token() -> str:
    return "amlreq_" + secrets.token_urlsafe(32)


async def submit(svc: Services, body: AccessRequest, team_id: str | None) -> AccessRequestCreated:
    """Check, record and return a new pending request; `team_id` is the sender's team for
    `add_version` (already authenticated by the caller) and None for `new_key`, which gets a
    request token (returned here once, stored hashed)."""
    urls = {
        "add_url": str(body.add_url),
        "search_url": str(body.search_url),
        "health_url": str(body.health_url),
    }
    if body.add_status_url_template is not None:
        sample = body.add_status_url_template.replace("{task_id}", SAMPLE_TASK_ID)
        urls["add_status_url_template"] = sample
    warnings = await check_participant_urls(
        urls, allow_loopback=svc.settings.allow_loopback_targets
    )
    declaration = {
        "repository_url": None if body.repository_url is None else str(body.repository_url),
        "source_disclosure": _dump(body.source_disclosure),
        "declared_models": _dump(body.declared_models),
    }
    # A system name belongs to one team (its public page is `/systems/{name}`): decided at
    # approval, told to the requester and the reviewer now.
    if await svc.stores.accounts.system_name_taken(body.system_name, team_id):
        warnings.append(f"system_name: {name_taken_reason(body.system_name)}; not approvable")
    version = VersionFields(
        system_name=body.system_name,
        version_label=body.version_label,
        tracks=list(body.tracks),
        board=body.board,
        add_url=urls["add_url"],
        search_url=urls["search_url"],
        health_url=urls["health_url"],
        add_status_url_template=body.add_status_url_template,
        auth_method=body.auth_method,
        secret_ref=None,
        capacity=body.capacity.model_dump(),
        run_limits=body.run_limits.model_dump(),
        declaration=declaration,
    )
    # An unhealthy system is recorded for the reviewer, not refused: it may be down for a
    # moment, and the Health URL is checked again before every job.
    healthy = await check_health(svc.settings, version)
    request_id = f"acc-{uuid.uuid4().hex[:12]}"
    token = new_request_token() if body.kind == "new_key" else None
    # Sealed only now, when everything else has been checked, and removed again if the request
    # cannot be stored: a refused request leaves no secret behind.
    secret_ref = await store_secret(svc.stores.accounts, svc.box, body.memory_system_key)
    at = svc.clock()
    document: Document = {
        "_id": request_id,
        "kind": body.kind,
        "state": "pending",
        "team_id": team_id,
        "contact": body.contact.model_dump(),
        "spec": version.model_copy(update={"secret_ref": secret_ref}).model_dump(),
        "health_check": {"ok": healthy, "checked_at": at},
        "warnings": warnings,
        "created_at": at,
        "decided_at": None,
        "reason": None,
        "version_id": None,
        "request_token_hash": None if token is None else key_hash(token),
    }
    try:
        await svc.stores.access_requests.store_access_request(document)
    except BaseException:
        await drop_secret(svc.stores.accounts, secret_ref)
        raise
    log.info("access_request_submitted", request_id=request_id, kind=body.kind, healthy=healthy)
    return AccessRequestCreated(**dict(view(document)), request_token=token)


async def list_requests(
    requests: AccessRequestStore, state: AccessState | None
) -> list[AccessRequestView]:
    return [view(document) async for document in requests.by_state(state, LIST_LIMIT)]


async def approve(svc: Services, request_id: str) -> AccessApproved:
    document = await _pending(svc.stores.access_requests, request_id)
    version = VersionFields.model_validate(document["spec"])
    new_key = None
    if document["kind"] == "new_key":
        # Refused before a team is created when another team took the name meanwhile.
        await check_system_name(svc.stores.accounts, version.system_name, None)
        contact = document["contact"]
        team_id, new_key = await create_team(
            svc.stores.accounts,
            contact["organisation"],
            svc.clock,
            {"contact": contact, "access_request_id": request_id},
        )
    else:
        team_id = document["team_id"]
        if await svc.stores.accounts.team(team_id) is None:
            raise Conflict("the requesting team no longer exists")
    try:
        version_id = await insert_version(svc.stores.accounts, team_id, version, svc.clock)
    except BaseException:
        if new_key is not None:
            await svc.stores.accounts.drop_team(team_id)
        raise
    decision: Document = {
        "state": "approved",
        "team_id": team_id,
        "version_id": version_id,
        "decided_at": svc.clock(),
    }
    if new_key is not None and document.get("request_token_hash"):
        # Held sealed for the requester, written with the decision itself (see the module doc).
        decision["key_delivery"] = {"state": "held", "sealed": svc.box.seal(SecretStr(new_key))}
    if not await svc.stores.access_requests.decide_access_request(request_id, decision):
        # Another admin decided the request meanwhile: undo, so it has exactly one outcome and
        # no second key or version exists for it.
        await svc.stores.accounts.unbind_version(version_id)
        if new_key is not None:
            await svc.stores.accounts.drop_team(team_id)
            await svc.stores.accounts.release_system_name(version.system_name, team_id)
        raise Conflict(f"access request {echoed(request_id)} was already decided")
    log.info("access_request_approved", request_id=request_id, version_id=version_id)
    return AccessApproved(
        request_id=request_id, version_id=version_id, team_id=team_id, leaderboard_api_key=new_key
    )


async def reject(svc: Services, request_id: str, reason: str) -> AccessRequestView:
    document = await _pending(svc.stores.access_requests, request_id)
    decision = {"state": "rejected", "reason": reason, "decided_at": svc.clock()}
    if not await svc.stores.access_requests.decide_access_request(request_id, decision):
        raise Conflict(f"access request {echoed(request_id)} was already decided")
    secret_ref = document["spec"].get("secret_ref")
    if secret_ref:
        # No version will ever call the system with this key: it is not kept.
        await svc.stores.accounts.drop_sealed_key(secret_ref)
    log.info("access_request_rejected", request_id=request_id)
    return view(await _find(svc.stores.access_requests, request_id))


async def for_team(
    requests: AccessRequestStore, request_id: str, team_id: str
) -> AccessRequestStatus:
    document = await requests.team_access_request(request_id, team_id)
    if document is None:
        # Another team's request answers exactly like a missing one: existence is not revealed.
        raise NotFound(f"access request {echoed(request_id)} not found")
    return AccessRequestStatus(**dict(view(document)))


async def for_requester(svc: Services, request_id: str, token: str) -> AccessRequestStatus | None:
    """The request read with its request token, or None when `token` is not this request's.
    The first read after approval takes the held key: one atomic write marks it delivered and
    drops the sealed copy, so of two concurrent reads exactly one returns it."""
    token_hash = key_hash(token)
    document = await svc.stores.access_requests.requester_access_request(request_id, token_hash)
    if document is None:
        return None
    key = None
    held = document.get("key_delivery") or {}
    if held.get("state") == "held":
        # Opened before it is taken: a copy the configured keys cannot open stays held (the
        # read fails) rather than being dropped unread.
        opened = svc.box.open(held["sealed"]).get_secret_value()
        taken = await svc.stores.access_requests.take_held_key(request_id, token_hash, svc.clock())
        if taken is not None:
            # Sealed once, at approval: what was taken is what was opened.
            key = opened
            log.info("leaderboard_key_delivered", request_id=request_id)
        document = await _find(svc.stores.access_requests, request_id)
    return AccessRequestStatus(**dict(view(document)), leaderboard_api_key=key)


async def _find(requests: AccessRequestStore, request_id: str) -> Document:
    document = await requests.access_request(request_id)
    if document is None:
        raise NotFound(f"access request {echoed(request_id)} not found")
    return document


async def _pending(requests: AccessRequestStore, request_id: str) -> Document:
    document = await _find(requests, request_id)
    if document["state"] != "pending":
        raise Conflict(f"access request {echoed(request_id)} is already {document['state']}")
    return document


def view(document: Document) -> AccessRequestView:
    """The stored request as the API shows it: the secret reference becomes a yes/no."""
    requested = document["spec"]
    declaration = requested.get("declaration") or {}
    health = document["health_check"]
    fields: dict[str, Any] = {
        "id": document["_id"],
        "kind": document["kind"],
        "state": document["state"],
        "team_id": document.get("team_id"),
        "contact": document["contact"],
        **{name: requested.get(name) for name in _SHOWN_VERSION_FIELDS},
        "has_memory_system_key": requested.get("secret_ref") is not None,
        "repository_url": declaration.get("repository_url"),
        "source_disclosure": declaration.get("source_disclosure"),
        "declared_models": declaration.get("declared_models"),
        "health_check": {"ok": health["ok"], "checked_at": read_time(health["checked_at"])},
        "warnings": document.get("warnings", []),
        "created_at": read_time(document["created_at"]),
        "decided_at": read_time(document.get("decided_at")),
        "reason": document.get("reason"),
        "version_id": document.get("version_id"),
        "key_delivery": (document.get("key_delivery") or {}).get("state"),
    }
    return AccessRequestView.model_validate(fields)


def _dump(model: BaseModel | None) -> Document | None:
    return None if model is None else model.model_dump()
