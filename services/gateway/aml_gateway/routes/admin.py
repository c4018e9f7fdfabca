"""Admin endpoints: review of access requests (R-3.2) and a shortcut that binds a version to a
team directly (used by the demo and the tests)."""

from __future__ import annotations

from datetime import UTC

from fastapi import APIRouter

from aml_contract.api.access_requests import (
    AccessApproved,
    AccessRejection,
    AccessRequestView,
    AccessState,
)
from aml_contract.api.retention import RetentionExtension, RetentionView
from aml_contract.api.versions import VersionRegistered, VersionRegistration
from aml_gateway import access_requests
from aml_gateway.deps import AdminDep, GuardedRoute, ServicesDep
from aml_gateway.errors import error_responses
from aml_gateway.refusals import Conflict, Invalid, NotFound, echoed
from aml_gateway.registry import (
    check_participant_urls,
    check_system_name,
    create_team,
    drop_secret,
    insert_version,
    store_secret,
)
from aml_runtime.documents import VersionFields

# Every admin route answers 403 to anyone without the admin token.
router = APIRouter(
    route_class=GuardedRoute,
    prefix="/v1/admin",
    tags=["admin"],
    responses=error_responses(403, 429),
)


@router.post("/versions", status_code=201, responses=error_responses(409))
async def register_version(
    body: VersionRegistration, svc: ServicesDep, _: AdminDep
) -> VersionRegistered:
    # URLs are checked before any store is touched: a refused registration leaves no trace.
    await check_participant_urls(
        {name: str(getattr(body, name)) for name in ("add_url", "search_url", "health_url")},
        allow_loopback=svc.settings.allow_loopback_targets,
    )
    team = await svc.stores.accounts.team_by_name(body.team)
    # Everything that can refuse runs before anything is stored.
    await check_system_name(
        svc.stores.accounts, body.system_name, None if team is None else team["_id"]
    )
    new_key = None
    if team is None:
        team_id, new_key = await create_team(svc.stores.accounts, body.team, svc.clock)
    else:
        team_id = team["_id"]
    secret_ref = await store_secret(svc.stores.accounts, svc.box, body.memory_system_key)
    version = VersionFields(
        system_name=body.system_name,
        version_label=body.version_label,
        tracks=[body.track],
        board=body.board,
        add_url=str(body.add_url),
        search_url=str(body.search_url),
        health_url=str(body.health_url),
        auth_method=body.auth_method,
        secret_ref=secret_ref,
        capacity=body.capacity.model_dump(),
    )
    try:
        version_id = await insert_version(svc.stores.accounts, team_id, version, svc.clock)
    except BaseException:
        # A name taken meanwhile: nothing of this registration stays.
        await drop_secret(svc.stores.accounts, secret_ref)
        if new_key is not None:
            await svc.stores.accounts.drop_team(team_id)
        raise
    return VersionRegistered(version_id=version_id, team_id=team_id, leaderboard_api_key=new_key)


@router.get("/access-requests")
async def list_access_requests(
    svc: ServicesDep, _: AdminDep, state: AccessState | None = None
) -> list[AccessRequestView]:
    return await access_requests.list_requests(svc.stores.access_requests, state)


@router.post("/access-requests/{request_id}/approve", responses=error_responses(404, 409))
async def approve_access_request(request_id: str, svc: ServicesDep, _: AdminDep) -> AccessApproved:
    return await access_requests.approve(svc, request_id)


@router.post("/access-requests/{request_id}/reject", responses=error_responses(404, 409))
async def reject_access_request(
    request_id: str, body: AccessRejection, svc: ServicesDep, _: AdminDep
) -> AccessRequestView:
    return await access_requests.reject(svc, request_id, body.reason)


@router.post("/jobs/{job_id}/retention", responses=error_responses(404, 409))
async def extend_retention(
    job_id: str, body: RetentionExtension, svc: ServicesDep, _: AdminDep
) -> RetentionView:
    """Keep a run's bodies, candidates and answers until `keep_until` (R-7.5); only before
    they are deleted, since deleted data cannot come back."""
    keep_until = body.keep_until if body.keep_until.tzinfo else body.keep_until.replace(tzinfo=UTC)
    if keep_until <= svc.clock():
        raise Invalid("keep_until must be in the future")
    jobs = svc.stores.jobs
    purged = await jobs.purged(job_id)
    if purged is None:
        raise NotFound(f"job {echoed(job_id)} not found")
    if purged:
        raise Conflict(f"job {echoed(job_id)}'s run data was already deleted")
    await jobs.keep_run_data(job_id, keep_until, body.reason)
    return RetentionView(job_id=job_id, keep_until=keep_until, reason=body.reason)
