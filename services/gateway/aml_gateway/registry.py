"""Teams, system versions and stored Memory System Keys, written in one place.

Two paths bind a version to a team: the admin shortcut (`POST /v1/admin/versions`) and an
approved access request. Both go through these functions, so every version document has the
fields the pipeline reads (`aml_pipeline.jobs.load_endpoint`) whichever way it was created.
"""

from __future__ import annotations

import secrets
import uuid
from collections.abc import Callable, Mapping
from datetime import datetime

import structlog
from pydantic import SecretStr

from aml_gateway.refusals import Conflict, Invalid, echoed
from aml_gateway.services import key_hash
from aml_pipeline.participants import REASON_QUOTE_MAX, Endpoint, ParticipantClient
from aml_pipeline.urlsafety import UnsafeUrl, check_target
from aml_runtime.db import Document
from aml_runtime.documents import VersionFields
from aml_runtime.secrets import SecretBox
from aml_runtime.settings import ParticipantCallSettings
from aml_runtime.stores.accounts import AccountStore

log = structlog.get_logger()

# Stands in for a real task id when an Add-status URL template is checked (R-4.1 applies to
# the URL that will be polled, not to the template text).
SAMPLE_TASK_ID = "task-id"


Clock = Callable[[], datetime]


def _name_taken(name: str) -> Conflict:
    return Conflict(name_taken_reason(name))


def name_taken_reason(name: str) -> str:
    return (
        f"system name {echoed(name)!r} belongs to another team; system names are unique across "
        "teams (the public page is /systems/{name})"
    )


async def check_system_name(accounts: AccountStore, name: str, team_id: str | None) -> None:
    """`Conflict` unless `name` is free or already the team's. Checked before anything is stored;
    `claim_system_name` decides for good."""
    if await accounts.system_name_taken(name, team_id):
        raise _name_taken(name)


async def claim_system_name(accounts: AccountStore, name: str, team_id: str, clock: Clock) -> bool:
    """Bind `name` to the team (the unique `_id` decides a race). Returns whether this call
    made the claim; `Conflict` when another team holds the name."""
    await check_system_name(accounts, name, team_id)
    claim = await accounts.reserve_system_name(name, team_id, clock())
    if claim == "taken":
        raise _name_taken(name)
    return claim == "claimed"


async def insert_version(
    accounts: AccountStore, team_id: str, version: VersionFields, clock: Clock
) -> str:
    """Claims the system name for the team first (`Conflict` when another team holds it)."""
    claimed = await claim_system_name(accounts, version.system_name, team_id, clock)
    version_id = f"ver-{uuid.uuid4().hex[:12]}"
    try:
        await accounts.bind_version(version_id, team_id, version, clock())
    except BaseException:
        if claimed:
            await accounts.release_system_name(version.system_name, team_id)
        raise
    return version_id


async def create_team(
    accounts: AccountStore, name: str, clock: Clock, details: Document | None = None
) -> tuple[str, str]:
    """A new team with a new Leaderboard API Key: returns (team id, key). The key is returned
    to be shown once; only its hash is stored (R-3.2, R-7.2)."""
    new_key = "aml_" + secrets.token_urlsafe(32)
    team_id = f"team-{uuid.uuid4().hex[:12]}"
    team = {
        "_id": team_id,
        "name": name,
        "key_hash": key_hash(new_key),
        "created_at": clock(),
        **(details or {}),
    }
    await accounts.add_team(team)
    return team_id, new_key


async def store_secret(accounts: AccountStore, box: SecretBox, key: SecretStr | None) -> str | None:
    """Seal a Memory System Key and return the reference that stands for it everywhere."""
    if key is None:
        return None
    secret_ref = f"sec-{uuid.uuid4().hex}"
    await accounts.keep_sealed_key(secret_ref, box.seal(key))
    return secret_ref


async def drop_secret(accounts: AccountStore, secret_ref: str | None) -> None:
    """Remove a sealed key no version or request will refer to."""
    if secret_ref is not None:
        await accounts.drop_sealed_key(secret_ref)


async def check_participant_urls(urls: Mapping[str, str], *, allow_loopback: bool) -> list[str]:
    """R-4.1 at registration, so a bad URL is refused now and not at the first job; the same
    checks run again before every connection, since DNS answers can change afterwards.

    Raises `Invalid` naming the field; returns warnings for what is allowed but discouraged."""
    warnings: list[str] = []
    for name, url in urls.items():
        try:
            checked, _addresses = await check_target(url, allow_loopback=allow_loopback)
        except UnsafeUrl as exc:
            # The reason quotes the URL's host, as long as the caller made it.
            raise Invalid(f"{name}: {echoed(exc.reason, REASON_QUOTE_MAX)}") from None
        if checked.insecure:
            # Allowed, but the Memory System Key would travel in clear text (R-4.1: warn).
            log.warning("participant_url_not_https", field=name, host=checked.host)
            warnings.append(
                f"{name}: http is not encrypted; use https so the Memory System Key is not "
                "sent in clear text"
            )
    return warnings


async def check_health(settings: ParticipantCallSettings, version: VersionFields) -> bool:
    """The unauthenticated Health GET (R-4.3), through the same guarded client the pipeline
    uses, so it obeys the R-4.1 checks and never follows redirects."""
    client = ParticipantClient.from_settings(settings)
    try:
        endpoint = Endpoint(
            add_url=version.add_url,
            search_url=version.search_url,
            health_url=version.health_url,
            auth_method=version.auth_method,
        )
        return await client.health(endpoint)
    finally:
        await client.aclose()
