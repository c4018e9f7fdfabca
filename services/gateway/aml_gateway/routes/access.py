"""Participants request evaluation access: a new Leaderboard API Key, or one more version for
the key they hold (R-3.1). Admins decide in `routes/admin.py`; how a new key reaches its
requester (the request token) is described in `aml_gateway.access_requests`."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Depends, Header, Path, Request

from aml_contract.api.access_requests import (
    AccessRequest,
    AccessRequestCreated,
    AccessRequestStatus,
)
from aml_gateway import access_requests
from aml_gateway.deps import (
    GuardedRoute,
    OptionalTeamDep,
    ServicesDep,
    access_request_allowance,
    auth_failed,
    bearer,
    check_not_blocked,
)
from aml_gateway.errors import error_responses
from aml_gateway.services import key_hash

router = APIRouter(route_class=GuardedRoute, prefix="/v1/access-requests", tags=["access"])


@router.post(
    "",
    status_code=201,
    responses=error_responses(401, 409, 413, 429),
    dependencies=[Depends(access_request_allowance)],
)
async def submit_access_request(
    body: AccessRequest, svc: ServicesDep, request: Request, team: OptionalTeamDep
) -> AccessRequestCreated:
    """`new_key` needs no authentication and is answered with a request token (shown once);
    `add_version` must carry the team's Leaderboard API Key as a Bearer token, and the version
    is bound to that team on approval. An Authorization header, when sent, is checked before
    the body is read (a wrong one answers 401 whatever the kind). Each client address may send
    `AML_ACCESS_REQUEST_BURST` requests at once, earned back at `AML_ACCESS_REQUESTS_PER_HOUR`
    (429 with Retry-After beyond it)."""
    team_id = None
    if body.kind == "add_version":
        # Authenticated before anything is checked or stored, so an unknown caller learns
        # nothing and leaves nothing behind.
        if team is None:
            raise await auth_failed(request, 401, "send the Leaderboard API Key as a Bearer token")
        team_id = team["_id"]
    return await access_requests.submit(svc, body, team_id)


@router.get("/{request_id}", responses=error_responses(401, 404, 429))
async def get_access_request(
    request_id: Annotated[str, Path(max_length=100)],
    svc: ServicesDep,
    request: Request,
    authorization: Annotated[str | None, Header()] = None,
) -> AccessRequestStatus:
    """Bearer: the request token the request was answered with (new_key; the first read after
    approval returns the new Leaderboard API Key, once), or a team's key for the requests bound
    to that team (its add_version requests and the new_key request that created it)."""
    await check_not_blocked(request)
    token = bearer(authorization)
    if token is None:
        raise await auth_failed(request, 401, "send the Leaderboard API Key as a Bearer token")
    as_requester = await access_requests.for_requester(svc, request_id, token)
    if as_requester is not None:
        return as_requester
    team = await svc.stores.accounts.team_by_key_hash(key_hash(token))
    if team is None:
        raise await auth_failed(request, 401, "unknown Leaderboard API Key or request token")
    return await access_requests.for_team(svc.stores.access_requests, request_id, team["_id"])
