"""Admin shortcut to bind a system version to a team (access requests come later, R-3.1/R-3.2)."""

from __future__ import annotations

import secrets
import uuid

import structlog
from fastapi import APIRouter, HTTPException

from aml_contract.api import VersionRegistered, VersionRegistration
from aml_gateway.deps import AdminDep, ServicesDep, key_hash
from aml_runtime.jobs import now
from aml_runtime.urlsafety import UnsafeUrl, check_target

router = APIRouter(prefix="/v1/admin", tags=["admin"])
log = structlog.get_logger()


@router.post("/versions", status_code=201)
async def register_version(
    body: VersionRegistration, svc: ServicesDep, _: AdminDep
) -> VersionRegistered:
    # at registration, so a bad URL is refused now and not at the first job; the same
    # checks run again before every connection, since DNS answers can change afterwards.
    for field in ("add_url", "search_url", "health_url"):
        try:
            checked, _addresses = await check_target(
                str(getattr(body, field)), allow_loopback=svc.settings.allow_loopback_targets
            )
        except UnsafeUrl as exc:
            raise HTTPException(422, {"reason": f"{field}: {exc.reason}"}) from None
        if checked.insecure:
            # Allowed, but the memory system key would travel in clear text (R-4.1: warn).
            log.warning("participant_url_not_https", field=field, host=checked.host)
    team = await svc.db.teams.find_one({"name": body.team})
    new_key = None
    if team is None:
        new_key = "aml_" + secrets.token_urlsafe(32)
        team = {
            "_id": f"team-{uuid.uuid4().hex[:12]}",
            "name": body.team,
            "key_hash": key_hash(new_key),
            "created_at": now(),
        }
        await svc.db.teams.insert_one(team)
    version_id = f"ver-{uuid.uuid4().hex[:12]}"
    secret_ref = None
    if body.memory_system_key is not None:
        secret_ref = f"sec-{uuid.uuid4().hex}"
        await svc.db.secrets.insert_one(
            {"_id": secret_ref, "sealed": svc.box.seal(body.memory_system_key)}
        )
    await svc.db.versions.insert_one(
        {
            "_id": version_id,
            "team_id": team["_id"],
            "system_name": body.system_name,
            "version_label": body.version_label,
            "track": body.track,
            "board": body.board,
            "add_url": str(body.add_url),
            "search_url": str(body.search_url),
            "health_url": str(body.health_url),
            "auth_method": body.auth_method,
            "secret_ref": secret_ref,
            "capacity": body.capacity.model_dump(),
            "created_at": now(),
        }
    )
    return VersionRegistered(
        version_id=version_id, team_id=team["_id"], leaderboard_api_key=new_key
    )
