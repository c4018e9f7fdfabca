"""A team's own system versions: what it may submit jobs for (R-3.2, R-3.5)."""

from __future__ import annotations

from fastapi import APIRouter

from aml_contract.api.versions import VersionView
from aml_gateway.deps import GuardedRoute, ServicesDep, TeamDep
from aml_gateway.errors import error_responses
from aml_gateway.refusals import NotFound, echoed
from aml_runtime.documents import VersionDocument

router = APIRouter(
    route_class=GuardedRoute,
    prefix="/v1/versions",
    tags=["versions"],
    responses=error_responses(429),
)


def _view(version: VersionDocument) -> VersionView:
    return VersionView(
        version_id=version.id,
        system_name=version.system_name,
        version_label=version.version_label,
        tracks=version.tracks,
        board=version.board,
        add_url=version.add_url,
        search_url=version.search_url,
        health_url=version.health_url,
        auth_method=version.auth_method,
        has_memory_system_key=bool(version.secret_ref),
        capacity=version.capacity,
        created_at=version.created_at,
    )


@router.get("", responses=error_responses(401))
async def list_versions(svc: ServicesDep, team: TeamDep) -> list[VersionView]:
    return [_view(version) async for version in svc.stores.accounts.team_versions(team["_id"])]


@router.get("/{version_id}", responses=error_responses(401, 404))
async def get_version(version_id: str, svc: ServicesDep, team: TeamDep) -> VersionView:
    version = await svc.stores.accounts.team_version(version_id, team["_id"])
    if version is None:
        raise NotFound(f"version {echoed(version_id)} not found")
    return _view(version)
