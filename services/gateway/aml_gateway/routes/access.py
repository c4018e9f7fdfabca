"""Participants request evaluation access: a new Leaderboard API Key, or one more version for
the key they hold (R-3.1). Admins decide in `routes/admin.py`."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Header

from aml_contract.api import AccessRequest, AccessRequestView
from aml_gateway import access_requests
from aml_gateway.deps import ServicesDep, TeamDep, current_team
from aml_gateway.errors import error_responses

router = APIRouter(prefix="/v1/access-requests", tags=["access"])


@router.post("", status_code=201, responses=error_responses(401))
async def submit_access_request(
    body: AccessRequest,
    svc: ServicesDep,
    authorization: Annotated[str | None, Header()] = None,
) -> AccessRequestView:
    """`new_key` needs no authentication; `add_version` must carry the team's Leaderboard API
    Key as a Bearer token, and the version is bound to that team on approval."""
    team_id = None
    if body.kind == "add_version":
        # Authenticated before anything is checked or stored, so an unknown caller learns
        # nothing and leaves nothing behind.
        team_id = (await current_team(svc, authorization))["_id"]
    return await access_requests.submit(svc, body, team_id)


@router.get("/{request_id}", responses=error_responses(401, 404))
async def get_access_request(request_id: str, svc: ServicesDep, team: TeamDep) -> AccessRequestView:
    """A request bound to the calling key's team: its add_version requests, and the new_key
    request that created the team."""
    return await access_requests.for_team(svc.db, request_id, team["_id"])
